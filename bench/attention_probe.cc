// One-thread probe of the attention tile phases (bench/README.md, "Session 8"): links the tile
// kernels of kernels/cpu/attention_tiles_*.cc directly, fills an AttentionJob, packs and attends
// on one thread and prints the best thread-CPU time of each phase, the useful GFLOP/s, the K/V
// bytes per second and a hash of Y (equal hashes: bit-identical outputs across builds).
//
//   I="-Ikernels -isystem $(grep -o '/[^ ]*ort-headers/[^ ]*' build/dev/build.ninja | head -1)"
//   F="-O3 -DNDEBUG -ffp-contract=off -fno-math-errno -std=c++17 $I"
//   g++ $F -c kernels/cpu/attention_tiles_baseline.cc -o /tmp/b.o
//   g++ $F -mavx2 -mfma -mf16c -c kernels/cpu/attention_tiles_avx2.cc -o /tmp/a2.o
//   g++ $F -mavx2 -mfma -mf16c -mavx512f -mavx512vl -mavx512bw -mavx512dq -c
//       kernels/cpu/attention_tiles_avx512.cc -o /tmp/a5.o
//   g++ $F bench/attention_probe.cc /tmp/b.o /tmp/a2.o /tmp/a5.o -o /tmp/attention_probe
//   /tmp/attention_probe ISA MODE TYPE S REPS     # e.g. avx512 decode fp16 4096 150
//
// ISA: avx512, avx2, baseline. MODE: decode (one query, 32:8 heads over a past of S keys, the
// direct path), causal, window (S/4), softcap (50), alibi (causal), bias ([1, 1, 1, S], dense), cache (S/4 new rows over 3S/4 past), gqa
// (16:4, causal), dense (not causal), padding (dense, the last S/4 keys padded out by an int64
// mask), kept (dense over 3S/4 keys: padding's visible work); 16 heads x 128 otherwise. TYPE: fp32, fp16. BQ=rows sets the query tile,
// BKV=keys the key tile. HUGE=1 puts the past K/V on transparent huge pages. DESC=1 runs a head's query tiles
// last first (the op's order); INTERLEAVE=1 packs each kv head's tiles just before its query heads' tasks
// (reported as attend time, pack 0); LAZY=1 packs each tile in the first task that reads it (the op's
// default since session 9; attend time, pack 0). Keep runs short and under the bench lock.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <vector>
#include <string>
#include <algorithm>
#include <sys/mman.h>
#include "common/float_types.h"
#include "cpu/attention_tiles.h"
using namespace otfuse;
using namespace otfuse::cpu;

static double Now() { timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }

template <typename T> T Conv(float x);
template <> float Conv<float>(float x) { return x; }
template <> Float16 Conv<Float16>(float x) { return FromFloat<Float16>(x); }
template <> BFloat16 Conv<BFloat16>(float x) { return FromFloat<BFloat16>(x); }

template <typename T>
AttentionFns<T> Fns(const char* isa) {
  if (!strcmp(isa, "avx512")) return avx512::AttentionFunctions<T>();
  if (!strcmp(isa, "avx2")) return avx2::AttentionFunctions<T>();
  return baseline::AttentionFunctions<T>();
}

