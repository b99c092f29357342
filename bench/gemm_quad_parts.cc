// Where one AVX-512 float32 task over packed-once panels loses against the FMA peak: the same
// MicroQuad calls (common/gemm_tiles.inc: 2 row blocks of 6 x 2 tiles of 16, 24 zmm accumulators)
// as PrepackedTask makes for M rows x 1024 columns x K = 2048, with one cost added at a time —
// every call's operands hot in L1; A's row blocks streaming from L2 (the accumulators hot); the
// task's accumulators loaded / stored per call (tile-major, 2.8 MiB at 684 rows: L3); the panels
// changing per tile pair; a shorter depth per call — then the library's whole task (RunTask).
// No PMU in this KVM guest (perf stat: cycles / instructions "not supported"), so costs are
// isolated by timing (bench/README.md, "AVX-512 float32 GEMM over packed panels, session 13").
//   g++ -O3 -DNDEBUG -ffp-contract=off -fno-math-errno -std=c++17 -Ikernels -mavx2 -mfma -mf16c -mavx512f
//       -Wno-maybe-uninitialized bench/gemm_quad_parts.cc -o /tmp/gemm_quad_parts   (+ the ORT headers' -isystem,
//       as bench/gemm_task_micro.cc)
//   /tmp/gemm_quad_parts M      # e.g. 684; thread CPU time, best / median of 7 runs each
#define OTFUSE_ISA_NAMESPACE avx512
#include "common/gemm_tiles.inc"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <vector>

using namespace otfuse;
using namespace otfuse::gemm_detail;
using namespace otfuse::gemm_detail::avx512;

static double Now() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

template <typename Body>
static void Run(const char* name, const Body& body, double flop) {
  std::vector<double> times;
  for (int turn = 0; turn < 7; ++turn) {
    const double t0 = Now();
    body();
    times.push_back(Now() - t0);
  }
  std::sort(times.begin(), times.end());
  printf("%-52s best %6.1f, median %6.1f GFLOP/s\n", name, flop / times[0] * 1e-9, flop / times[3] * 1e-9);
}

int main(int argc, char** argv) {
  const int64_t m = argc > 1 ? atoll(argv[1]) : 684, k = 2048, cols = 1024, kc = kPackDepth;
  const int64_t blocks = m / kRowBlock, tiles = cols / kTileWidth;
  std::vector<float> a(m * k, 0.1f), panels(k * cols, 0.01f), acc(m * cols + 2 * 12 * kTileWidth, 0.0f);
  const double flop = 2.0 * m * k * cols;
  // The library's order: k blocks, tile pairs, row block pairs; a_of / p_of / c_of say where each
  // call's A blocks, panels and accumulators are.
  auto sweep = [&](int64_t depth, auto a_of, auto p_of, auto c_of) {
    for (int64_t k0 = 0; k0 < k; k0 += depth) {
      for (int64_t t = 0; t + 1 < tiles; t += 2) {
        for (int64_t rb = 0; rb + 1 < blocks; rb += 2) {
          float* c = c_of(t, rb);
          MicroQuad(a_of(rb, k0, depth), a_of(rb + 1, k0, depth), p_of(t, k0, depth), p_of(t + 1, k0, depth), depth,
                    c, c == acc.data() ? c + 12 * kTileWidth : acc.data() + ((t + 1) * m + rb * kRowBlock) * kTileWidth,
                    k0 > 0);
        }
      }
    }
  };
  auto a_hot = [&](int64_t rb, int64_t, int64_t depth) { return a.data() + (rb % 2) * kRowBlock * depth; };
  auto a_streams = [&](int64_t rb, int64_t k0, int64_t) { return a.data() + rb * kRowBlock * k + k0 * kRowBlock; };
  auto p_hot = [&](int64_t t, int64_t, int64_t depth) { return panels.data() + (t % 2) * depth * kTileWidth; };
  auto p_task = [&](int64_t t, int64_t k0, int64_t depth) {
    return panels.data() + k0 * cols + t * depth * kTileWidth;
  };
  auto c_hot = [&](int64_t, int64_t) { return acc.data(); };
  auto c_task = [&](int64_t t, int64_t rb) { return acc.data() + (t * m + rb * kRowBlock) * kTileWidth; };
  for (int64_t depth : {kc, kc / 2}) {
    printf("depth per call %lld:\n", static_cast<long long>(depth));
    Run("  all hot (one call's A, panels, accumulators)", [&] { sweep(depth, a_hot, p_hot, c_hot); }, flop);
    Run("  A streams from L2", [&] { sweep(depth, a_streams, p_hot, c_hot); }, flop);
    Run("  panels per tile pair", [&] { sweep(depth, a_hot, p_task, c_hot); }, flop);
    Run("  accumulators per call", [&] { sweep(depth, a_hot, p_hot, c_task); }, flop);
    Run("  A streams + panels per tile pair", [&] { sweep(depth, a_streams, p_task, c_hot); }, flop);
    Run("  all three (the task's calls)", [&] { sweep(depth, a_streams, p_task, c_task); }, flop);
  }
  std::vector<float> y(m * cols), buffer(kStageFloats + m * cols);
  const GemmProduct product{panels.data(), WeightType::kFloat32, false, cols, nullptr, y.data(), panels.data()};
  const Job job{m, k, a.data(), &product, a.data(), nullptr};
  const Task task{0, TaskKind::kPacked, 0, m, 0, cols};
  Run("RunTask (calls + prefetches + writing Y)", [&] { RunTask(job, task, buffer.data(), buffer.data() + kStageFloats); },
      flop);
}
