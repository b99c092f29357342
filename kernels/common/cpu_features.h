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
// rounds of independent FMA chains, ~0.5 ms at the first call; more batches when the first one is
// ambiguous: PoolFmaBatches); 0 without AVX-512.
double Fma512Over256();

// The measurement's decision rule, apart from the clock (tests feed it batches). Each batch is the
// fastest of kRounds alternating 256-bit and 512-bit rounds (seconds); the ratio is taken over the
// minima of all batches so far, and batches go on, `pause` between them, while it lies between
// kFmaClearlyHalf and kFmaClearlyFull, or at or below kFmaClearlyHalf after one batch only, at
// most kMaxFmaBatches. Why: one batch is ~0.3 ms, and on
// a shared host (bench/README.md, "End to end, session 16") 7 of 4000 processes measured 0.71-1.5
// on an Emerald Rapids Xeon whose ratio is 1.85-2.0, so they ran their attention and GEMM on the
// AVX2 kernels at half speed: a disturbance that lasts a whole batch. A full-rate CPU normally
// stops after one batch; half rate (<= kFmaClearlyHalf) takes two that agree (~1 ms more, once).
struct FmaBatch {
  double t256;
  double t512;
};
struct FmaVerdict {
  double ratio;  // 2 * min t256 / min t512
  int batches;   // batches taken
};
constexpr double kFmaClearlyFull = 1.7;
constexpr double kFmaClearlyHalf = 1.3;
constexpr int kMaxFmaBatches = 16;
FmaVerdict PoolFmaBatches(FmaBatch (*next)(void*), void* context, void (*pause)());
// This process's measurement (Fma512Over256's ratio, and the batches it took).
FmaVerdict MeasuredFma512Over256();

// True when 512-bit FMAs run at >= 1.5x the 256-bit rate (two full-width pipes). The measurement
// can be overridden with OTFUSE_AVX512_RATE=full or half (tests, and CPUs where it misjudges).
bool Avx512AtFullRate();

}  // namespace otfuse
