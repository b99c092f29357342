// One-thread micro of one many-rows GEMM task (common/gemm.h): M rows of A x COLS columns of a
// [K, N_TOTAL] weight (float32, or float16 with HALF=1), either packed once as PackWeight lays it
// out (the plugin-EP route, PrepackedTask) or packed per call from W (the custom-op route,
// PackedTask), run as the library runs it (RunTask: its calls, prefetches, copies, bias pass). ROUTE
// both: the two routes of this tree in alternating turns, the median of the per-turn time ratios
// printed (bench/README.md, "norm_linear custom-op route, session 13"). With OTHER (another tree's
// gemm_tiles.inc, e.g. main's) both trees' tasks run in alternating turns instead ("AVX2 float32
// GEMM, session 12"). -DISA=avx512 (and -mavx512f) for the AVX-512 kernels, else AVX2. HUGE=1 /
// HUGEW=1: the task's buffer / W on transparent huge pages.
//   I="-Ikernels -isystem $(grep -o '/[^ ]*ort-headers/[^ ]*' build/dev/build.ninja | head -1)"
//   g++ -O3 -DNDEBUG -ffp-contract=off -fno-math-errno -std=c++17 $I -mavx2 -mfma -mf16c
//       -DOTHER='"/work/main/kernels/common/gemm_tiles.inc"' bench/gemm_task_micro.cc -o /tmp/gemm_task_micro
//   /tmp/gemm_task_micro M K COLS N_TOTAL ROUTE TURNS   # e.g. 512 4096 1008 11008 ep 12
// ROUTE ep | custom | both | deep | all (custom, ep and "deep" in alternating turns, each's time
// ratio to custom's and deep's to ep's, and deep's Y compared with custom's bit for bit). "deep" (also
// with OTHER: both trees' deep tasks in alternating turns, bench/README.md "norm_linear AVX2 at 512 rows, session 21"):
// the library's kDeepPlain task (W read in place, each tile pair staged in L1 by the first row
// block). ROUTE mid (65-256 rows, bench/README.md "norm_linear, 65-256 rows, session 15"): custom,
// ep, deep and "plain" (the library's kPlain task, 32 deep in place) in alternating turns, each's
// time ratio to plain's, deep's Y compared with plain's bit for bit; MID_DEPTH=64|128: "deep" is
// the plain task at that depth instead. The session-14 variants measured against it and dropped (W read in place by every row
// block; other staging calls: knobs DEPTH, FETCH, STAGE=1..4) are in this file as of commit ef52584
// (bench/README.md, "norm_linear custom-op route, session 14: W read in place"). COLD_W=1: W
// flushed from the caches before each run. PLAIN=1: the custom-op route's task is the few-rows one
// (kPlain, W read in place: M <= 64) instead of PackedTask; with OTHER, both trees' kPlain tasks
// (bench/README.md, "norm_linear, few rows on hidden 768, session 15").
// COLD_PANELS=1 in the environment: the packed panels flushed from the caches before each run (in a
// node a task's 8 MiB of panels come from memory, not from the L3 the previous turn left them in);
// HUGE_PANELS=1: the panels in 2 MiB pages. OTHER's own #include "common/..." lines resolve to this
// tree's files (-Ikernels): copy them beside it and point them there when they differ too.
// Each variant's GFLOP/s by thread CPU time and by wall time; HUGEY=1: Y on transparent huge pages
// (bench/README.md, "Per-core GEMM, session 18").
// AVX-512 (bench/README.md, "AVX-512 float32 GEMM over packed panels, session 13"): the same line
// with -mavx512f -DISA=avx512 (GCC 12: also -Wno-maybe-uninitialized), e.g. 684 2048 1024 5632 ep 9.
#if !defined(ISA)
#define ISA avx2
#endif
#define OTFUSE_ISA_NAMESPACE ISA
#include "common/gemm_tiles.inc"
#undef OTFUSE_ISA_NAMESPACE
#if defined(OTHER)
#define OTFUSE_ISA_NAMESPACE other
#include OTHER
#undef OTFUSE_ISA_NAMESPACE
#endif

