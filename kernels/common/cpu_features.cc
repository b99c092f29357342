#include "common/cpu_features.h"

#include <cstdlib>
#include <cstring>

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

}  // namespace otfuse
