#include "common/gemm.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>

#include "common/cpu_features.h"
#include "common/float_types.h"

namespace otfuse {
namespace {

using gemm_detail::PanelsFn;
using gemm_detail::PanelsJob;

bool UseAvx2() {
#if defined(OTFUSE_HAVE_AVX2_KERNELS)
  static const bool avx2 = SelectCpuIsa() == CpuIsa::kAvx2 && __builtin_cpu_supports("fma");
  return avx2;
#else
  return false;
#endif
}

PanelsFn SelectPanels() {
#if defined(OTFUSE_HAVE_AVX2_KERNELS)
  if (UseAvx2()) return &gemm_detail::avx2::Panels;
#endif
  return &gemm_detail::baseline::Panels;
}

template <typename S>
void PackColumns(const S* src, int64_t k, int64_t n, bool transposed, S* dst) {
  // dst: ceil(n/16) panels of [k][16]; padding columns were zeroed by the caller.
  for (int64_t col0 = 0; col0 < n; col0 += kPanelWidth) {
    const int64_t width = std::min(kPanelWidth, n - col0);
    S* panel = dst + (col0 / kPanelWidth) * k * kPanelWidth;
    if (!transposed) {
      for (int64_t kk = 0; kk < k; ++kk) {
        std::memcpy(panel + kk * kPanelWidth, src + kk * n + col0, static_cast<size_t>(width) * sizeof(S));
      }
    } else {
      for (int64_t j = 0; j < width; ++j) {
        const S* column = src + (col0 + j) * k;  // row (col0 + j) of the [n, k] matrix
        for (int64_t kk = 0; kk < k; ++kk) panel[kk * kPanelWidth + j] = column[kk];
      }
    }
  }
}

// How a product is cut into tasks: row chunks of A times groups of panels of B.
//
// A chunk of at most kChunkRows rows keeps its A slice (rows x kDepth, <= 384 KiB) in L2 while the
// group's panels pass over it. Without chunks every panel streamed all of A, fine while A sat in
// L3 (M = 512, K = 4096: 8 MiB, ~205 GFLOP/s with 2 threads) but not beyond: measured at M = 2048,
// N = 28160 the old split ran at 52 GFLOP/s, this one at 199 (MLAS 187; bench/README.md).
// 384 rows ran 3-9% faster than 192 at M = 512-1024 (fewer passes over B, same L2 fit).
// Groups: enough tasks for ORT to balance the threads, none below ~0.1 ms of work, and the
// accumulators of a task (rows x panels x 16 floats) bounded so they stay in L2.
constexpr int64_t kChunkRows = 64 * kRowBlock;
constexpr int64_t kMaxAccumulatorBytes = 256 << 10;
constexpr int64_t kMinTaskWork = 1 << 18;  // multiply-adds
constexpr int64_t kTargetTasks = 64;

struct TaskGrid {
  int64_t chunk_rows;
  int64_t chunks;
  int64_t groups;
  int64_t max_group_panels;
};

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

TaskGrid GridFor(int64_t m, int64_t k, int64_t panels) {
  TaskGrid grid{};
  // Equal chunks, each a whole number of row blocks.
  grid.chunk_rows = CeilDiv(CeilDiv(m, CeilDiv(m, kChunkRows)), kRowBlock) * kRowBlock;
  grid.chunk_rows = std::min(grid.chunk_rows, m);
  grid.chunks = CeilDiv(m, grid.chunk_rows);
  const int64_t work_per_panel = grid.chunk_rows * std::max<int64_t>(k, 1) * kPanelWidth;
  int64_t groups = std::min(panels, CeilDiv(kTargetTasks, grid.chunks));
  groups = std::min(groups, std::max<int64_t>(1, panels * work_per_panel / kMinTaskWork));
  const int64_t acc_panels = std::max<int64_t>(1, kMaxAccumulatorBytes / (grid.chunk_rows * kPanelWidth * 4));
  groups = std::max(groups, CeilDiv(panels, acc_panels));
  grid.groups = std::clamp<int64_t>(groups, 1, panels);
  grid.max_group_panels = CeilDiv(panels, grid.groups);
  return grid;
}

// Per worker thread, reused across runs (ORT's pool threads live as long as the session).
float* ThreadBuffer(size_t floats) {
  thread_local std::unique_ptr<float[]> buffer;
  thread_local size_t capacity = 0;
  if (capacity < floats) {
    buffer.reset(new (std::nothrow) float[floats]);
    capacity = buffer ? floats : 0;
  }
  return buffer.get();
}

class ColumnSink final : public GemmSink {
 public:
  ColumnSink(float* c, int64_t ldc, int64_t n) : c_(c), ldc_(ldc), n_(n) {}
  void Panel(int64_t panel, int64_t row0, int64_t rows, const float* acc) const override {
    const int64_t col0 = panel * kPanelWidth;
    const int64_t width = std::min(kPanelWidth, n_ - col0);
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(c_ + (row0 + r) * ldc_ + col0, acc + r * kPanelWidth, static_cast<size_t>(width) * sizeof(float));
    }
  }

