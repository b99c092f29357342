// Every op family contributes its OrtCustomOps through one Append*Ops function, called from the
// single registration list in op_registry.cc. A family registers one OrtCustomOp per input
// element type under the same op name; ORT merges them into one schema and picks the kernel
// whose declared types match the node (see docs/building.md, "How the ops are registered").
#pragma once

#include "ascend/placement.h"
#include "common/custom_op.h"

namespace otfuse {

constexpr const char* kOpDomain = "otfuse";

namespace cpu {
void AppendNormOps(CustomOpList& ops);  // RMSNorm, AddRMSNorm, LayerNorm, AddLayerNorm
void AppendNormLinearOps(CustomOpList& ops);  // RMSNormLinear, AddRMSNormLinear, LayerNormLinear, AddLayerNormLinear
void AppendRotaryOps(CustomOpList& ops);  // RotaryEmbedding, RotaryEmbeddingQK
void AppendAttentionOps(CustomOpList& ops);  // Attention, RopeAttention
void AppendActivationOps(CustomOpList& ops);  // Gelu, QuickGelu, SiLU, ReluSquared, SwiGLU, GeGLU
}  // namespace cpu

// Ascend (CANN) kernels: registered for the CANN EP, so ORT only runs them in sessions that have
// it (CANNExecutionProvider::GetCapability claims a node whose kernel lookup succeeds). With the
// test-only session config otfuse.ascend_ep.fake_mode=1 they replace the CPU kernels of the same
// ops under the CPU EP instead, backed by the CANN test double (docs/building.md).
namespace ascend {
void AppendAscendNormOps(CustomOpList& ops, Placement placement);  // RMSNorm, AddRMSNorm, LayerNorm, AddLayerNorm
void AppendAscendRotaryOps(CustomOpList& ops, Placement placement);  // RotaryEmbedding, RotaryEmbeddingQK
void AppendAscendAttentionOps(CustomOpList& ops, Placement placement, AttentionFp32 fp32);  // Attention, RopeAttention
void AppendAscendNormLinearOps(CustomOpList& ops, Placement placement);  // RMSNormLinear, AddRMSNormLinear, LayerNormLinear, AddLayerNormLinear
void AppendAscendActivationOps(CustomOpList& ops, Placement placement);  // Gelu, QuickGelu, SiLU, SwiGLU, GeGLU (not ReluSquared: its CPU kernel runs)
}  // namespace ascend

}  // namespace otfuse
