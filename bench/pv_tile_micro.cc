// One-thread micro of the two tile GEMMs (bench/README.md, "Session 10, P·V"): TileQk against TilePv
// on one 64 x 128 tile, D = 128, V packed or read in place (misaligned by OFF floats, row stride LDV).
//   I="-Ikernels -isystem $(grep -o '/[^ ]*ort-headers/[^ ]*' build/dev/build.ninja | head -1)"
//   g++ -O3 -DNDEBUG -ffp-contract=off -fno-math-errno -std=c++17 $I -mavx2 -mfma -mf16c -mavx512f -mavx512vl \
//       -mavx512bw -mavx512dq bench/pv_tile_micro.cc -o /tmp/pv_tile_micro
//   /tmp/pv_tile_micro TILES OFF LDV     # e.g. 16 4 128 (16 tiles cycled: 1 MiB of K and V, 16 bytes off)
// (AVX2: the same with OTFUSE_ISA_NAMESPACE avx2, cpu::avx2 and only -mavx2 -mfma -mf16c.)
#define OTFUSE_ISA_NAMESPACE avx512
#include "cpu/attention_tiles.inc"
#include <cstdio>
#include <ctime>
#include <vector>
#include <cstdlib>
using namespace otfuse::cpu::avx512; using otfuse::cpu::kPanel;
static double Now() { timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
int main(int argc, char** argv) {
  const int64_t R = 64, K = 128, D = 128; int reps = 20000;
  int ntiles = argc > 1 ? atoi(argv[1]) : 1;  // cycle over tiles of K/V (footprint)
  int off = argc > 2 ? atoi(argv[2]) : 0;     // misalign V by off floats
  int64_t ldv = argc > 3 ? atoi(argv[3]) : 128;  // V row stride (BSND: H*D)
  float* q = (float*)aligned_alloc(64, R*D*4); float* s = (float*)aligned_alloc(64, R*K*4);
  float* o = (float*)aligned_alloc(64, R*D*4);
  float* kp = (float*)aligned_alloc(64, ntiles*K*D*4); float* v = (float*)aligned_alloc(64, ntiles*K*ldv*4 + 64*4);
  for (int i = 0; i < R*D; ++i) { q[i] = (i % 7) * 0.1f; o[i] = 0; }
  for (int i = 0; i < R*K; ++i) s[i] = (i % 5) * 0.01f;
  for (int64_t i = 0; i < ntiles*K*D; ++i) kp[i] = (i % 3) * 0.1f;
  for (int64_t i = 0; i < ntiles*K*ldv + 64; ++i) v[i] = (i % 11) * 0.1f;
  float* vv = v + off;
  KeyBand band;
  double best_qk = 1e9, best_pv = 1e9, best_pvp = 1e9;
  for (int t = 0; t < 5; ++t) {
    double t0 = Now();
    for (int i = 0; i < reps; ++i) TileQk(q, R, D, kp + (i % ntiles) * K * D, K, s, K, nullptr, band);
    double t1 = Now();
    for (int i = 0; i < reps; ++i) TilePv(s, R, K, vv + (i % ntiles) * K * ldv, ldv, kPanel, K, o, D, nullptr, band);
    double t2 = Now();
    for (int i = 0; i < reps; ++i) TilePv(s, R, K, kp + (i % ntiles) * K * D, kPanel, K * kPanel, K, o, D, nullptr, band);
    double t3 = Now();
    best_qk = std::min(best_qk, t1 - t0); best_pv = std::min(best_pv, t2 - t1); best_pvp = std::min(best_pvp, t3 - t2);
  }
  double fl = 2.0 * R * K * D * reps * 1e-9;
  printf("qk %.1f  pv(in place) %.1f  pv(packed) %.1f GFLOP/s  (o[5]=%g)\n", fl / best_qk, fl / best_pv, fl / best_pvp, o[5]);
}
