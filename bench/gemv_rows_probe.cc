// One row of A times a [K, N] weight (decode, M = 1), AVX-512, read as the custom-op route reads
// it (in place): today's kPlain form against row sweeps (bench/README.md, "norm_linear custom-op
// route, session 14: one row"). W cold: the passes cycle through copies of W totalling MB
// megabytes. Tasks of COLS columns each (the planner's column ranges), claimed by THREADS threads
// from one counter, as GemmInPlace's ParallelFor does. Every variant's y must equal lock16's bit
// for bit (same FMA chain per output: k ascending from 0). Prints GB/s of W read (median, best)
// and a plain sum over the same copies ("stream", bench/stream_read.c's loop in zmm).
//
//   g++ -O3 -march=native -std=c++17 -pthread bench/gemv_rows_probe.cc -o /tmp/gemv_rows_probe
//   /work/coord/quiet_run.sh /tmp/gemv_rows_probe fp32 3072 1024 2 240 40 lock16 sweep4:8:2 ...
//   ... panel4: W packed [tile][K][16] (each copy; fp32), 4 panels in lockstep, the next 4 into L2:
//   the plugin EP's form, the reference of what W packed reads at (session 16)
//   ROWS=4 ...: M rows of A (1, 2, 3, 4, 6: one row block), A packed [K][M], y tile-major [tile][M][16]
// Variants: lock16 (today: 16 k rows in lockstep along the task's columns, next 8 tiles of each
// row prefetched into L1), lock16n (no prefetch), lock16:D:L (D tiles ahead into L<L>), sweepR:D:L (R rows at a time, each row's whole
// run of the task's columns before the next R; rows D ahead prefetched into L<L>, 0: none).
#include <immintrin.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

static constexpr int64_t K = 2048;
extern const float* g_panels;

static inline __m512 Load16(const float* p) { return _mm512_loadu_ps(p); }
static inline __m512 Load16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

struct Variant {
  std::string name;
  int rows = 16;    // k rows per step
  int ahead = 0;    // rows (sweep) ahead prefetched
  int level = 0;    // 1: L1, 2: L2, 0: none
  bool lock = false;
  bool stream = false;
  bool panel = false;  // W packed [tile][K][16] (the plugin EP's panels): the packed reference
};

// Today's PlainTaskOfDepth<S, 16> with one row (MicroRows<1>): per 16-deep k step, tile by tile.
// y: [tile][M][16] (the tasks' tile-major accumulators), a: [K][M].
template <typename S, int M>
static void Lock16(const float* a, const S* w, int64_t n, int64_t col0, int64_t cols, float* y, int level,
                   int64_t ahead_tiles) {
  const bool prefetch = level != 0;
  const int64_t ahead = ahead_tiles * 16;
  for (int64_t k0 = 0; k0 < K; k0 += 16) {
    for (int64_t c = 0; c < cols; c += 16) {
      const S* wt = w + k0 * n + col0 + c;
      __m512 acc[M];
      for (int m = 0; m < M; ++m) acc[m] = k0 > 0 ? _mm512_loadu_ps(y + c * M + m * 16) : _mm512_setzero_ps();
      const bool pf = prefetch && c + ahead < cols;
      for (int64_t kk = 0; kk < 16; ++kk) {
        if (pf && level == 1) _mm_prefetch(reinterpret_cast<const char*>(wt + kk * n + ahead), _MM_HINT_T0);
        if (pf && level == 2) _mm_prefetch(reinterpret_cast<const char*>(wt + kk * n + ahead), _MM_HINT_T1);
        const __m512 b = Load16(wt + kk * n);
        for (int m = 0; m < M; ++m) acc[m] = _mm512_fmadd_ps(_mm512_set1_ps(a[(k0 + kk) * M + m]), b, acc[m]);
      }
      for (int m = 0; m < M; ++m) _mm512_storeu_ps(y + c * M + m * 16, acc[m]);
    }
  }
}

