// In-process A/B probe of the decode op's direct path (bench/README.md, "Decode, session 10: fp16"):
// one query, 32 query heads over 8 kv heads, a past of P keys (+ 1 new), D = 128, scheduled as the
// op schedules it (attention.cc: 8 kv heads x up to 16 / 8 key splits, the last split of a kv
// head merges) on T threads that pull tasks from one counter. Several builds of the tile kernels
// are linked into one binary, each in its own namespace, and timed in alternating turns, so
// that the VM's process-to-process variance (up to 2x) does not enter their ratios. "cold":
// L layers' caches called in turn (each call reads its K/V from memory, as a decoder's step).
//
//   I="-Ikernels -isystem $(grep -o '/[^ ]*ort-headers/[^ ]*' build/dev/build.ninja | head -1)"
//   F="-O3 -DNDEBUG -ffp-contract=off -fno-math-errno -std=c++17 $I"
//   X5="-mavx2 -mfma -mf16c -mavx512f -mavx512vl -mavx512bw -mavx512dq"; X2="-mavx2 -mfma -mf16c"
//   # one object per build and ISA: the .inc of that tree in namespace <name>
//   for v in a:/work/main b:$PWD; do n=${v%%:*}; t=${v#*:}
//     printf '#define OTFUSE_ISA_NAMESPACE %s\n#include "%s/kernels/cpu/attention_tiles.inc"\n' v512_$n $t > /tmp/v512_$n.cc
//     printf '#define OTFUSE_ISA_NAMESPACE %s\n#include "%s/kernels/cpu/attention_tiles.inc"\n' v2_$n $t > /tmp/v2_$n.cc
//     g++ $F $X5 -c /tmp/v512_$n.cc -o /tmp/v512_$n.o; g++ $F $X2 -c /tmp/v2_$n.cc -o /tmp/v2_$n.o; done
//   g++ $F -pthread bench/decode_probe.cc /tmp/v512_a.o /tmp/v512_b.o /tmp/v2_a.o /tmp/v2_b.o -o /tmp/decode_probe
//   /tmp/decode_probe ISA TYPE LAYERS ROUNDS [THREADS]    # e.g. avx512 fp16 32 20: main (a) vs this tree (b)
//
// With -DFOUR_VARIANTS two more objects (namespaces v512_c, v512_d, v2_c, v2_d) are linked and
// timed too (e.g. builds with different -D knobs). Environment: CPU=1 times process CPU instead
// of wall (with THREADS 1: no spinning pool in it); HUGE=1 puts the caches on transparent huge
// pages (numpy's large arrays get them, so the bench's caches may); PAST=keys; SPLIT_TASKS=16 or
// a list, one per variant ("16,32": a with 16 tasks, b with 32).
// Prints per variant the best and median ms per call and the median over turns of a's time /
// each other's. Keep runs short and under the bench lock. Not part of the build or the tests.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>
#include <sys/mman.h>
#include "common/float_types.h"
#include "cpu/attention_tiles.h"
using namespace otfuse;
using namespace otfuse::cpu;

namespace otfuse::cpu {
#define DECLARE_VARIANT(ns) \
  namespace ns {            \
  template <typename T>     \
  AttentionFns<T> AttentionFunctions(); \
  }
DECLARE_VARIANT(v512_a)
DECLARE_VARIANT(v512_b)
DECLARE_VARIANT(v2_a)
DECLARE_VARIANT(v2_b)
#ifdef FOUR_VARIANTS
DECLARE_VARIANT(v512_c)
DECLARE_VARIANT(v512_d)
DECLARE_VARIANT(v2_c)
DECLARE_VARIANT(v2_d)
#endif
}  // namespace otfuse::cpu

template <typename T> T Conv(float x);
template <> float Conv<float>(float x) { return x; }
template <> Float16 Conv<Float16>(float x) { return FromFloat<Float16>(x); }

