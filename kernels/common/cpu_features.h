// Which compiled variant of the CPU kernels to run.
//
// The shipped build targets the baseline ISA (SSE2 on x86-64). On x86-64 the hot loops are also
// compiled for AVX2 + F16C (+ FMA), and some for AVX-512, and picked at kernel creation from what
// the CPU has. Measured on a 4096x4096 float16 RMSNorm: 8 ms instead of 24 ms (hardware fp16
// conversions); float32 gains a few percent. OTFUSE_CPU_ISA=baseline forces the portable variant;
// both give bit-identical results (fixed-order reductions), which the tests check.
//
// Having AVX-512 is not the same as running it at twice the AVX2 rate: Zen 4 splits every 512-bit
// FMA in two, some Intel cores have one 512-bit FMA pipe for two 256-bit ones. The FLOP-bound
// kernels (attention tiles, GEMM, activations) take their AVX-512 variant by default only where
// Avx512AtFullRate() measured it (issue 12: dispatch by measurement); their own knobs
// (OTFUSE_ATTENTION_ISA, OTFUSE_GEMM_ISA, OTFUSE_ACTIVATION_ISA) still force either variant.
#pragma once

namespace otfuse {

enum class CpuIsa { kBaseline, kAvx2 };

CpuIsa SelectCpuIsa();
const char* CpuIsaName(CpuIsa isa);

// The CPU and OS run AVX-512 F/VL/BW/DQ (zmm state saved) and this build has the kernels.
bool CpuHasAvx512();

// 512-bit FMA throughput over 256-bit FMA throughput on this core, measured once (best of short
// rounds of independent FMA chains, ~0.5 ms at the first call); 0 without AVX-512.
double Fma512Over256();

// True when 512-bit FMAs run at >= 1.5x the 256-bit rate (two full-width pipes). The measurement
// can be overridden with OTFUSE_AVX512_RATE=full or half (tests, and CPUs where it misjudges).
bool Avx512AtFullRate();

}  // namespace otfuse
