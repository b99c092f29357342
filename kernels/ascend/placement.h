// Where an Ascend (CANN) kernel class is registered. Kept apart from the CANN declarations so the
// registration list (op_registry.h) can name it without seeing any of them.
#pragma once

namespace otfuse::ascend {

enum class Placement {
  kCannEp,         // CANNExecutionProvider: device memory, the EP's aclrtStream
  kCpuTestDouble,  // TEST ONLY (session config otfuse.ascend_ep.fake_mode=1): CPU EP, CPU
                   // memory, and otfuse's CPU test double of the CANN runtime (tests/fake_cann)
};

// float32 Attention / RopeAttention nodes under the CANN EP (session config
// otfuse.ascend_ep.fp32_attention, read when the library is registered; docs/ops.md "float32 policy").
enum class AttentionFp32 {
  kCpu,       // default: no float32 Ascend kernel is registered, so ORT runs the CPU kernel
  kFloat16,   // "float16": cast to float16 around aclnnFusedInferAttentionScoreV3
  kBFloat16,  // "bfloat16": the same in bfloat16
};

}  // namespace otfuse::ascend
