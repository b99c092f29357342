// One thread, the few-rows in-place task (kPlain, M = 7..18 AVX-512: MicroTall) over a whole
// [K, N] float32 weight split into tasks of COLS columns, against the same columns packed once
// (the plugin-EP route's PrepackedTask), in alternating turns (bench/README.md, "norm_linear, few
// rows in place, session 20"). Where W lies: WHERE=l2 (one task's columns, N = COLS, hot),
// l3 (COPIES copies of W read in turn, default 6: from L3), dram (W flushed before each run).
// Variants: "new" (this tree's kPlain task), "base" (OTHER's: another tree's gemm_tiles.inc, e.g.
// main's, in namespace other), "ep" (this tree's task over the panels); l2one: only the first COLS
// columns (hot in L2 after the first turn). Y of every variant compared with the first's bit for bit;
// "first/this": the first variant's time / this one's, median over turns. Compiled alone, the code is
// laid out as it is not in the library: confirm at node level (bench/README.md says why).
//   I="-Ikernels -isystem $(grep -o '/[^ ]*ort-headers/[^ ]*' build/dev/build.ninja | head -1)"
//   git show main:kernels/common/gemm_tiles.inc > /tmp/base/common/gemm_tiles.inc   # (and its .inc files)
//   g++ -O3 -DNDEBUG -ffp-contract=off -fno-math-errno -std=c++17 $I -mavx2 -mfma -mf16c -mavx512f \
//       -DISA=avx512 -DOTHER='"/tmp/base/common/gemm_tiles.inc"' bench/few_rows_probe.cc -o /tmp/few_rows_probe
//   /tmp/few_rows_probe M K N COLS TURNS WHERE VARIANTS...   # e.g. 16 768 2304 576 201 l3 base new ep
#define OTFUSE_ISA_NAMESPACE ISA
#include "common/gemm_tiles.inc"
#undef OTFUSE_ISA_NAMESPACE
#define OTFUSE_ISA_NAMESPACE other
#include OTHER
#undef OTFUSE_ISA_NAMESPACE

#include <sys/mman.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gemm_micro_common.h"

using namespace otfuse;
using namespace otfuse::gemm_detail;

int main(int argc, char** argv) {
  if (argc < 8) {
    fprintf(stderr, "usage: M K N COLS TURNS WHERE(l2|l3|dram) VARIANTS... (ep = packed once)\n");
    return 2;
  }
  const int64_t m = atoll(argv[1]), k = atoll(argv[2]), n = atoll(argv[3]), cols = atoll(argv[4]);
  const int turns = atoi(argv[5]);
  const std::string where = argv[6];
  std::vector<std::string> variants(argv + 7, argv + argc);
  const int copies = where == "l3" ? (getenv("COPIES") ? atoi(getenv("COPIES")) : 6) : 1;
  std::vector<float> a(m * k);
  for (int64_t i = 0; i < m * k; ++i) a[i] = static_cast<float>((i * 7919) % 13) * 0.1f - 0.6f;
  const std::vector<float> a_packed = PackRowBlocks(a, m, k);
  std::vector<std::vector<float>> w(copies, std::vector<float>(k * n));
  for (auto& wc : w) {
    for (int64_t i = 0; i < k * n; ++i) wc[i] = static_cast<float>((i * 104729) % 17) * 0.01f - 0.08f;
  }
  // Panels laid out as PackWeight does (ranges of PackedRangeCols(n) in turn); the EP route's tasks
  // at few rows are half a range each (kFewRowsRangeSplits).
  const int64_t range = PackedRangeCols(n);
  const int64_t ep_cols = RangeCols(range, range / kFewRowsRangeSplits);
  std::vector<std::vector<float>> panels(copies);
  for (int c = 0; c < copies; ++c) {
    for (int64_t c0 = 0; c0 < n; c0 += range) {
      const std::vector<float> r = PackRange(w[c].data() + c0, k, n, std::min(range, n - c0));
      panels[c].insert(panels[c].end(), r.begin(), r.end());
    }
  }
  std::vector<float> y(m * n);
  std::vector<float> buffer(kStageFloats + m * ((cols + kTileWidth - 1) / kTileWidth) * kTileWidth);
  const int nv = static_cast<int>(variants.size());
  std::vector<std::vector<double>> times(nv);
  std::vector<std::vector<float>> ys(nv);
  int copy = 0;
  for (int turn = 0; turn < turns + 1; ++turn) {
    for (int vi = 0; vi < nv; ++vi) {
      const int v = (vi + turn) % nv;  // rotating first slot
      const bool ep = variants[v] == "ep";
      const TaskFn run = variants[v] == "base" ? &other::RunTask : &ISA::RunTask;
      const int cc = copy;
      copy = (copy + 1) % copies;
      if (where == "dram") {
        Flush(w[cc].data(), k * n * 4);
        Flush(panels[cc].data(), panels[cc].size() * 4);
      }
      GemmProduct product{w[cc].data(), WeightType::kFloat32, false, n, nullptr, y.data(), nullptr};
      const Job job{m, k, a_packed.data(), &product, a.data(), nullptr};
      const double t0 = Now();
      product.packed = ep ? panels[cc].data() : nullptr;
      const int64_t task_cols = ep ? ep_cols : cols;
      // l2one: the first COLS columns only, once per turn (W's rows N apart, those columns hot in L2).
      const int64_t n_run = where == "l2one" ? cols : n;
      for (int64_t c0 = 0; c0 < n_run; c0 += task_cols) {
        const int64_t tc = std::min(task_cols, n - c0);
        Task task{0, ep ? TaskKind::kPacked : TaskKind::kPlain, 0, m, c0, tc};
        run(job, task, buffer.data(), buffer.data() + kStageFloats);
      }
      const double t = Now() - t0;
      if (turn > 0) times[v].push_back(t);
      if (turn == 0) ys[v] = y;
      if (turn == 0 && where == "l2one") std::fill(y.begin(), y.end(), 0.0f);
    }
  }
  const double flop = 2.0 * m * k * (where == "l2one" ? cols : n);
  for (int v = 0; v < nv; ++v) {
    std::vector<double> ratio;
    for (int t = 0; t < turns; ++t) ratio.push_back(times[0][t] / times[v][t]);
    const bool same = std::memcmp(ys[v].data(), ys[0].data(), ys[0].size() * 4) == 0;
    printf("%-6s median %7.1f GFLOP/s  first/this %.3f  %s\n", variants[v].c_str(), flop / Median(times[v]) * 1e-9,
           Median(ratio), same ? "same bits" : "DIFFERENT BITS");
  }
  printf("M %lld K %lld N %lld COLS %lld, W %s (%d copies), %d turns\n", (long long)m, (long long)k, (long long)n,
         (long long)cols, where.c_str(), copies, turns);
}
