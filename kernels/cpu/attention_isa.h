// Which tile kernels the attention ops run (docs/ops.md, "CPU kernel"). By default the AVX-512
// ones where the CPU runs 512-bit FMAs at full rate (common/cpu_features.h), else the AVX2 ones;
// OTFUSE_ATTENTION_ISA=avx2 or avx512 forces either (tests and tuning).
#pragma once

namespace otfuse::cpu {

bool AttentionUsesAvx512();

}  // namespace otfuse::cpu
