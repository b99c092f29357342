// A small float32 GEMM against a weight matrix packed once: C = A · B, A row-major float32 [M, K],
// B constant (packed when the kernel is created), C handed to the caller panel by panel.
//
// Why our own and not a BLAS: measured on this project's 2-core AVX-512 machine (bench/README.md,
// "Norm + Linear"), OpenBLAS 0.3.34 (scipy-openblas32, SkylakeX kernels) ran a [M,4096]x[4096,28160]
// product in 29.8 / 44.0 / 602 ms at M = 1 / 16 / 512, ORT's MLAS in 13.6 / 24.3 / 622 ms, and this
// code in ~15 / ~30 / ~590 ms; a BLAS also repacks B on every call, cannot keep float16 or
// bfloat16 weights in their own type (half the bytes to stream at small M, where the product is
// memory bound), and brings its own thread pool. Here B is packed once, in its own element
// type, and the work is split over ORT's intra-op thread pool (KernelContext::ParallelFor), so
// there is exactly one pool and nothing to tune.
//
// Layout. B is stored as panels of kPanelWidth (16) columns; panel p holds [K][16] values,
// columns past the end of a block are zero. Blocks appended with Append() start on a new panel,
// so every panel belongs to one block (one projection of a fused Norm + Linear node). A is packed
// per call into blocks of up to kRowBlock (6) rows, [K][rows] each, so the micro-kernel reads
// it with broadcasts. K is cut into slices of kDepth (256): a B slice (16 KiB in float32) stays
// in L1 while every row block of A passes over it; float16 / bfloat16 slices are widened into a
// float32 buffer once per slice, by the first row block as it runs (or read directly when there is
// a single row block). With few rows a later slice is prefetched meanwhile (float32: two slices
// ahead, into L2, a share by every row block; gemm_panels.inc).
//
// Parallel split: tasks are (row chunk of up to 384 rows) x (group of panels), chunk-major, and
// inside a large chunk k is the outer loop, so its A slice (<= 384 x 256 floats) stays in L2 while
// the group's panels pass over it (gemm.cc, GridFor: why and what it measured).
//
// Numerics: float32 products summed in a fixed order (k ascending, in slices of kDepth), the
// same for every thread count. The AVX2 variant uses FMA, the baseline variant multiply + add,
// so the two agree within float32 rounding, not bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "ort_glue.h"

namespace otfuse {

constexpr int64_t kPanelWidth = 16;
constexpr int64_t kRowBlock = 6;
constexpr int64_t kDepth = 256;
// A chunk whose A (rows x K floats) fits in this is run panel by panel, else k slice by k slice.
// 1 MiB: one core's L2 here; against 256 KiB (bench/README.md, K = 4096, 2 threads) fp16 M = 64
// took 70.8 vs 80.6 ms and fp32 M = 32 44.4 vs 49.4: the panel order with its prefetch wins.
constexpr int64_t kAInL2Bytes = 1 << 20;

enum class PackedType { kFloat32, kFloat16, kBFloat16 };

class PackedB {
 public:
  PackedB() = default;
  PackedB(int64_t k, PackedType type) : k_(k), type_(type) {}

  // Appends the columns of one weight: `data` is [K, n] row-major, or [n, K] when `transposed`,
  // of element type `type` (must be the packed type). Returns the block's first panel.
  int64_t Append(const void* data, int64_t n, bool transposed);

  int64_t k() const { return k_; }
  PackedType type() const { return type_; }
  int64_t panels() const { return panels_; }
  size_t element_size() const { return type_ == PackedType::kFloat32 ? 4 : 2; }
  // Panel p: K * kPanelWidth elements of type().
  const void* panel(int64_t p) const {
    return storage_.get() + static_cast<size_t>(p) * static_cast<size_t>(k_) * kPanelWidth * element_size();
  }

 private:
  void Grow(int64_t new_panels);

  int64_t k_ = 0;
  PackedType type_ = PackedType::kFloat32;
  int64_t panels_ = 0;
  int64_t capacity_ = 0;  // panels
  struct Free {
    void operator()(unsigned char* p) const;
  };
  std::unique_ptr<unsigned char[], Free> storage_;
};

// Receives finished output blocks: rows [row0, row0 + rows) of panel `panel`,
// acc[r * kPanelWidth + j] is C[row0 + r, panel * 16 + j] (in the packed column numbering).
// Called from worker threads, once per (row chunk, panel); must not throw.
class GemmSink {
 public:
  virtual ~GemmSink() = default;
  virtual void Panel(int64_t panel, int64_t row0, int64_t rows, const float* acc) const = 0;
};

// C = A · B for A float32 row-major [m, b.k()] with row stride lda; every panel of B once, split
// over ORT's thread pool. Throws Error when out of memory.
void GemmPacked(const KernelContext& ctx, int64_t m, const float* a, int64_t lda, const PackedB& b,
                const GemmSink& sink);

// Convenience for other kernels: C (float32 row-major [m, n], row stride ldc) = A · B where B was
// packed as a single block of n columns.
void Sgemm(const KernelContext& ctx, int64_t m, int64_t n, const float* a, int64_t lda, const PackedB& b,
           float* c, int64_t ldc);

const char* GemmIsaName();

namespace gemm_detail {

// Everything one worker needs; plain data (crosses between ISA translation units).
struct PanelsJob {
  int64_t m;
  int64_t k;
  PackedType type;
  const float* a_packed;  // row blocks of kRowBlock rows: block r at a_packed + r*kRowBlock*k, [k][rows]
  const PackedB* b;
  const GemmSink* sink;
};

// One task: rows [row0, row0 + rows) (row0 a multiple of kRowBlock) times panels
// [panel_begin, panel_end).
struct PanelsTask {
  int64_t row0;
  int64_t rows;
  int64_t panel_begin;
  int64_t panel_end;
};

// `b_buffer` holds kDepth * kPanelWidth floats, `acc` rows * 16 per panel of the task.
using PanelsFn = void (*)(const PanelsJob& job, const PanelsTask& task, float* b_buffer, float* acc);

namespace baseline {
void Panels(const PanelsJob& job, const PanelsTask& task, float* b_buffer, float* acc);
}
namespace avx2 {
void Panels(const PanelsJob& job, const PanelsTask& task, float* b_buffer, float* acc);
}

}  // namespace gemm_detail
}  // namespace otfuse
