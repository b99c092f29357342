// Memory read bandwidth of this machine: THREADS threads each sum their share of a MB-sized (10^6 bytes)
// buffer (AVX2 loads, 4 independent accumulators), REPS times; prints the best and median pass
// (bench/README.md, "Norm + Linear": the weight streams of the small-M products).
// Build and run: gcc -O2 -mavx2 -pthread bench/stream_read.c -o /tmp/stream_read
//   /tmp/stream_read THREADS MB [REPS]
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
typedef struct { const float* p; size_t n; float out; } Part;
static void* sum(void* arg) {
  Part* part = (Part*)arg;
  __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  for (size_t i = 0; i < part->n; i += 32) {
    s0 = _mm256_add_ps(s0, _mm256_load_ps(part->p + i));
    s1 = _mm256_add_ps(s1, _mm256_load_ps(part->p + i + 8));
    s2 = _mm256_add_ps(s2, _mm256_load_ps(part->p + i + 16));
    s3 = _mm256_add_ps(s3, _mm256_load_ps(part->p + i + 24));
  }
  float t[8]; _mm256_storeu_ps(t, _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
  part->out = t[0] + t[7]; return 0;
}
static int cmp(const void* a, const void* b) { double x = *(const double*)a, y = *(const double*)b; return (x > y) - (x < y); }
int main(int argc, char** argv) {
  if (argc < 3) { fprintf(stderr, "usage: %s THREADS MB [REPS]\n", argv[0]); return 2; }
  int th = atoi(argv[1]); size_t bytes = (size_t)atol(argv[2]) * 1000000; int reps = argc > 3 ? atoi(argv[3]) : 10;
  if (th < 1 || th > 8 || reps < 1 || reps > 1000) return 2;
  size_t n = bytes / sizeof(float) / (32 * th) * (32 * th);
  float* buf = aligned_alloc(64, n * sizeof(float));
  if (!buf) return 1;
  for (size_t i = 0; i < n; ++i) buf[i] = (float)(i & 1023);  // touch every page
  double* dt = malloc(sizeof(double) * reps);
  for (int r = 0; r < reps; ++r) {
    pthread_t t[8]; Part parts[8];
    double t0 = now();
    for (int i = 0; i < th; ++i) { parts[i] = (Part){buf + n / th * i, n / th, 0}; pthread_create(&t[i], 0, sum, &parts[i]); }
    for (int i = 0; i < th; ++i) pthread_join(t[i], 0);
    dt[r] = now() - t0;
  }
  qsort(dt, reps, sizeof(double), cmp);
  double gb = n * sizeof(float) * 1e-9;
  printf("%.0f MB, %d thread(s): best %.1f GB/s (%.2f ms), median %.1f GB/s (%.2f ms)\n", gb * 1e3, th, gb / dt[0],
         dt[0] * 1e3, gb / dt[reps / 2], dt[reps / 2] * 1e3);
  return 0;
}
