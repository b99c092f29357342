// The SUSTAINED 512-bit FMA rate of this machine on 1 thread (pinned to each CPU in turn) and on
// 2 threads at once (one per CPU, started together), each over a whole interval of MS milliseconds,
// not the best short round (bench/fma_peak.c sums each thread's fastest 0.5 ms round, an upper
// bound that no GEMM sustains on a host whose cores slow down for stretches). Per run it prints
// each thread's rate over the interval and the spread of its 1 ms slices (10th / 50th / 90th
// percentile), REPS times in alternation, so that the 1- and 2-thread figures come from the same
// minute (bench/README.md, "Two threads, session 18").
// Build and run: gcc -O2 -pthread bench/fma_sustained.c -o /tmp/fma_sustained && /tmp/fma_sustained 200 5
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

#define SLICE_ITERATIONS 100000L  // 28 x 16 x 2 x 1e5 = 90 MFLOP: ~0.5-1 ms per slice
#define MAX_SLICES 20000
#define CHAINS14(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13)
#define CHAINS28(X) CHAINS14(X) X(14) X(15) X(16) X(17) X(18) X(19) X(20) X(21) X(22) X(23) X(24) X(25) X(26) X(27)

typedef struct {
  int cpu;
  double seconds;            // the interval to run
  volatile int* go;          // all threads start together
  double rate;               // GFLOP/s over the whole interval
  double slices[MAX_SLICES]; // GFLOP/s per slice
  int count;
  float sink;
} job_t;

__attribute__((target("avx512f"))) static void* run(void* arg) {
  job_t* j = (job_t*)arg;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(j->cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
  while (!*j->go) {
  }
  const __m512 b = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
#define DECL(i) __m512 a##i = _mm512_set1_ps((float)(i));
  CHAINS28(DECL)
#undef DECL
  const double slice_flop = 2.0 * 16 * 28 * SLICE_ITERATIONS;
  const double start = now();
  double t = start;
  j->count = 0;
  while (t - start < j->seconds && j->count < MAX_SLICES) {
    for (long it = 0; it < SLICE_ITERATIONS; ++it) {
#define FMA(i) a##i = _mm512_fmadd_ps(a##i, b, c);
      CHAINS28(FMA)
#undef FMA
    }
    const double t1 = now();
    j->slices[j->count++] = slice_flop / (t1 - t) * 1e-9;
    t = t1;
  }
  j->rate = slice_flop * j->count / (t - start) * 1e-9;
  __m512 sum = _mm512_setzero_ps();
#define SUM(i) sum = _mm512_add_ps(sum, a##i);
  CHAINS28(SUM)
#undef SUM
  j->sink = _mm512_reduce_add_ps(sum);
  return 0;
}

static int by_value(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static void describe(job_t* j) {
  qsort(j->slices, j->count, sizeof(double), by_value);
  printf(" cpu%d %.1f (slices p10/p50/p90 %.0f/%.0f/%.0f)", j->cpu, j->rate, j->slices[j->count / 10],
         j->slices[j->count / 2], j->slices[j->count * 9 / 10]);
}

static job_t jobs[2];

static void measure(const int* cpus, int threads, double seconds) {
  pthread_t t[2];
  volatile int go = 0;
  for (int i = 0; i < threads; ++i) {
    jobs[i].cpu = cpus[i];
    jobs[i].seconds = seconds;
    jobs[i].go = &go;
    pthread_create(&t[i], 0, run, &jobs[i]);
  }
  go = 1;
  double total = 0;
  for (int i = 0; i < threads; ++i) pthread_join(t[i], 0);
  printf("%d thread(s):", threads);
  for (int i = 0; i < threads; ++i) {
    total += jobs[i].rate;
    describe(&jobs[i]);
  }
  printf(" -> %.1f GFLOP/s\n", total);
  fflush(stdout);
}

int main(int argc, char** argv) {
  const double ms = argc > 1 ? atof(argv[1]) : 200;
  const int reps = argc > 2 ? atoi(argv[2]) : 5;
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512f")) {
    fprintf(stderr, "no AVX-512F\n");
    return 2;
  }
  const int cpu0[] = {0}, cpu1[] = {1}, both[] = {0, 1};
  measure(cpu0, 1, 0.05);  // warm-up
  for (int r = 0; r < reps; ++r) {
    measure(cpu0, 1, ms * 1e-3);
    measure(cpu1, 1, ms * 1e-3);
    measure(both, 2, ms * 1e-3);
  }
  return 0;
}