#include <ctime>
static bool g_cpu_time = getenv("CPU") && atoi(getenv("CPU"));
static double Seconds() {
  if (g_cpu_time) {  // CPU=1: the process's CPU time (with THREADS 1: no spinning pool in it)
    timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The op's task loop on `threads` threads: a persistent pool spinning on a generation counter,
// as ORT's spinning pool does; the calling thread takes tasks too.
class Pool {
 public:
  explicit Pool(int threads) {
    for (int t = 1; t < threads; ++t) workers_.emplace_back([this] { Work(); });
  }
  ~Pool() {
    stop_ = true;
    generation_.fetch_add(1);
    for (auto& w : workers_) w.join();
  }
  template <typename Fn>
  void Run(int64_t tasks, const Fn& fn) {
    fn_ = [&fn](int64_t t) { fn(t); };
    tasks_ = tasks;
    next_.store(0);
    done_.store(0);
    generation_.fetch_add(1, std::memory_order_release);
    Take();
    while (done_.load(std::memory_order_acquire) < tasks_) {
    }
  }

 private:
  void Take() {
    for (int64_t t; (t = next_.fetch_add(1)) < tasks_;) {
      fn_(t);
      done_.fetch_add(1, std::memory_order_release);
    }
  }
  void Work() {
    int64_t seen = generation_.load();
    while (!stop_) {
      const int64_t now = generation_.load(std::memory_order_acquire);
      if (now == seen) continue;
      seen = now;
      if (!stop_) Take();
    }
  }
  std::vector<std::thread> workers_;
  std::function<void(int64_t)> fn_;
  std::atomic<int64_t> generation_{0}, next_{0}, done_{0};
  int64_t tasks_ = 0;
  std::atomic<bool> stop_{false};
};

template <typename T>
int Run(const std::string& isa, int64_t layers, int rounds, int threads) {
  const int64_t D = 128, nq = 32, nkv = 8, past = getenv("PAST") ? atol(getenv("PAST")) : 4096, skv = past + 1;
  std::vector<std::pair<const char*, AttentionFns<T>>> variants;
  if (isa == "avx512") {
    variants = {{"a", v512_a::AttentionFunctions<T>()}, {"b", v512_b::AttentionFunctions<T>()}};
#ifdef FOUR_VARIANTS
    variants.push_back({"c", v512_c::AttentionFunctions<T>()});
    variants.push_back({"d", v512_d::AttentionFunctions<T>()});
#endif
  } else {
    variants = {{"a", v2_a::AttentionFunctions<T>()}, {"b", v2_b::AttentionFunctions<T>()}};
#ifdef FOUR_VARIANTS
    variants.push_back({"c", v2_c::AttentionFunctions<T>()});
    variants.push_back({"d", v2_d::AttentionFunctions<T>()});
#endif
  }
  const size_t rows = static_cast<size_t>(nkv * past * D);
  auto big = [](size_t n) {  // huge pages when HUGE=1 (numpy madvises its large arrays)
    const size_t bytes = (n * sizeof(T) + (2 << 20)) & ~size_t((2 << 20) - 1);
    T* p = static_cast<T*>(aligned_alloc(2 << 20, bytes));
    if (getenv("HUGE") && atoi(getenv("HUGE"))) madvise(p, bytes, MADV_HUGEPAGE);
    return p;
  };
  std::vector<T*> kp(layers), vp(layers);
  srand(1);
  auto rnd = [] { return (rand() / (float)RAND_MAX) * 2 - 1; };
  for (int64_t l = 0; l < layers; ++l) {
    kp[l] = big(rows);
    vp[l] = big(rows);
    for (size_t i = 0; i < rows; ++i) {
      kp[l][i] = Conv<T>(rnd());
      vp[l][i] = Conv<T>(rnd());
    }
  }
  std::vector<T> q(nq * D), kn(nkv * D), vn(nkv * D), y(nq * D);
  for (auto& x : q) x = Conv<T>(rnd());
  for (auto& x : kn) x = Conv<T>(rnd());
  for (auto& x : vn) x = Conv<T>(rnd());
  AttentionJob<T> job{};
  job.batch = 1; job.q_heads = nq; job.kv_heads = nkv; job.group = nq / nkv; job.sq = 1; job.skv = skv;
  job.d = D; job.dv = D; job.causal_offset = skv - 1; job.causal = true; job.scale = 1.0f / std::sqrt((float)D);
  job.q = q.data(); job.q_sb = nq * D; job.q_sh = D; job.q_ss = D;
  job.k_past_len = job.v_past_len = past;
  job.k_new = kn.data(); job.k_sb = nkv * D; job.k_sh = D; job.k_ss = D;
  job.v_new = vn.data(); job.v_sb = nkv * D; job.v_sh = D; job.v_ss = D;
  job.y = y.data(); job.y_sb = nq * D; job.y_sh = D; job.y_ss = D;
  job.block_q = 64; job.block_kv = 128; job.kv_tiles = (skv + 127) / 128; job.dv_padded = D;
  job.k_tile_floats = job.v_tile_floats = 128 * D;
  // PlanKeySplits (attention.cc): up to 16 tasks, at least 4 tiles a split. SPLIT_TASKS=16 or a
  // list, one per variant (e.g. "16,32,16,32": variants a-d with those task counts).
  struct Plan {
    int64_t splits, split_tiles;
  };
  std::vector<Plan> plans;
  const char* list = getenv("SPLIT_TASKS") ? getenv("SPLIT_TASKS") : "16";
  for (size_t v = 0; v < variants.size(); ++v) {
    const int64_t split_tasks = atol(list);
    if (const char* comma = strchr(list, ',')) list = comma + 1;
    int64_t splits = std::max<int64_t>(1, std::min((split_tasks + nkv - 1) / nkv, job.kv_tiles / 4));
    const int64_t split_tiles = (job.kv_tiles + splits - 1) / splits;
    plans.push_back({(job.kv_tiles + split_tiles - 1) / split_tiles, split_tiles});
  }
  std::vector<float> partials(nq * job.kv_tiles * PartialFloats(job));
  Pool pool(threads);
  std::vector<std::vector<float>> scratch(threads * 64);
  std::atomic<int> slot{0};
  thread_local int my_slot = -1;
  auto call = [&](const AttentionFns<T>& fns, const Plan& plan, int64_t l) {
    job.k_past = kp[l]; job.v_past = vp[l];
    const int64_t splits = plan.splits;
    job.partials = splits > 1 ? partials.data() : nullptr;
    job.kv_splits = splits;
    job.kv_split0 = 0;
    job.kv_split_len = plan.split_tiles * job.block_kv;
    std::unique_ptr<std::atomic<int64_t>[]> finished(new std::atomic<int64_t>[nkv]());
    pool.Run(nkv * splits, [&](int64_t task) {
      if (my_slot < 0) my_slot = slot.fetch_add(1);
      auto& sc = scratch[my_slot];
      if (sc.empty()) sc.resize(AttendScratchFloats(job) + 64);
      const int64_t g = task / splits, split = task % splits;
      fns.attend(job, 0, g * job.group, job.group, 0, 1, split, sc.data());
      if (splits > 1 && finished[g].fetch_add(1) == splits - 1) fns.combine_splits(job, 0, g * job.group, job.group, 0, 1, sc.data());
    });
  };
  std::vector<std::vector<double>> times(variants.size());
  std::vector<uint64_t> hashes(variants.size());
  for (int round = -1; round < rounds; ++round) {
    for (size_t v = 0; v < variants.size(); ++v) {
      const double t0 = Seconds();
      for (int64_t l = 0; l < layers; ++l) call(variants[v].second, plans[v], l);
      const double t = (Seconds() - t0) / layers;
      if (round >= 0) times[v].push_back(t);
      uint64_t h = 1469598103934665603ull;
      const unsigned char* yb = reinterpret_cast<const unsigned char*>(y.data());
      for (size_t i = 0; i < y.size() * sizeof(T); ++i) h = (h ^ yb[i]) * 1099511628211ull;
      hashes[v] = h;
    }
  }
  const double bytes = 2.0 * nkv * skv * D * sizeof(T);
  printf("%s %s past %ld, %ld layer(s), %d threads, %d rounds\n", isa.c_str(), std::is_same_v<T, float> ? "fp32" : "fp16",
         (long)past, (long)layers, threads, rounds);
  for (size_t v = 0; v < variants.size(); ++v) {
    std::vector<double> t = times[v];
    std::sort(t.begin(), t.end());
    printf("  %s (%ld splits): best %.3f ms (%.1f GB/s), median %.3f ms (%.1f GB/s)  hash %016llx\n", variants[v].first, (long)plans[v].splits, t[0] * 1e3,
           bytes / t[0] * 1e-9, t[t.size() / 2] * 1e3, bytes / t[t.size() / 2] * 1e-9, (unsigned long long)hashes[v]);
  }
  for (size_t v = 1; v < variants.size(); ++v) {
    std::vector<double> ratio;
    for (int r = 0; r < rounds; ++r) ratio.push_back(times[0][r] / times[v][r]);
    std::sort(ratio.begin(), ratio.end());
    printf("  a / %s per turn: median %.3f (quartiles %.3f %.3f)\n", variants[v].first, ratio[ratio.size() / 2],
           ratio[ratio.size() / 4], ratio[3 * ratio.size() / 4]);
  }
  return 0;
}

int main(int argc, char** argv) {
  const std::string isa = argc > 1 ? argv[1] : "avx512";
  const std::string type = argc > 2 ? argv[2] : "fp16";
  const int64_t layers = argc > 3 ? atol(argv[3]) : 32;
  const int rounds = argc > 4 ? atoi(argv[4]) : 20;
  const int threads = argc > 5 ? atoi(argv[5]) : 2;
  if (type == "fp32") return Run<float>(isa, layers, rounds, threads);
  return Run<Float16>(isa, layers, rounds, threads);
}