#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <vector>


using namespace otfuse;
using namespace otfuse::gemm_detail;

#include "gemm_micro_common.h"

// Route "deep": the library's kDeepPlain task (common/gemm.h: W read in place up to
// kDeepPlainMaxRows rows, each tile pair staged in L1 by its first row block).
static void RunDeep(const Job& job, const Task& task, float* stage, float* acc) {
  Task deep = task;
  deep.kind = TaskKind::kDeepPlain;
  ISA::RunTask(job, deep, stage, acc);
}

// Route "plain": the library's kPlain task (W read in place, kStreamDepthPaired deep past
// kStreamMaxRows rows: the AVX-512 custom-op route up to kStreamMaxRowsAvx512 rows).
static void RunPlain(const Job& job, const Task& task, float* stage, float* acc) {
  Task plain = task;
  plain.kind = TaskKind::kPlain;
  ISA::RunTask(job, plain, stage, acc);
}

// MID_DEPTH=64|128 with route mid: "deep" is the plain task at that depth instead (Y written as RunTask does).
template <int64_t kDepth>
static void RunDepth(const Job& job, const Task& task, float* stage, float* acc) {
  Task plain = task;
  plain.kind = TaskKind::kPlain;
  if (job.products[0].type == WeightType::kFloat32) {
    ISA::PlainTaskOfDepth<float, kDepth>(job, plain, stage, acc);
    ISA::WriteRows<float>(job.products[0], plain, acc, 0, plain.rows, 0, (plain.cols + kTileWidth - 1) / kTileWidth);
  } else {
    ISA::PlainTaskOfDepth<Float16, kDepth>(job, plain, stage, acc);
    ISA::WriteRows<Float16>(job.products[0], plain, acc, 0, plain.rows, 0, (plain.cols + kTileWidth - 1) / kTileWidth);
  }
}

