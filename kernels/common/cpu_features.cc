#include "common/cpu_features.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "ort_glue.h"

#if defined(OTFUSE_HAVE_AVX2_KERNELS)
#include <immintrin.h>
#endif

namespace otfuse {

CpuIsa SelectCpuIsa() {
  const char* requested = std::getenv("OTFUSE_CPU_ISA");
  if (requested != nullptr && std::strcmp(requested, "baseline") == 0) return CpuIsa::kBaseline;
#if defined(OTFUSE_HAVE_AVX2_KERNELS)
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c")) return CpuIsa::kAvx2;
#endif
  return CpuIsa::kBaseline;
}

const char* CpuIsaName(CpuIsa isa) { return isa == CpuIsa::kAvx2 ? "avx2" : "baseline"; }

bool CpuHasAvx512() {
#if defined(OTFUSE_HAVE_AVX2_KERNELS)
  // libgcc's checks include the OS saving the zmm state (XGETBV).
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
#else
  return false;
#endif
}

FmaVerdict PoolFmaBatches(FmaBatch (*next)(void*), void* context, void (*pause)()) {
  // Same instruction count per round at both widths, twice the lanes at 512 bits: the rate ratio
  // is 2 * t256 / t512 over the fastest rounds seen so far (2 at full rate, 1 when 512-bit FMAs
  // are split in two). Minima pooled over batches only come closer to the true times, from above.
  double t256 = 1e30, t512 = 1e30;
  FmaVerdict verdict{0.0, 0};
  while (verdict.batches < kMaxFmaBatches) {
    if (verdict.batches > 0 && pause != nullptr) pause();
    const FmaBatch batch = next(context);
    ++verdict.batches;
    t256 = std::min(t256, batch.t256);
    t512 = std::min(t512, batch.t512);
    verdict.ratio = t512 > 0 && t512 < 1e30 ? 2.0 * t256 / t512 : 0.0;
    // Half rate takes two batches that agree: a disturbed batch on a full-rate core read as low as
    // 0.71 (bench/README.md, "End to end, session 16"); a core at half rate pays one more batch.
    if (verdict.ratio >= kFmaClearlyFull || (verdict.ratio <= kFmaClearlyHalf && verdict.batches >= 2)) break;
  }
  return verdict;
}

#if defined(OTFUSE_HAVE_AVX2_KERNELS)
namespace {

constexpr int kRounds = 64;
constexpr int kSteps = 256;  // x 10 chains x 2 per step: ~2-3 us per round, inside one time slice

double Seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void PauseBetweenFmaBatches() {
  // Long enough for a passing disturbance (a neighbour on the host core's FMA pipes, an
  // interrupt burst) to end, short enough that even kMaxFmaBatches of them cost ~20 ms once.
  std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

// Ten independent chains: enough to cover 4-cycle latency x 2 pipes on every core so far.
#define OTFUSE_CHAINS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9)

// One round of kSteps x 20 FMAs at each width, in seconds.
__attribute__((target("avx2,fma"))) double Round256() {
  const __m256 b = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
#define OTFUSE_DECL(i) __m256 a##i = _mm256_set1_ps(static_cast<float>(i));
  OTFUSE_CHAINS(OTFUSE_DECL)
#undef OTFUSE_DECL
  const double t0 = Seconds();
  for (int step = 0; step < kSteps; ++step) {
#define OTFUSE_FMA(i) a##i = _mm256_fmadd_ps(a##i, b, c);
    OTFUSE_CHAINS(OTFUSE_FMA) OTFUSE_CHAINS(OTFUSE_FMA)
#undef OTFUSE_FMA
  }
  __m256 sum = _mm256_setzero_ps();
#define OTFUSE_SUM(i) sum = _mm256_add_ps(sum, a##i);
  OTFUSE_CHAINS(OTFUSE_SUM)
#undef OTFUSE_SUM
  volatile float sink = _mm256_cvtss_f32(sum);  // keeps the chains alive
  (void)sink;
  return Seconds() - t0;
}

__attribute__((target("avx512f"))) double Round512() {
  const __m512 b = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
#define OTFUSE_DECL(i) __m512 a##i = _mm512_set1_ps(static_cast<float>(i));
  OTFUSE_CHAINS(OTFUSE_DECL)
#undef OTFUSE_DECL
  const double t0 = Seconds();
  for (int step = 0; step < kSteps; ++step) {
#define OTFUSE_FMA(i) a##i = _mm512_fmadd_ps(a##i, b, c);
    OTFUSE_CHAINS(OTFUSE_FMA) OTFUSE_CHAINS(OTFUSE_FMA)
#undef OTFUSE_FMA
  }
  __m512 sum = _mm512_setzero_ps();
#define OTFUSE_SUM(i) sum = _mm512_add_ps(sum, a##i);
  OTFUSE_CHAINS(OTFUSE_SUM)
#undef OTFUSE_SUM
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, sum);
  volatile float sink = lanes[0];
  (void)sink;
  return Seconds() - t0;
}

#undef OTFUSE_CHAINS

// The best round of each width over one batch of kRounds alternating rounds, in seconds.
FmaBatch OneFmaBatch(void*) {
  // Some cores run 512-bit ops at a fraction of their rate for tens of microseconds after the
  // first one (the upper vector halves waking up, also after a pause between batches): 200 us
  // of them first.
  for (const double start = Seconds(); Seconds() - start < 2e-4;) Round512();
  // Rounds alternate, so a frequency step or an interruption hits both widths alike; the
  // fastest of each counts.
  FmaBatch batch{1e30, 1e30};
  for (int round = 0; round < kRounds; ++round) {
    batch.t256 = std::min(batch.t256, Round256());
    batch.t512 = std::min(batch.t512, Round512());
  }
  return batch;
}

FmaVerdict MeasureFma512Over256() {
  if (!CpuHasAvx512() || !__builtin_cpu_supports("fma")) return FmaVerdict{0.0, 0};
  return PoolFmaBatches(OneFmaBatch, nullptr, PauseBetweenFmaBatches);
}

}  // namespace
#endif

FmaVerdict MeasuredFma512Over256() {
#if defined(OTFUSE_HAVE_AVX2_KERNELS)
  static const FmaVerdict verdict = MeasureFma512Over256();  // thread-safe, once per process
  return verdict;
#else
  return FmaVerdict{0.0, 0};
#endif
}

double Fma512Over256() { return MeasuredFma512Over256().ratio; }

bool Avx512AtFullRate() {
  // The knob is checked on every CPU, so a typo fails alike on AVX2-only machines.
  const char* forced = std::getenv("OTFUSE_AVX512_RATE");
  const bool is_forced = forced != nullptr && *forced != '\0';
  if (is_forced && std::strcmp(forced, "full") != 0 && std::strcmp(forced, "half") != 0) {
    throw Error(std::string("OTFUSE_AVX512_RATE must be full or half (or unset), got '") + forced + "'");
  }
  if (!CpuHasAvx512()) return false;
  if (is_forced) return std::strcmp(forced, "full") == 0;
  return Fma512Over256() >= 1.5;
}

}  // namespace otfuse