// R rows at a time, each row's whole run along the task's columns; rows `ahead` further prefetched.
template <typename S, int M, int R>
static void Sweep(const float* a, const S* w, int64_t n, int64_t col0, int64_t cols, float* y, int ahead, int level) {
  for (int64_t c = 0; c < cols * M; c += 16) _mm512_storeu_ps(y + c, _mm512_setzero_ps());
  const int64_t line = 64 / sizeof(S);
  for (int64_t k0 = 0; k0 < K; k0 += R) {
    __m512 av[R][M];
    for (int r = 0; r < R; ++r)
      for (int m = 0; m < M; ++m) av[r][m] = _mm512_set1_ps(a[(k0 + r) * M + m]);
    const S* wk = w + k0 * n + col0;
    const bool pf = level != 0 && k0 + ahead + R <= K;
    const S* wp = wk + ahead * n;
    for (int64_t c = 0; c < cols; c += 16) {
      if (pf && c % line == 0) {
        for (int r = 0; r < R; ++r) {
          if (level == 1) _mm_prefetch(reinterpret_cast<const char*>(wp + r * n + c), _MM_HINT_T0);
          else _mm_prefetch(reinterpret_cast<const char*>(wp + r * n + c), _MM_HINT_T1);
        }
      }
      __m512 acc[M];
      for (int m = 0; m < M; ++m) acc[m] = _mm512_loadu_ps(y + c * M + m * 16);
      for (int r = 0; r < R; ++r) {
        const __m512 b = Load16(wk + r * n + c);
        for (int m = 0; m < M; ++m) acc[m] = _mm512_fmadd_ps(av[r][m], b, acc[m]);
      }
      for (int m = 0; m < M; ++m) _mm512_storeu_ps(y + c * M + m * 16, acc[m]);
    }
  }
}

// The packed reference (session 16): W as [tile][K][16] panels (p: the whole packed W), 4 panels in
// lockstep along K, the next 4 panels' rows prefetched into L2 (as the plugin EP's one-row calls).
template <int M>
static void Panel4(const float* a, const float* p, int64_t col0, int64_t cols, float* y) {
  const int64_t tiles = cols / 16;
  for (int64_t t = 0; t < tiles; t += 4) {
    const int64_t nt = std::min<int64_t>(4, tiles - t);
    const float* pt[4];
    for (int i = 0; i < 4; ++i) pt[i] = p + ((col0 / 16) + t + std::min<int64_t>(i, nt - 1)) * K * 16;
    const float* next = t + 4 < tiles ? p + ((col0 / 16) + t + 4) * K * 16 : nullptr;
    __m512 acc[4][M];
    for (int i = 0; i < 4; ++i)
      for (int m = 0; m < M; ++m) acc[i][m] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; ++k) {
      if (next != nullptr)
        for (int i = 0; i < 4; ++i) _mm_prefetch(reinterpret_cast<const char*>(next + i * K * 16 + k * 16), _MM_HINT_T1);
      for (int i = 0; i < 4; ++i) {
        const __m512 b = _mm512_loadu_ps(pt[i] + k * 16);
        for (int m = 0; m < M; ++m) acc[i][m] = _mm512_fmadd_ps(_mm512_set1_ps(a[k * M + m]), b, acc[i][m]);
      }
    }
    for (int i = 0; i < nt; ++i)
      for (int m = 0; m < M; ++m) _mm512_storeu_ps(y + (t + i) * 16 * M + m * 16, acc[i][m]);
  }
}

