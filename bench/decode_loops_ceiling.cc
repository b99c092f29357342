// The ceiling of the decode op's fp16 inner loops on this core (bench/README.md, "Decode and
// norm_linear, session 25"): the shapes of the AVX-512 direct path's Scores4x4 (4 query rows x 4
// keys, D = 128, sums across lanes at the end) and PvRows512Pass (4 rows, 64 value lanes per pass),
// written out here with their operands in L1 / L2, so that no memory latency enters. Also what one
// vcvtph2ps costs beside FMAs (AVX-512 widening takes FMA-port slots). K/V bytes per ns of the
// loops alone, one thread: twice that is what two cores could read at most with these loops, the
// figure the decode op's hot cache (`attention_paths.py`, "decode 32:8 fp16") is compared with.
//
//   g++ -O3 -march=native -std=c++17 bench/decode_loops_ceiling.cc -o /tmp/decode_loops_ceiling
//   /work/coord/quiet_run.sh /tmp/decode_loops_ceiling [KEYS]     # 64: K in L1; 1024: in L2
//   (two copies at once: whether two cores keep the rate)
#include <immintrin.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

constexpr int kD = 128;

// Lane i = the sum of v[i]'s 16 lanes (as attention_tiles/input_rows.inc's SumLanes16).
__m512 SumLanes16(const __m512* v) {
  __m512 w[8], x[4], z[2];
  for (int m = 0; m < 8; ++m) {
    w[m] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * m], v[2 * m + 1]), _mm512_unpackhi_ps(v[2 * m], v[2 * m + 1]));
  }
  for (int g = 0; g < 4; ++g) {
    x[g] = _mm512_add_ps(_mm512_shuffle_ps(w[2 * g], w[2 * g + 1], 0x44), _mm512_shuffle_ps(w[2 * g], w[2 * g + 1], 0xEE));
  }
  for (int h = 0; h < 2; ++h) {
    z[h] = _mm512_add_ps(_mm512_shuffle_f32x4(x[2 * h], x[2 * h + 1], 0x88),
                         _mm512_shuffle_f32x4(x[2 * h], x[2 * h + 1], 0xDD));
  }
  return _mm512_add_ps(_mm512_shuffle_f32x4(z[0], z[1], 0x88), _mm512_shuffle_f32x4(z[0], z[1], 0xDD));
}

__m512 Widen(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }

// Scores of 4 query rows against `keys` float16 key rows, 4 keys at a time.
__attribute__((noinline)) void Scores(const float* q, const uint16_t* k, int64_t keys, float* s) {
  for (int64_t j = 0; j < keys; j += 4) {
    __m512 acc[16];
    for (auto& a : acc) a = _mm512_setzero_ps();
    const uint16_t* kr = k + j * kD;
#pragma GCC unroll 8
    for (int c = 0; c < kD; c += 16) {
      __m512 kv[4];
      for (int kk = 0; kk < 4; ++kk) kv[kk] = Widen(kr + kk * kD + c);
      for (int r = 0; r < 4; ++r) {
        const __m512 qv = _mm512_loadu_ps(q + r * kD + c);
        for (int kk = 0; kk < 4; ++kk) acc[r * 4 + kk] = _mm512_fmadd_ps(qv, kv[kk], acc[r * 4 + kk]);
      }
    }
    _mm512_storeu_ps(s + j * 4, SumLanes16(acc));
  }
}

// O[4][kD] += P[4][keys] . V[keys][kD], float16 values, 64 lanes per pass over the keys.
__attribute__((noinline)) void Pv(const float* p, const uint16_t* v, int64_t keys, float* o) {
  for (int c0 = 0; c0 < kD; c0 += 64) {
    __m512 acc[4][4];
    for (int r = 0; r < 4; ++r) {
      for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_loadu_ps(o + r * kD + c0 + 16 * c);
    }
#pragma GCC unroll 2
    for (int64_t j = 0; j < keys; ++j) {
      __m512 vv[4];
      for (int c = 0; c < 4; ++c) vv[c] = Widen(v + j * kD + c0 + 16 * c);
      for (int r = 0; r < 4; ++r) {
        const __m512 a = _mm512_set1_ps(p[r * keys + j]);
        for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_fmadd_ps(a, vv[c], acc[r][c]);
      }
    }
    for (int r = 0; r < 4; ++r) {
      for (int c = 0; c < 4; ++c) _mm512_storeu_ps(o + r * kD + c0 + 16 * c, acc[r][c]);
    }
  }
}

