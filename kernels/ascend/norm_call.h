// The aclnn call of one normalisation, shared by the norm family (norm_ascend.cc) and the norm +
// linear family (norm_linear_ascend.cc, whose norm part is exactly the norm op's call).
//
//   RMSNorm      -> aclnnRmsNorm(x, gamma, epsilon, yOut, rstdOut)
//   AddRMSNorm   -> aclnnAddRmsNorm(x1, x2, gamma, epsilon, yOut, rstdOut, xOut)
//   LayerNorm    -> aclnnLayerNorm(input, normalizedShape, weight, bias, eps, out, null, null)
//   AddLayerNorm -> aclnnAddLayerNorm(x1, x2, gamma, beta, null, epsilon, additionalOutput, yOut,
//                                     meanOut, rstdOut, xOut)
//
// The aclnn documents used (hicann/ops-nn, English versions):
//   norm/rms_norm/docs/aclnnRmsNorm_en.md, norm/add_rms_norm/docs/aclnnAddRmsNorm_en.md,
//   norm/layer_norm_v4/docs/aclnnLayerNorm&aclnnLayerNormWithImplMode.md,
//   norm/add_layer_norm/docs/aclnnAddLayerNorm_en.md.
#pragma once

#include <optional>
#include <string>

#include "ascend/aclnn_call.h"
#include "common/norm_kind.h"
#include "common/shape_check.h"

