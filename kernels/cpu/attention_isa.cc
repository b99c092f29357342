#include "cpu/attention_isa.h"

#include <cstdlib>
#include <cstring>
#include <string>

#include "common/cpu_features.h"
#include "ort_glue.h"

namespace otfuse::cpu {

bool AttentionUsesAvx512() {
  const char* forced = std::getenv("OTFUSE_ATTENTION_ISA");
  if (forced != nullptr && *forced != '\0') {
    if (std::strcmp(forced, "avx2") == 0) return false;
    if (std::strcmp(forced, "avx512") != 0) {
      throw Error(std::string("OTFUSE_ATTENTION_ISA must be avx2 or avx512 (or unset), got '") + forced + "'");
    }
    if (!CpuHasAvx512()) throw Error("OTFUSE_ATTENTION_ISA=avx512: this CPU (or this build) cannot run it");
    return true;
  }
  return Avx512AtFullRate();  // false without AVX-512; checks the rate knob on every CPU
}

}  // namespace otfuse::cpu
