// The FMA peak of this machine, per vector width the CPU has: every thread runs independent FMA
// chains held in named registers, as many as the register file allows (14 ymm of AVX2's 16, 28
// zmm of AVX-512's 32), so that FMA latency x FMA pipes is covered on any core so far (Zen 3-5,
// Intel since Haswell need 8-10). The previous version kept 12 chains in an array, which the
// compiler need not keep in registers, and measured below what MLAS reaches on a Zen 5 (issue
// 12). Each width is compiled for its ISA (target attributes) and run only when the CPU has it.
// Each thread times ROUNDS short rounds and keeps its fastest: one timing of the whole run (the
// previous version) counted every moment another process held the core, so on a shared machine it
// measured below what MLAS reaches in its own best-of-runs (issue 12). The figure is the sum over
// threads of their best round, the same "best of" rule as the MatMul reference.
// Build and run (bench/common.py does both): gcc -O2 -pthread bench/fma_peak.c -o /tmp/fma_peak
//   /tmp/fma_peak THREADS   ->  one line per width: "256-bit FMA, 2 thread(s): 180.2 GFLOP/s (best round 0.005 s)"
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

#define ROUNDS 400
#define ITERATIONS 100000L  // per round and thread: 28 x 16 x 2 x 1e5 = 90 MFLOP at 512 bits, ~0.5 ms:
                            // shorter than a scheduler slice, so some rounds run uninterrupted

typedef struct {
  float sink;
  double best;  // seconds of the fastest round
} result_t;

#define CHAINS14(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13)
#define CHAINS28(X) CHAINS14(X) X(14) X(15) X(16) X(17) X(18) X(19) X(20) X(21) X(22) X(23) X(24) X(25) X(26) X(27)

__attribute__((target("avx2,fma"))) static void* run256(void* out) {
  result_t* r = (result_t*)out;
  const __m256 b = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
#define DECL(i) __m256 a##i = _mm256_set1_ps((float)(i));
  CHAINS14(DECL)
#undef DECL
  r->best = 1e30;
  for (int round = 0; round < ROUNDS; ++round) {
    const double t0 = now();
    for (long it = 0; it < ITERATIONS; ++it) {
#define FMA(i) a##i = _mm256_fmadd_ps(a##i, b, c);
      CHAINS14(FMA)
#undef FMA
    }
    const double dt = now() - t0;
    if (dt < r->best) r->best = dt;
  }
  __m256 sum = _mm256_setzero_ps();
#define SUM(i) sum = _mm256_add_ps(sum, a##i);
  CHAINS14(SUM)
#undef SUM
  float lanes[8];
  _mm256_storeu_ps(lanes, sum);
  r->sink = lanes[0];
  return 0;
}

__attribute__((target("avx512f"))) static void* run512(void* out) {
  result_t* r = (result_t*)out;
  const __m512 b = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
#define DECL(i) __m512 a##i = _mm512_set1_ps((float)(i));
  CHAINS28(DECL)
#undef DECL
  r->best = 1e30;
  for (int round = 0; round < ROUNDS; ++round) {
    const double t0 = now();
    for (long it = 0; it < ITERATIONS; ++it) {
#define FMA(i) a##i = _mm512_fmadd_ps(a##i, b, c);
      CHAINS28(FMA)
#undef FMA
    }
    const double dt = now() - t0;
    if (dt < r->best) r->best = dt;
  }
  __m512 sum = _mm512_setzero_ps();
#define SUM(i) sum = _mm512_add_ps(sum, a##i);
  CHAINS28(SUM)
#undef SUM
  r->sink = _mm512_reduce_add_ps(sum);
  return 0;
}

static void measure(int threads, int bits, void* (*fn)(void*), int chains) {
  pthread_t t[64];
  result_t out[64];
  fn(&out[0]);  // warm-up: clocks up, code paged in
  for (int i = 0; i < threads; ++i) pthread_create(&t[i], 0, fn, &out[i]);
  for (int i = 0; i < threads; ++i) pthread_join(t[i], 0);
  const double round_flops = 2.0 * (bits / 32) * chains * (double)ITERATIONS;
  double rate = 0, slowest = 0;
  for (int i = 0; i < threads; ++i) {
    rate += round_flops / out[i].best;
    if (out[i].best > slowest) slowest = out[i].best;
  }
  printf("%d-bit FMA, %d thread(s): %.1f GFLOP/s (best round %.4f s)\n", bits, threads, rate * 1e-9, slowest);
}

int main(int argc, char** argv) {
  const int threads = argc > 1 ? atoi(argv[1]) : 1;
  if (threads < 1 || threads > 64) {
    fprintf(stderr, "usage: %s THREADS (1-64)\n", argv[0]);
    return 2;
  }
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) measure(threads, 256, run256, 14);
  if (__builtin_cpu_supports("avx512f")) measure(threads, 512, run512, 28);
  return 0;
}