template <typename S>
static float StreamSum(const S* w, int64_t n, int64_t col0, int64_t cols) {  // same bytes, rows in order
  __m512 s0 = _mm512_setzero_ps(), s1 = s0;
  for (int64_t kk = 0; kk < K; ++kk) {
    const S* row = w + kk * n + col0;
    int64_t c = 0;
    for (; c + 32 <= cols; c += 32) {
      s0 = _mm512_add_ps(s0, Load16(row + c));
      s1 = _mm512_add_ps(s1, Load16(row + c + 16));
    }
    for (; c < cols; c += 16) s0 = _mm512_add_ps(s0, Load16(row + c));
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

template <typename S, int M>
static void RunTaskM(const Variant& v, const float* a, const S* w, int64_t n, int64_t col0, int64_t cols, float* y) {
  if (v.lock) return Lock16<S, M>(a, w, n, col0, cols, y, v.level, v.ahead);
  if constexpr (sizeof(S) == 4) {
    if (v.panel) return Panel4<M>(a, g_panels, col0, cols, y);
  }
  switch (v.rows) {
    case 1: return Sweep<S, M, 1>(a, w, n, col0, cols, y, v.ahead, v.level);
    case 2: return Sweep<S, M, 2>(a, w, n, col0, cols, y, v.ahead, v.level);
    case 4: return Sweep<S, M, 4>(a, w, n, col0, cols, y, v.ahead, v.level);
    case 8: return Sweep<S, M, 8>(a, w, n, col0, cols, y, v.ahead, v.level);
    default: return Sweep<S, M, 16>(a, w, n, col0, cols, y, v.ahead, v.level);
  }
}

static int g_rows = 1;  // M: rows of A
const float* g_panels = nullptr;  // this pass's copy of W packed (panel4)

template <typename S>
static void RunTask(const Variant& v, const float* a, const S* w, int64_t n, int64_t col0, int64_t cols, float* y,
                    float* sink) {
  if (v.stream) { *sink += StreamSum(w, n, col0, cols); return; }
  switch (g_rows) {
    case 1: return RunTaskM<S, 1>(v, a, w, n, col0, cols, y);
    case 2: return RunTaskM<S, 2>(v, a, w, n, col0, cols, y);
    case 3: return RunTaskM<S, 3>(v, a, w, n, col0, cols, y);
    case 4: return RunTaskM<S, 4>(v, a, w, n, col0, cols, y);
    default: return RunTaskM<S, 6>(v, a, w, n, col0, cols, y);
  }
}

static Variant Parse(const std::string& s) {
  Variant v;
  v.name = s;
  if (s == "stream") { v.stream = true; return v; }
  if (s == "lock16") { v.lock = true; v.level = 1; v.ahead = 8; return v; }
  if (sscanf(s.c_str(), "lock16:%d:%d", &v.ahead, &v.level) == 2) { v.lock = true; return v; }
  if (s == "lock16n") { v.lock = true; return v; }
  if (s == "panel4") { v.panel = true; return v; }
  if (sscanf(s.c_str(), "sweep%d:%d:%d", &v.rows, &v.ahead, &v.level) != 3) { fprintf(stderr, "bad %s\n", s.c_str()); exit(2); }
  return v;
}

template <typename S>
static int Main(int64_t n, int64_t cols, int threads, int64_t mb, int turns, const std::vector<Variant>& vs) {
  const int64_t bytes = K * n * sizeof(S);
  const int64_t copies = std::max<int64_t>(1, mb * 1000000 / bytes);
  std::vector<S> w(copies * K * n);
  for (int64_t i = 0; i < K * n; ++i) {  // every copy the same values: the variants' y compared
    const float f = ((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
    if constexpr (sizeof(S) == 4) w[i] = f; else w[i] = _cvtss_sh(f, 0);
  }
  for (int64_t c = 1; c < copies; ++c) std::copy(w.begin(), w.begin() + K * n, w.begin() + c * K * n);
  // Each copy of W packed too (panel4 reads its copy's panels; n a multiple of 16).
  std::vector<float> packed;
  const bool any_panel = std::any_of(vs.begin(), vs.end(), [](const Variant& v) { return v.panel; });
  if constexpr (sizeof(S) == 4) {
    if (any_panel) {
      packed.resize(copies * K * n);
      for (int64_t c = 0; c < copies; ++c)
        for (int64_t t = 0; t < n / 16; ++t)
          for (int64_t k = 0; k < K; ++k)
            for (int j = 0; j < 16; ++j) packed[c * K * n + t * K * 16 + k * 16 + j] = w[c * K * n + k * n + t * 16 + j];
    }
  }
  std::vector<float> a(K * g_rows);
  for (int64_t i = 0; i < K * g_rows; ++i) a[i] = ((i * 40503u) % 1001) / 500.0f - 1.0f;
  const int64_t ranges = (n + cols - 1) / cols;
  std::vector<std::vector<float>> ys(vs.size(), std::vector<float>(n * g_rows));
  std::vector<std::vector<double>> gbs(vs.size());
  float sink = 0;
  int64_t copy = 0;
  for (int turn = 0; turn < turns; ++turn) {
    for (size_t j = 0; j < vs.size(); ++j) {
      const size_t vi = (j + turn) % vs.size();
      const int64_t this_copy = copy++ % copies;
      const S* wc = w.data() + this_copy * K * n;
      if (!packed.empty()) g_panels = packed.data() + this_copy * K * n;
      std::atomic<int64_t> next{0};
      std::vector<float> sinks(threads, 0.0f);
      auto work = [&](int t) {
        for (int64_t r; (r = next.fetch_add(1)) < ranges;) {
          const int64_t c0 = r * cols;
          RunTask<S>(vs[vi], a.data(), wc, n, c0, std::min(cols, n - c0), ys[vi].data() + c0 * g_rows, &sinks[t]);
        }
      };
      const auto t0 = std::chrono::steady_clock::now();
      std::vector<std::thread> helpers;
      for (int t = 1; t < threads; ++t) helpers.emplace_back(work, t);
      work(0);
      for (auto& h : helpers) h.join();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (turn > 0) gbs[vi].push_back(bytes / s / 1e9);
      for (float f : sinks) sink += f;
    }
  }
  printf("M=%d %s K=%lld N=%lld cols=%lld threads=%d copies=%lld (%.0f MB) turns=%d\n", g_rows, sizeof(S) == 4 ? "fp32" : "fp16",
         (long long)K, (long long)n, (long long)cols, threads, (long long)copies, copies * bytes / 1e6, turns);
  for (size_t j = 0; j < vs.size(); ++j) {
    std::vector<double> g = gbs[j];
    std::sort(g.begin(), g.end());
    const bool same = vs[j].stream || memcmp(ys[j].data(), ys[0].data(), n * g_rows * sizeof(float)) == 0;
    printf("  %-14s GB/s median %6.2f best %6.2f %s\n", vs[j].name.c_str(), g[g.size() / 2], g.back(),
           same ? "" : "DIFFERS");
  }
  // ratio of medians to the first variant
  std::vector<double> med;
  for (auto g : gbs) { std::sort(g.begin(), g.end()); med.push_back(g[g.size() / 2]); }
  for (size_t j = 1; j < vs.size(); ++j) printf("  %s / %s = %.3f\n", vs[j].name.c_str(), vs[0].name.c_str(), med[j] / med[0]);
  return sink == 12345.0f;
}

int main(int argc, char** argv) {
  if (argc < 8) {
    fprintf(stderr, "usage: %s fp32|fp16 N COLS THREADS MB TURNS VARIANT...\n", argv[0]);
    return 2;
  }
  const std::string dtype = argv[1];
  std::vector<Variant> vs;
  for (int i = 7; i < argc; ++i) vs.push_back(Parse(argv[i]));
  const int64_t n = atoll(argv[2]), cols = atoll(argv[3]), mb = atoll(argv[5]);
  const int threads = atoi(argv[4]), turns = atoi(argv[6]);
  if (const char* rows = getenv("ROWS")) g_rows = atoi(rows);  // M: 1, 2, 3, 4 or 6
  if (g_rows != 1 && g_rows != 2 && g_rows != 3 && g_rows != 4 && g_rows != 6) return 2;
  return dtype == "fp16" ? Main<uint16_t>(n, cols, threads, mb, turns, vs) : Main<float>(n, cols, threads, mb, turns, vs);
}