// mode: "decode" (sq=1 over past P, heads 32:8), "causal" (S, 16 heads), "window", "softcap", "cache"
template <typename T>
int Run(const char* isa, const std::string& mode, int64_t S, int reps) {
  const int64_t D = 128;
  bool decode = mode == "decode";
  int64_t nq = decode ? 32 : 16, nkv = decode ? 8 : 16;
  if (mode == "gqa") nkv = 4;
  int64_t sq, past, fresh;
  if (decode) { sq = 1; past = S; fresh = 1; }
  else if (mode == "cache") { sq = S / 4; past = S - sq; fresh = sq; }
  else if (mode == "kept") { sq = S; past = 0; fresh = S - S / 4; }  // dense over padding's kept keys
  else { sq = S; past = 0; fresh = S; }
  int64_t skv = past + fresh;
  std::vector<T> q(nq * sq * D), kn(nkv * fresh * D), vn(nkv * fresh * D), y(nq * sq * D);
  auto big = [](size_t n) {
    size_t bytes = (n * sizeof(T) + (2 << 20)) & ~size_t((2 << 20) - 1);
    T* p = static_cast<T*>(aligned_alloc(2 << 20, bytes));
    if (getenv("HUGE")) madvise(p, bytes, MADV_HUGEPAGE);
    memset((void*)p, 0, bytes);
    return p;
  };
  size_t npast = nkv * past * D + 1;
  T* kp = big(npast); T* vp = big(npast);
  srand(1);
  auto rnd = [] { return (rand() / (float)RAND_MAX) * 2 - 1; };
  for (auto& x : q) x = Conv<T>(rnd());
  for (size_t i = 0; i < npast; ++i) {
    kp[i] = Conv<T>(rnd());
    vp[i] = Conv<T>(rnd());
  }
  for (auto& x : kn) x = Conv<T>(rnd());
  for (auto& x : vn) x = Conv<T>(rnd());
  AttentionJob<T> job{};
  job.batch = 1; job.q_heads = nq; job.kv_heads = nkv; job.group = nq / nkv; job.sq = sq; job.skv = skv; job.d = D; job.dv = D;
  job.causal_offset = skv - sq; job.causal = mode != "dense" && mode != "padding" && mode != "kept"; job.window = mode == "window" ? S / 4 : 0;
  job.scale = 1.0f / std::sqrt((float)D); job.softcap = mode == "softcap" ? 50.0f : 0.0f;
  std::vector<float> slopes(nq), bias_row(skv);
  for (int64_t h = 0; h < nq; ++h) slopes[h] = std::pow(2.0f, -8.0f * (h + 1) / nq);
  for (auto& x : bias_row) x = 0.5f * rnd();
  if (mode == "alibi") job.alibi_slopes = slopes.data();
  std::vector<int64_t> key_mask(skv, 1);
  const int64_t keep = mode == "padding" ? skv - skv / 4 : skv;  // "padding": the last S/4 keys padded out
  if (mode == "padding") {
    std::fill(key_mask.begin() + keep, key_mask.end(), 0);
    job.key_mask = key_mask.data(); job.key_mask_type = MaskType::kInt64;
  }
  if (mode == "bias") {  // a BERT bias [1, 1, 1, S], not causal
    job.causal = false; job.bias = bias_row.data(); job.bias_is_float = true; job.bias_sj = 1;
  }
  job.q = q.data(); job.q_sb = nq * sq * D; job.q_sh = sq * D; job.q_ss = D;
  job.k_past = past ? kp : nullptr; job.v_past = past ? vp : nullptr; job.k_past_len = job.v_past_len = past;
  job.k_new = kn.data(); job.k_sb = nkv * fresh * D; job.k_sh = fresh * D; job.k_ss = D;
  job.v_new = vn.data(); job.v_sb = nkv * fresh * D; job.v_sh = fresh * D; job.v_ss = D;
  job.y = y.data(); job.y_sb = nq * sq * D; job.y_sh = sq * D; job.y_ss = D;
  job.block_q = getenv("BQ") ? atol(getenv("BQ")) : 64; job.block_kv = getenv("BKV") ? atol(getenv("BKV")) : 128; job.kv_tiles = (skv + job.block_kv - 1) / job.block_kv; job.dv_padded = D;
  job.k_tile_floats = job.block_kv * D; job.v_tile_floats = job.block_kv * D;
  AttentionFns<T> fns = Fns<T>(isa);
  std::vector<float> packed;
  bool packed_path = sq >= 8;
  bool pack_values = !std::is_same_v<T, float>;
  if (packed_path) {
    packed.resize(nkv * job.kv_tiles * (job.k_tile_floats + (pack_values ? job.v_tile_floats : 0)));
    job.k_packed = packed.data();
    job.v_packed = pack_values ? packed.data() + nkv * job.kv_tiles * job.k_tile_floats : nullptr;
  }
  std::vector<float> scratch(AttendScratchFloats(job) + 64);
  double best = 1e9, best_pack = 1e9;
  for (int rep = 0; rep < reps; ++rep) {
    double t0 = Now();
    if (packed_path && getenv("INTERLEAVE")) {  // pack a kv head's tiles, then attend its query heads
      int64_t first_key = job.window > 0 ? std::max<int64_t>(0, job.causal_offset - job.window + 1) : 0;
      int64_t BQv = job.block_q, q_tiles = (sq + BQv - 1) / BQv;
      for (int64_t g = 0; g < nkv; ++g) {
        for (int64_t t = first_key / 128; t < job.kv_tiles; ++t) fns.pack_kv(job, 0, g, t, scratch.data());
        for (int64_t h = g * job.group; h < (g + 1) * job.group; ++h)
          for (int64_t qt = q_tiles - 1; qt >= 0; --qt)
            fns.attend(job, 0, h, 1, qt * BQv, std::min<int64_t>(BQv, sq - qt * BQv), 0, scratch.data());
      }
      double t2 = Now();
      best = std::min(best, t2 - t0); best_pack = 0;
      continue;
    }
    if (packed_path && !getenv("LAZY")) {
      int64_t first_key = job.window > 0 ? std::max<int64_t>(0, job.causal_offset - job.window + 1) : 0;
      for (int64_t g = 0; g < nkv; ++g)
        for (int64_t t = first_key / 128; t < job.kv_tiles; ++t) fns.pack_kv(job, 0, g, t, scratch.data());
    }
    double t1 = Now();
    std::vector<int32_t> states;
    if (packed_path && getenv("LAZY")) {  // each tile packed by the first task that reads it (timed as attend)
      states.assign(nkv * job.kv_tiles, 0);
      job.pack_state = states.data();
      t0 = t1 = Now();
    }
    if (packed_path) {
      int64_t BQv = job.block_q; int64_t q_tiles = (sq + BQv - 1) / BQv;
      for (int64_t h = 0; h < nq; ++h)
        for (int64_t step = 0; step < q_tiles; ++step) {
          int64_t i0 = (getenv("DESC") ? q_tiles - 1 - step : step) * BQv;  // DESC=1: the op's order
          fns.attend(job, 0, h, 1, i0, std::min<int64_t>(BQv, sq - i0), 0, scratch.data());
        }
    } else {
      for (int64_t g = 0; g < nkv; ++g) fns.attend(job, 0, g * job.group, job.group, 0, sq, 0, scratch.data());
    }
    double t2 = Now();
    best = std::min(best, t2 - t1); best_pack = std::min(best_pack, t1 - t0);
  }
  // useful flops
  double pairs = 0;
  for (int64_t i = 0; i < sq; ++i) {
    int64_t t = skv - sq + i; int64_t hi = std::min(job.causal ? t + 1 : skv, keep); int64_t lo = job.window ? std::max<int64_t>(0, t - job.window + 1) : 0;
    pairs += hi - lo;
  }
  double flops = 4.0 * D * nq * pairs;
  double bytes = 2.0 * nkv * skv * D * sizeof(T);
  double chk = 0; for (auto& x : y) chk += ToFloat(x);
  { uint64_t hsh = 1469598103934665603ull; const unsigned char* yb = (const unsigned char*)y.data();
    for (size_t i = 0; i < y.size() * sizeof(T); ++i) { hsh ^= yb[i]; hsh *= 1099511628211ull; } chk = (double)(hsh % 1000000007ull); }
  printf("%-7s %-8s %-5s S=%-6ld attend %.3f ms (%.1f GFLOP/s, %.1f GB/s)  pack %.3f ms  total %.1f GFLOP/s  hash %.0f\n", isa, mode.c_str(),
         std::is_same_v<T, float> ? "fp32" : "fp16", (long)S, best * 1e3, flops / best * 1e-9, bytes / best * 1e-9, best_pack * 1e3,
         flops / (best + best_pack) * 1e-9, chk);
  free(kp);
  free(vp);
  return 0;
}

int main(int argc, char** argv) {
  const char* isa = argc > 1 ? argv[1] : "avx512";
  std::string mode = argc > 2 ? argv[2] : "decode";
  std::string type = argc > 3 ? argv[3] : "fp16";
  int64_t S = argc > 4 ? atol(argv[4]) : 4096;
  int reps = argc > 5 ? atoi(argv[5]) : 50;
  if (type == "fp32") return Run<float>(isa, mode, S, reps);
  return Run<Float16>(isa, mode, S, reps);
}
