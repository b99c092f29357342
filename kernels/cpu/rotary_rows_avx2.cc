// The rotary row kernels for x86-64 CPUs with AVX2 and F16C; CMake compiles this file with
// -mavx2 -mf16c, and rotary.cc calls it only after checking the CPU (common/cpu_features.h).
#define OTFUSE_ISA_NAMESPACE avx2
#include "cpu/rotary_rows.inc"
