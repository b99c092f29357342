// One-thread micro of the deep in-place task (kDeepPlain: the custom-op route at 257-576 rows)
// over a float16 [K, N] weight, as several trees of common/gemm_tiles.inc run it, in alternating
// turns (bench/README.md, "norm_linear fp16, session 18"): each tree's time over the first's
// (median of per-turn ratios), GFLOP/s, and its Y against the first's bit for bit. W (and with
// COLD_Y=1 also Y) flushed from the caches before each run. BIAS=1: a float32 bias. F32=1: float32
// W and Y instead. HUGEW=1: W on transparent huge pages. WARM_W=1: W not flushed (in a node it is in L3).
//   I="-Ikernels -isystem $(grep -o '/[^ ]*ort-headers/[^ ]*' build/dev/build.ninja | head -1)"
//   F="-O3 -DNDEBUG -std=c++17 -fPIC -ffp-contract=off -fno-math-errno -mavx2 -mfma -mf16c -mavx512f"  # the library's
//   g++ $F $I -c bench/gemm_tree.cc -DTREE='"common/gemm_tiles.inc"' -DTREE_NS=t0 -o /tmp/t0.o
//   g++ $F $I -c bench/gemm_tree.cc -DTREE='"/work/main/kernels/common/gemm_tiles.inc"' -DTREE_NS=t1 -o /tmp/t1.o
//   g++ $F $I -DTREES=2 bench/gemm_ystore_micro.cc /tmp/t0.o /tmp/t1.o -o /tmp/ystore
//   /tmp/ystore M K COLS N TURNS [NAME...]   # e.g. 512 896 496 4864 15 this main   (TREES: up to 4)
// Each tree in its own translation unit (bench/gemm_tree.cc), as the library compiles it: in one
// unit together the compiler inlined each copy differently (a tree 14% slower for that alone). The
// AVX2 kernels: F without -mavx512f. A throw-away tree is a copy of gemm_tiles.inc (its own
// #include "common/..." lines resolve to this tree's files through -Ikernels), e.g. WriteRows
// emptied: what writing Y costs.
#include "common/gemm.h"

#if !defined(TREES)
#define TREES 2
#endif
namespace otfuse::gemm_detail {
namespace t0 { void RunTask(const Job& job, const Task& task, float* stage, float* acc); }
namespace t1 { void RunTask(const Job& job, const Task& task, float* stage, float* acc); }
namespace t2 { void RunTask(const Job& job, const Task& task, float* stage, float* acc); }
namespace t3 { void RunTask(const Job& job, const Task& task, float* stage, float* acc); }
}  // namespace otfuse::gemm_detail

#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

using namespace otfuse;
using namespace otfuse::gemm_detail;

#include "gemm_micro_common.h"

static bool Env(const char* name) { return std::getenv(name) != nullptr && std::atoi(std::getenv(name)) == 1; }

int main(int argc, char** argv) {
  const int64_t m = argc > 1 ? atoll(argv[1]) : 512;
  const int64_t k = argc > 2 ? atoll(argv[2]) : 896;
  const int64_t cols = argc > 3 ? atoll(argv[3]) : 496;
  const int64_t n = argc > 4 ? atoll(argv[4]) : 4864;
  const int turns = argc > 5 ? atoi(argv[5]) : 15;
  const bool f32 = Env("F32"), cold_y = Env("COLD_Y");
  const size_t es = f32 ? 4 : 2;
  std::vector<float> a(m * k), w(k * n), bias(n);
  std::vector<uint16_t> w16(k * n);
  if (Env("HUGEW")) {  // HUGEW=1: W on transparent huge pages (its 2 MiB-aligned interior)
    for (void* p : {static_cast<void*>(w.data()), static_cast<void*>(w16.data())}) {
      const size_t bytes = p == w.data() ? w.size() * 4 : w16.size() * 2;
      const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + (2 << 20) - 1) & ~uintptr_t((2 << 20) - 1);
      const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + bytes) & ~uintptr_t((2 << 20) - 1);
      if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
    }
  }
  for (int64_t i = 0; i < m * k; ++i) a[i] = static_cast<float>(i % 7) * 0.1f - 0.3f;
  for (int64_t i = 0; i < k * n; ++i) {
    w16[i] = _cvtss_sh(static_cast<float>(i % 13) * 0.01f - 0.06f, 0);
    w[i] = _cvtsh_ss(w16[i]);
  }
  for (int64_t i = 0; i < n; ++i) bias[i] = static_cast<float>(i % 11) * 0.03f;
  const std::vector<float> a_packed = PackRowBlocks(a, m, k);  // row blocks of 6, [k][rows] each
  std::vector<float> buffer(kStageFloats + m * ((cols + kTileWidth - 1) / kTileWidth) * kTileWidth);
  std::vector<TaskFn> trees = {&t0::RunTask, &t1::RunTask};
