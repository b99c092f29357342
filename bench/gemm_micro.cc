// Single-thread throughput of the GEMM micro-kernel (kernels/common/gemm_panels.inc, AVX2 6x16) on
// data in L1/L2, next to a 12x32 AVX-512 one: does Zen 4 want an AVX-512 variant? (bench/README.md)
// Build and run: g++ -O2 -mavx2 -mfma bench/gemm_micro.cc -o /tmp/gemm_micro && /tmp/gemm_micro
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <vector>
#define ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)
__attribute__((noinline)) void Micro6x16(const float* a, const float* b, int64_t kc, float* c) {
#define DECL(r) __m256 c##r##0 = _mm256_loadu_ps(c + r * 16), c##r##1 = _mm256_loadu_ps(c + r * 16 + 8);
  ROWS(DECL)
  for (int64_t k = 0; k < kc; ++k) {
    __m256 b0 = _mm256_loadu_ps(b + k * 16), b1 = _mm256_loadu_ps(b + k * 16 + 8);
#define FMA(r) { __m256 av = _mm256_broadcast_ss(a + k * 6 + r); c##r##0 = _mm256_fmadd_ps(av, b0, c##r##0); c##r##1 = _mm256_fmadd_ps(av, b1, c##r##1); }
    ROWS(FMA)
  }
#define ST(r) _mm256_storeu_ps(c + r * 16, c##r##0); _mm256_storeu_ps(c + r * 16 + 8, c##r##1);
  ROWS(ST)
}
#define ROWS12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
__attribute__((target("avx512f"), noinline)) void Micro12x32(const float* a, const float* b, int64_t kc, float* c) {
#define DECL5(r) __m512 c##r##0 = _mm512_loadu_ps(c + r * 32), c##r##1 = _mm512_loadu_ps(c + r * 32 + 16);
  ROWS12(DECL5)
  for (int64_t k = 0; k < kc; ++k) {
    __m512 b0 = _mm512_loadu_ps(b + k * 32), b1 = _mm512_loadu_ps(b + k * 32 + 16);
#define FMA5(r) { __m512 av = _mm512_set1_ps(a[k * 12 + r]); c##r##0 = _mm512_fmadd_ps(av, b0, c##r##0); c##r##1 = _mm512_fmadd_ps(av, b1, c##r##1); }
    ROWS12(FMA5)
  }
#define ST5(r) _mm512_storeu_ps(c + r * 32, c##r##0); _mm512_storeu_ps(c + r * 32 + 16, c##r##1);
  ROWS12(ST5)
}
int main() {
  const int64_t kc = 256, blocks = 32;  // a 192-row chunk over one B slice, as gemm.cc does
  std::vector<float> a(blocks * 12 * kc, 0.001f), b(kc * 32, 0.5f), c(blocks * 12 * 32, 0.0f);
  for (int variant = 0; variant < 2; ++variant) {
    double best = 1e30; const int reps = 2000;
    for (int t = 0; t < 5; ++t) {
      auto t0 = std::chrono::steady_clock::now();
      for (int r = 0; r < reps; ++r)
        for (int64_t bl = 0; bl < blocks; ++bl) {
          if (variant == 0) Micro6x16(a.data() + bl * 6 * kc, b.data(), kc, c.data() + bl * 6 * 16);
          else Micro12x32(a.data() + bl * 12 * kc, b.data(), kc, c.data() + bl * 12 * 32);
        }
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    const double flops = variant == 0 ? 2.0 * 6 * 16 * kc * blocks * reps : 2.0 * 12 * 32 * kc * blocks * reps;
    std::printf("%s: %.1f GFLOP/s\n", variant == 0 ? "AVX2 6x16 (ours)" : "AVX-512 12x32 (24 zmm accumulators)", flops / best * 1e-9);
  }
}
