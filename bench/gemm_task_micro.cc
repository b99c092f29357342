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
// ROUTE ep | custom | both | direct | all (session 14: custom, ep and "direct" in alternating turns,
// each's time ratio to custom's and direct's to ep's, and direct's Y compared with custom's bit for
// bit). "direct" reads W in place: by every row block (MicroQuad / MicroBlockAhead with ldb = n,
// DirectTask below: DEPTH k rows per block, default 256; the next tiles' rows fetched into L2 over
// FETCH calls, default 8); STAGE=1: the library's kDeepPlain task (each tile pair, AVX2 tile, staged
// in L1 by the first row block; another DEPTH: DirectStagedTask below); STAGE=2: blocks 0-1 stage
// the pair (MicroQuad), the next pair fetched over calls 1-8, Y written per call; STAGE=3: 2 with
// the fetch in the staging call; STAGE=4: 2 with PlainTilePair's one-tile staging calls (AVX2: the
// next tile's rows into L2 in FETCH bursts) (bench/README.md, "norm_linear custom-op route,
// session 14: W read in place"). COLD_W=1: W flushed from the caches before each run.
// COLD_PANELS=1 in the environment: the packed panels flushed from the caches before each run (in a
// node a task's 8 MiB of panels come from memory, not from the L3 the previous turn left them in);
// HUGE_PANELS=1: the panels in 2 MiB pages. OTHER's own #include "common/..." lines resolve to this
// tree's files (-Ikernels): copy them beside it and point them there when they differ too.
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

#include <sys/mman.h>

using namespace otfuse;
using namespace otfuse::gemm_detail;

static double Now() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

// PackWeight's layout of columns [0, cols) (one column range) of a [k, n] weight.
template <typename E>
static std::vector<E> PackRange(const E* w, int64_t k, int64_t n, int64_t cols) {
  const int64_t tiles = (cols + kTileWidth - 1) / kTileWidth;
  std::vector<E> panels(tiles * kTileWidth * k, E{});
  for (int64_t k0 = 0; k0 < k; k0 += kPackDepth) {
    const int64_t kc = std::min(kPackDepth, k - k0);
    for (int64_t t = 0; t < tiles; ++t) {
      for (int64_t kk = 0; kk < kc; ++kk) {
        for (int64_t j = 0; j < kTileWidth && t * kTileWidth + j < cols; ++j) {
          panels[k0 * tiles * kTileWidth + (t * kc + kk) * kTileWidth + j] = w[(k0 + kk) * n + t * kTileWidth + j];
        }
      }
    }
  }
  return panels;
}