#if TREES > 2
  trees.push_back(&t2::RunTask);
#endif
#if TREES > 3
  trees.push_back(&t3::RunTask);
#endif
  std::vector<const char*> names;
  for (int i = 0; i < TREES; ++i) names.push_back(argc > 6 + i ? argv[6 + i] : "tree");
  std::vector<std::vector<char>> ys(trees.size(), std::vector<char>(m * n * es));
  std::vector<std::vector<double>> times(trees.size());
  const void* w_used = f32 ? static_cast<const void*>(w.data()) : w16.data();
  // PACKED=D: a packed-once task (the plugin EP's: PrepackedTask) over columns [0, COLS) packed as
  // one range, in k blocks of D rows for the first tree (e.g. 256: main before session 20) and of
  // EvenDepth(K) rows for the others (COLS must be PackedRangeCols(N), e.g. 976 of 4864).
  const int64_t packed_depth = std::getenv("PACKED") != nullptr ? atoll(std::getenv("PACKED")) : 0;
  std::vector<float> panels32[2];
  std::vector<uint16_t> panels16[2];
  for (int i = 0; i < 2 && packed_depth > 0; ++i) {
    if (cols != PackedRangeCols(n)) {
      printf("PACKED: COLS must be %lld\n", (long long)PackedRangeCols(n));
      return 2;
    }
    panels32[i] = PackRange(w.data(), k, n, cols, i == 0 ? packed_depth : 0);
    panels16[i] = PackRange(w16.data(), k, n, cols, i == 0 ? packed_depth : 0);
  }
  for (int turn = 0; turn < turns + 1; ++turn) {
    for (size_t v = 0; v < trees.size(); ++v) {
      const size_t tree = (v + turn) % trees.size();  // each tree first in turn
      const GemmProduct product{w_used, f32 ? WeightType::kFloat32 : WeightType::kFloat16, false, n,
                                Env("BIAS") ? bias.data() : nullptr, ys[tree].data(),
                                packed_depth == 0 ? nullptr
                                : f32 ? static_cast<const void*>(panels32[tree > 0].data())
                                      : static_cast<const void*>(panels16[tree > 0].data())};
      const Job job{m, k, a_packed.data(), &product, a.data(), nullptr};
      // PER_CALL=1: W packed per call (PackedTask: the custom-op route past kDeepPlainMaxRows rows).
      const bool per_call = Env("PER_CALL");
      const Task task{0, packed_depth > 0 || per_call ? TaskKind::kPacked : TaskKind::kDeepPlain, 0, m, 0, cols};
      if (!Env("WARM_W")) Flush(w_used, w.size() * es);  // WARM_W=1: W left in the caches
      if (cold_y) Flush(ys[tree].data(), ys[tree].size());
      const double t0 = Now();
      trees[tree](job, task, buffer.data(), buffer.data() + kStageFloats);
      if (turn > 0) times[tree].push_back(Now() - t0);
    }
  }
  const double flop = 2.0 * m * k * cols;

  printf("M %lld K %lld COLS %lld of %lld, %s W and Y, bias %d, cold Y %d, one thread, %d turns\n", (long long)m,
         (long long)k, (long long)cols, (long long)n, f32 ? "float32" : "float16", Env("BIAS"), cold_y, turns);
  for (size_t v = 0; v < trees.size(); ++v) {
    std::vector<double> ratios;
    for (int t = 0; t < turns; ++t) ratios.push_back(times[v][t] / times[0][t]);
    int64_t differ = 0;
    for (int64_t r = 0; r < m; ++r) {
      differ += std::memcmp(ys[v].data() + r * n * es, ys[0].data() + r * n * es, cols * es) != 0;
    }
    printf("  %-10s %6.1f GFLOP/s, time / the first's %.3f, Y rows differing %lld\n", names[v],
           flop / Median(times[v]) * 1e-9, Median(ratios), (long long)differ);
  }
}
