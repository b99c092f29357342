// The FMA peak of this machine: a tight loop of independent FMAs per thread (bench/README.md,
// "Norm + Linear"). Build and run: gcc -O2 -mavx2 -mfma -mavx512f -pthread bench/fma_peak.c -o /tmp/fma_peak
//   /tmp/fma_peak THREADS 256|512
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <pthread.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define N 2000000000L  // FMAs per thread: ~0.3 s at the peak
static void* run256(void* arg){
  __m256 a[12]; __m256 b=_mm256_set1_ps(0.999999f), c=_mm256_set1_ps(1e-7f);
  for(int i=0;i<12;i++) a[i]=_mm256_set1_ps((float)i);
  for(long it=0;it<N/12;it++){
#pragma GCC unroll 12
    for(int i=0;i<12;i++) a[i]=_mm256_fmadd_ps(a[i],b,c);
  }
  float s=0; for(int i=0;i<12;i++){ float t[8]; _mm256_storeu_ps(t,a[i]); s+=t[0];} *(float*)arg=s; return 0;}
#ifdef __AVX512F__
static void* run512(void* arg){
  __m512 a[12]; __m512 b=_mm512_set1_ps(0.999999f), c=_mm512_set1_ps(1e-7f);
  for(int i=0;i<12;i++) a[i]=_mm512_set1_ps((float)i);
  for(long it=0;it<N/12;it++){
#pragma GCC unroll 12
    for(int i=0;i<12;i++) a[i]=_mm512_fmadd_ps(a[i],b,c);
  }
  float s=0; for(int i=0;i<12;i++) s+=_mm512_reduce_add_ps(a[i]); *(float*)arg=s; return 0;}
#endif
int main(int argc,char**argv){
  int th=atoi(argv[1]); int w=atoi(argv[2]);
  pthread_t t[8]; float out[8];
  void*(*f)(void*)=run256; int lanes=8;
#ifdef __AVX512F__
  if(w==512){f=run512;lanes=16;}
#endif
  double t0=now();
  for(int i=0;i<th;i++) pthread_create(&t[i],0,f,&out[i]);
  for(int i=0;i<th;i++) pthread_join(t[i],0);
  double dt=now()-t0;
  printf("%d-bit FMA, %d thread(s): %.1f GFLOP/s (%.3f s)\n", w, th, 2.0*lanes*(N/12*12)*th/dt*1e-9, dt);
  return 0;}
