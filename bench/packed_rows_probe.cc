// In-process probe of otfuse's GEMM on the norm_linear block's projections (bench/norm_linear.py:
// K = 4096; q / k / v 4096 / 1024 / 1024, then gate / up 11008 each, [K, N] weights) at M rows:
// `custom` reads W as stored (the custom-op route's plan), `ep` the panels PackWeight made of it
// (the plugin-EP route's), `eph` the same panels on transparent huge pages. GemmInPlace runs as the
// kernels call it, its ParallelFor on THREADS (2) threads pulling tasks from one counter; the
// configurations take turns (rotating order) and every one's output must equal the first's bit
// for bit. Prints per configuration the median and best wall time of a block, and the median
// over turns of the first configuration's wall / CPU time over its own (bench/README.md,
// "norm_linear, one row over packed panels, session 12"). Not part of the build or the tests.
//
//   cmake --build build/dev   # the ISA objects below
//   I="-Ikernels -isystem $(grep -o '/[^ ]*ort-headers/[^ ]*' build/dev/build.ninja | head -1)"
//   g++ -O3 -DNDEBUG -ffp-contract=off -std=c++17 -DOTFUSE_HAVE_AVX2_KERNELS $I -pthread
//       bench/packed_rows_probe.cc kernels/common/gemm.cc kernels/common/cpu_features.cc kernels/ort_glue.cc
//       build/dev/CMakeFiles/otfuse_ops.dir/common/gemm_tiles_*.o -o /tmp/packed_rows_probe
//   flock /work/coord/bench.lock /tmp/packed_rows_probe fp32 1 30 custom ep   # OTFUSE_GEMM_ISA=avx2: AVX2 kernels
#include <sys/mman.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>
#include "common/gemm.h"
#include "common/float_types.h"

using namespace otfuse;
static int g_threads = 2;

static OrtStatus* ORT_API_CALL FakeParallelFor(const OrtKernelContext*, void (*fn)(void*, size_t), size_t total,
                                               size_t, void* data) noexcept {
  std::atomic<size_t> next{0};
  auto work = [&] { for (size_t i; (i = next.fetch_add(1)) < total;) fn(data, i); };
  std::vector<std::thread> helpers;
  for (int t = 1; t < g_threads; ++t) helpers.emplace_back(work);
  work();
  for (auto& h : helpers) h.join();
  return nullptr;
}

static void* Alloc(size_t bytes, bool huge) {
  if (!huge) return malloc(bytes);
  void* p = aligned_alloc(2 << 20, (bytes + (2 << 20) - 1) / (2 << 20) * (2 << 20));
  madvise(p, bytes, MADV_HUGEPAGE);
  return p;
}

int main(int argc, char** argv) {
  if (argc < 5) { fprintf(stderr, "probe fp32|fp16 M ROUNDS CONFIG...  (custom | ep | eph)\n"); return 1; }
  static OrtApi api{};
  api.KernelContext_ParallelFor = FakeParallelFor;
  SetApi(&api);
  const bool half = std::string(argv[1]) == "fp16";
  const int64_t m = atoi(argv[2]);
  const int rounds = atoi(argv[3]);
  if (getenv("THREADS")) g_threads = atoi(getenv("THREADS"));
  const int64_t K = 4096;
  const std::vector<std::vector<int64_t>> nodes = {{4096, 1024, 1024}, {11008, 11008}};
  const size_t es = half ? 2 : 4;
  const WeightType wt = half ? WeightType::kFloat16 : WeightType::kFloat32;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1, 1);
  bool need_huge = false, need_plain = false;
  for (int i = 4; i < argc; ++i) {
    std::string c = argv[i];
    if (c.rfind("eph", 0) == 0) need_huge = true; else if (c.rfind("ep", 0) == 0) need_plain = true;
  }
  struct W { void* w; void* packed; void* huge; int64_t n; void* y; };
  std::vector<std::vector<W>> ws(nodes.size());
  for (size_t g = 0; g < nodes.size(); ++g) {
    for (int64_t n : nodes[g]) {
      W x{};
      x.n = n;
      const size_t count = K * n;
      x.w = Alloc(count * es, false);
      for (size_t i = 0; i < count; ++i) {
        float v = dist(rng) * 0.05f;
        if (half) static_cast<Float16*>(x.w)[i] = FromFloat<Float16>(v); else static_cast<float*>(x.w)[i] = v;
      }
      const size_t pbytes = PackedWeightElements(K, n) * es;
      if (need_plain) { x.packed = Alloc(pbytes, false); PackWeight(x.w, wt, false, K, n, x.packed); }
      if (need_huge) { x.huge = Alloc(pbytes, true); PackWeight(x.w, wt, false, K, n, x.huge); }
      x.y = malloc(m * n * es);
      ws[g].push_back(x);
    }
  }
  std::vector<float> a(m * K);
  for (auto& v : a) v = dist(rng);
  const GemmIsa isa = SelectGemmIsa();
  const KernelContext ctx(nullptr);
  const int nc = argc - 4;
  std::vector<std::vector<double>> times(nc), cpus(nc);
  auto cpu_now = [] { timespec ts; clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts); return ts.tv_sec + 1e-9 * ts.tv_nsec; };
  auto run = [&](const std::string& c) {
    const bool ep = c.rfind("ep", 0) == 0, huge = c.rfind("eph", 0) == 0;
    for (auto& node : ws) {
      std::vector<GemmProduct> products;
      for (W& x : node) products.push_back({x.w, wt, false, x.n, nullptr, x.y, ep ? (huge ? x.huge : x.packed) : nullptr});
      GemmInPlace(ctx, isa, m, K, a.data(), products);
    }
  };
  // Warm-up and check: every config's output equals the first's bit for bit.
  std::vector<std::vector<char>> first;
  for (int i = 0; i < nc; ++i) {
    run(argv[4 + i]);
    size_t idx = 0;
    for (auto& node : ws) for (W& x : node) {
      std::vector<char> bytes(static_cast<char*>(x.y), static_cast<char*>(x.y) + m * x.n * es);
      if (i == 0) first.push_back(bytes);
      else if (bytes != first[idx]) printf("MISMATCH %s product %zu\n", argv[4 + i], idx);
      ++idx;
    }
  }
  for (int r = 0; r < rounds; ++r) {
    for (int j = 0; j < nc; ++j) {
      const int i = (j + r) % nc;
      const auto t0 = std::chrono::steady_clock::now();
      const double c0 = cpu_now();
      run(argv[4 + i]);
      cpus[i].push_back(cpu_now() - c0);
      times[i].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  printf("%s M=%ld isa %s threads %d rounds %d\n", argv[1], (long)m, GemmIsaName(isa), g_threads, rounds);
  for (int i = 0; i < nc; ++i) {
    std::vector<double> t = times[i], ratio, cratio, c = cpus[i];
    for (int r = 0; r < rounds; ++r) ratio.push_back(times[0][r] / times[i][r]);
    for (int r = 0; r < rounds; ++r) cratio.push_back(cpus[0][r] / cpus[i][r]);
    std::sort(c.begin(), c.end());
    std::sort(cratio.begin(), cratio.end());
    std::sort(t.begin(), t.end());
    std::sort(ratio.begin(), ratio.end());
    printf("  %-10s median %.2f ms best %.2f ms  %s/this %.3f | cpu median %.2f ms ratio %.3f\n", argv[4 + i],
           t[t.size() / 2] * 1e3, t[0] * 1e3, argv[4], ratio[ratio.size() / 2], c[c.size() / 2] * 1e3,
           cratio[cratio.size() / 2]);
  }
}
