// Every op family contributes its OrtCustomOps through one Append*Ops function, called from the
// single registration list in op_registry.cc. A family registers one OrtCustomOp per input
// element type under the same op name; ORT merges them into one schema and picks the kernel
// whose declared types match the node (see docs/building.md, "How the ops are registered").
#pragma once

#include "common/custom_op.h"

namespace otfuse {

constexpr const char* kOpDomain = "otfuse";

namespace cpu {
void AppendNormOps(CustomOpList& ops);  // RMSNorm, AddRMSNorm, LayerNorm, AddLayerNorm
void AppendNormLinearOps(CustomOpList& ops);  // RMSNormLinear, AddRMSNormLinear, LayerNormLinear, AddLayerNormLinear
void AppendRotaryOps(CustomOpList& ops);  // RotaryEmbedding, RotaryEmbeddingQK
void AppendAttentionOps(CustomOpList& ops);  // Attention, RopeAttention
}  // namespace cpu

}  // namespace otfuse