 private:
  float* c_;
  int64_t ldc_;
  int64_t n_;
};

}  // namespace

void PackedB::Free::operator()(unsigned char* p) const { std::free(p); }

void PackedB::Grow(int64_t new_panels) {
  if (new_panels <= capacity_) return;
  const size_t panel_bytes = static_cast<size_t>(k_) * kPanelWidth * element_size();
  const size_t bytes = std::max<size_t>(64, static_cast<size_t>(new_panels) * panel_bytes);
  auto* grown = static_cast<unsigned char*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64));
  if (grown == nullptr) throw Error("out of memory packing a " + std::to_string(bytes) + "-byte weight");
  if (storage_) std::memcpy(grown, storage_.get(), static_cast<size_t>(panels_) * panel_bytes);
  storage_.reset(grown);
  capacity_ = new_panels;
}

int64_t PackedB::Append(const void* data, int64_t n, bool transposed) {
  const int64_t first = panels_;
  const int64_t count = (n + kPanelWidth - 1) / kPanelWidth;
  Grow(panels_ + count);
  unsigned char* dst = storage_.get() + static_cast<size_t>(first) * static_cast<size_t>(k_) * kPanelWidth * element_size();
  std::memset(dst, 0, static_cast<size_t>(count) * static_cast<size_t>(k_) * kPanelWidth * element_size());
  if (type_ == PackedType::kFloat32) {
    PackColumns(static_cast<const float*>(data), k_, n, transposed, reinterpret_cast<float*>(dst));
  } else {
    PackColumns(static_cast<const uint16_t*>(data), k_, n, transposed, reinterpret_cast<uint16_t*>(dst));
  }
  panels_ += count;
  return first;
}

void GemmPacked(const KernelContext& ctx, int64_t m, const float* a, int64_t lda, const PackedB& b,
                const GemmSink& sink) {
  if (m <= 0 || b.panels() == 0) return;
  const int64_t k = b.k();
  // A in row blocks of up to 6 rows, [k][rows] each (one broadcast per row and k).
  std::unique_ptr<float[]> a_packed(new (std::nothrow) float[static_cast<size_t>(m * std::max<int64_t>(k, 1))]);
  if (!a_packed) throw Error("out of memory for a " + std::to_string(m) + "x" + std::to_string(k) + " GEMM panel");
  const int64_t blocks = (m + kRowBlock - 1) / kRowBlock;
  ctx.ParallelFor(static_cast<size_t>(blocks), [&](size_t block) {
    const int64_t row0 = static_cast<int64_t>(block) * kRowBlock;
    const int64_t rows = std::min(kRowBlock, m - row0);
    float* dst = a_packed.get() + row0 * k;
    for (int64_t r = 0; r < rows; ++r) {
      const float* src = a + (row0 + r) * lda;
      for (int64_t kk = 0; kk < k; ++kk) dst[kk * rows + r] = src[kk];
    }
  });

  const PanelsJob job{m, k, b.type(), a_packed.get(), &b, &sink};
  const PanelsFn panels_fn = SelectPanels();
  const int64_t panels = b.panels();
  const TaskGrid grid = GridFor(m, k, panels);
  const size_t buffer_floats = static_cast<size_t>(kDepth * kPanelWidth + grid.chunk_rows * grid.max_group_panels * kPanelWidth);
  std::atomic<bool> out_of_memory{false};
  // Chunk-major: the threads share one chunk of A (in L3) while they take its panel groups.
  ctx.ParallelFor(static_cast<size_t>(grid.chunks * grid.groups), [&](size_t index) {
    const int64_t chunk = static_cast<int64_t>(index) / grid.groups;
    const int64_t group = static_cast<int64_t>(index) % grid.groups;
    gemm_detail::PanelsTask task{};
    task.row0 = chunk * grid.chunk_rows;
    task.rows = std::min(grid.chunk_rows, m - task.row0);
    task.panel_begin = panels * group / grid.groups;
    task.panel_end = panels * (group + 1) / grid.groups;
    // Nothing may throw into ORT's worker threads: a failed allocation is reported afterwards.
    float* buffer = ThreadBuffer(buffer_floats);
    if (buffer == nullptr) {
      out_of_memory = true;
      return;
    }
    panels_fn(job, task, buffer, buffer + kDepth * kPanelWidth);
  });
  if (out_of_memory) throw Error("out of memory for GEMM accumulators");
}

void Sgemm(const KernelContext& ctx, int64_t m, int64_t n, const float* a, int64_t lda, const PackedB& b,
           float* c, int64_t ldc) {
  GemmPacked(ctx, m, a, lda, b, ColumnSink(c, ldc, n));
}

const char* GemmIsaName() { return UseAvx2() ? "avx2+fma" : "baseline"; }

}  // namespace otfuse
