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

// Tasks of whole panels; enough of them for ORT to balance 2-64 threads, each still long.
size_t PanelTasks(int64_t panels, int64_t m, int64_t k) {
  const int64_t work_per_panel = std::max<int64_t>(1, m) * k * kPanelWidth;
  const int64_t min_work = 1 << 18;  // ~0.1 ms of FMAs: below this a task is not worth a thread
  int64_t tasks = std::min<int64_t>(panels, 64);
  tasks = std::min<int64_t>(tasks, std::max<int64_t>(1, panels * work_per_panel / min_work));
  return static_cast<size_t>(std::max<int64_t>(tasks, 1));
}

class ColumnSink final : public GemmSink {
 public:
  ColumnSink(float* c, int64_t ldc, int64_t n) : c_(c), ldc_(ldc), n_(n) {}
  void Panel(int64_t panel, int64_t m, const float* acc) const override {
    const int64_t col0 = panel * kPanelWidth;
    const int64_t width = std::min(kPanelWidth, n_ - col0);
    for (int64_t r = 0; r < m; ++r) {
      std::memcpy(c_ + r * ldc_ + col0, acc + r * kPanelWidth, static_cast<size_t>(width) * sizeof(float));
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
  const size_t tasks = PanelTasks(panels, m, k);
  std::atomic<bool> out_of_memory{false};
  ctx.ParallelFor(tasks, [&](size_t task) {
    const int64_t begin = panels * static_cast<int64_t>(task) / static_cast<int64_t>(tasks);
    const int64_t end = panels * static_cast<int64_t>(task + 1) / static_cast<int64_t>(tasks);
    // Nothing may throw into ORT's worker threads: a failed allocation is reported afterwards.
    std::unique_ptr<float[]> buffer(new (std::nothrow) float[static_cast<size_t>(kDepth * kPanelWidth + m * kPanelWidth)]);
    if (!buffer) {
      out_of_memory = true;
      return;
    }
    panels_fn(job, begin, end, buffer.get(), buffer.get() + kDepth * kPanelWidth);
  });
  if (out_of_memory) throw Error("out of memory for GEMM accumulators");
}

void Sgemm(const KernelContext& ctx, int64_t m, int64_t n, const float* a, int64_t lda, const PackedB& b,
           float* c, int64_t ldc) {
  GemmPacked(ctx, m, a, lda, b, ColumnSink(c, ldc, n));
}

const char* GemmIsaName() { return UseAvx2() ? "avx2+fma" : "baseline"; }

}  // namespace otfuse
