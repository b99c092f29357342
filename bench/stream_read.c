// Memory read bandwidth of this machine: THREADS threads each sum their share of a MB-sized (10^6 bytes)
// buffer (AVX2 loads, 4 independent accumulators), REPS times; prints the best and median pass
// (bench/README.md, "Norm + Linear": the weight streams of the small-M products).
// Build and run: gcc -O2 -mavx2 -pthread bench/stream_read.c -o /tmp/stream_read
//   /tmp/stream_read THREADS MB [REPS]
// Built with -shared -fPIC -DSTREAM_READ_LIBRARY (common.ReadPass) it is instead an in-process pass
// over persistent threads, which a bench calls between the calls it times, so that the reference
// is read in the same stretch of the host as the op (bench/attention_paths.py, decode): its helper
// threads sleep between passes and are woken for each (as ORT's intra-op pool with spinning off,
// the benches' setting), or spin between passes (stream_read_spin(1): no wake-up in the pass, the
// plain bandwidth). Starting threads for every pass, as the command does, costs ~0.4 ms a pass in
// a KVM guest: its median over 17 MB read 22 GB/s where the spinning pool read 48.
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

// Each of `th` threads (1-8) sums its n / th floats of `buf` (64-byte aligned; n a multiple of 32 * th).
static void split(Part* parts, const float* buf, size_t n, int th) {
  for (int i = 0; i < th; ++i) parts[i] = (Part){buf + n / th * i, n / th, 0};
}

#ifdef STREAM_READ_LIBRARY
#include <stdatomic.h>
#include <stdint.h>
static int pool_threads = 0;  // stream_read_start's, helpers included
static Part pool_parts[8];
static pthread_mutex_t pool_mutex = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pool_wake = PTHREAD_COND_INITIALIZER;
static atomic_int pool_generation, pool_done, pool_spin;

static void* helper(void* arg) {
  const int index = (int)(intptr_t)arg;
  int seen = 0;
  for (;;) {
    const int generation = atomic_load(&pool_generation);
    if (generation == seen) {
      if (atomic_load(&pool_spin)) { _mm_pause(); continue; }
      pthread_mutex_lock(&pool_mutex);
      while (atomic_load(&pool_generation) == seen && !atomic_load(&pool_spin)) pthread_cond_wait(&pool_wake, &pool_mutex);
      pthread_mutex_unlock(&pool_mutex);
      continue;
    }
    seen = generation;
    sum(&pool_parts[index]);
    atomic_fetch_add(&pool_done, 1);
  }
  return 0;
}

// Starts the pool once per process (th - 1 helpers beside the caller); 0 when it runs th threads.
int stream_read_start(int th) {
  if (pool_threads) return pool_threads == th ? 0 : -1;
  if (th < 1 || th > 8) return -1;
  for (int i = 1; i < th; ++i) {
    pthread_t t;
    if (pthread_create(&t, 0, helper, (void*)(intptr_t)i) != 0) return -1;
    pthread_detach(t);
  }
  pool_threads = th;
  return 0;
}

// 1: the helpers spin between passes (until 0: they sleep again).
void stream_read_spin(int on) {
  pthread_mutex_lock(&pool_mutex);
  atomic_store(&pool_spin, on);
  pthread_cond_broadcast(&pool_wake);
  pthread_mutex_unlock(&pool_mutex);
}

// One pass of the pool's threads over `buf`; returns its wall seconds (the helpers' wake-up included).
double stream_read_pass(const float* buf, size_t n) {
  const int th = pool_threads;
  split(pool_parts, buf, n, th);
  atomic_store(&pool_done, 0);
  const double t0 = now();
  if (atomic_load(&pool_spin)) {
    atomic_fetch_add(&pool_generation, 1);
  } else {
    pthread_mutex_lock(&pool_mutex);
    atomic_fetch_add(&pool_generation, 1);
    pthread_cond_broadcast(&pool_wake);
    pthread_mutex_unlock(&pool_mutex);
  }
  sum(&pool_parts[0]);
  while (atomic_load(&pool_done) < th - 1) _mm_pause();
  return now() - t0;
}

#else
// One pass, its threads started for the pass (the command's figures, as they always were).
static double pass(const float* buf, size_t n, int th) {
  pthread_t t[8]; Part parts[8];
  split(parts, buf, n, th);
  double t0 = now();
  for (int i = 0; i < th; ++i) pthread_create(&t[i], 0, sum, &parts[i]);
  for (int i = 0; i < th; ++i) pthread_join(t[i], 0);
  return now() - t0;
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
  for (int r = 0; r < reps; ++r) dt[r] = pass(buf, n, th);
  qsort(dt, reps, sizeof(double), cmp);
  double gb = n * sizeof(float) * 1e-9;
  printf("%.0f MB, %d thread(s): best %.1f GB/s (%.2f ms), median %.1f GB/s (%.2f ms)\n", gb * 1e3, th, gb / dt[0],
         dt[0] * 1e3, gb / dt[reps / 2], dt[reps / 2] * 1e3);
  return 0;
}
#endif
