// Which compiled variant of the CPU row kernels to run.
//
// The shipped build targets the baseline ISA (SSE2 on x86-64). On x86-64 the hot row loops are
// also compiled for AVX2 + F16C and picked at kernel creation when the CPU has both. Measured on
// a 4096x4096 float16 RMSNorm: 8 ms instead of 24 ms (hardware fp16 conversions); float32 gains
// a few percent. OTFUSE_CPU_ISA=baseline forces the portable variant; both give bit-identical
// results (fixed-order reductions), which the tests check.
#pragma once

namespace otfuse {

enum class CpuIsa { kBaseline, kAvx2 };

CpuIsa SelectCpuIsa();
const char* CpuIsaName(CpuIsa isa);

}  // namespace otfuse