// 16 independent FMAs per turn (the clock: 2 per cycle), with or without 4 widenings beside them.
__attribute__((noinline)) __m512 FmaTurns(const uint16_t* k, int64_t turns, bool widen) {
  __m512 acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512 q = _mm512_set1_ps(1.0001f);
  __m512 kv[4] = {_mm512_set1_ps(1), _mm512_set1_ps(2), _mm512_set1_ps(3), _mm512_set1_ps(4)};
  for (int64_t i = 0; i < turns; ++i) {
    if (widen) {
      for (int c = 0; c < 4; ++c) kv[c] = Widen(k + (i & 63) * 64 + 16 * c);
    } else {
      asm volatile("" : "+v"(kv[0]), "+v"(kv[1]), "+v"(kv[2]), "+v"(kv[3]));
    }
    for (int r = 0; r < 4; ++r) {
      for (int c = 0; c < 4; ++c) acc[r * 4 + c] = _mm512_fmadd_ps(q, kv[c], acc[r * 4 + c]);
    }
  }
  __m512 sum = acc[0];
  for (int i = 1; i < 16; ++i) sum = _mm512_add_ps(sum, acc[i]);
  return sum;
}

template <typename Fn>
double NsPerCall(Fn&& fn, int64_t calls) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < calls; ++i) fn();
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / calls;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t keys = argc > 1 ? std::atoll(argv[1]) : 64;
  if (keys < 4 || keys % 4 != 0) {
    std::fprintf(stderr, "KEYS must be a positive multiple of 4\n");
    return 2;
  }
  std::vector<uint16_t> kv(keys * kD, 0x3c00);  // 1.0 in float16
  std::vector<float> q(4 * kD, 0.01f), s(keys * 4), p(4 * keys, 0.001f), o(4 * kD);
  const int64_t calls = std::max<int64_t>(1, static_cast<int64_t>(4e8) / (keys * kD * 4));
  const int64_t turns = 50000000;
  volatile float sink = 0;
  for (int round = 0; round < 3; ++round) {
    const double fma_ns = NsPerCall([&] { sink = sink + _mm512_reduce_add_ps(FmaTurns(kv.data(), turns, false)); }, 1);
    const double widen_ns = NsPerCall([&] { sink = sink + _mm512_reduce_add_ps(FmaTurns(kv.data(), turns, true)); }, 1);
    const double cycle_ns = fma_ns / turns / 8;  // 16 FMAs at 2 per cycle
    const double scores_ns = NsPerCall([&] { Scores(q.data(), kv.data(), keys, s.data()); }, calls) / (keys / 4);
    const double pv_ns = NsPerCall([&] { Pv(p.data(), kv.data(), keys, o.data()); }, calls) / (keys / 4);
    const double block_bytes = 4.0 * kD * 2;  // 4 keys' K (or V) rows, float16
    std::printf(
        "keys %lld: clock %.2f GHz (2 FMAs / cycle); 16 FMAs + 4 widenings %.1f cycles (8: widening free, 12: two FMA-port "
        "slots each); per 4 keys: scores %.1f ns (%.1f GB/s of K), P.V %.1f ns (%.1f GB/s of V); K and V together "
        "%.1f GB/s per core\n",
        static_cast<long long>(keys), 1 / cycle_ns, widen_ns / turns / cycle_ns, scores_ns, block_bytes / scores_ns,
        pv_ns, block_bytes / pv_ns, 2 * block_bytes / (scores_ns + pv_ns));
  }
  return sink == 12345.0f ? 1 : 0;
}
