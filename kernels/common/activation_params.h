// Checks shared by the activation family's kernels of every backend (contract: docs/ops.md,
// "Activation family"): attributes and operands are read and checked once here, so the CPU and
// Ascend kernels refuse the same nodes with the same messages. What an aclnn operator cannot do
// stays with the Ascend kernels.
#pragma once

#include <cstdint>
#include <optional>

#include "common/activation_kind.h"
#include "common/custom_op.h"
#include "ort_glue.h"

namespace otfuse {

// Gelu's and GeGLU's `approximate`: "none" (default) -> kGeluErf, "tanh" -> kGeluTanh.
ActivationKind ReadGeluApproximate(const KernelInfo& info);
// QuickGelu's `alpha`: 1.702 when absent; must be finite.
float ReadQuickGeluAlpha(const KernelInfo& info);
// SwiGLU's / GeGLU's `gate_half`: 0 (default) or 1; only 0 when the node has two inputs.
int64_t ReadGateHalf(const KernelInfo& info);

// The operands of one run, with Y viewed as [rows, width] and the gate / up rows located in their
// inputs (offsets and row strides in elements).
struct ActivationOperands {
  InputTensor x;                 // X, or A (the gate, or gate and up halves)
  std::optional<InputTensor> b;  // B (up) of the two-input gated form
  Shape y_shape;
  int64_t rows = 0;
  int64_t width = 0;
  int64_t gate_offset = 0;
  int64_t gate_stride = 0;
  int64_t up_offset = 0;  // into B for the two-input form, into A for the split form
  int64_t up_stride = 0;
  bool split = false;     // one input split in halves along its last axis
  bool gated() const { return split || b.has_value(); }
  int64_t elements() const { return rows * width; }
};

// Gelu / QuickGelu / SiLU: X of float32, float16 or bfloat16, any shape; Y = X's shape.
ActivationOperands ReadUnaryOperands(const KernelContext& ctx);
// SwiGLU / GeGLU: A and B of one float type and one shape (Y = that shape), or A alone, of shape
// [..., 2H] (Y = [..., H]), gate = half `gate_half` of the last axis, up = the other.
ActivationOperands ReadGatedOperands(const KernelContext& ctx, int64_t gate_half);

// The schemas for element type t: X -> Y, and A, optional B -> Y.
OpSpec UnaryActivationSpec(const char* name, const char* execution_provider, ONNXTensorElementDataType t);
OpSpec GatedActivationSpec(const char* name, const char* execution_provider, ONNXTensorElementDataType t);

}  // namespace otfuse
