// The schema of RotaryEmbedding (qk = false) and RotaryEmbeddingQK, shared by the CPU and Ascend
// kernels (contract: docs/ops.md, "Rotary embedding family").
#pragma once

#include "common/custom_op.h"

namespace otfuse {

// X (Q, K) and the outputs are T; cos and sin are declared UNDEFINED (any type) because they may
// be T or float32, and the kernels check them.
inline OpSpec RotaryOpSpec(const char* name, const char* execution_provider, ONNXTensorElementDataType t, bool qk) {
  OpSpec spec{name, execution_provider, {}, {}};
  spec.inputs.push_back({t});
  if (qk) spec.inputs.push_back({t});
  spec.inputs.push_back({ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED});  // cos
  spec.inputs.push_back({ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED});  // sin
  spec.outputs.push_back({t});
  if (qk) spec.outputs.push_back({t});
  return spec;
}

}  // namespace otfuse
