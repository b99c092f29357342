// The attention tile kernels for x86-64 CPUs with AVX-512 (F, VL, BW, DQ) besides AVX2, FMA and
// F16C: 16-lane tile GEMMs and softmax pass. CMake compiles this file with those flags, and
// attention.cc calls it only after checking the CPU and the OS (which must save the zmm state).
// GCC 12's avx512fintrin.h trips -Wmaybe-uninitialized (and, depending on what gets inlined,
// -Wuninitialized) on its own _mm512_undefined_ps() / _mm256_undefined_pd() (GCC bug 105593,
// fixed in 12.3/13): silenced for this file only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#define OTFUSE_ISA_NAMESPACE avx512
#include "cpu/attention_tiles.inc"
