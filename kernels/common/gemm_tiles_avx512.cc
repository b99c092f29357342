// The GEMM tasks for x86-64 CPUs with AVX-512F (and AVX2, FMA, F16C): 16-lane micro-kernels.
// CMake compiles this file with -mavx512f on top of the AVX2 flags, and gemm.cc calls it only
// after checking the CPU and the OS (which must save the zmm state).
// GCC 12's avx512fintrin.h trips -Wmaybe-uninitialized on its own _mm512_undefined_ps() (GCC bug
// 105593, fixed in 12.3/13; -Wuninitialized once its results are kept in arrays of zmm): silenced
// for this file only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#define OTFUSE_ISA_NAMESPACE avx512
#include "common/gemm_tiles.inc"