namespace otfuse::ascend {

using ::otfuse::NormKind;

constexpr size_t kMaxNormRank = 8;  // every one of the four: "Dimension (Shape) 1-8"

// Phase-one signatures, as documented.
// aclnnRmsNormGetWorkspaceSize(x, gamma, double epsilon, yOut, rstdOut, workspaceSize, executor)
using RmsNormGetWorkspace = aclnnStatus (*)(const aclTensor* x, const aclTensor* gamma, double epsilon,
                                            const aclTensor* y_out, const aclTensor* rstd_out,
                                            uint64_t* workspace_size, aclOpExecutor** executor);
// aclnnAddRmsNormGetWorkspaceSize(x1, x2, gamma, double epsilon, yOut, rstdOut, xOut, ...)
using AddRmsNormGetWorkspace = aclnnStatus (*)(const aclTensor* x1, const aclTensor* x2, const aclTensor* gamma,
                                               double epsilon, aclTensor* y_out, aclTensor* rstd_out,
                                               aclTensor* x_out, uint64_t* workspace_size,
                                               aclOpExecutor** executor);
// aclnnLayerNormGetWorkspaceSize(input, normalizedShape, weightOptional, biasOptional, double eps,
//                                out, meanOutOptional, rstdOutOptional, ...)
using LayerNormGetWorkspace = aclnnStatus (*)(const aclTensor* input, const aclIntArray* normalized_shape,
                                              const aclTensor* weight, const aclTensor* bias, double eps,
                                              aclTensor* out, aclTensor* mean_out, aclTensor* rstd_out,
                                              uint64_t* workspace_size, aclOpExecutor** executor);
// aclnnAddLayerNormGetWorkspaceSize(x1, x2, gamma, beta, biasOptional, double epsilon,
//                                   bool additionalOutput, yOut, meanOut, rstdOut, xOut, ...)
using AddLayerNormGetWorkspace = aclnnStatus (*)(const aclTensor* x1, const aclTensor* x2, const aclTensor* gamma,
                                                 const aclTensor* beta, const aclTensor* bias, double epsilon,
                                                 bool additional_output, const aclTensor* y_out,
                                                 const aclTensor* mean_out, const aclTensor* rstd_out,
                                                 const aclTensor* x_out, uint64_t* workspace_size,
                                                 aclOpExecutor** executor);

template <NormKind kKind, bool kAdd>
struct NormApi;
template <>
struct NormApi<NormKind::kRms, false> {
  using GetWorkspace = RmsNormGetWorkspace;
  static constexpr const char* kName = "aclnnRmsNorm";
};
template <>
struct NormApi<NormKind::kRms, true> {
  using GetWorkspace = AddRmsNormGetWorkspace;
  static constexpr const char* kName = "aclnnAddRmsNorm";
};
template <>
struct NormApi<NormKind::kLayer, false> {
  using GetWorkspace = LayerNormGetWorkspace;
  static constexpr const char* kName = "aclnnLayerNorm";
};
template <>
struct NormApi<NormKind::kLayer, true> {
  using GetWorkspace = AddLayerNormGetWorkspace;
  static constexpr const char* kName = "aclnnAddLayerNorm";
};

template <NormKind kKind, bool kAdd>
using NormOp = AclnnOp<typename NormApi<kKind, kAdd>::GetWorkspace>;

template <NormKind kKind, bool kAdd>
NormOp<kKind, kAdd> BindNormOp(const CannRuntime& rt) {
  return NormOp<kKind, kAdd>::Bind(rt, NormApi<kKind, kAdd>::kName);
}

// The type rules of the aclnn norm operator itself (every product), beyond the contract's: the
// weights must share one type (LayerNorm forms), and aclnnAddRmsNorm's gamma must have the
// input's type. `x_name` names the input ("A"), `bias_name` the norm bias ("bias", "norm_bias").
template <NormKind kKind, bool kAdd>
void CheckNormWeightTypes(const char* x_name, ONNXTensorElementDataType x, ONNXTensorElementDataType scale,
                          std::optional<ONNXTensorElementDataType> bias, const char* bias_name) {
  const char* api = NormApi<kKind, kAdd>::kName;
  if constexpr (kKind == NormKind::kLayer) {
    if (bias && *bias != scale) {
      throw Error(std::string("scale is ") + ElementTypeName(scale) + " but " + bias_name + " is " +
                  ElementTypeName(*bias) + "; " + api +
                  " needs both weights of one type (store them alike, or run this node on CPU)");
    }
  }
  if constexpr (kKind == NormKind::kRms && kAdd) {
    // aclnnAddRmsNorm: "gamma ... The data type must be the same as that of x1".
    if (scale != x) {
      throw Error(std::string("scale is ") + ElementTypeName(scale) + " but " + x_name + " is " + ElementTypeName(x) +
                  "; aclnnAddRmsNorm needs gamma of the input's type (store scale as " + ElementTypeName(x) +
                  ", or run this node on CPU)");
    }
  }
  (void)x_name, (void)x, (void)bias_name;
}

// What the aclnn documents restrict on product lines other than Atlas A2/A3 and Ascend 950
// (whose dtype tables the other checks follow); `soc` is aclrtGetSocName(). An unknown SoC is
// left to CANN. Throws Error naming the aclnn function, the product and the reason.
template <NormKind kKind, bool kAdd>
void CheckNormProduct(const std::string& soc, ONNXTensorElementDataType x, int64_t last_dim,
                      ONNXTensorElementDataType scale, std::optional<ONNXTensorElementDataType> bias) {
  const Product product = ClassifySoc(soc);
  if (product == Product::kUnknown || product == Product::kAtlasA2A3 || product == Product::kAscend950) return;
  auto refuse = [&](const std::string& why) {
    throw Error(std::string(NormApi<kKind, kAdd>::kName) + " on " + ProductName(product) + " (" + soc + "): " + why +
                " (run this node on CPU)");
  };
  bool supported;
  if constexpr (kKind == NormKind::kRms) {
    supported = product == Product::kAtlasInference;
  } else if constexpr (!kAdd) {
    supported = product != Product::kAtlasInference;
  } else {
    supported = product == Product::kAtlasInference;
  }
  if (!supported) refuse("this operator is not supported on this product");
  if (x == ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16) refuse("bfloat16 is not supported on this product");
  if (product != Product::kAtlasInference) return;
  // Atlas inference products: weights of the input's type only, and (RmsNorm, AddLayerNorm) a
  // last axis of at least 32 bytes.
  if (scale != x || (bias && *bias != x)) {
    refuse(std::string("the weights must have the input's type (") + ElementTypeName(x) + ") on this product");
  }
  const bool needs_32_bytes = kKind == NormKind::kRms ? !kAdd : kAdd;
  const int64_t last_bytes = last_dim * static_cast<int64_t>(ElementBytes(x));
  if (needs_32_bytes && last_bytes < 32) {
    refuse("the last axis must be at least 32 bytes on this product, got " + std::to_string(last_dim) + " x " +
           ElementTypeName(x));
  }
}

// The device buffers of one norm call and how aclnn sees them.
struct NormTensors {
  ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;  // T: x, b, y, sum
  Shape shape;       // x's shape as passed (rank 1-8)
  size_t axis = 0;   // first normalised axis
  const void* x = nullptr;
  const void* b = nullptr;  // Add forms
  const void* scale = nullptr;
  ONNXTensorElementDataType scale_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  const void* bias = nullptr;  // LayerNorm forms; null: no bias
  ONNXTensorElementDataType bias_type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  void* y = nullptr;
  void* sum = nullptr;  // Add forms: S, or null (the sum then lands in scratch)
  const char* x_name = "X";
};

// The aclnn call: aclTensors over the buffers, scratch statistics (and residual sum), both
// phases on the call's stream. The caller has checked shapes and types; nothing empty.
template <NormKind kKind, bool kAdd>
void RunNorm(AclnnCall& call, const NormOp<kKind, kAdd>& op, const NormTensors& t, double eps) {
  constexpr auto kF32 = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  const size_t rank = t.shape.size();
  const Shape row_shape = Slice(t.shape, t.axis);
  // Statistics per row: x.shape[:axis] followed by ones, the shape aclnn documents for
  // rstdOut / meanOut ("the first several dimensions ... the rest dimensions are 1").
  Shape stat_shape = t.shape;
  for (size_t i = t.axis; i < rank; ++i) stat_shape[i] = 1;
  const size_t stat_bytes = static_cast<size_t>(DimProduct(stat_shape, 0, rank)) * sizeof(float);
  const size_t x_bytes = static_cast<size_t>(DimProduct(t.shape, 0, rank)) * ElementBytes(t.type);

  aclTensor* x_acl = call.Tensor(t.x, t.type, t.shape, t.x_name);
  aclTensor* gamma = call.Tensor(t.scale, t.scale_type, row_shape, "scale");
  aclTensor* y_acl = call.Tensor(t.y, t.type, t.shape, "Y");
  if constexpr (kKind == NormKind::kRms && !kAdd) {
    aclTensor* rstd = call.Tensor(call.Scratch(stat_bytes, "rstd"), kF32, stat_shape, "rstd");
    call.Run(op, x_acl, gamma, eps, y_acl, rstd);
  } else if constexpr (kKind == NormKind::kRms && kAdd) {
    aclTensor* b_acl = call.Tensor(t.b, t.type, t.shape, "B");
    aclTensor* rstd = call.Tensor(call.Scratch(stat_bytes, "rstd"), kF32, stat_shape, "rstd");
    // xOut is needed whenever rstdOut is passed; the sum lands in S, or in scratch.
    void* x_out_data = t.sum != nullptr ? t.sum : call.Scratch(x_bytes, "residual sum");
    aclTensor* x_out = call.Tensor(x_out_data, t.type, t.shape, "S");
    call.Run(op, x_acl, b_acl, gamma, eps, y_acl, rstd, x_out);
  } else if constexpr (kKind == NormKind::kLayer && !kAdd) {
    aclIntArray* normalized_shape = call.IntArray(row_shape, "normalizedShape");
    aclTensor* beta = t.bias != nullptr ? call.Tensor(t.bias, t.bias_type, row_shape, "bias") : nullptr;
    call.Run(op, x_acl, normalized_shape, gamma, beta, eps, y_acl, static_cast<aclTensor*>(nullptr),
             static_cast<aclTensor*>(nullptr));
  } else {
    aclTensor* b_acl = call.Tensor(t.b, t.type, t.shape, "B");
    // beta is required by aclnnAddLayerNorm: without a bias it is a zero tensor of gamma's type.
    const size_t row_bytes = static_cast<size_t>(DimProduct(row_shape, 0, row_shape.size())) *
                             ElementBytes(t.scale_type);
    const void* beta_data = t.bias != nullptr ? t.bias : call.ZeroedScratch(row_bytes, "zero bias");
    aclTensor* beta = call.Tensor(beta_data, t.scale_type, row_shape, "bias");
    aclTensor* mean = call.Tensor(call.Scratch(stat_bytes, "mean"), kF32, stat_shape, "mean");
    aclTensor* rstd = call.Tensor(call.Scratch(stat_bytes, "rstd"), kF32, stat_shape, "rstd");
    void* x_out_data = t.sum != nullptr ? t.sum : call.Scratch(x_bytes, "residual sum");
    aclTensor* x_out = call.Tensor(x_out_data, t.type, t.shape, "S");
    call.Run(op, x_acl, b_acl, gamma, beta, static_cast<const aclTensor*>(nullptr), eps, t.sum != nullptr, y_acl,
             mean, rstd, x_out);
  }
}

}  // namespace otfuse::ascend
