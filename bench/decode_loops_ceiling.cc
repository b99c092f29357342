// The ceiling of the decode op's fp16 inner loops on this core (bench/README.md, "Decode and
// norm_linear, session 25"): the shapes of the AVX-512 direct path's Scores4x4 (4 query rows x 4
// keys, D = 128, sums across lanes at the end) and PvRows512Pass (4 rows, 64 value lanes per pass),
// written out here with their operands in L1 / L2, so that no memory latency enters. Also what one
// vcvtph2ps costs beside FMAs (AVX-512 widening takes FMA-port slots). K/V bytes per ns of the
// loops alone, one thread: twice that is what two cores could read at most with these loops, the
// figure the decode op's hot cache (`attention_paths.py`, "decode 32:8 fp16") is compared with.
//
//
// --stream THREADS (session 26): the same two loops streaming a decode step's K/V instead, 8 kv
// heads x KEYS keys of float16 (16.8 MB at 4096: L3 on the Emerald Rapids host, hot from the
// previous pass), in the op's tasks (a kv head's half of the keys, claimed in turn by THREADS
// threads) and tiles (the scores of 128 keys, then their P·V), with no softmax, no software
// prefetch and no thread pool; beside it a plain read of the same bytes, same threads and tasks.
// Their ratio is what the op could reach at most against the bench's L3-sized read.
// Session 29 adds a third pass, the same loops pipelined: the scores of tile t + 1, 16 keys at a
// time, beside the P·V of tile t, so that the K and V streams run at once instead of in turn
// (whether the order of the op's tiles, not its loops, holds it under the goal).
//
//   g++ -O3 -march=native -std=c++17 -pthread bench/decode_loops_ceiling.cc -o /tmp/decode_loops_ceiling
//   /work/coord/quiet_run.sh /tmp/decode_loops_ceiling [KEYS]     # 64: K in L1; 1024: in L2
//   (two copies at once: whether two cores keep the rate)
//   /work/coord/quiet_run.sh /tmp/decode_loops_ceiling 4096 --stream 2
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
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

// Sums the lines of [p, p + bytes): a plain read.
__m512 ReadLines(const char* p, int64_t bytes, __m512 acc) {
  for (int64_t at = 0; at < bytes; at += 64) acc = _mm512_add_ps(acc, _mm512_load_ps(reinterpret_cast<const float*>(p + at)));
  return acc;
}

enum class Pass { kRead, kTiles, kPipelined };

// Keys of tile t + 1 scored per P·V step of tile t in a pipelined pass.
constexpr int64_t kPipelineKeys = 16;

// --stream: best and median GB/s of the loops over the K/V of 8 kv heads (tile after tile, and
// pipelined), and of a plain read of it, in alternating passes (the host's speed drifts: each
// ratio compares neighbours).
int Stream(int64_t keys, int threads) {
  constexpr int kHeads = 8, kTile = 128, kTasks = 2 * kHeads, kPasses = 41;
  const size_t elements = static_cast<size_t>(kHeads) * keys * kD;
  uint16_t* k = static_cast<uint16_t*>(std::aligned_alloc(64, elements * 2));
  uint16_t* v = static_cast<uint16_t*>(std::aligned_alloc(64, elements * 2));
  if (k == nullptr || v == nullptr) return 1;
  for (size_t i = 0; i < elements; ++i) k[i] = v[i] = 0x3c00;
  const auto pass = [&](Pass kind) {
    std::atomic<int> next{0};
    const auto work = [&] {
      std::vector<float> q(4 * kD, 0.01f), s(kTile * 4), p(4 * kTile, 0.001f), o(4 * kD);
      __m512 acc = _mm512_setzero_ps();
      for (int task; (task = next.fetch_add(1)) < kTasks;) {
        const int64_t head = task / 2, begin = task % 2 * keys / 2, end = begin + keys / 2;
        for (int64_t t = begin; t < end; t += kTile) {
          const int64_t n = std::min<int64_t>(kTile, end - t);
          const uint16_t* kt = k + (head * keys + t) * kD;
          const uint16_t* vt = v + (head * keys + t) * kD;
          if (kind == Pass::kTiles) {
            Scores(q.data(), kt, n, s.data());
            Pv(p.data(), vt, n, o.data());
          } else if (kind == Pass::kPipelined) {
            if (t == begin) Scores(q.data(), kt, n, s.data());
            const int64_t next = std::min<int64_t>(kTile, end - t - n);  // keys of tile t + 1
            for (int64_t c = 0; c < n; c += kPipelineKeys) {
              const int64_t step = std::min<int64_t>(kPipelineKeys, n - c);
              if (c < next) Scores(q.data(), kt + (n + c) * kD, std::min<int64_t>(kPipelineKeys, next - c), s.data());
              Pv(p.data() + c, vt + c * kD, step, o.data());
            }
          } else {
            acc = ReadLines(reinterpret_cast<const char*>(kt), n * kD * 2, acc);
            acc = ReadLines(reinterpret_cast<const char*>(vt), n * kD * 2, acc);
          }
        }
      }
      volatile float sink = _mm512_reduce_add_ps(acc) + o[0];
      (void)sink;
    };
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> others;
    for (int i = 1; i < threads; ++i) others.emplace_back(work);
    work();
    for (auto& t : others) t.join();
    return 2.0 * elements * 2 / std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  };
  std::vector<double> loop_rates, pipe_rates, read_rates, ratios, pipe_ratios;
  for (int i = 0; i < kPasses; ++i) {
    loop_rates.push_back(pass(Pass::kTiles));
    read_rates.push_back(pass(Pass::kRead));
    pipe_rates.push_back(pass(Pass::kPipelined));
    ratios.push_back(loop_rates.back() / read_rates.back());
    pipe_ratios.push_back(pipe_rates.back() / read_rates.back());
  }
  for (auto* rates : {&loop_rates, &pipe_rates, &read_rates, &ratios, &pipe_ratios}) std::sort(rates->begin(), rates->end());
  std::printf("stream, %d thread(s), %lld keys x 8 kv heads (%.1f MB of K/V): a plain read best %.1f median %.1f GB/s\n",
              threads, static_cast<long long>(keys), 4e-6 * elements, read_rates.back(), read_rates[kPasses / 2]);
  std::printf("  the loops tile after tile: best %.1f median %.1f GB/s; / read per pair: median %.2f (quartiles %.2f-%.2f)\n",
              loop_rates.back(), loop_rates[kPasses / 2], ratios[kPasses / 2], ratios[kPasses / 4], ratios[3 * kPasses / 4]);
  std::printf("  the loops pipelined:       best %.1f median %.1f GB/s; / read per pair: median %.2f (quartiles %.2f-%.2f)\n",
              pipe_rates.back(), pipe_rates[kPasses / 2], pipe_ratios[kPasses / 2], pipe_ratios[kPasses / 4],
              pipe_ratios[3 * kPasses / 4]);
  std::free(k);
  std::free(v);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t keys = argc > 1 ? std::atoll(argv[1]) : 64;
  if (keys < 4 || keys % 4 != 0) {
    std::fprintf(stderr, "KEYS must be a positive multiple of 4\n");
    return 2;
  }
  if (argc > 3 && std::strcmp(argv[2], "--stream") == 0) {
    const int threads = std::atoi(argv[3]);
    if (threads < 1 || threads > 64 || keys % 256 != 0) {
      std::fprintf(stderr, "--stream THREADS (1-64) wants KEYS a multiple of 256\n");
      return 2;
    }
    return Stream(keys, threads);
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
