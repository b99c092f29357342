// A float32 GEMM that reads the weights where the model keeps them: Y = A · W (+ bias), A
// float32 row-major [m, k], W the initializer itself ([k, n] row-major, or [n, k] when
// transposed) in float32, float16 or bfloat16, Y [m, n] in W's type. No copy of W is kept: the
// norm + linear kernels (cpu/norm_linear.cc) use it so that fusing costs no memory.
//
// Why our own besides ORT's (MLAS through cpu/ort_gemm.h): MLAS packs a weight once when the
// weight is a MatMul's constant input, and the unfused graph gets that; called on the original
// weight it packs 128 x 128 blocks on every call, reading 512-byte runs a row apart, which on
// this project's Zen 3 machine streams at half the rate of a sequential read (bench/README.md).
// The products here read W in the order that streams fastest, measured on that machine: for a
// [k, n] weight, kDepthPlain rows in lockstep along the task's columns (8 concurrent streams beat
// one sequential stream, 32 were 2.5x slower); for an [n, k] weight, its rows along k.
// cpu/norm_linear.cc chooses between this and MLAS per product size (bench/README.md says which
// wins where, per CPU).
//
// Blocking. The rows of A are packed into blocks of kRowBlock (6) rows, [k][6] each (GemmA::packed:
// by the caller as it makes A, or per call by GemmInPlace from row-major A, into a buffer the
// calling thread keeps from one call to the next: common/thread_floats.h), so the micro-kernel
// broadcasts them. With AVX-512 (one zmm per 16-wide tile row) a call over
// packed panels takes two row blocks of two adjacent tiles (24 accumulators), over a staged panel
// two row blocks (12): 6 accumulators alone cannot cover the FMA latency. With AVX2 (a 6 x 16
// block is 12 ymm accumulators) a panel passes through all of a task's row blocks, each call
// fetching the next call's A block into L1 as it goes (gemm_tiles.inc, SweepTile); except the last
// k block of a deep in-place task or one over panels packed once (float32 Y, full tiles), where each
// row block passes over all the tiles, writing Y's rows from its registers (SweepRowsLastBlock).
// A task is (row chunk, up to kPackedSpanChunks of them when it packs W per call) x (column
// range) of one product;
// its accumulators (rows x range floats) stay in L2 for the whole k loop, and are biased, rounded
// to T and stored once at the end. The micro-kernel computes a 6 x 16 block over a depth of kb
// rows of W read straight from W (float32, [k, n]) or from a [kb][16] float32 stage in L1
// (16-bit weights widened, [n, k] weights transposed when many rows share them, partial tiles
// zero-padded).
//
// Few rows (up to kStreamMaxRows) and an [n, k] weight (common/gemm_few_rows.inc): no stage of
// transposes; each of W's rows is read along k once per call for all rows of A. Up to kDotMaxRows
// rows as dot products (16-lane partial sums along k per (row of A, row of W), in registers for a
// group of W's rows against every row of A, summed across lanes once at the end); more rows with
// A's rows in the vector lanes ([k][16] per 16 rows) and each element of W broadcast against
// them, W's rows copied (16-bit ones widened) a k block at a time into an L1 stage.
//
// Numerics: float32 products summed in a fixed order, whatever the thread count: k ascending in
// one float32 sum, except for the dot form ([n, k] weight, up to kDotMaxRows rows), where lane j
// of 16 sums the products of k = 16c + j (c ascending), the last k % 16 products are added to
// lanes 0, 1, ... in turn, and the lanes are summed by a fixed tree (lanes j and j + 8, then j and
// j + 4, j and j + 2, 0 and 1). The AVX2 and AVX-512 variants use the same FMAs in the same order
// (bit-identical results), the baseline variant multiply + add, so it agrees with them within
// float32 rounding, not bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ort_glue.h"