// The experiment's tasks (session 14), in gemm_tiles.inc's namespace: its kernels, unchanged.
namespace otfuse::gemm_detail::ISA {
namespace {
// W read in place by every row block (no copy).
// `tiles_now` tiles from t, `step` row blocks from `block`, W's rows from `w` (row stride n).
template <typename S>
static void DirectTiles(int64_t tiles_now, int64_t t, int64_t step, int64_t block, int64_t task_rows,
                        const float* a_chunk, int64_t k, int64_t k0, const S* w, int64_t n, int64_t kc, float* acc,
                        bool accumulate, const S* prefetch, [[maybe_unused]] int64_t prefetch_mask,
                        [[maybe_unused]] int64_t prefetch_phase) {
  const int64_t r0 = block * kRowBlock;
#if defined(OTFUSE_GEMM_AVX512)
  if (tiles_now == 2 && step == 2) {
    MicroQuad<S, true>(a_chunk + r0 * k + k0 * kRowBlock, a_chunk + (r0 + kRowBlock) * k + k0 * kRowBlock, w,
                       w + kTileWidth, kc, acc + (t * task_rows + r0) * kTileWidth,
                       acc + ((t + 1) * task_rows + r0) * kTileWidth, accumulate, prefetch, prefetch_mask,
                       prefetch_phase, n, nullptr, n);
    return;
  }
#endif
  for (int64_t tt = 0; tt < tiles_now; ++tt) {
    for (int64_t b = block; b < block + step; ++b) {
      const int64_t rb0 = b * kRowBlock;
      const int64_t rows = Min(kRowBlock, task_rows - rb0);
      MicroRows<S>(rows, a_chunk + rb0 * k + k0 * rows, w + tt * kTileWidth, n, kc,
                   acc + ((t + tt) * task_rows + rb0) * kTileWidth, kTileWidth, accumulate);
    }
  }
}

template <typename S>
static void DirectTask(const Job& job, const Task& task, float* acc, int64_t depth, int64_t fetch_calls) {
  const GemmProduct& p = job.products[task.product];
  const int64_t k = job.k, n = p.n;
  const int64_t blocks = (task.rows + kRowBlock - 1) / kRowBlock;
  const int64_t tiles = (task.cols + kTileWidth - 1) / kTileWidth;
  const float* a_chunk = job.a_packed + task.row0 * k;
  for (int64_t k0 = 0; k0 < k; k0 += depth) {
    const int64_t kc = Min(depth, k - k0);
    for (int64_t t = 0; t < tiles;) {
      const int64_t tiles_now = TileStep(t, tiles);
      const S* w = Offset<S>(p.w, k0 * n + task.col0 + t * kTileWidth);
      const S* next = t + tiles_now < tiles ? w + tiles_now * kTileWidth
                      : k0 + kc < k         ? Offset<S>(p.w, (k0 + kc) * n + task.col0)
                                            : nullptr;
#if defined(OTFUSE_GEMM_AVX2) && !defined(OTFUSE_GEMM_AVX512)
      for (int64_t rb = 0; rb < blocks; ++rb) {
        const int64_t r0 = rb * kRowBlock;
        const int64_t rows = Min(kRowBlock, task.rows - r0);
        const float* a = a_chunk + r0 * k + k0 * rows;
        float* c = acc + (t * task.rows + r0) * kTileWidth;
        if (rb + 1 < blocks) PrefetchNextCall(task, t, 1, rb + 1, blocks, a_chunk, k, k0, acc);
        if (rows < kRowBlock) {
          MicroRows<S>(rows, a, w, n, kc, c, kTileWidth, k0 > 0);
        } else {
          const int64_t r1 = r0 + kRowBlock;
          const float* a_next = rb + 1 < blocks ? a_chunk + r1 * k + k0 * Min(kRowBlock, task.rows - r1) : a;
          MicroBlockAhead<S, true>(a, w, kc, c, k0 > 0, a_next, rb < fetch_calls ? next : nullptr, n);
        }
      }
      if (k0 + kc == k) WriteRows<S>(p, task, acc, 0, task.rows, t, t + tiles_now);
#else
      for (int64_t rb = 0; rb < blocks;) {
        const int64_t step = PanelStep(rb, blocks, task.rows);
        if ((rb + step) * kRowBlock < task.rows) PrefetchNextCall(task, t, tiles_now, rb + step, blocks, a_chunk, k, k0, acc);
        const bool fetch = rb < 2 * fetch_calls;
        DirectTiles<S>(tiles_now, t, step, rb, task.rows, a_chunk, k, k0, w, n, kc, acc, k0 > 0,
                       fetch ? next : nullptr, fetch_calls - 1, rb / 2);
        if (k0 + kc == k) WriteRows<S>(p, task, acc, rb * kRowBlock, Min((rb + step) * kRowBlock, task.rows), t, t + tiles_now);
        rb += step;
      }
#endif
      t += tiles_now;
    }
  }
}

#if defined(OTFUSE_GEMM_AVX2) && !defined(OTFUSE_GEMM_AVX512)
// Row blocks [first, blocks) of a task over one staged tile (its panel [kc][16] float32), into the
// tile's accumulators acc_tile ([rows][16]) (experiment, session 14).
template <typename S = float>
static void SweepTileFrom(const Task& task, int64_t blocks, int64_t first, const float* a_chunk, int64_t k, int64_t k0,
                          const float* panel, int64_t kc, float* acc_tile, const S* next = nullptr, int64_t n = 0,
                          int64_t fetch = 1) {
  for (int64_t rb = first; rb < blocks; ++rb) {
    if (next != nullptr && rb - first < fetch) {
      const int64_t per = (kc + fetch - 1) / fetch;
      for (int64_t kk = (rb - first) * per; kk < Min(kc, (rb - first + 1) * per); ++kk) PrefetchL2(next + kk * n);
    }
    const int64_t r0 = rb * kRowBlock;
    const int64_t rows = Min(kRowBlock, task.rows - r0);
    const float* a = a_chunk + r0 * k + k0 * rows;
    float* c = acc_tile + r0 * kTileWidth;
    if (rows < kRowBlock) {
      MicroRows<float>(rows, a, panel, kTileWidth, kc, c, kTileWidth, k0 > 0);
    } else {
      const int64_t r1 = r0 + kRowBlock;
      const float* a_next = rb + 1 < blocks ? a_chunk + r1 * k + k0 * Min(kRowBlock, task.rows - r1) : a;
      MicroBlockAhead(a, panel, kc, c, k0 > 0, a_next, panel);
    }
  }
}
#endif

}  // namespace
}  // namespace otfuse::gemm_detail::ISA

