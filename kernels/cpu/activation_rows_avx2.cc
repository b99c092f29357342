// The activation element loops for x86-64 CPUs with AVX2, FMA and F16C (8 lanes, hardware float16
// conversions); CMake compiles this file with -mavx2 -mfma -mf16c, and activation_kernel.cc picks it
// only after checking the CPU.
#define OTFUSE_ISA_NAMESPACE avx2
#include "cpu/activation_rows.inc"
