// What the CPU and Ascend RotaryEmbedding / RotaryEmbeddingQK kernels share (contract: docs/ops.md,
// "Rotary embedding family"): the schema, the rotation attributes (RopeAttention's too) and the
// checks of the cos / sin tables, so both backends refuse the same inputs with the same messages.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/custom_op.h"
#include "common/shape_check.h"
#include "contract/contract_spec.h"

namespace otfuse {

struct RotaryAttributes {
  bool interleaved = false;
  int64_t rotary_dim = 0;         // 0: the whole last dim
  std::vector<int64_t> sections;  // empty: one section of r lanes
  int64_t sections_sum = 0;       // their sum (it fits in int64)
  const char* sections_name = "sections";  // the attribute, for messages
};

// The mode (`mode_name`: "mode", or RopeAttention's "rotary_mode"), rotary_dim and sections
// (`sections_name`) attributes: rotary_dim even and >= 0, sections even widths >= 0 whose sum
// fits in int64 and equals rotary_dim when that is set. Throws Error on the first bad one.
RotaryAttributes ReadRotaryAttributes(const KernelInfo& info, const char* mode_name, const char* sections_name);

// r, the rotated width, for an input `x_name` whose last dim is d: rotary_dim <= d, r even, the
// sections summing to r.
int64_t RotaryWidth(const char* x_name, int64_t d, const RotaryAttributes& attrs);

// cos (whose shape sin shares) broadcasts to x.shape[:-1] + [r] (numpy rules, aligned right), its
// last dim exactly r. x has rank >= 2.
void CheckRotaryBroadcast(const char* x_name, const Shape& x_shape, const Shape& cos_shape, int64_t r);

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
