// What the CPU and Ascend RotaryEmbedding / RotaryEmbeddingQK kernels share (contract: docs/ops.md,
// "Rotary embedding family"): the schema and the checks of the cos / sin tables, so both backends
// refuse the same inputs with the same messages.
#pragma once

#include <string>

#include "common/custom_op.h"
#include "common/shape_check.h"
#include "contract/contract_spec.h"

namespace otfuse {

// The contract's schema (otfuse/ops.py): X (Q, K) and the outputs are T; cos and sin, T or float32,
// are declared UNDEFINED and checked by the kernels (CheckRotaryTables).
inline OpSpec RotaryOpSpec(const char* name, const char* execution_provider, ONNXTensorElementDataType t, bool) {
  return ContractOpSpec(name, execution_provider, t);
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