// Route "direct"'s knobs (the header: DEPTH, FETCH, STAGE).
static int64_t g_depth = kPackDepth, g_fetch = 8;
static bool g_stage = false, g_stage_quad = false, g_fetch_first = false, g_stage_single = false;
namespace otfuse::gemm_detail::ISA {
namespace {
template <typename S>
void DirectStagedTask(const Job& job, const Task& task, float* stage, float* acc, int64_t depth) {
  const GemmProduct& p = job.products[task.product];
  const int64_t k = job.k, n = p.n;
  const int64_t blocks = (task.rows + kRowBlock - 1) / kRowBlock;
  const float* a_chunk = job.a_packed + task.row0 * k;
  for (int64_t k0 = 0; k0 < k; k0 += depth) {
    const int64_t kc = Min(depth, k - k0);
    for (int64_t c = 0; c < task.cols; c += kTileWidth) {
      const S* w = Offset<S>(p.w, k0 * n + task.col0 + c);
      float* acc_tile = acc + c * task.rows;
#if defined(OTFUSE_GEMM_AVX512)
      if (g_stage_quad) {  // STAGE=2: the first two row blocks read W and stage it (MicroQuad)
        const S* next = c + 2 * kTileWidth < task.cols ? w + 2 * kTileWidth
                        : k0 + kc < k                 ? Offset<S>(p.w, (k0 + kc) * n + task.col0)
                                                      : nullptr;
        for (int64_t rb = 0; rb < blocks;) {
          const int64_t step = g_stage_single && rb == 0 ? 1 : PanelStep(rb, blocks, task.rows);
          const int64_t r0 = rb * kRowBlock;
          if ((rb + step) * kRowBlock < task.rows) PrefetchNextCall(task, 0, 2, rb + step, blocks, a_chunk, k, k0, acc_tile);
          const int64_t f0 = g_stage_single ? 1 : 2;
          const bool fetch = !g_fetch_first && rb >= f0 && rb < f0 + 2 * g_fetch;
          if (rb == 0 && g_stage_single) {  // STAGE=4: block 0 stages one tile at a time (PlainTilePair's calls)
            MicroRows<S, true>(kRowBlock, a_chunk + k0 * kRowBlock, w, n, kc, acc_tile, kTileWidth, k0 > 0, nullptr, stage);
            MicroRows<S, true>(kRowBlock, a_chunk + k0 * kRowBlock, w + kTileWidth, n, kc, acc_tile + task.rows * kTileWidth,
                               kTileWidth, k0 > 0, nullptr, stage + kc * kTileWidth);
          } else if (rb == 0 && step == 2) {
            MicroQuad<S, true, true>(a_chunk + k0 * kRowBlock, a_chunk + kRowBlock * k + k0 * kRowBlock, w,
                                     w + kTileWidth, kc, acc_tile, acc_tile + task.rows * kTileWidth, k0 > 0,
                                     g_fetch_first ? next : nullptr, 0, 0, n, stage, n);
          } else if (step == 2) {
            MicroQuad<float, false, false, S, true>(a_chunk + r0 * k + k0 * kRowBlock, a_chunk + (r0 + kRowBlock) * k + k0 * kRowBlock,
                                     stage, stage + kc * kTileWidth, kc, acc_tile + r0 * kTileWidth,
                                     acc_tile + (task.rows + r0) * kTileWidth, k0 > 0, fetch ? next : nullptr,
                                     g_fetch - 1, ((rb - f0) / 2) & (g_fetch - 1), kTileWidth, nullptr, n);
          } else {
            PanelTiles(2, 0, step, rb, task.rows, a_chunk, k, k0, stage, kc, acc_tile, k0 > 0);
          }
          if (k0 + kc == k) WriteRows<S>(p, task, acc, r0, Min(r0 + step * kRowBlock, task.rows), c / kTileWidth, c / kTileWidth + 2);
          rb += step;
        }
      } else {
        PlainTilePair<S>(task, blocks, a_chunk, k, k0, kc, w, n, c, acc_tile, stage, nullptr, nullptr);
      }
      c += kTileWidth;
#else
      const S* next = c + kTileWidth < task.cols ? w + kTileWidth : k0 + kc < k ? Offset<S>(p.w, (k0 + kc) * n + task.col0) : nullptr;
      const bool spread = g_stage_single;  // STAGE=4 with AVX2: the next tile's rows into L2 in bursts before calls 1..FETCH
      MicroRows<S, true>(kRowBlock, a_chunk + k0 * kRowBlock, w, n, kc, acc_tile, kTileWidth, k0 > 0,
                         spread ? nullptr : next, stage);
      SweepTileFrom(task, blocks, 1, a_chunk, k, k0, stage, kc, acc_tile, spread ? next : nullptr, n, g_fetch);
#endif
    }
  }
  const int64_t tiles = (task.cols + kTileWidth - 1) / kTileWidth;
#if defined(OTFUSE_GEMM_AVX512)
  if (g_stage_quad) return;  // (STAGE >= 2 wrote Y per call)
#endif
  WriteRows<S>(p, task, acc, 0, task.rows, 0, tiles);
}
}  // namespace
}  // namespace otfuse::gemm_detail::ISA

