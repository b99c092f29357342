#include "common/activation_params.h"

#include <cmath>
#include <string>

#include "common/shape_check.h"

namespace otfuse {
namespace {

bool IsActivationType(ONNXTensorElementDataType type) {
  return type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT || type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 ||
         type == ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16;
}

InputTensor FloatInput(const KernelContext& ctx, size_t index, const char* name) {
  std::optional<InputTensor> tensor = ctx.Input(index);
  if (!tensor) throw Error(std::string("input '") + name + "' is required");
  if (!IsActivationType(tensor->type)) {
    throw Error(std::string(name) + " has element type " + ElementTypeName(tensor->type) +
                "; expected float32, float16 or bfloat16");
  }
  return *tensor;
}

// The tensor as [rows, width] over its last axis (rank 0: one element).
void ViewAsRows(const Shape& shape, int64_t* rows, int64_t* width) {
  const size_t rank = shape.size();
  DimProduct(shape, 0, rank);  // the element count must not overflow
  *width = rank == 0 ? 1 : shape[rank - 1];
  *rows = rank == 0 ? 1 : DimProduct(shape, 0, rank - 1);
}

}  // namespace

ActivationKind ReadGeluApproximate(const KernelInfo& info) {
  const std::string approximate = info.StringAttribute("approximate").value_or("none");
  if (approximate == "none") return ActivationKind::kGeluErf;
  if (approximate == "tanh") return ActivationKind::kGeluTanh;
  throw Error("attribute 'approximate' must be \"none\" or \"tanh\", got \"" + approximate + "\"");
}

float ReadQuickGeluAlpha(const KernelInfo& info) {
  const float alpha = info.FloatAttribute("alpha").value_or(1.702f);
  if (!std::isfinite(alpha)) throw Error("attribute 'alpha' must be finite, got " + std::to_string(alpha));
  return alpha;
}

int64_t ReadGateHalf(const KernelInfo& info) {
  const int64_t gate_half = info.IntAttribute("gate_half").value_or(0);
  if (gate_half != 0 && gate_half != 1) {
    throw Error("attribute 'gate_half' must be 0 or 1, got " + std::to_string(gate_half));
  }
  if (gate_half != 0 && info.InputCount() > 1) {
    throw Error("attribute 'gate_half' applies to the one-input form only; with inputs A and B it must be 0");
  }
  return gate_half;
}

ActivationOperands ReadUnaryOperands(const KernelContext& ctx) {
  ActivationOperands ops;
  ops.x = FloatInput(ctx, 0, "X");
  ops.y_shape = ops.x.shape;
  ViewAsRows(ops.x.shape, &ops.rows, &ops.width);
  ops.gate_stride = ops.width;
  return ops;
}

ActivationOperands ReadGatedOperands(const KernelContext& ctx, int64_t gate_half) {
  ActivationOperands ops;
  ops.x = FloatInput(ctx, 0, "A");
  const std::optional<InputTensor> b = ctx.Input(1);
  if (b) {
    ops.b = FloatInput(ctx, 1, "B");
    if (ops.b->type != ops.x.type) {
      throw Error(std::string("B has element type ") + ElementTypeName(ops.b->type) + " but A is " +
                  ElementTypeName(ops.x.type));
    }
    ExpectShape("B", ops.b->shape, "A.shape", ops.x.shape);
    ops.y_shape = ops.x.shape;
    ViewAsRows(ops.x.shape, &ops.rows, &ops.width);
    ops.gate_stride = ops.up_stride = ops.width;
    return ops;
  }
  const Shape& shape = ops.x.shape;
  if (shape.empty() || shape.back() % 2 != 0) {
    throw Error("A alone must have an even last dimension (gate and up halves), got shape " + ToString(shape));
  }
  ops.split = true;
  ops.y_shape = shape;
  ops.y_shape.back() = shape.back() / 2;
  ViewAsRows(ops.y_shape, &ops.rows, &ops.width);
  ops.gate_offset = gate_half * ops.width;
  ops.up_offset = (1 - gate_half) * ops.width;
  ops.gate_stride = ops.up_stride = 2 * ops.width;
  return ops;
}

OpSpec UnaryActivationSpec(const char* name, const char* execution_provider, ONNXTensorElementDataType t) {
  return OpSpec{name, execution_provider, {{t}}, {{t}}};
}

OpSpec GatedActivationSpec(const char* name, const char* execution_provider, ONNXTensorElementDataType t) {
  return OpSpec{name, execution_provider, {{t}, {t, true}}, {{t}}};
}

}  // namespace otfuse
