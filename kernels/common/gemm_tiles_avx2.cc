// The GEMM tasks for x86-64 CPUs with AVX2, FMA and F16C; CMake compiles this file with
// -mavx2 -mfma -mf16c, and gemm.cc calls it only after checking the CPU.
#define OTFUSE_ISA_NAMESPACE avx2
#include "common/gemm_tiles.inc"