static void RunDirect(const Job& job, const Task& task, float* stage, float* acc) {
  if (g_stage && !g_stage_quad && g_depth == kPackDepth) {  // the library's kDeepPlain task
    Task deep = task;
    deep.kind = TaskKind::kDeepPlain;
    return ISA::RunTask(job, deep, stage, acc);
  }
  if (g_stage) {
    if (job.products[task.product].type == WeightType::kFloat16) {
      ISA::DirectStagedTask<Float16>(job, task, stage, acc, g_depth);
    } else {
      ISA::DirectStagedTask<float>(job, task, stage, acc, g_depth);
    }
    return;
  }
  if (job.products[task.product].type == WeightType::kFloat16) {
    ISA::DirectTask<Float16>(job, task, acc, g_depth, g_fetch);
  } else {
    ISA::DirectTask<float>(job, task, acc, g_depth, g_fetch);
  }
}

int main(int argc, char** argv) {
  if (getenv("DEPTH") != nullptr) g_depth = atoll(getenv("DEPTH"));
  if (getenv("FETCH") != nullptr) g_fetch = atoll(getenv("FETCH"));
  g_stage = getenv("STAGE") != nullptr;
  g_stage_quad = g_stage && atoi(getenv("STAGE")) >= 2;
  g_fetch_first = g_stage && atoi(getenv("STAGE")) == 3;  // STAGE=3: the staging call fetches the next pair
  g_stage_single = g_stage && atoi(getenv("STAGE")) == 4;
  const int64_t m = argc > 1 ? atoll(argv[1]) : 512;
  const int64_t k = argc > 2 ? atoll(argv[2]) : 4096;
  const int64_t cols = argc > 3 ? atoll(argv[3]) : 1008;
  const int64_t n = argc > 4 ? atoll(argv[4]) : cols;
  const bool all = argc > 5 && std::strcmp(argv[5], "all") == 0;  // custom, ep, direct: one tree
  const bool both = all || (argc > 5 && std::strcmp(argv[5], "both") == 0);  // custom, then ep: one tree
  const bool direct_only = argc > 5 && std::strcmp(argv[5], "direct") == 0;
  const bool packed_once = !both && !direct_only && (argc <= 5 || std::strcmp(argv[5], "custom") != 0);
  const int turns = argc > 6 ? atoi(argv[6]) : 8;
  std::vector<float> a(m * k), y(m * n);
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
  std::vector<float> a_packed(m * k);  // row blocks of 6, [k][rows] each (gemm.cc)
  for (int64_t r0 = 0; r0 < m; r0 += kRowBlock) {
    const int64_t rows = std::min(kRowBlock, m - r0);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t kk = 0; kk < k; ++kk) a_packed[r0 * k + kk * rows + r] = a[(r0 + r) * k + kk];
    }
  }
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
  const TaskFn runs_one[] = {direct_only ? &RunDirect : &ISA::RunTask, &ISA::RunTask, &RunDirect};
  const TaskFn* runs = runs_one;
