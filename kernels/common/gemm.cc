#include "common/gemm.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <string>
#include <thread>

#include "common/cpu_features.h"
#include "common/thread_floats.h"

namespace otfuse {
namespace {

using gemm_detail::kRowBlock;
using gemm_detail::kTileWidth;
using gemm_detail::Task;

gemm_detail::TaskFn TaskFnFor(GemmIsa isa) {
#if defined(OTFUSE_HAVE_AVX2_KERNELS)
  switch (isa) {
    case GemmIsa::kAvx512: return &gemm_detail::avx512::RunTask;
    case GemmIsa::kAvx2: return &gemm_detail::avx2::RunTask;
    default: break;
  }
#endif
  (void)isa;
  return &gemm_detail::baseline::RunTask;
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t RoundUp(int64_t a, int64_t b) { return CeilDiv(a, b) * b; }

// ---- The task plan (common/gemm.h: why each regime reads W the way it does). Measured on the
// Zen 3 machine of bench/README.md, the bench block ([M, 4096] x [4096, 28160]).

// Few rows: W read in place, kStreamDepth rows in lockstep. At M = 64 this beat packing (0.79x
// vs 0.66x the unfused MLAS); at 512 and 2048 packing wins.
using gemm_detail::kStreamMaxRows;
using gemm_detail::TaskKind;
// (kStreamDepth, common/gemm.h: 16 lockstep rows beat 8 and 32 at M = 16, fp32 0.98x vs 0.88x /
// 0.80x the unfused time, fp16 1.20x vs 1.02x / 1.09x.)
// Column ranges as wide as the accumulators allow, at most a quarter of the node's columns:
// long runs along W's rows (a quarter measured 1.03x at fp32 M = 16, a 16th 0.98x, a 64th 0.72x).
constexpr int64_t kStreamTasks = 4;
constexpr int64_t kMinRangeCols = 256;

// This CPU's L2 per core in bytes (512 KiB when the OS does not say).
int64_t L2Bytes() {
  static const int64_t bytes = [] {
    const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return static_cast<int64_t>(l2 > 0 ? l2 : 512 << 10);
  }();
  return bytes;
}

// A streaming task's accumulators (rows x cols floats) stay in L2 for its whole k loop: a quarter
// of this CPU's L2 (512 KiB on Zen 3, 1 MiB on Zen 4), the rest for W's lines and A.
int64_t StreamAccumulatorFloats() {
  static const int64_t floats =
      std::clamp<int64_t>(L2Bytes() / 4, 32 << 10, 1 << 20) / static_cast<int64_t>(sizeof(float));
  return floats;
}

// Panels packed once (nothing copied per task, so a smaller chunk only re-reads W): chunks short
// enough that the largest task is at most 1/kPackedOnceTasks of the node's work, so that a node
// dominated by one narrow product (the LM head's N = 1024 is one column range) still has a task
// for every thread and a small last one; at least kPackedOnceMinRows rows (16 row blocks).
constexpr int64_t kPackedOnceTasks = 8;
constexpr int64_t kPackedOnceMinRows = 96;

// 16-bit panels packed once are widened into a float32 stage once per task, k block and tile step
// (gemm_tiles.inc, PrepackedTask), a pass its row blocks amortise: on the AVX-512 Xeon one task
// took 1.15x the float32 panels' time at 66 rows and 1.09x at 128, 0.94-0.98x from 512. So up to
// kWidenedMinRows rows they are one row chunk, a packed range split into column tasks where whole
// ranges would leave the threads uneven (kFewRowsRangeSplits, PlanTasks), not two or more chunks of
// 66-86 rows: GPT-2 fp16 on the plugin EP 0.91 / 0.96 -> 0.94 / 0.97x the unfused time at M = 128,
// 0.89 / 0.90 -> 0.95 / 0.99x at 256 (two runs, in the same turns; one task 1.09-1.15x -> ~1.0x the
// float32 panels' time). 256-row chunks above that (512 rows: 2 chunks x 3 ranges instead of 4 x 3)
// ran 0.93x the 128-row chunks' speed: their accumulators and A slice outgrow L2 (bench/README.md,
// "norm_linear, session 16: fp16"). Above it, up to kDeepPlainMaxRows rows, one chunk in column parts
// that fit L2 (WidenedOneChunkWidestCols), then those chunks.
constexpr int64_t kWidenedMinRows = 256;

bool WidensPanels(const std::vector<GemmProduct>& products) {
  return std::any_of(products.begin(), products.end(),
                     [](const GemmProduct& p) { return p.packed != nullptr && p.type != WeightType::kFloat32; });
}

// Rows up to which a packed range may be split into column tasks (one row chunk).
int64_t SplitRangeMaxRows(const std::vector<GemmProduct>& products) {
  return WidensPanels(products) ? kWidenedMinRows : gemm_detail::kSplitRangeMaxRows;
}

int64_t PackedOnceChunkRows(int64_t m, const std::vector<GemmProduct>& products, int64_t chunk_rows) {
  int64_t total_cols = 0, widest_range = 0;
  for (const GemmProduct& p : products) {
    total_cols += p.n;
    if (p.packed != nullptr) widest_range = std::max(widest_range, gemm_detail::PackedRangeCols(p.n));
  }
  if (widest_range == 0) return chunk_rows;
  if (WidensPanels(products) && m <= kWidenedMinRows) return RoundUp(m, kRowBlock);  // one chunk
  const int64_t rows = std::max(kPackedOnceMinRows, m * total_cols / (kPackedOnceTasks * widest_range));
  return std::min(chunk_rows, RoundUp(CeilDiv(m, CeilDiv(m, rows)), kRowBlock));
}

void AddTasks(const std::vector<GemmProduct>& products, TaskKind kind, int64_t m, int64_t chunk_rows, size_t product,
              int64_t range, std::vector<Task>* tasks, int64_t* max_cells) {
  const int64_t n = products[product].n;
  const int64_t cols = gemm_detail::RangeCols(n, range);
  for (int64_t row0 = 0; row0 < m; row0 += chunk_rows) {
    const int64_t rows = std::min(chunk_rows, m - row0);
    for (int64_t col0 = 0; col0 < n; col0 += cols) {
      const Task task{static_cast<int64_t>(product), kind, row0, rows, col0, std::min(cols, n - col0)};
      tasks->push_back(task);
      *max_cells = std::max(*max_cells, rows * RoundUp(task.cols, kTileWidth));
    }
  }
}

// A product packed once: a task per packed range and row chunk; up to kSplitRangeMaxRows rows (one
// chunk) `splits` tasks per range (gemm_tiles.inc, TaskPanels: a task reads a range's tiles from
// any first one); part_cols > 0 (WidenedOneChunkWidestCols): all m rows in one chunk, each range in parts of
// part_cols columns.
void AddPackedOnceTasks(int64_t m, const std::vector<GemmProduct>& products, int64_t chunk_rows, size_t product,
                        int64_t splits, std::vector<Task>* tasks, int64_t* max_cells, int64_t part_cols) {
  const int64_t n = products[product].n;
  const int64_t range = gemm_detail::PackedRangeCols(n);
  if (part_cols > 0) {  // one row chunk, each range in parts of part_cols columns (its last one shorter)
    for (int64_t col0 = 0; col0 < n; col0 += range) {
      const int64_t range_end = std::min(n, col0 + range);
      for (int64_t c = col0; c < range_end; c += part_cols) {
        const Task task{static_cast<int64_t>(product), TaskKind::kPacked, 0, m, c, std::min(part_cols, range_end - c)};
        tasks->push_back(task);
        *max_cells = std::max(*max_cells, m * RoundUp(task.cols, kTileWidth));
      }
    }
    return;
  }
  if (splits == 1 || m > SplitRangeMaxRows(products) || m > chunk_rows) {
    AddTasks(products, TaskKind::kPacked, m, chunk_rows, product, gemm_detail::kPackCols, tasks, max_cells);
    return;
  }
  for (int64_t range0 = 0; range0 < n; range0 += range) {
    const int64_t range_cols = std::min(range, n - range0);
    const int64_t cols = RoundUp(CeilDiv(range_cols, splits), kTileWidth);
    for (int64_t col0 = range0; col0 < range0 + range_cols; col0 += cols) {
      const Task task{static_cast<int64_t>(product), TaskKind::kPacked, 0, m, col0,
                      std::min(cols, range0 + range_cols - col0)};
      tasks->push_back(task);
      *max_cells = std::max(*max_cells, m * RoundUp(task.cols, kTileWidth));
    }
  }
}

// Rows up to which a product reads W in place (common/gemm.h).
int64_t StreamMaxRows(GemmIsa isa, const GemmProduct& product) {
  if (product.transposed) return kStreamMaxRows;
  switch (isa) {
    case GemmIsa::kAvx512: return gemm_detail::kStreamMaxRowsAvx512;
    case GemmIsa::kAvx2: return gemm_detail::kStreamMaxRowsAvx2;
    default: return kStreamMaxRows;
  }
}

// Whether a [k, n] weight's rows are a multiple of kDeepAliasBytes apart (common/gemm.h).
bool RowsAlias(const GemmProduct& product) {
  const int64_t element_bytes = product.type == WeightType::kFloat32 ? 4 : 2;
  return product.n * element_bytes % gemm_detail::kDeepAliasBytes == 0;
}

// Rows from which a [k, n] weight not packed once is read deep in place (kDeepPlain, common/gemm.h).
int64_t DeepPlainMinRows(GemmIsa isa, const GemmProduct& product) {
  if (isa == GemmIsa::kAvx2) return gemm_detail::kDeepPlainMinRowsAvx2;
  if (product.type == WeightType::kFloat32 && !RowsAlias(product)) return gemm_detail::kDeepPlainMinRowsAvx512;
  return gemm_detail::kStreamMaxRowsAvx512 + 1;
}

// A 16-bit [k, n] weight read deep in place (kDeepPlain): each task's accumulators (rows x cols
// floats) are read and written once per k block, between which its A slice (rows x kPackDepth
// floats) passes through L2 once per tile pair. Column ranges whose two fit in
// kDeepL2Share of L2 run faster than wider ones that spill to L3: Qwen2's gate / up at 512 rows,
// 976 -> 496 columns (1.95 -> 0.97 MiB of accumulators beside 0.5 MiB of A), 1-5% less time per task in
// four runs on the Emerald Rapids Xeon, GPT-2's 3072 columns 768 -> 512 3% (bench/README.md,
// "norm_linear fp16, session 17"). float32 W not measured: its plan stays.
constexpr int64_t kDeepL2ShareNum = 3, kDeepL2ShareDen = 4;

bool DeepRangeFitsL2(int64_t m, const GemmProduct& product, int64_t cols) {
  const int64_t range = RoundUp(gemm_detail::RangeCols(product.n, cols), kTileWidth);
  const int64_t bytes = static_cast<int64_t>(sizeof(float)) * m * (range + gemm_detail::kPackDepth);
  return bytes * kDeepL2ShareDen <= L2Bytes() * kDeepL2ShareNum;
}

// How the tasks of a product read W at m rows: packed once, its panels at every row count; a
// [k, n] weight deep in place from DeepPlainMinRows up to kDeepPlainMaxRows (AVX2, AVX-512);
// W packed per task past StreamMaxRows otherwise; else in place, an [n, k] weight as dot products up to
// kDotMaxRows rows and with A's rows in the vector lanes above (gemm_few_rows.inc).
TaskKind KindFor(GemmIsa isa, int64_t m, const GemmProduct& product) {
  if (product.packed != nullptr) return TaskKind::kPacked;
  if (isa != GemmIsa::kBaseline && !product.transposed && m >= DeepPlainMinRows(isa, product) &&
      m <= gemm_detail::kDeepPlainMaxRows) {
    return TaskKind::kDeepPlain;
  }
  if (m > StreamMaxRows(isa, product)) return TaskKind::kPacked;
  if (!product.transposed) return TaskKind::kPlain;
  return m <= gemm_detail::kDotMaxRows ? TaskKind::kDot : TaskKind::kLane;
}

// Whether column ranges of at most `cols` keep every 16-bit deep in-place task within L2 (DeepRangeFitsL2).
bool DeepRangesFitL2(GemmIsa isa, int64_t m, const std::vector<GemmProduct>& products, int64_t cols) {
  return std::all_of(products.begin(), products.end(), [&](const GemmProduct& p) {
    return p.type == WeightType::kFloat32 || KindFor(isa, m, p) != TaskKind::kDeepPlain || DeepRangeFitsL2(m, p, cols);
  });
}

// The dot and lane forms read A row-major (the lane form through its [k][16] copy); the others packed.
bool ReadsRowMajorA(TaskKind kind) { return kind == TaskKind::kDot || kind == TaskKind::kLane; }

// Whether a product's many-rows tasks pack W per call (PackedTask; gemm_tiles.inc chooses by the
// same rule): not packed once, and not staged ([n, k] weights with the AVX-512 kernels).
bool PacksPerCall(GemmIsa isa, const GemmProduct& product) {
  return product.packed == nullptr && (!product.transposed || isa != GemmIsa::kAvx512);
}

// Tasks that pack W per call: span_chunks row chunks (gemm_detail::kPackedSpanChunks) x column
// ranges of at most packed_cols columns.
// `one_row_cols` (one row, OneRowCandidateCols): the column ranges of [k, n] weights read in place.
std::vector<Task> PlanTasksSpanning(GemmIsa isa, int64_t m, const std::vector<GemmProduct>& products,
                                    int64_t span_chunks, int64_t packed_cols, int64_t* max_cells,
                                    int64_t packed_once_splits = 1, int64_t packed_once_more_chunks = 0,
                                    int64_t one_row_cols = 0, int64_t packed_once_part_cols = 0) {
  std::vector<Task> tasks;
  *max_cells = 0;
  const int64_t chunk_rows = gemm_detail::PackedChunkRows(m);
  const int64_t span_rows = span_chunks * chunk_rows;
  int64_t packed_once_rows = PackedOnceChunkRows(m, products, chunk_rows);
  if (packed_once_more_chunks > 0) {
    packed_once_rows = RoundUp(CeilDiv(m, CeilDiv(m, packed_once_rows) + packed_once_more_chunks), kRowBlock);
  }
  int64_t total_cols = 0;
  for (const GemmProduct& p : products) total_cols += p.n;
  const int64_t max_range = std::max(kTileWidth, StreamAccumulatorFloats() / m / kTileWidth * kTileWidth);
  const int64_t wanted = std::max(kMinRangeCols, RoundUp(CeilDiv(total_cols, kStreamTasks), kTileWidth));
  for (size_t i = 0; i < products.size(); ++i) {
    const TaskKind kind = KindFor(isa, m, products[i]);
    if (products[i].packed != nullptr) {
      AddPackedOnceTasks(m, products, packed_once_rows, i, packed_once_splits, &tasks, max_cells, packed_once_part_cols);
    } else if (kind == TaskKind::kDeepPlain) {  // one row chunk: m <= kDeepPlainMaxRows
      AddTasks(products, kind, m, chunk_rows, i, packed_cols, &tasks, max_cells);
    } else if (kind == TaskKind::kPacked) {
      // Column ranges: staged tasks for [n, k] weights with AVX-512, else packed ones.
      const int64_t range = !products[i].transposed  ? packed_cols
                            : isa == GemmIsa::kAvx512 ? gemm_detail::kStagedCols
                                                      : gemm_detail::kPackColsTransposed;
      const int64_t rows = PacksPerCall(isa, products[i]) ? span_rows : chunk_rows;
      AddTasks(products, kind, m, rows, i, range, &tasks, max_cells);
    } else if (kind == TaskKind::kPlain && one_row_cols > 0) {
      AddTasks(products, kind, m, m, i, one_row_cols, &tasks, max_cells);
    } else {
      AddTasks(products, kind, m, m, i, std::min(max_range, wanted), &tasks, max_cells);
    }
  }
  // The largest tasks first: the threads claim them in this order (GemmInPlace), so the last
  // ones, which decide how long one thread waits for the other, are the smallest.
  std::stable_sort(tasks.begin(), tasks.end(),
                   [](const Task& a, const Task& b) { return a.rows * a.cols > b.rows * b.cols; });
  return tasks;
}

// Whether the largest task is at most 1 / (threads + 1) of the node's work: the threads, claiming
// the tasks largest first, then finish close together.
bool Balanced(const std::vector<Task>& tasks, int64_t threads) {
  int64_t total = 0, largest = 0;
  for (const Task& task : tasks) {
    total += task.rows * task.cols;
    largest = std::max(largest, task.rows * task.cols);
  }
  return largest * (threads + 1) <= total;
}

// The busiest thread's cells when the threads take the tasks (largest first) as they finish one.
int64_t BusiestLoad(const std::vector<Task>& tasks, int64_t threads) {
  std::vector<int64_t> load(static_cast<size_t>(threads), 0);
  for (const Task& task : tasks) *std::min_element(load.begin(), load.end()) += task.rows * task.cols;
  return *std::max_element(load.begin(), load.end());
}

int64_t Cells(const std::vector<Task>& tasks) {
  int64_t total = 0;
  for (const Task& task : tasks) total += task.rows * task.cols;
  return total;
}

// Candidate plans, most wanted first: the first one the threads share evenly (the busiest within
// 10% of an even share: three equal tasks on 2 threads end at 4/3 of it) is the plan; if none is,
// the one whose busiest thread ends first (the first of equals).
class PlanChoice {
 public:
  explicit PlanChoice(int64_t threads) : threads_(threads) {}
  // Whether `tasks` is taken (then stop offering); `may_take` false: only as the fallback.
  bool Offer(std::vector<Task> tasks, int64_t cells, bool may_take) {
    const int64_t load = BusiestLoad(tasks, threads_);
    const bool even = may_take && load * threads_ * 10 <= Cells(tasks) * 11;
    if (even || load < best_load_) {
      best_ = std::move(tasks);
      best_cells_ = cells;
      best_load_ = load;
    }
    return even;
  }
  std::vector<Task> Take(int64_t* max_cells) {
    *max_cells = best_cells_;
    return std::move(best_);
  }

 private:
  int64_t threads_;
  std::vector<Task> best_;
  int64_t best_cells_ = 0;
  int64_t best_load_ = std::numeric_limits<int64_t>::max();
};

// ---- One row (decode) over [k, n] weights read in place (kPlain). Reading W is all the work, and
// its rate from L3 rises with the length of the runs a task reads along W's rows (its columns):
// bench/gemv_rows_probe.cc, 2 threads, N = 3072, tasks of 256 / 384 / 768 / 1536 columns read
// 26 / 30 / 38 / 42 GB/s (from DRAM 18 / 23 / 25 / 25). The plan takes the widest ranges (the
// node's columns over threads x splits, splits = 1, 2, ...) that the threads share evenly
// (PlanChoice): one task per thread on GPT-2's nodes (2304, 3072 columns) and LLaMA's gate / up,
// where kStreamTasks' quarters of the node's columns went before. CPU time of the tasks (perf,
// W in L3, one session a process) -25% on the LLaMA block, -6% on GPT-2 (bench/README.md,
// "norm_linear, session 16: one row"). The same FMAs per output, so the same bits.
constexpr int64_t kOneRowMaxSplits = 4;

bool OneRowPlain(GemmIsa isa, int64_t m, const std::vector<GemmProduct>& products) {
  if (m != 1) return false;
  return std::any_of(products.begin(), products.end(),
                     [&](const GemmProduct& p) { return KindFor(isa, m, p) == TaskKind::kPlain; });
}

// Column ranges of the one-row candidate with `splits` tasks per thread, at least kMinRangeCols.
int64_t OneRowCandidateCols(const std::vector<GemmProduct>& products, int64_t threads, int64_t splits) {
  int64_t total_cols = 0;
  for (const GemmProduct& p : products) total_cols += p.n;
  return std::max(kMinRangeCols, RoundUp(CeilDiv(total_cols, threads * splits), kTileWidth));
}

// Tasks that pack W per call or read it deep in place, in plans of many rows: at least
// kPackedTasksPerThread per thread, and each row chunk's accumulators with its A slice
// (PackedChunkRows, or a deep task's rows, x (columns + kPackDepth) floats) within L2, where the
// candidate widths allow (PlanTasks). Qwen2's gate / up ([896, 4864] x 2) at
// M = 2048 took 10 tasks of 2048 x 976 (a chunk's accumulators 2.7 MiB: from L3 on every call) and
// its q / k / v node ([896, 896 + 128 + 128]) 5 of 128-304 columns, which left a thread idle for up
// to half a task whenever the other core ran slower (this host: FMA loops ~1.5x slower for seconds
// at a time); 384 / 128 columns ran 1.03-1.09x / 1.04-1.11x the old plan's speed in the same turns
// (bench/README.md, "norm_linear large M, session 17"). Deep tasks at M = 512 the same way: Qwen2's
// gate / up 1.02-1.31x, LLaMA's 1.03x, GPT-2's up projection 1.03x; AVX2 kernels 1.00x.
constexpr int64_t kPackedTasksPerThread = 3;
constexpr int64_t kFineCandidateCols[] = {1024, 768, 512, 384, 256, 192, 128};

bool IsPackedCandidate(int64_t cols) {
  return std::find(std::begin(gemm_detail::kPackedCandidateCols), std::end(gemm_detail::kPackedCandidateCols), cols) !=
         std::end(gemm_detail::kPackedCandidateCols);
}

// The L2 bytes a fine-grained plan's row chunk may fill, tried in order (0: the coarse pass). Half
// of L2 first (what each of a core's two hyperthreads gets; this host's slow stretches look like
// another tenant on the sibling), then the whole. Deep tasks at M = 512 (LLaMA's gate / up: 768 ->
// 256 columns, 2 threads, paired turns) ran 1.005x / 1.025x as fast in the host's quiet / slow turns,
// AVX2 kernels 1.015x / 1.03x; at M = 2048 no 684-row chunk fits half of L2 (128 columns: 1.002 MiB),
// and 128 columns forced instead of 384 read 0.97-1.02x, no better than two equal plans
// (bench/README.md, "Half of L2, session 18"): the whole L2 there.
// float32 weights only (FineGrained).
std::array<int64_t, 3> FineBudgets() { return {L2Bytes() / 2, L2Bytes(), 0}; }

bool FineGrained(GemmIsa isa, const std::vector<GemmProduct>& products, const std::vector<Task>& tasks,
                 int64_t threads, int64_t budget_bytes) {
  if (static_cast<int64_t>(tasks.size()) < threads * kPackedTasksPerThread) return false;
  for (const Task& task : tasks) {
    const bool deep = task.kind == TaskKind::kDeepPlain;
    if (!deep && (task.kind != TaskKind::kPacked || !PacksPerCall(isa, products[task.product]))) continue;
    const int64_t chunk_rows = deep ? task.rows : gemm_detail::PackedChunkRows(task.rows);
    const int64_t bytes = chunk_rows * (RoundUp(task.cols, kTileWidth) + gemm_detail::kPackDepth) * 4;
    // (16-bit weights: the whole L2, their deep ranges measured as DeepRangeFitsL2 says; half not measured)
    const bool float32 = products[task.product].type == WeightType::kFloat32;
    if (bytes > (float32 ? budget_bytes : L2Bytes())) return false;
  }
  return true;
}

// ---- The plan's tail. The threads claim the tasks largest first, so the first thread done waits
// for the other's last task; a plan of equal tasks that pack W per call left it waiting up to a
// whole task. On 2 threads at M = 2048 (bench/gemm_node_threads.cc, LLaMA's shapes, AVX-512 /
// AVX2 kernels, median of 25-41 rotated turns) the wait was 9 / 20 ms of gate / up's 464 / 815 ms
// node (30 tasks of 384 columns), 7 / 10 ms of q / k / v's 140 / 249 ms (10 tasks), 14 / 7 ms of
// o_proj's shape (6 tasks, 81 / 159 ms), 22 / 43 ms of down_proj's (6 tasks, 243 / 415 ms). So the
// last `threads` tasks are split into column halves (whole tile pairs: AVX-512 calls take two
// tiles), kTaperLevels times over, which makes the last ones an eighth of the others: waits of
// 1-5 / 2-9 ms, node time 1.00-1.07x / 1.00-1.06x as fast (bench/README.md, "Two threads, session
// 18"). Each half still spans all the task's rows (W's columns copied once, as before) and each
// output is the same FMAs in the same order: the same bits. Deep in-place tasks (kDeepPlain) too:
// Qwen2's gate / up at 512 rows (38 tasks of 256 columns, 2 threads) waited 0.8-1.3 ms of ~40 ms
// for the last one, tapered 0.1-0.3 ms; node time 1.006x as fast in the same turns (bench/README.md,
// "norm_linear at 512 rows, session 20"). Tasks over panels packed once (the plugin EP) too, in
// the plans PlanTasks offers past the few-row ones and before more row chunks: fp16 hidden 768 ->
// 3072 / 3 x 768 at 512 rows (one row chunk: 6 tasks of 512 columns / 9 of 256-496 on 2 threads)
// ran 1.03-1.11x as fast in four paired runs (one process, the plan switched between slices of
// calls; bench/README.md, "Plugin EP at 512 rows, session 28"). The plans of more row chunks
// (float32 at 512 rows, 2048 rows) are not: tapered, they read 0.90-1.06x, noise. Where a plan of
// many rows tapers anyway (a shared weight's panels beside weights read in place, custom-op
// route), its packed-once tasks are split like the others (not timed apart).
constexpr int kTaperLevels = 3;

bool TapersTask(GemmIsa isa, const std::vector<GemmProduct>& products, const Task& task) {
  const GemmProduct& p = products[task.product];
  if (task.kind == TaskKind::kDeepPlain) return true;
  if (task.kind == TaskKind::kPacked && p.packed != nullptr) return true;  // panels packed once
  return task.kind == TaskKind::kPacked && PacksPerCall(isa, p) && !p.transposed;
}

// The last `threads` tasks (the plan sorted largest first) split in column halves, kTaperLevels
// times over; tasks of one tile pair or of another kind stay whole.
void TaperTail(GemmIsa isa, const std::vector<GemmProduct>& products, int64_t threads, std::vector<Task>* tasks) {
  for (int level = 0; level < kTaperLevels && static_cast<int64_t>(tasks->size()) >= threads; ++level) {
    const std::vector<Task> last(tasks->end() - threads, tasks->end());
    tasks->resize(tasks->size() - static_cast<size_t>(threads));
    for (const Task& task : last) {
      const int64_t half = RoundUp(CeilDiv(task.cols, 2), 2 * kTileWidth);
      if (!TapersTask(isa, products, task) || half >= task.cols) {
        tasks->push_back(task);
        continue;
      }
      Task first = task, second = task;
      first.cols = half;
      second.col0 += half;
      second.cols -= half;
      tasks->push_back(first);
      tasks->push_back(second);
    }
    std::stable_sort(tasks->begin(), tasks->end(),
                     [](const Task& a, const Task& b) { return a.rows * a.cols > b.rows * b.cols; });
  }
}

std::vector<Task> Tapered(GemmIsa isa, const std::vector<GemmProduct>& products, int64_t threads, std::vector<Task> tasks) {
  if (threads > 1) TaperTail(isa, products, threads, &tasks);
  return tasks;
}

// 16-bit panels packed once, kWidenedMinRows < m <= kDeepPlainMaxRows rows: all rows in one chunk,
// each packed range in parts whose accumulators and A slice fit kDeepL2Share of L2 (as the deep
// in-place tasks over the same 16-bit bytes: DeepRangeFitsL2), as wide as that allows and as the
// threads share evenly (PlanTasks narrows them 16 columns at a time). Row chunks of ~128 rows (4 at
// 512) each widened and multiplied all of W's panels, read from L3 once per chunk. In one process,
// the plugin EP with either plan in alternating turns (21 turns, bits equal; the Emerald Rapids
// Xeon, bench/README.md "Decode and norm_linear, session 25"), old plan's time / this one's at 384
// / 512 rows: GPT-2 fp16 1.050 / 1.030, BERT 1.058 / 1.031, Qwen2 1.017 / 1.019; the AVX2 machine
// GPT-2 1.031 / 1.028, Qwen2 0.997 / 0.997. The widest parts that fit (0: none, L2 too small for
// kMinRangeCols columns at m rows, or not that case).
int64_t WidenedOneChunkWidestCols(int64_t m, const std::vector<GemmProduct>& products) {
  if (!WidensPanels(products) || m <= kWidenedMinRows || m > gemm_detail::kDeepPlainMaxRows) return 0;
  const int64_t floats = L2Bytes() * kDeepL2ShareNum / kDeepL2ShareDen / static_cast<int64_t>(sizeof(float));
  const int64_t cols = (floats / m - gemm_detail::kPackDepth) / kTileWidth * kTileWidth;
  return std::min(cols, gemm_detail::kPackCols);
}

// Tasks that pack W per call copy each k block of their columns once for all their rows, so the
// plan takes the fewest row spans (up to kPackedSpanChunks chunks each) and then the widest column
// ranges (kPackedCandidateCols) that leave the tasks Balanced and shared evenly (PlanChoice) by
// the hardware threads (ORT's pool has at most that many); none: the candidate whose busiest
// thread ends first.
// A q/k/v node (N = 2048 + 512 + 512) at M = 2048 on 2 threads is one task per 1024-column range;
// a node that is mostly one 1024-column product (an LM head of vocabulary 1024) has 256-column
// tasks over all rows, where one 1024-column task per chunk kept one thread idle at M = 512
// (0.63x the unfused time) and unevenly loaded at 2048 (3 chunks on 2 threads). Balanced alone
// let three equal tasks onto 2 threads (largest = total / 3): hidden 768's nodes (N = 2304 = 3 x
// 768, 3072 = 3 x 1024, q/k/v 768 x 3) ran at 4/3 of an even split; 768 and 384 columns split
// them in 4 and 6 (bench/README.md, "norm_linear, even task splits, session 15").
// Deep plain tasks (kDeepPlain: one row chunk, nothing copied) take the column ranges the same way,
// a 16-bit weight's only those whose accumulators and A slice fit in L2 (DeepRangeFitsL2; the
// narrowest always).
// Weights packed once: row chunks of PackedOnceChunkRows, or up to 3 more chunks where those
// leave the threads uneven (9 tasks on 2 threads: hidden 768 at M = 512). Products of no other
// kind take the same tasks in every candidate plan: then the first is the plan (a decode step's
// node plans once).
std::vector<Task> PlanTasks(GemmIsa isa, int64_t m, const std::vector<GemmProduct>& products, int64_t* max_cells) {
  const bool packs_per_call = std::any_of(products.begin(), products.end(), [&](const GemmProduct& p) {
    return KindFor(isa, m, p) == TaskKind::kPacked && PacksPerCall(isa, p);
  });
  const bool deep_plain = std::any_of(products.begin(), products.end(),
                                      [&](const GemmProduct& p) { return KindFor(isa, m, p) == TaskKind::kDeepPlain; });
  const bool packed_once =
      std::any_of(products.begin(), products.end(), [](const GemmProduct& p) { return p.packed != nullptr; });
  // Read once: glibc answers it from /sys on every call.
  static const int64_t threads = std::max(1u, std::thread::hardware_concurrency());
  PlanChoice choice(threads);
  // Each candidate's tasks and their largest task's cells (PlanTasksSpanning sets them).
  auto offer = [&](int64_t span, int64_t cols, int64_t splits, int64_t more_chunks, bool must_balance,
                   int64_t packed_once_part_cols = 0) {
    int64_t cells = 0;
    std::vector<Task> tasks =
        PlanTasksSpanning(isa, m, products, span, cols, &cells, splits, more_chunks, 0, packed_once_part_cols);
    const bool may_take = !must_balance || Balanced(tasks, threads);
    return choice.Offer(std::move(tasks), cells, may_take);
  };
  if (OneRowPlain(isa, m, products)) {
    for (int64_t splits = 1; splits <= kOneRowMaxSplits; ++splits) {
      int64_t cells = 0;
      std::vector<Task> tasks = PlanTasksSpanning(isa, m, products, 1, gemm_detail::kPackCols, &cells, 1, 0,
                                                  OneRowCandidateCols(products, threads, splits));
      if (choice.Offer(std::move(tasks), cells, true)) break;
    }
    return choice.Take(max_cells);
  }
  if (!packs_per_call && !deep_plain) {
    const bool split = m <= SplitRangeMaxRows(products);
    // Past the few-row plans, the plans offered before more row chunks end tapered (TaperTail).
    const auto first_plan = [&] {
      return split ? choice.Take(max_cells) : Tapered(isa, products, threads, choice.Take(max_cells));
    };
    // 16-bit panels at kWidenedMinRows-kDeepPlainMaxRows rows: one row chunk first (WidenedOneChunkWidestCols).
    for (int64_t cols = WidenedOneChunkWidestCols(m, products); cols >= kMinRangeCols; cols -= kTileWidth) {
      if (offer(1, gemm_detail::kPackCols, 1, 0, false, cols)) return first_plan();
    }
    if (offer(1, gemm_detail::kPackCols, 1, 0, false)) return first_plan();
    if (split && (offer(1, gemm_detail::kPackCols, gemm_detail::kFewRowsRangeSplits, 0, false) ||
                  m <= gemm_detail::kSplitRangeMaxRows)) {
      return choice.Take(max_cells);
    }
    {  // more row chunks (also where 16-bit panels' column split left the threads uneven): the best one kept
      int64_t more = 1;
      while (packed_once && more <= 3 && !offer(1, gemm_detail::kPackCols, 1, more, false)) ++more;
    }
    return choice.Take(max_cells);
  }
  const int64_t narrowest = gemm_detail::kPackedCandidateCols[std::size(gemm_detail::kPackedCandidateCols) - 1];
  // Fine-grained plans first (FineGrained: the fewest row spans, more candidate widths; within half
  // of L2, then the whole: FineBudgets); then as before.
  for (const int64_t budget : FineBudgets()) {
    const bool fine = budget > 0;
    if (fine && !packs_per_call && !deep_plain) continue;
    const int64_t fewest_spans = packs_per_call ? gemm_detail::kPackedSpanChunks : 1;
    for (int64_t span = fewest_spans; span >= (fine ? fewest_spans : 1); --span) {
      for (const int64_t cols : kFineCandidateCols) {
        if (!fine && !IsPackedCandidate(cols)) continue;
        if (cols != narrowest && !DeepRangesFitL2(isa, m, products, cols)) continue;  // (16-bit deep tasks)
        int64_t cells = 0;
        std::vector<Task> tasks = PlanTasksSpanning(isa, m, products, span, cols, &cells);
        const bool may_take = Balanced(tasks, threads) && (!fine || FineGrained(isa, products, tasks, threads, budget));
        if (choice.Offer(std::move(tasks), cells, may_take)) return Tapered(isa, products, threads, choice.Take(max_cells));
      }
    }
  }
  return Tapered(isa, products, threads, choice.Take(max_cells));
}

// A full row block ([kRowBlock][k] at src) as [k][kRowBlock] at dst: the writes in order, a
// compile-time row count (the compiler keeps the six read streams in registers).
void PackFullRowBlock(const float* src, int64_t k, float* dst) {
  for (int64_t kk = 0; kk < k; ++kk) {
    for (int64_t r = 0; r < kRowBlock; ++r) dst[kk * kRowBlock + r] = src[r * k + kk];
  }
}

}  // namespace

void PackRowBlock(const float* rows, int64_t count, int64_t k, float* block) {
  if (count == kRowBlock) {
    PackFullRowBlock(rows, k, block);
    return;
  }
  for (int64_t r = 0; r < count; ++r) {
    for (int64_t kk = 0; kk < k; ++kk) block[kk * count + r] = rows[r * k + kk];
  }
}

GemmALayouts GemmReadsA(GemmIsa isa, int64_t m, const std::vector<GemmProduct>& products) {
  GemmALayouts layouts;
  for (const GemmProduct& product : products) {
    (ReadsRowMajorA(KindFor(isa, m, product)) ? layouts.rows : layouts.packed) = true;
  }
  return layouts;
}

void GemmInPlace(const KernelContext& ctx, GemmIsa isa, int64_t m, int64_t k, const float* a,
                 const std::vector<GemmProduct>& products) {
  if (m <= 0 || products.empty()) return;
  float* packed = nullptr;
  if (GemmReadsA(isa, m, products).packed) {
    packed = CallerFloats<ThreadSlot::kCallerPackedA>(static_cast<size_t>(m * k), "a packed GEMM operand");
    ctx.ParallelFor(static_cast<size_t>(CeilDiv(m, kRowBlock)), [&](size_t block) {
      const int64_t row0 = static_cast<int64_t>(block) * kRowBlock;
      PackRowBlock(a + row0 * k, std::min(kRowBlock, m - row0), k, packed + row0 * k);
    });
  }
  GemmInPlace(ctx, isa, m, k, GemmA{a, packed}, products);
}

void GemmInPlace(const KernelContext& ctx, GemmIsa isa, int64_t m, int64_t k, const GemmA& a,
                 const std::vector<GemmProduct>& products) {
  if (m <= 0 || products.empty()) return;
  int64_t max_cells = 0;
  const std::vector<Task> tasks = PlanTasks(isa, m, products, &max_cells);
  bool wants_lanes = false;
  for (const Task& task : tasks) {
    if ((ReadsRowMajorA(task.kind) ? a.rows : a.packed) == nullptr) throw Error("GemmInPlace: A lacks a layout it reads");
    wants_lanes |= task.kind == TaskKind::kLane;
  }
  // A in groups of 16 rows, [k][16] each, for the lane form (at most kStreamMaxRows rows).
  const int64_t groups = CeilDiv(m, 16);
  float* const a_lanes = wants_lanes ? CallerFloats<ThreadSlot::kCallerLanesA>(static_cast<size_t>(groups * 16 * k),
                                                                                "a GEMM operand's row groups")
                                     : nullptr;
  ctx.ParallelFor(static_cast<size_t>(wants_lanes ? groups : 0), [&](size_t group) {
    const int64_t row0 = static_cast<int64_t>(group) * 16;
    float* dst = a_lanes + row0 * k;
    for (int64_t r = 0; r < 16; ++r) {
      const float* src = row0 + r < m ? a.rows + (row0 + r) * k : nullptr;
      for (int64_t kk = 0; kk < k; ++kk) dst[kk * 16 + r] = src != nullptr ? src[kk] : 0.0f;
    }
  });

  const gemm_detail::Job job{m, k, a.packed, products.data(), a.rows, a_lanes};
  const gemm_detail::TaskFn run = TaskFnFor(isa);
  const size_t stage_floats = static_cast<size_t>(gemm_detail::kStageFloats);
  const size_t buffer_floats = stage_floats + static_cast<size_t>(max_cells);
  std::atomic<bool> out_of_memory{false};
  // Each call claims the next task in the plan's order, whatever index ORT hands it: ORT's
  // ParallelFor splits the indices into one contiguous shard per thread (its LoopCounter), each
  // thread running its own shard's first, so the plan's order decided each thread's share. On a
  // q, k, v node (N = 2048, 512, 512, M = 512, 2 threads) one shard held q's two tasks, the other
  // k's and v's (half that work); the thread done first stole one of q's, the other then waited:
  // the products took 28.2 ms instead of 20.9 (bench/README.md, "Issue 12, session 12").
  std::atomic<size_t> next_task{0};
  ctx.ParallelFor(tasks.size(), [&](size_t) {
    const size_t index = next_task.fetch_add(1, std::memory_order_relaxed);
    // Nothing may throw into ORT's worker threads: a failed allocation is reported afterwards.
    float* buffer = ThreadFloats<ThreadSlot::kGemmTask>(buffer_floats);
    if (buffer == nullptr) {
      out_of_memory = true;
      return;
    }
    run(job, tasks[index], buffer, buffer + stage_floats);
  });
  if (out_of_memory) throw Error("out of memory for GEMM accumulators");
}

int64_t PackedWeightElements(int64_t k, int64_t n) { return RoundUp(n, kTileWidth) * k; }

namespace {

// One k block of one column range: tile t's panel [kc][16] at block + t * kc * 16. An [n, k]
// weight is read along its rows (k), a [k, n] one along its columns. E: W's element, copied as
// it is (16-bit values by their bits).
template <typename E>
void PackBlock(const E* w, bool transposed, int64_t k, int64_t n, int64_t col0, int64_t cols, int64_t k0,
               int64_t kc, E* block) {
  const int64_t tiles = CeilDiv(cols, kTileWidth);
  for (int64_t t = 0; t < tiles; ++t) {
    E* panel = block + t * kc * kTileWidth;
    for (int64_t j = 0; j < kTileWidth; ++j) {
      const int64_t c = col0 + t * kTileWidth + j;
      for (int64_t kk = 0; kk < kc; ++kk) {
        const E value = c >= col0 + cols ? E{} : transposed ? w[c * k + k0 + kk] : w[(k0 + kk) * n + c];
        panel[kk * kTileWidth + j] = value;
      }
    }
  }
}

// PackBlock's layout, compared instead of written: the padding columns must be zeros too.
template <typename E>
bool BlockHolds(const E* w, bool transposed, int64_t k, int64_t n, int64_t col0, int64_t cols, int64_t k0,
                int64_t kc, const E* block) {
  const int64_t tiles = CeilDiv(cols, kTileWidth);
  for (int64_t t = 0; t < tiles; ++t) {
    const E* panel = block + t * kc * kTileWidth;
    for (int64_t j = 0; j < kTileWidth; ++j) {
      const int64_t c = col0 + t * kTileWidth + j;
      for (int64_t kk = 0; kk < kc; ++kk) {
        const E value = c >= col0 + cols ? E{} : transposed ? w[c * k + k0 + kk] : w[(k0 + kk) * n + c];
        if (std::memcmp(&panel[kk * kTileWidth + j], &value, sizeof(E)) != 0) return false;  // bits: NaNs, -0
      }
    }
  }
  return true;
}

// visit(col0, cols, k0, kc, offset) over the packed layout's blocks in order, `offset` the block's
// first element; stops at the first false.
template <typename Visit>
bool ForEachPackedBlock(int64_t k, int64_t n, const Visit& visit) {
  const int64_t range = gemm_detail::PackedRangeCols(n);
  for (int64_t col0 = 0; col0 < n; col0 += range) {
    const int64_t cols = std::min(range, n - col0);
    const int64_t tiles = CeilDiv(cols, kTileWidth);
    const int64_t depth = gemm_detail::EvenDepth(k);
    for (int64_t k0 = 0; k0 < k; k0 += depth) {
      const int64_t kc = std::min(depth, k - k0);
      if (!visit(col0, cols, k0, kc, col0 * k + k0 * tiles * kTileWidth)) return false;
    }
  }
  return true;
}

template <typename E>
bool PackedWeightHoldsOf(const E* w, bool transposed, int64_t k, int64_t n, const E* panels) {
  return ForEachPackedBlock(k, n, [&](int64_t col0, int64_t cols, int64_t k0, int64_t kc, int64_t offset) {
    return BlockHolds(w, transposed, k, n, col0, cols, k0, kc, panels + offset);
  });
}

template <typename E>
void PackWeightOf(const E* w, bool transposed, int64_t k, int64_t n, E* panels) {
  ForEachPackedBlock(k, n, [&](int64_t col0, int64_t cols, int64_t k0, int64_t kc, int64_t offset) {
    PackBlock(w, transposed, k, n, col0, cols, k0, kc, panels + offset);
    return true;
  });
}

}  // namespace

void PackWeight(const void* w, WeightType type, bool transposed, int64_t k, int64_t n, void* panels) {
  if (type == WeightType::kFloat32) {
    PackWeightOf(static_cast<const float*>(w), transposed, k, n, static_cast<float*>(panels));
  } else {  // float16 and bfloat16 alike: their bits (a zero pads either)
    PackWeightOf(static_cast<const uint16_t*>(w), transposed, k, n, static_cast<uint16_t*>(panels));
  }
}

bool PackedWeightHolds(const void* w, WeightType type, bool transposed, int64_t k, int64_t n, const void* panels) {
  if (type == WeightType::kFloat32) {
    return PackedWeightHoldsOf(static_cast<const float*>(w), transposed, k, n, static_cast<const float*>(panels));
  }
  return PackedWeightHoldsOf(static_cast<const uint16_t*>(w), transposed, k, n, static_cast<const uint16_t*>(panels));
}

GemmIsa SelectGemmIsa() {
#if defined(OTFUSE_HAVE_AVX2_KERNELS)
  const char* forced = std::getenv("OTFUSE_GEMM_ISA");
  const bool forced_avx2 = forced != nullptr && std::strcmp(forced, "avx2") == 0;
  const bool forced_avx512 = forced != nullptr && std::strcmp(forced, "avx512") == 0;
  if (forced != nullptr && *forced != '\0' && !forced_avx2 && !forced_avx512) {
    throw Error(std::string("OTFUSE_GEMM_ISA must be avx2 or avx512 (or unset), got '") + forced + "'");
  }
  if (SelectCpuIsa() != CpuIsa::kAvx2 || !__builtin_cpu_supports("fma")) {
    if (forced_avx512 || forced_avx2) throw Error(std::string("OTFUSE_GEMM_ISA=") + forced + ": this CPU (or this build) cannot run it");
    return GemmIsa::kBaseline;
  }
  if (forced_avx512) {
    if (!CpuHasAvx512()) throw Error("OTFUSE_GEMM_ISA=avx512: this CPU (or this build) cannot run it");
    return GemmIsa::kAvx512;
  }
  // AVX-512 only where 512-bit FMAs run at full rate (common/cpu_features.h).
  if (Avx512AtFullRate() && !forced_avx2) return GemmIsa::kAvx512;  // the rate knob checked first: a typo fails on every CPU
  return GemmIsa::kAvx2;
#else
  return GemmIsa::kBaseline;
#endif
}

const char* GemmIsaName(GemmIsa isa) {
  switch (isa) {
    case GemmIsa::kAvx512: return "avx512f";
    case GemmIsa::kAvx2: return "avx2+fma";
    default: return "baseline";
  }
}

}  // namespace otfuse