namespace otfuse {

enum class WeightType { kFloat32, kFloat16, kBFloat16 };

// One product of a node; all products of a node share A and run in one parallel section.
struct GemmProduct {
  const void* w;       // [k, n] row-major, or [n, k] when transposed; of `type`
  WeightType type;     // of W and of Y
  bool transposed;
  int64_t n;
  const float* bias;   // [n] float32, or null
  void* y;             // [m, n] row-major, of `type`
  // W packed once by PackWeight (its values of `type` as they were), or null: then every row
  // count reads these panels and `w` is not read (ORT may have freed it).
  const void* packed = nullptr;
};

// W packed once, as a packed task reads it (the plugin-EP route, cpu/norm_linear_ep.cc: ORT hands
// the initializer to PrePackWeight and frees it afterwards, so the panels take W's place instead
// of being copied block by block on every call). Column ranges of PackedRangeCols(n) columns, each
// as its k blocks of EvenDepth(k) rows, each block as its tiles' [kc][16] panels (columns past n
// zero): the panel of (col0, k0) starts at element col0 * k + k0 * tiles * 16. The elements keep
// W's type (float16 / bfloat16 stay 16-bit, widened in the micro-kernels' registers), so the
// panels take W's bytes (plus its last partial tile), never twice them.
int64_t PackedWeightElements(int64_t k, int64_t n);
void PackWeight(const void* w, WeightType type, bool transposed, int64_t k, int64_t n, void* panels);
// Whether `panels` hold exactly (bit for bit) PackWeight's packing of `w`: one read of each, nothing
// allocated (the plugin EP shares one set of panels among the kernels that pack the same weight).
bool PackedWeightHolds(const void* w, WeightType type, bool transposed, int64_t k, int64_t n, const void* panels);

// Which micro-kernels run. SelectGemmIsa: AVX-512F when the CPU and OS have it and run it at full
// rate (Avx512AtFullRate), else AVX2 + FMA, else the portable ones; OTFUSE_CPU_ISA=baseline forces
// the portable ones, OTFUSE_GEMM_ISA=avx2|avx512 either of the others (tests and benchmarks: every
// variant stays testable). Read when a kernel is created; throws Error for any other value, or
// for a variant this CPU cannot run.
enum class GemmIsa { kBaseline, kAvx2, kAvx512 };
GemmIsa SelectGemmIsa();
const char* GemmIsaName(GemmIsa isa);  // "avx512f", "avx2+fma" or "baseline"

// A float32 [m, k] in the layouts a call reads: `rows` row-major (the few-rows forms over [n, k]
// weights, gemm_few_rows.inc), `packed` in row blocks (every other task): block b, of kRowBlock
// rows (the last one fewer), at packed + b * kRowBlock * k as [k][rows of the block]
// (PackRowBlock). A caller that makes A row by row (cpu/norm_linear.cc) writes the packed blocks
// itself, which spares GemmInPlace a pass over A.
struct GemmA {
  const float* rows = nullptr;
  const float* packed = nullptr;
};
struct GemmALayouts {
  bool rows = false;
  bool packed = false;
};
// Which layouts a call of m rows over these products reads (GemmInPlace's plan).
GemmALayouts GemmReadsA(GemmIsa isa, int64_t m, const std::vector<GemmProduct>& products);
// Rows [count][k] of A (count <= kRowBlock: one row block) as that block of GemmA::packed, [k][count].
void PackRowBlock(const float* rows, int64_t count, int64_t k, float* block);

// Y_i = A · W_i (+ bias_i) for every product. A given in the layouts GemmReadsA names (the others
// are not read and may be null), or row-major only: then packed per call. Throws Error when out
// of memory.
void GemmInPlace(const KernelContext& ctx, GemmIsa isa, int64_t m, int64_t k, const GemmA& a,
                 const std::vector<GemmProduct>& products);
void GemmInPlace(const KernelContext& ctx, GemmIsa isa, int64_t m, int64_t k, const float* a,
                 const std::vector<GemmProduct>& products);

namespace gemm_detail {

constexpr int64_t kRowBlock = 6;
constexpr int64_t kTileWidth = 16;
// k rows per step over a [k, n] weight read in place: rows read in lockstep (gemm.cc). (AVX-512, 7-18
// rows: kTallDepth, gemm_tiles.inc.)
constexpr int64_t kStreamDepth = 16;
// ... for a task of more than kStreamMaxRows rows (two tiles per call, AVX-512): fewer reloads
// of its accumulators per FMA (bench/README.md, "norm_linear, middle rows, session 9").
constexpr int64_t kStreamDepthPaired = 32;

// Plain data: crosses between the translation units built for each ISA.
struct Job {
  int64_t m;
  int64_t k;
  const float* a_packed;  // row block b at a_packed + b * kRowBlock * k: [k][rows of the block]
  const GemmProduct* products;
  const float* a;        // row-major [m, k]
  const float* a_lanes;  // group g of 16 rows at a_lanes + g * k * 16: [k][16], zero rows past m
};

// How a task reads W (gemm.cc plans, gemm_tiles.inc runs).
enum class TaskKind {
  kPlain,       // [k, n], few rows: in place, kStreamDepth rows in lockstep
  kDot,         // [n, k], up to kDotMaxRows rows: dot products along k (gemm_few_rows.inc)
  kLane,        // [n, k], more rows: A's rows in the vector lanes, W's elements broadcast
  kPacked,      // many rows: W packed (or staged) per call
  kDeepPlain,   // [k, n], AVX2 / AVX-512, up to kDeepPlainMaxRows rows: in place, kPackDepth rows deep
};

// Few rows: W read in place up to this many rows (gemm.cc).
constexpr int64_t kStreamMaxRows = 64;
// ... and up to this many for a [k, n] weight with the AVX-512 kernels, two tiles per call above
// kStreamMaxRows rows (PlainTask). On the Emerald Rapids Xeon (bench/README.md, "norm_linear,
// middle rows, session 9") this beat packing by 2-20% at 96-256 rows and lost at 384 (float32 W
// from 97 rows whose rows do not alias: deep, kDeepPlainMinRowsAvx512).
constexpr int64_t kStreamMaxRowsAvx512 = 256;
// ... and up to this many with the AVX2 kernels (one tile per call): on the Emerald Rapids Xeon
// (AVX2 kernels, W flushed from the caches) packing per call took 1.05-1.22x the in-place task's
// time at 96 and 128 rows (bench/README.md, "norm_linear, 65-256 rows, session 15").
constexpr int64_t kStreamMaxRowsAvx2 = 128;
// ... and up to this many (a [k, n] weight, W not packed once, the AVX2 or AVX-512 kernels), from
// DeepPlainMinRows (gemm.cc) on: still in place, but kPackDepth rows deep (PlainTask: each tile,
// AVX-512 tile pair, staged in L1 by its first row block for the others): no copy of W per call, and
// an eighth of the 32-deep steps' accumulator reloads. On the Emerald Rapids Xeon a 512-row task ran
// 0.92-0.93x PackedTask's time in float32, 0.96-0.97x in float16 (AVX2 kernels: 0.97-0.99x either
// way); an earlier form 1.00x / 0.97x at 684 rows, and a 2052-row task (its A slice and
// accumulators out of L2) 1.04x (bench/README.md, "norm_linear custom-op route, session 14").
constexpr int64_t kDeepPlainMaxRows = 576;
// From these rows on (bench/README.md, "norm_linear, 65-256 rows, session 15"; Emerald Rapids Xeon,
// W flushed from the caches): AVX2 kernels 129 (at 192-256 rows deep 0.91-1.0x the 32-deep time,
// packing 0.93-1.11x; at 96-128 deep 1.02-1.09x); AVX-512 kernels 97 for a float32 W whose rows do
// not alias (below: 0.91-1.00x the 32-deep time at 96-256 rows; 16-bit W 1.0-1.3x, so it keeps the
// 32-deep steps up to kStreamMaxRowsAvx512, as float32 W whose rows alias does).
constexpr int64_t kDeepPlainMinRowsAvx2 = 129;
constexpr int64_t kDeepPlainMinRowsAvx512 = 97;
// W's rows alias when they are a multiple of this many bytes apart: the 256 rows of a deep step
// then fall in at most 16 of the Xeon's L2 sets (2 MiB, 16-way: 128 KiB apart share a set), and the
// next tile pair's rows fetched into L2 evict each other: float32 [2048, 8192] and [2048, 2048] at
// 128 rows ran 1.04x the 32-deep time, [2048, 8256] and [2048, 2112] 0.96x.
constexpr int64_t kDeepAliasBytes = 8192;
// [n, k] weights, few rows: the dot form up to this many rows, the lane form above (its register
// tile holds at most 4 rows of A; on the AVX-512 Xeon, float32 block, one thread, the dot form ran
// 30.0 vs 53.1 ms at 2 rows and 39.9 vs 43.5 at 4: bench/README.md, "Issue 12, session 9").
constexpr int64_t kDotMaxRows = 4;

struct Task {
  int64_t product;
  TaskKind kind;
  int64_t row0;  // a multiple of kRowBlock
  int64_t rows;
  int64_t col0;  // a multiple of kTileWidth
  int64_t cols;
};

// Many rows, an [n, k] weight, AVX-512 micro-kernels: staged tasks, units of kStageDepth k rows x
// kStageTiles tiles copied into two alternating [kStageTiles][kStageDepth][16] float32 stages
// (2 x 32 KiB); the next unit is copied during the current one's calls, its lines prefetched
// kStageLead calls before their copy. Measured on the AVX-512 Xeon (bench/README.md, 2026-12-05).
constexpr int64_t kStageDepth = 256;
constexpr int64_t kStageTiles = 2;
constexpr int64_t kStageLead = 3;
// Columns per staged task: its accumulators (rows x cols) and its A slice (rows x kStageDepth)
// stay in L2 together.
constexpr int64_t kStagedCols = 256;

// Many rows otherwise ([k, n] weights; [n, k] ones with the AVX2 and portable kernels): packed
// tasks, blocks of kPackDepth (EvenDepth) k rows x at most kPackCols columns (kPackColsTransposed for an
// [n, k] weight), two at a time (2 x 1 MiB in float32: they live in L3 and their panels pass
// through L1). Staged tasks ran [k, n] weights 0.95-0.97x these on the AVX-512 Xeon, and 0.82-0.89x
// with the AVX2 kernels (bench/README.md).
constexpr int64_t kPackDepth = 256;
// The k blocks of every task that multiplies by kPackDepth-deep blocks (deep in-place tasks, W
// packed per call, and the layout of W packed once, PackWeight): as few as kPackDepth allows, of
// equal depth (a multiple of 8: A's block slices stay whole cache lines), not kPackDepth rows and a
// short rest. The last block's calls write Y; a short last block gives those stores too few FMAs to
// hide behind: one 512-row deep task (AVX-512, float32, one thread) ran 1.02-1.05x as fast with
// Qwen2's K = 896 as 4 x 224 instead of 3 x 256 + 128, K = 1152 as 5 blocks of ~230 instead of 4 x
// 256 + 128 1.06x, while 3 x 224 + 96 for K = 768 instead of 3 x 256 ran 0.96x; packed per call (684
// rows) 1.035x, packed once (976 columns) 1.01-1.02x; the AVX2 kernels 1.00-1.01x (bench/README.md,
// "norm_linear at 512 rows, session 20"). The same FMAs in the same order per output (k ascending,
// one float32 chain): the same bits.
inline int64_t EvenDepth(int64_t k) {
  const int64_t blocks = (k + kPackDepth - 1) / kPackDepth;
  return ((k + blocks - 1) / blocks + 7) / 8 * 8;
}
constexpr int64_t kPackCols = 1024;
constexpr int64_t kPackColsTransposed = 128;
// Column ranges a plan of tasks that pack W per call (or read it deep in place) tries, widest
// first (common/gemm.cc, PlanTasks): 768 and 384 split 3 x 768 and 3 x 1024 columns evenly on 2
// threads, where halving 1024 did not.
constexpr int64_t kPackedCandidateCols[] = {1024, 768, 512, 384, 256};
// Row chunks: a packed task multiplies its W block by up to kPackedChunkRows rows at a time,
// whose A slice (rows x kPackDepth floats, 768 KiB) stays in L2 (L3 where L2 is 512 KiB) and
// whose accumulators take at most 3 MiB per 1024 columns.
constexpr int64_t kPackedChunkRows = 768;
// Rows of kRowBlock in chunks of at most kPackedChunkRows, as even as whole row blocks allow.
inline int64_t PackedChunkRows(int64_t rows) {
  const int64_t chunks = (rows + kPackedChunkRows - 1) / kPackedChunkRows;
  return ((rows + chunks - 1) / chunks + kRowBlock - 1) / kRowBlock * kRowBlock;
}
// A task that packs W per call (PackedTask) spans up to this many row chunks: each W block is
// copied once for all of them (the copy, not the FMAs, is what packing per call costs: on the
// AVX-512 Xeon about 9% of a 512-row task's time, bench/README.md "session 13").
constexpr int64_t kPackedSpanChunks = 3;

// Columns per task of a product's n columns split into equal ranges of whole tiles, at most
// `max_cols` each (the task planner's split; a product packed once is laid out by the same split,
// so each task's columns are one range of its panels).
inline int64_t RangeCols(int64_t n, int64_t max_cols) {
  const int64_t ranges = (n + max_cols - 1) / max_cols;
  return ((n + ranges - 1) / ranges + kTileWidth - 1) / kTileWidth * kTileWidth;
}
inline int64_t PackedRangeCols(int64_t n) { return RangeCols(n, kPackCols); }
// Few rows (up to kSplitRangeMaxRows) over W packed once, when the threads would not share a task
// per packed range evenly (common/gemm.cc, PlanChoice): each range split into this many tasks of
// whole tiles. Whole ranges left hidden 768's nodes (N = 2304, 3072, 768 x 3: three ranges) with
// three equal tasks on 2 threads, one thread doing two (bench/README.md, "Plugin-EP route at one
// row on small models, session 14").
constexpr int64_t kFewRowsRangeSplits = 2;
constexpr int64_t kSplitRangeMaxRows = 64;

// `stage`: kStageFloats floats (either kind); `acc`: rows * (cols rounded up to 16) floats.
constexpr int64_t kStageFloats = 2 * kPackDepth * kPackCols;
using TaskFn = void (*)(const Job& job, const Task& task, float* stage, float* acc);

namespace baseline {
void RunTask(const Job& job, const Task& task, float* stage, float* acc);
}
namespace avx2 {
void RunTask(const Job& job, const Task& task, float* stage, float* acc);
}
namespace avx512 {
void RunTask(const Job& job, const Task& task, float* stage, float* acc);
}

}  // namespace gemm_detail
}  // namespace otfuse
