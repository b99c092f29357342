// What the CPU and Ascend RotaryEmbedding / RotaryEmbeddingQK kernels share (contract: docs/ops.md,
// "Rotary embedding family"): the schema and the checks of the cos / sin tables, so both backends
// refuse the same inputs with the same messages.
#pragma once

#include <string>

#include "common/custom_op.h"
#include "common/shape_check.h"

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

// cos and sin: element type T or float32, both the same, and the same shape.
inline void CheckRotaryTables(const InputTensor& cos, const InputTensor& sin, ONNXTensorElementDataType t) {
  if (cos.type != t && cos.type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT) {
    throw Error(std::string("cos has element type ") + ElementTypeName(cos.type) + "; expected float32" +
                (t == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT ? "" : std::string(" or ") + ElementTypeName(t)));
  }
  if (sin.type != cos.type) {
    throw Error(std::string("sin has element type ") + ElementTypeName(sin.type) + " but cos has " +
                ElementTypeName(cos.type));
  }
  ExpectShape("sin", sin.shape, "cos.shape", cos.shape);
}

}  // namespace otfuse
