// The activation element loops for x86-64 CPUs with AVX-512F (16 lanes) besides AVX2, FMA and F16C;
// CMake compiles this file with those flags, and activation_kernel.cc picks it only after
// checking the CPU and the OS (which must save the zmm state).
// GCC 12's avx512fintrin.h trips -Wmaybe-uninitialized on its own _mm512_undefined_ps() (GCC bug
// 105593, fixed in 12.3/13): silenced for this file only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#define OTFUSE_ISA_NAMESPACE avx512
#include "cpu/activation_rows.inc"
