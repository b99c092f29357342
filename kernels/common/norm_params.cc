#include "common/norm_params.h"

#include <algorithm>
#include <cmath>

#include "common/shape_check.h"
#include "contract/contract_spec.h"

namespace otfuse {
namespace {

std::vector<int64_t> ReadFlags(const KernelInfo& info, const char* name, size_t count) {
  std::vector<int64_t> flags = info.IntsAttribute(name).value_or(std::vector<int64_t>(count, 0));
  if (flags.size() != count) {
    throw Error(std::string("attribute '") + name + "' has " + std::to_string(flags.size()) +
                " entries; expected one per projection (" + std::to_string(count) + ")");
  }
  for (int64_t flag : flags) {
    if (flag != 0 && flag != 1) throw Error(std::string("attribute '") + name + "' entries must be 0 or 1");
  }
  return flags;
}

}  // namespace

bool IsNormType(ONNXTensorElementDataType type) {
  return type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT || type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 ||
         type == ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16;
}

float ReadNormEpsilon(const KernelInfo& info, NormKind kind) {
  const float default_epsilon = kind == NormKind::kRms ? contract::RMSNorm::defaults::kEpsilon
                                                       : contract::LayerNorm::defaults::kEpsilon;
  const float epsilon = info.FloatAttribute("epsilon").value_or(default_epsilon);
  if (!(epsilon >= 0.0f) || !std::isfinite(epsilon)) {
    throw Error("attribute 'epsilon' must be a finite number >= 0, got " + std::to_string(epsilon));
  }
  return epsilon;
}

NormInput ReadNormInput(const KernelContext& ctx, bool add) {
  NormInput input{RequiredInput(ctx, 0, add ? "A" : "X"), std::nullopt, add ? "A" : "X"};
  const ONNXTensorElementDataType t = input.x.type;
  if (!IsNormType(t)) {
    throw Error(std::string(input.x_name) + " has element type " + ElementTypeName(t) +
                "; expected float32, float16 or bfloat16");
  }
  if (add) {
    input.b = RequiredInput(ctx, 1, "B");
    if (input.b->type != t) {
      throw Error(std::string("B has element type ") + ElementTypeName(input.b->type) + " but A has " +
                  ElementTypeName(t));
    }
    ExpectShape("B", input.b->shape, "A.shape", input.x.shape);
  }
  return input;
}

void CheckNormParameter(const std::string& name, const InputTensor& tensor, ONNXTensorElementDataType t,
                        const std::string& shape_name, const Shape& shape) {
  if (tensor.type != t && tensor.type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT) {
    const std::string expected = t == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT
                                     ? "float32"
                                     : std::string("float32 or ") + ElementTypeName(t) + " (the input's type)";
    throw Error(name + " has element type " + ElementTypeName(tensor.type) + "; expected " + expected);
  }
  ExpectShape(name, tensor.shape, shape_name, shape);
}

OpSpec NormOpSpec(const char* name, const char* execution_provider, ONNXTensorElementDataType t, NormKind,
                  bool) {
  return ContractOpSpec(name, execution_provider, t);
}

NormLinearParams ReadNormLinearParams(const KernelInfo& info, NormKind kind, bool add) {
  NormLinearParams params;
  params.epsilon = ReadNormEpsilon(info, kind);
  const int64_t axis = info.IntAttribute("axis").value_or(-1);
  if (axis != -1) throw Error("attribute 'axis' must be -1, got " + std::to_string(axis));
  params.widths = info.IntsAttribute("out_features").value_or(std::vector<int64_t>{});
  if (params.widths.empty()) throw Error("attribute 'out_features' is required (one width per projection)");
  for (int64_t n : params.widths) {
    if (n <= 0) throw Error("every entry of 'out_features' must be > 0, got " + std::to_string(n));
  }
  const size_t count = params.count();
  params.transposed = ReadFlags(info, "transposed", count);
  params.has_bias = ReadFlags(info, "has_bias", count);
  params.shared_weight = ReadFlags(info, "shared_weight", count);
  params.first_weight = (add ? 3 : 2) + (kind == NormKind::kLayer ? 1 : 0);
  params.bias_count = static_cast<size_t>(std::count(params.has_bias.begin(), params.has_bias.end(), 1));
  const size_t expected_inputs = params.first_weight + count + params.bias_count;
  if (info.InputCount() != expected_inputs) {
    throw Error("expected " + std::to_string(expected_inputs) + " inputs (" + std::to_string(params.first_weight) +
                " norm inputs, " + std::to_string(count) + " weights, " + std::to_string(params.bias_count) +
                " biases), got " + std::to_string(info.InputCount()));
  }
  return params;
}

NormLinearRows ReadNormLinearRows(const NormInput& input) {
  const Shape& shape = input.x.shape;
  if (shape.empty()) throw Error(std::string(input.x_name) + " must have rank >= 1");
  const size_t rank = shape.size();
  NormLinearRows rows{DimProduct(shape, 0, rank - 1), shape.back()};
  DimProduct(shape, 0, rank);  // rows * K must not overflow either
  if (rows.k == 0) {
    throw Error(std::string(input.x_name) + " has an empty last dimension; the normalised rows must not be empty");
  }
  return rows;
}

NormLinearNormParams ReadNormLinearNormParams(const KernelContext& ctx, const NormInput& input, int64_t k,
                                              NormKind kind, bool add) {
  const Shape row_shape{k};
  const std::string row_name = std::string(input.x_name) + ".shape[-1:]";
  const size_t scale_index = add ? 2 : 1;
  NormLinearNormParams params{RequiredInput(ctx, scale_index, "scale"), std::nullopt};
  CheckNormParameter("scale", params.scale, input.x.type, row_name, row_shape);
  if (kind == NormKind::kLayer) {
    params.norm_bias = ctx.Input(scale_index + 1);
    if (params.norm_bias) CheckNormParameter("norm_bias", *params.norm_bias, input.x.type, row_name, row_shape);
  }
  return params;
}

void CheckProjectionWeights(const std::vector<InputTensor>& weights, ONNXTensorElementDataType t, int64_t k,
                            const NormLinearParams& params) {
  for (size_t i = 0; i < weights.size(); ++i) {
    const std::string name = "W" + std::to_string(i + 1);
    if (weights[i].type != t) {
      throw Error(name + " has element type " + ElementTypeName(weights[i].type) + "; expected " +
                  ElementTypeName(t) + " (the input's type)");
    }
    const bool transposed = params.transposed[i] != 0;
    const Shape expected = transposed ? Shape{params.widths[i], k} : Shape{k, params.widths[i]};
    ExpectShape(name, weights[i].shape, transposed ? "[out_features, K]" : "[K, out_features]", expected);
  }
}

std::vector<InputTensor> ReadProjectionWeights(const KernelContext& ctx, const NormLinearParams& params) {
  std::vector<InputTensor> weights;
  for (size_t i = 0; i < params.count(); ++i) {
    weights.push_back(RequiredInput(ctx, params.first_weight + i, "W" + std::to_string(i + 1)));
  }
  return weights;
}

std::vector<std::optional<InputTensor>> ReadProjectionBiases(const KernelContext& ctx, ONNXTensorElementDataType t,
                                                             const NormLinearParams& params) {
  std::vector<std::optional<InputTensor>> biases(params.count());
  size_t next = params.first_weight + params.count();
  for (size_t i = 0; i < params.count(); ++i) {
    if (!params.has_bias[i]) continue;
    const std::string name = "bias" + std::to_string(i + 1);
    biases[i] = RequiredInput(ctx, next++, name);
    CheckNormParameter(name, *biases[i], t, "[out_features[" + std::to_string(i) + "]]", Shape{params.widths[i]});
  }
  return biases;
}

bool HasNormalizedOutput(size_t outputs, const NormLinearParams& params, bool add) {
  const size_t fixed = params.count() + (add ? 1 : 0);
  if (outputs != fixed && outputs != fixed + 1) {
    throw Error("expected " + std::to_string(fixed) + " or " + std::to_string(fixed + 1) + " outputs, got " +
                std::to_string(outputs));
  }
  return outputs == fixed + 1;
}

NormLinearOutputs AllocateNormLinearOutputs(const KernelContext& ctx, const NormLinearParams& params,
                                            const Shape& x_shape, bool add) {
  NormLinearOutputs out;
  const size_t count = params.count();
  for (size_t i = 0; i < count; ++i) {
    Shape shape = x_shape;
    shape.back() = params.widths[i];
    out.ys.push_back(ctx.Output(i, shape));
    if (!out.ys.back()) throw Error("output 'Y" + std::to_string(i + 1) + "' is required");
  }
  if (add) out.sum = ctx.Output(count, x_shape);
  if (HasNormalizedOutput(ctx.OutputCount(), params, add)) out.normalized = ctx.Output(count + (add ? 1 : 0), x_shape);
  return out;
}

OpSpec NormLinearOpSpec(const char* name, const char* execution_provider, ONNXTensorElementDataType t,
                        NormKind, bool) {
  // The contract's W..., bias... are one variadic input of mixed types (biases may be float32 in a
  // T model), its Y..., S, Yn one variadic output of type T.
  return ContractOpSpec(name, execution_provider, t);
}

}  // namespace otfuse
