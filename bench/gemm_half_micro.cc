// One-thread micro: the same GEMM task over a float32 and a float16 [K, N] weight in alternating
// turns (bench/README.md, "norm_linear, session 16: fp16"): per task kind, the float16 task's time
// over the float32 one's (median of per-turn ratios) and each one's GFLOP/s, so that what a 16-bit
// weight costs the kernels (its widening, in registers or into stages) shows apart from the host's
// drift. Kinds: plain (kPlain: W read in place, the custom-op route up to 256 rows), deep
// (kDeepPlain: 257-576 rows), packed (PackedTask: W packed per call, above), once (PrepackedTask:
// the plugin-EP route's panels packed once). W and the panels flushed from the caches before each run.
//   I="-Ikernels -isystem $(grep -o '/[^ ]*ort-headers/[^ ]*' build/dev/build.ninja | head -1)"
//   g++ -O3 -DNDEBUG -ffp-contract=off -fno-math-errno -std=c++17 $I -mavx2 -mfma -mf16c -mavx512f -DISA=avx512
//       -Wno-maybe-uninitialized bench/gemm_half_micro.cc -o /tmp/gemm_half_micro   # (-DISA=avx2 without -mavx512f)
//   /tmp/gemm_half_micro M K COLS N TURNS KINDS   # e.g. 512 896 976 4864 9 plain,deep,packed,once
#if !defined(ISA)
#define ISA avx512
#endif
#define OTFUSE_ISA_NAMESPACE ISA
#include "common/gemm_tiles.inc"
#undef OTFUSE_ISA_NAMESPACE

#include <immintrin.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

using namespace otfuse;
using namespace otfuse::gemm_detail;

#include "gemm_micro_common.h"

int main(int argc, char** argv) {
  const int64_t m = argc > 1 ? atoll(argv[1]) : 512;
  const int64_t k = argc > 2 ? atoll(argv[2]) : 896;
  const int64_t cols = argc > 3 ? atoll(argv[3]) : 976;
  const int64_t n = argc > 4 ? atoll(argv[4]) : 4864;
  const int turns = argc > 5 ? atoi(argv[5]) : 9;
  const std::string kinds = argc > 6 ? argv[6] : "plain,deep,packed,once";
  std::vector<float> a(m * k), w(k * n), y(m * n);
  std::vector<uint16_t> w16(k * n), y16(m * n);
  for (int64_t i = 0; i < m * k; ++i) a[i] = static_cast<float>(i % 7) * 0.1f - 0.3f;
  for (int64_t i = 0; i < k * n; ++i) {
    w16[i] = _cvtss_sh(static_cast<float>(i % 13) * 0.01f - 0.06f, 0);
    w[i] = _cvtsh_ss(w16[i]);  // the same values
  }
  const std::vector<float> panels = PackRange(w.data(), k, n, cols);
  const std::vector<uint16_t> panels16 = PackRange(w16.data(), k, n, cols);
  const std::vector<float> a_packed = PackRowBlocks(a, m, k);  // row blocks of 6, [k][rows] each
  std::vector<float> buffer(kStageFloats + m * ((cols + kTileWidth - 1) / kTileWidth) * kTileWidth);
  struct Kind {
    const char* name;
    TaskKind kind;
    bool once;
  };
  std::vector<Kind> all = {{"plain", TaskKind::kPlain, false}, {"deep", TaskKind::kDeepPlain, false},
                           {"packed", TaskKind::kPacked, false}, {"once", TaskKind::kPacked, true}};
  std::vector<Kind> used;
  for (const Kind& kd : all) {
    if (kinds.find(kd.name) != std::string::npos) used.push_back(kd);
  }
  // times[kind][dtype]
  std::vector<std::vector<std::vector<double>>> times(used.size(), std::vector<std::vector<double>>(2));
  for (int turn = 0; turn < turns + 1; ++turn) {
    for (size_t v = 0; v < used.size(); ++v) {
      for (int half = 0; half < 2; ++half) {
        const GemmProduct product{half ? static_cast<const void*>(w16.data()) : w.data(),
                                  half ? WeightType::kFloat16 : WeightType::kFloat32, false, n, nullptr,
                                  half ? static_cast<void*>(y16.data()) : y.data(),
                                  used[v].once ? (half ? static_cast<const void*>(panels16.data()) : panels.data())
                                               : nullptr};
        const Job job{m, k, a_packed.data(), &product, a.data(), nullptr};
        const Task task{0, used[v].kind, 0, m, 0, cols};
        if (used[v].once) {
          Flush(half ? static_cast<const void*>(panels16.data()) : panels.data(), panels.size() * (half ? 2 : 4));
        } else {
          Flush(half ? static_cast<const void*>(w16.data()) : w.data(), w.size() * (half ? 2 : 4));
        }
        const double t0 = Now();
        ISA::RunTask(job, task, buffer.data(), buffer.data() + kStageFloats);
        if (turn > 0) times[v][half].push_back(Now() - t0);
      }
    }
  }
  const double flop = 2.0 * m * k * cols;
  printf("M %lld K %lld COLS %lld of %lld, one thread, %d turns\n", (long long)m, (long long)k, (long long)cols,
         (long long)n, turns);
  for (size_t v = 0; v < used.size(); ++v) {
    std::vector<double> ratios;
    for (int t = 0; t < turns; ++t) ratios.push_back(times[v][1][t] / times[v][0][t]);
    printf("  %-6s f32 %6.1f GFLOP/s, f16 %6.1f GFLOP/s, f16 time / f32 time %.3f\n", used[v].name,
           flop / Median(times[v][0]) * 1e-9, flop / Median(times[v][1]) * 1e-9, Median(ratios));
  }
  // float16 Y vs float32 Y rounded: the same sums (same order), so equal bits after rounding.
  int64_t differ = 0;
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t c = 0; c < cols; ++c) differ += y16[r * n + c] != _cvtss_sh(y[r * n + c], 0);
  }
  printf("  f16 Y vs f32 Y rounded: %lld of %lld differ (last kind)\n", (long long)differ, (long long)(m * cols));
}