#endif
#if defined(OTHER)
  const int variants = 2;
#else
  const int variants = all ? 3 : both ? 2 : 1;
#endif
  const bool cold_w = std::getenv("COLD_W") != nullptr;  // W flushed from every cache before each run
  const int64_t w_bytes_used = k * n * (half ? 2 : 4);
  const char* w_bytes_base = half ? reinterpret_cast<const char*>(w16.data()) : reinterpret_cast<const char*>(w.data());
  std::vector<std::vector<double>> times(variants);
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
      const double t0 = Now();
      runs[v](v == 1 && both ? job_ep : job, task, buffer.data(), buffer.data() + kStageFloats);
      times[v].push_back(Now() - t0);
    }
  }
  if (all) {  // direct's Y against custom's, bit for bit
    const size_t y_bytes = half ? y16.size() * 2 : y.size() * 4;
    void* const y_data = half ? static_cast<void*>(y16.data()) : static_cast<void*>(y.data());
    std::vector<char> y_custom(y_bytes);
    runs[0](job, task, buffer.data(), buffer.data() + kStageFloats);
    std::memcpy(y_custom.data(), y_data, y_bytes);
    std::memset(y_data, 0, y_bytes);
    runs[2](job, task, buffer.data(), buffer.data() + kStageFloats);
    int64_t differ = 0;
    for (int64_t r = 0; r < m; ++r) {
      const size_t row = (half ? 2 : 4) * n, used = (half ? 2 : 4) * cols;
      differ += std::memcmp(y_custom.data() + r * row, static_cast<char*>(y_data) + r * row, used) != 0;
    }
    printf("direct vs custom: %lld of %lld rows differ\n", static_cast<long long>(differ), static_cast<long long>(m));
  }
  double err = 0;  // a few outputs against a double sum
  for (int64_t i = 0; i < 5; ++i) {
    const int64_t r = (i * 97) % m, c = (i * 131) % cols;
    double s = 0;
    for (int64_t kk = 0; kk < k; ++kk) s += static_cast<double>(a[r * k + kk]) * w[kk * n + c];
    err = std::max(err, std::abs(s - y[r * n + c]) / (std::abs(s) + 1e-9));
  }
  const double flop = 2.0 * m * k * cols;
  for (int v = 0; v < variants; ++v) {
    std::vector<double> sorted = times[v];
    std::sort(sorted.begin(), sorted.end());
    const char* names[] = {"custom", "ep", "direct"};
    printf("%s: best %.1f, median %.1f GFLOP/s\n", both ? names[v] : direct_only ? "direct" : v == 0 ? "this tree" : "OTHER", flop / sorted[0] * 1e-9,
           flop / sorted[sorted.size() / 2] * 1e-9);
  }
  for (int v = 1; v < variants; ++v) {
    std::vector<double> ratios;
    for (int turn = 0; turn < turns; ++turn) ratios.push_back(times[v][turn] / times[0][turn]);
    std::sort(ratios.begin(), ratios.end());
    printf(both ? "%s time / custom's: %.3fx (median of %d turns)\n" : "%sOTHER time / this tree's: %.3fx (median of %d turns)\n",
           both ? (v == 1 ? "ep" : "direct") : "", ratios[ratios.size() / 2], turns);
  }
  if (all) {  // direct against the EP route
    std::vector<double> ratios;
    for (int turn = 0; turn < turns; ++turn) ratios.push_back(times[2][turn] / times[1][turn]);
    std::sort(ratios.begin(), ratios.end());
    printf("direct time / ep's: %.3fx\n", ratios[ratios.size() / 2]);
  }
  printf("M %lld K %lld COLS %lld of %lld, %s; relative error %.1e\n", static_cast<long long>(m),
         static_cast<long long>(k), static_cast<long long>(cols), static_cast<long long>(n),
         packed_once ? "packed once (EP route)" : "packed per call (custom-op route)", err);
}