int main(int argc, char** argv) {
  const int64_t m = argc > 1 ? atoll(argv[1]) : 512;
  const int64_t k = argc > 2 ? atoll(argv[2]) : 4096;
  const int64_t cols = argc > 3 ? atoll(argv[3]) : 1008;
  const int64_t n = argc > 4 ? atoll(argv[4]) : cols;
  // mid: plain, deep, ep, custom in alternating turns, each's time ratio to plain's (65-256 rows)
  const bool mid = argc > 5 && std::strcmp(argv[5], "mid") == 0;
  const bool all = mid || (argc > 5 && std::strcmp(argv[5], "all") == 0);  // custom, ep, deep: one tree
  const bool both = all || (argc > 5 && std::strcmp(argv[5], "both") == 0);  // custom, then ep: one tree
  const bool deep_only = argc > 5 && std::strcmp(argv[5], "deep") == 0;
  const bool packed_once = !both && !deep_only && (argc <= 5 || std::strcmp(argv[5], "custom") != 0);
  const int turns = argc > 6 ? atoi(argv[6]) : 8;
  std::vector<float> a(m * k);
  // HUGEY=1: Y on transparent huge pages (ORT's outputs are on 4 KiB ones: a task's 12 rows per
  // call are 12 pages).
  const size_t y_bytes_huge = (m * n * sizeof(float) + (2 << 20) - 1) / (2 << 20) * (2 << 20);
  float* const y_memory = static_cast<float*>(aligned_alloc(2 << 20, y_bytes_huge));
  if (getenv("HUGEY") != nullptr && atoi(getenv("HUGEY")) == 1) madvise(y_memory, y_bytes_huge, MADV_HUGEPAGE);
  std::fill(y_memory, y_memory + m * n, 0.0f);
  struct {
    float* p;
    size_t n;
    float* data() const { return p; }
    size_t size() const { return n; }
    float& operator[](size_t i) const { return p[i]; }
  } y{y_memory, static_cast<size_t>(m * n)};
  // HUGEW=1: W on transparent huge pages (else 4 KiB ones, as a malloc'd initializer).
  const size_t w_bytes = (k * n * sizeof(float) + (2 << 20) - 1) / (2 << 20) * (2 << 20);
  float* const w_memory = static_cast<float*>(aligned_alloc(2 << 20, w_bytes));
  if (getenv("HUGEW") != nullptr && atoi(getenv("HUGEW")) == 1) madvise(w_memory, w_bytes, MADV_HUGEPAGE);
  struct { float* p; float& operator[](int64_t i) const { return p[i]; } float* data() const { return p; } } w{w_memory};
  for (int64_t i = 0; i < m * k; ++i) a[i] = static_cast<float>(i % 7) * 0.1f;
  for (int64_t i = 0; i < k * n; ++i) w[i] = static_cast<float>(i % 5) * 0.01f;
  const std::vector<float> packed = PackRange(w.data(), k, n, cols);
  // HUGE_PANELS=1: the panels in 2 MiB pages (madvise), as a packed weight could be held.
  const size_t panel_bytes = (packed.size() * sizeof(float) + (2 << 20) - 1) / (2 << 20) * (2 << 20);
  float* panel_memory = static_cast<float*>(aligned_alloc(2 << 20, panel_bytes));
  if (std::getenv("HUGE_PANELS") != nullptr) madvise(panel_memory, panel_bytes, MADV_HUGEPAGE);
  std::memcpy(panel_memory, packed.data(), packed.size() * sizeof(float));
  const struct {
    float* p;
    size_t n;
    float* data() const { return p; }
    size_t size() const { return n; }
    const float& operator[](size_t i) const { return p[i]; }
  } panels{panel_memory, packed.size()};
  const std::vector<float> a_packed = PackRowBlocks(a, m, k);  // row blocks of 6, [k][rows] each
  // HALF=1: W (and Y) float16, W's values rounded (F16C).
  const bool half = getenv("HALF") != nullptr && atoi(getenv("HALF")) == 1;
  std::vector<uint16_t> w16(half ? k * n : 0), y16(half ? m * n : 0);
  for (size_t i = 0; i < w16.size(); ++i) w16[i] = _cvtss_sh(w[i], 0);
  const std::vector<uint16_t> panels16 = half ? PackRange(w16.data(), k, n, cols) : std::vector<uint16_t>();
  const void* const panels_used = half ? static_cast<const void*>(panels16.data()) : panels.data();
  const GemmProduct product{half ? static_cast<const void*>(w16.data()) : w.data(),
                            half ? WeightType::kFloat16 : WeightType::kFloat32, false, n, nullptr,
                            half ? static_cast<void*>(y16.data()) : y.data(), packed_once ? panels_used : nullptr};
  const Job job{m, k, a_packed.data(), &product, a.data(), nullptr};
  GemmProduct product_ep = product;
  product_ep.packed = panels_used;
  const Job job_ep{m, k, a_packed.data(), &product_ep, a.data(), nullptr};
  const Task task{0, TaskKind::kPacked, 0, m, 0, cols};
  // PLAIN=1: the custom-op route's task is the few-rows one (kPlain: W read in place, up to
  // kStreamMaxRows rows; common/gemm.h) instead of PackedTask.
  const bool plain = getenv("PLAIN") != nullptr && atoi(getenv("PLAIN")) == 1;
  const Task task_custom{0, plain ? TaskKind::kPlain : deep_only ? TaskKind::kDeepPlain : TaskKind::kPacked, 0, m, 0, cols};
  // HUGE=1: the task's buffer (its pack blocks and accumulators) on transparent huge pages.
  const size_t buffer_floats = kStageFloats + m * ((cols + kTileWidth - 1) / kTileWidth) * kTileWidth;
  const size_t huge_bytes = (buffer_floats * sizeof(float) + (2 << 20) - 1) / (2 << 20) * (2 << 20);
  float* const buffer_memory = static_cast<float*>(aligned_alloc(2 << 20, huge_bytes));
  if (getenv("HUGE") != nullptr && atoi(getenv("HUGE")) == 1) madvise(buffer_memory, huge_bytes, MADV_HUGEPAGE);
  std::fill(buffer_memory, buffer_memory + buffer_floats, 0.0f);
  struct { float* p; float* data() const { return p; } } buffer{buffer_memory};
#if defined(OTHER)
  const TaskFn runs[] = {&ISA::RunTask, &other::RunTask};
#else
  const char* mid_depth = std::getenv("MID_DEPTH");
  const TaskFn third = mid_depth == nullptr ? &RunDeep : atoi(mid_depth) == 64 ? &RunDepth<64> : atoi(mid_depth) == 128 ? &RunDepth<128> : &RunDepth<16>;
  const TaskFn runs_one[] = {deep_only ? &RunDeep : &ISA::RunTask, &ISA::RunTask, third, &RunPlain};
  const TaskFn* runs = runs_one;
#endif
#if defined(OTHER)
  const int variants = 2;
#else
  const int variants = mid ? 4 : all ? 3 : both ? 2 : 1;
#endif
  const bool cold_w = std::getenv("COLD_W") != nullptr;  // W flushed from every cache before each run
  const int64_t w_bytes_used = k * n * (half ? 2 : 4);
  const char* w_bytes_base = half ? reinterpret_cast<const char*>(w16.data()) : reinterpret_cast<const char*>(w.data());
  std::vector<std::vector<double>> times(variants), walls(variants);
  const bool cold = std::getenv("COLD_PANELS") != nullptr;  // W's panels flushed from every cache before each run
  for (int turn = 0; turn < turns; ++turn) {
    for (int v = 0; v < variants; ++v) {
      if (cold) {
        for (size_t i = 0; i < panels.size(); i += 16) _mm_clflush(&panels[i]);
        for (size_t i = 0; i < panels16.size(); i += 32) _mm_clflush(&panels16[i]);
        _mm_mfence();
      }
      if (cold_w) {
        for (int64_t i = 0; i < w_bytes_used; i += 64) _mm_clflush(w_bytes_base + i);
        _mm_mfence();
      }
      const double t0 = Now(), w0 = WallNow();
      runs[v](v == 1 && both ? job_ep : job, v == 1 && both ? task : task_custom, buffer.data(),
              buffer.data() + kStageFloats);
      times[v].push_back(Now() - t0);
      walls[v].push_back(WallNow() - w0);
    }
  }
  if (mid) {  // deep's Y against plain's, bit for bit, and the times against plain's
    const size_t y_bytes = half ? y16.size() * 2 : y.size() * 4;
    void* const y_data = half ? static_cast<void*>(y16.data()) : static_cast<void*>(y.data());
    std::vector<char> y_plain(y_bytes);
    runs[3](job, task, buffer.data(), buffer.data() + kStageFloats);
    std::memcpy(y_plain.data(), y_data, y_bytes);
    std::memset(y_data, 0, y_bytes);
    runs[2](job, task, buffer.data(), buffer.data() + kStageFloats);
    printf("deep vs plain: %s\n", std::memcmp(y_plain.data(), y_data, y_bytes) == 0 ? "same bits" : "DIFFER");
    const char* names[] = {"custom", "ep", "deep", "plain"};
    for (int v = 0; v < 3; ++v) {
      std::vector<double> ratios;
      for (int turn = 0; turn < turns; ++turn) ratios.push_back(times[v][turn] / times[3][turn]);
      std::sort(ratios.begin(), ratios.end());
      std::vector<double> sorted = times[v];
      std::sort(sorted.begin(), sorted.end());
      printf("%s time / plain's: %.3fx (median %.1f GFLOP/s)\n", names[v], ratios[ratios.size() / 2],
             2.0 * m * k * cols / sorted[sorted.size() / 2] * 1e-9);
    }
    std::vector<double> sorted = times[3];
    std::sort(sorted.begin(), sorted.end());
    printf("plain: median %.1f GFLOP/s; M %lld K %lld COLS %lld of %lld%s\n", 2.0 * m * k * cols / sorted[sorted.size() / 2] * 1e-9,
           static_cast<long long>(m), static_cast<long long>(k), static_cast<long long>(cols), static_cast<long long>(n),
           half ? " float16" : "");
    return 0;
  }
  if (all) {  // deep's Y against custom's, bit for bit
    const size_t y_bytes = half ? y16.size() * 2 : y.size() * 4;
    void* const y_data = half ? static_cast<void*>(y16.data()) : static_cast<void*>(y.data());
    std::vector<char> y_custom(y_bytes);
    runs[0](job, task_custom, buffer.data(), buffer.data() + kStageFloats);
    std::memcpy(y_custom.data(), y_data, y_bytes);
    std::memset(y_data, 0, y_bytes);
    runs[2](job, task, buffer.data(), buffer.data() + kStageFloats);
    int64_t differ = 0;
    for (int64_t r = 0; r < m; ++r) {
      const size_t row = (half ? 2 : 4) * n, used = (half ? 2 : 4) * cols;
      differ += std::memcmp(y_custom.data() + r * row, static_cast<char*>(y_data) + r * row, used) != 0;
    }
    printf("deep vs custom: %lld of %lld rows differ\n", static_cast<long long>(differ), static_cast<long long>(m));
  }
  double err = 0;  // a few outputs against a double sum (float32 Y only)
  for (int64_t i = 0; i < (half ? 0 : 5); ++i) {
    const int64_t r = (i * 97) % m, c = (i * 131) % cols;
    double s = 0;
    for (int64_t kk = 0; kk < k; ++kk) s += static_cast<double>(a[r * k + kk]) * w[kk * n + c];
    err = std::max(err, std::abs(s - y[r * n + c]) / (std::abs(s) + 1e-9));
  }
  const double flop = 2.0 * m * k * cols;
  for (int v = 0; v < variants; ++v) {
    std::vector<double> sorted = times[v];
    std::sort(sorted.begin(), sorted.end());
    const char* names[] = {"custom", "ep", "deep"};
    std::vector<double> wall = walls[v];
    std::sort(wall.begin(), wall.end());
    printf("%s: best %.1f, median %.1f GFLOP/s (wall time: best %.1f, median %.1f)\n",
           both ? names[v] : deep_only ? (v == 0 ? "deep (this tree)" : "deep (OTHER)") : v == 0 ? "this tree" : "OTHER", flop / sorted[0] * 1e-9,
           flop / sorted[sorted.size() / 2] * 1e-9, flop / wall[0] * 1e-9, flop / wall[wall.size() / 2] * 1e-9);
  }
  for (int v = 1; v < variants; ++v) {
    std::vector<double> ratios;
    for (int turn = 0; turn < turns; ++turn) ratios.push_back(times[v][turn] / times[0][turn]);
    std::sort(ratios.begin(), ratios.end());
    printf(both ? "%s time / custom's: %.3fx (median of %d turns)\n" : "%sOTHER time / this tree's: %.3fx (median of %d turns)\n",
           both ? (v == 1 ? "ep" : "deep") : "", ratios[ratios.size() / 2], turns);
  }
  if (all) {  // deep against the EP route
    std::vector<double> ratios;
    for (int turn = 0; turn < turns; ++turn) ratios.push_back(times[2][turn] / times[1][turn]);
    std::sort(ratios.begin(), ratios.end());
    printf("deep time / ep's: %.3fx\n", ratios[ratios.size() / 2]);
  }
  printf("M %lld K %lld COLS %lld of %lld, %s; relative error %.1e\n", static_cast<long long>(m),
         static_cast<long long>(k), static_cast<long long>(cols), static_cast<long long>(n),
         packed_once ? "packed once (EP route)" : "packed per call (custom-op route)", err);
}
