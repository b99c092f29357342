// Checks shared by the norm family (RMSNorm, AddRMSNorm, LayerNorm, AddLayerNorm) and the norm +
// linear family (RMSNormLinear, ... AddLayerNormLinear) of every backend (contract: docs/ops.md):
// read and checked once here, so the CPU and Ascend kernels refuse the same nodes with the same
// messages. What an aclnn operator cannot do stays with the Ascend kernels.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/custom_op.h"
#include "common/norm_kind.h"
#include "ort_glue.h"

namespace otfuse {

// float32, float16 or bfloat16: the element types of the norm and norm + linear ops.
bool IsNormType(ONNXTensorElementDataType type);

// Attribute `epsilon`: 1e-6 (RMS) / 1e-5 (LayerNorm) when absent; must be finite and >= 0.
float ReadNormEpsilon(const KernelInfo& info, NormKind kind);

// X (input 0), or A and B (inputs 0 and 1) for the residual forms: float32, float16 or bfloat16,
// B of A's type and shape.
struct NormInput {
  InputTensor x;
  std::optional<InputTensor> b;
  const char* x_name;  // "X" or "A"
};
NormInput ReadNormInput(const KernelContext& ctx, bool add);

// A scale, a norm bias or a projection bias: of the input's type t or float32, exactly `shape`
// (named `shape_name` in the message).
void CheckNormParameter(const std::string& name, const InputTensor& tensor, ONNXTensorElementDataType t,
                        const std::string& shape_name, const Shape& shape);

// The schema of a norm-family op for element type t (one OrtCustomOp per t): X (A, B), scale,
// LayerNorm's optional bias; Y (and S).
OpSpec NormOpSpec(const char* name, const char* execution_provider, ONNXTensorElementDataType t, NormKind kind,
                  bool add);

// ---- Norm + linear ----

// The node's attributes and the input layout they imply; throws on the first bad one.
struct NormLinearParams {
  float epsilon = 0.0f;
  std::vector<int64_t> widths;      // out_features
  std::vector<int64_t> transposed;  // per projection, 0 or 1
  std::vector<int64_t> has_bias;    // per projection, 0 or 1
  // per projection, 0 or 1: W_i is a constant another node of the model reads too (a tied embedding
  // table's Gather), so the session keeps it whatever this node does (docs/ops.md)
  std::vector<int64_t> shared_weight;
  size_t first_weight = 0;          // input index of W_1
  size_t bias_count = 0;
  size_t count() const { return widths.size(); }
};
NormLinearParams ReadNormLinearParams(const KernelInfo& info, NormKind kind, bool add);

// The rows of X as [rows, K]: rank >= 1, no overflow, K > 0.
struct NormLinearRows {
  int64_t rows;
  int64_t k;
};
NormLinearRows ReadNormLinearRows(const NormInput& input);

// The scale and LayerNorm's optional norm_bias, checked against [K].
struct NormLinearNormParams {
  InputTensor scale;
  std::optional<InputTensor> norm_bias;
};
NormLinearNormParams ReadNormLinearNormParams(const KernelContext& ctx, const NormInput& input, int64_t k,
                                              NormKind kind, bool add);

// W_i of type t, [K, N_i] (or [N_i, K] when transposed).
void CheckProjectionWeights(const std::vector<InputTensor>& weights, ONNXTensorElementDataType t, int64_t k,
                            const NormLinearParams& params);
std::vector<InputTensor> ReadProjectionWeights(const KernelContext& ctx, const NormLinearParams& params);

// bias_i (null where has_bias[i] = 0), each of type t or float32, [N_i].
std::vector<std::optional<InputTensor>> ReadProjectionBiases(const KernelContext& ctx, ONNXTensorElementDataType t,
                                                             const NormLinearParams& params);

// n, n + 1 or n + 2 outputs (see docs/ops.md); true when the last one is Yn.
bool HasNormalizedOutput(size_t outputs, const NormLinearParams& params, bool add);

// The outputs, allocated: Y_i [..., N_i] (each required), S (AddNorm) and Yn (when requested) as X.
struct NormLinearOutputs {
  std::vector<OutputTensor> ys;
  OutputTensor sum;         // empty unless add
  OutputTensor normalized;  // empty unless requested
};
NormLinearOutputs AllocateNormLinearOutputs(const KernelContext& ctx, const NormLinearParams& params,
                                            const Shape& x_shape, bool add);

OpSpec NormLinearOpSpec(const char* name, const char* execution_provider, ONNXTensorElementDataType t,
                        NormKind kind, bool add);

}  // namespace otfuse
