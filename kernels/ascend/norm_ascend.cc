// Ascend kernels of the normalisation family: RMSNorm, AddRMSNorm, LayerNorm, AddLayerNorm, each
// one aclnn call (contract and argument mapping: docs/ops.md, the "Ascend" line of each op).
//
// The node is checked exactly as on CPU (cpu/norm.cc); on top of that, what the aclnn operator
// documents it cannot do is refused with the reason (ranks above 8, dtype pairs it lacks), never
// passed on to fail inside CANN. The aclnn documents used (hicann/ops-nn, English versions):
//   norm/rms_norm/docs/aclnnRmsNorm_en.md, norm/add_rms_norm/docs/aclnnAddRmsNorm_en.md,
//   norm/layer_norm_v4/docs/aclnnLayerNorm&aclnnLayerNormWithImplMode.md,
//   norm/add_layer_norm/docs/aclnnAddLayerNorm_en.md.
#include <cmath>
#include <optional>
#include <string>

#include "ascend/aclnn_call.h"
#include "common/shape_check.h"
#include "op_registry.h"

namespace otfuse::ascend {
namespace {

enum class Kind { kRms, kLayer };

constexpr size_t kMaxRank = 8;  // every one of the four: "Dimension (Shape) 1-8"

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

template <Kind kKind, bool kAdd>
struct Aclnn;
template <>
struct Aclnn<Kind::kRms, false> {
  using GetWorkspace = RmsNormGetWorkspace;
  static constexpr const char* kName = "aclnnRmsNorm";
};
template <>
struct Aclnn<Kind::kRms, true> {
  using GetWorkspace = AddRmsNormGetWorkspace;
  static constexpr const char* kName = "aclnnAddRmsNorm";
};
template <>
struct Aclnn<Kind::kLayer, false> {
  using GetWorkspace = LayerNormGetWorkspace;
  static constexpr const char* kName = "aclnnLayerNorm";
};
template <>
struct Aclnn<Kind::kLayer, true> {
  using GetWorkspace = AddLayerNormGetWorkspace;
  static constexpr const char* kName = "aclnnAddLayerNorm";
};

InputTensor RequiredInput(const KernelContext& ctx, size_t index, const char* name) {
  std::optional<InputTensor> tensor = ctx.Input(index);
  if (!tensor) throw Error(std::string("input '") + name + "' is required");
  return *tensor;
}

size_t ElementSize(ONNXTensorElementDataType type) {
  return type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT ? 4 : 2;
}

template <Kind kKind, bool kAdd, Placement kPlacement>
class AscendNormKernel {
  using Api = Aclnn<kKind, kAdd>;

 public:
  explicit AscendNormKernel(const KernelInfo& info)
      : rt_(&BindRuntime(kPlacement)), op_(AclnnOp<typename Api::GetWorkspace>::Bind(*rt_, Api::kName)) {
    const float default_epsilon = kKind == Kind::kRms ? 1e-6f : 1e-5f;
    epsilon_ = info.FloatAttribute("epsilon").value_or(default_epsilon);
    if (!(epsilon_ >= 0.0f) || !std::isfinite(epsilon_)) {
      throw Error("attribute 'epsilon' must be a finite number >= 0, got " + std::to_string(epsilon_));
    }
    axis_ = info.IntAttribute("axis").value_or(-1);
  }

  void Compute(const KernelContext& ctx) const {
    const char* x_name = kAdd ? "A" : "X";
    const InputTensor x = RequiredInput(ctx, 0, x_name);
    const ONNXTensorElementDataType t = x.type;
    if (t != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT && t != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 &&
        t != ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16) {
      throw Error(std::string(x_name) + " has element type " + ElementTypeName(t) +
                  "; expected float32, float16 or bfloat16");
    }
    std::optional<InputTensor> b;
    if constexpr (kAdd) {
      b = RequiredInput(ctx, 1, "B");
      if (b->type != t) {
        throw Error(std::string("B has element type ") + ElementTypeName(b->type) + " but A has " +
                    ElementTypeName(t));
      }
      ExpectShape("B", b->shape, "A.shape", x.shape);
    }
    const size_t rank = x.shape.size();
    if (rank < 1 || rank > kMaxRank) {
      throw Error(std::string(Api::kName) + " takes inputs of rank 1 to 8; " + x_name + " has rank " +
                  std::to_string(rank) + " " + ToString(x.shape) + " (reshape it, or run this node on CPU)");
    }
    const size_t axis = NormalizeAxis(axis_, rank);
    const Shape row_shape = Slice(x.shape, axis);
    const std::string row_shape_name = std::string(x_name) + ".shape[axis:]";
    const int64_t elements = DimProduct(x.shape, 0, rank);

    const size_t scale_index = kAdd ? 2 : 1;
    const InputTensor scale = RequiredInput(ctx, scale_index, "scale");
    CheckWeights("scale", scale, t, row_shape, row_shape_name);
    std::optional<InputTensor> bias;
    if constexpr (kKind == Kind::kLayer) {
      bias = ctx.Input(scale_index + 1);
      if (bias) {
        CheckWeights("bias", *bias, t, row_shape, row_shape_name);
        if (bias->type != scale.type) {
          throw Error(std::string("scale is ") + ElementTypeName(scale.type) + " but bias is " +
                      ElementTypeName(bias->type) + "; " + Api::kName +
                      " needs both weights of one type (store them alike, or run this node on CPU)");
        }
      }
    }
    if constexpr (kKind == Kind::kRms && kAdd) {
      // aclnnAddRmsNorm: "gamma ... The data type must be the same as that of x1".
      if (scale.type != t) {
        throw Error(std::string("scale is ") + ElementTypeName(scale.type) + " but A is " + ElementTypeName(t) +
                    "; aclnnAddRmsNorm needs gamma of the input's type (store scale as " + ElementTypeName(t) +
                    ", or run this node on CPU)");
      }
    }

    CheckProduct(rt_->SocName(), x, scale, bias);

    const OutputTensor y = ctx.Output(0, x.shape);
    if (!y) throw Error("output 'Y' is required");
    const OutputTensor sum = kAdd ? ctx.Output(1, x.shape) : OutputTensor{};
    if (elements == 0) return;  // empty tensors: nothing to compute (aclnnAddLayerNorm refuses 0 dims)

    // Statistics per row: X.shape[:axis] followed by ones, the shape aclnn documents for
    // rstdOut / meanOut ("the first several dimensions ... the rest dimensions are 1").
    Shape stat_shape = x.shape;
    for (size_t i = axis; i < rank; ++i) stat_shape[i] = 1;
    const size_t stat_bytes = static_cast<size_t>(DimProduct(stat_shape, 0, rank)) * sizeof(float);
    const size_t x_bytes = static_cast<size_t>(elements) * ElementSize(t);
    constexpr auto kF32 = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;

    AclnnCall call(*rt_, ctx, 0);
    aclTensor* x_acl = call.Tensor(x.data, t, x.shape, x_name);
    aclTensor* gamma = call.Tensor(scale.data, scale.type, row_shape, "scale");
    aclTensor* y_acl = call.Tensor(y.data, t, x.shape, "Y");
    const double eps = static_cast<double>(epsilon_);
    if constexpr (kKind == Kind::kRms && !kAdd) {
      aclTensor* rstd = call.Tensor(call.Scratch(stat_bytes, "rstd"), kF32, stat_shape, "rstd");
      call.Run(op_, x_acl, gamma, eps, y_acl, rstd);
    } else if constexpr (kKind == Kind::kRms && kAdd) {
      aclTensor* b_acl = call.Tensor(b->data, t, x.shape, "B");
      aclTensor* rstd = call.Tensor(call.Scratch(stat_bytes, "rstd"), kF32, stat_shape, "rstd");
      // xOut is needed whenever rstdOut is passed; the sum lands in S, or in scratch.
      void* x_out_data = sum ? sum.data : call.Scratch(x_bytes, "residual sum");
      aclTensor* x_out = call.Tensor(x_out_data, t, x.shape, "S");
      call.Run(op_, x_acl, b_acl, gamma, eps, y_acl, rstd, x_out);
    } else if constexpr (kKind == Kind::kLayer && !kAdd) {
      aclIntArray* normalized_shape = call.IntArray(row_shape, "normalizedShape");
      aclTensor* beta = bias ? call.Tensor(bias->data, bias->type, row_shape, "bias") : nullptr;
      call.Run(op_, x_acl, normalized_shape, gamma, beta, eps, y_acl, static_cast<aclTensor*>(nullptr),
               static_cast<aclTensor*>(nullptr));
    } else {
      aclTensor* b_acl = call.Tensor(b->data, t, x.shape, "B");
      // beta is required by aclnnAddLayerNorm: without a bias it is a zero tensor of gamma's type.
      const size_t row_bytes = static_cast<size_t>(DimProduct(row_shape, 0, row_shape.size())) *
                               ElementSize(scale.type);
      const void* beta_data = bias ? bias->data : call.ZeroedScratch(row_bytes, "zero bias");
      aclTensor* beta = call.Tensor(beta_data, scale.type, row_shape, "bias");
      aclTensor* mean = call.Tensor(call.Scratch(stat_bytes, "mean"), kF32, stat_shape, "mean");
      aclTensor* rstd = call.Tensor(call.Scratch(stat_bytes, "rstd"), kF32, stat_shape, "rstd");
      void* x_out_data = sum ? sum.data : call.Scratch(x_bytes, "residual sum");
      aclTensor* x_out = call.Tensor(x_out_data, t, x.shape, "S");
      call.Run(op_, x_acl, b_acl, gamma, beta, static_cast<const aclTensor*>(nullptr), eps,
               static_cast<bool>(sum), y_acl, mean, rstd, x_out);
    }
  }

 private:
  // What the aclnn documents restrict on product lines other than Atlas A2/A3 and Ascend 950
  // (whose tables the checks above follow). An unknown SoC is left to CANN.
  static void CheckProduct(const std::string& soc, const InputTensor& x, const InputTensor& scale,
                           const std::optional<InputTensor>& bias) {
    const Product product = ClassifySoc(soc);
    if (product == Product::kUnknown || product == Product::kAtlasA2A3 || product == Product::kAscend950) return;
    auto refuse = [&](const std::string& why) {
      throw Error(std::string(Api::kName) + " on " + ProductName(product) + " (" + soc + "): " + why +
                  " (run this node on CPU)");
    };
    bool supported;
    if constexpr (kKind == Kind::kRms) {
      supported = product == Product::kAtlasInference;
    } else if constexpr (!kAdd) {
      supported = product != Product::kAtlasInference;
    } else {
      supported = product == Product::kAtlasInference;
    }
    if (!supported) refuse("this operator is not supported on this product");
    if (x.type == ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16) refuse("bfloat16 is not supported on this product");
    if (product != Product::kAtlasInference) return;
    // Atlas inference products: weights of the input's type only, and (RmsNorm, AddLayerNorm) a
    // last axis of at least 32 bytes.
    if (scale.type != x.type || (bias && bias->type != x.type)) {
      refuse(std::string("the weights must have the input's type (") + ElementTypeName(x.type) + ") on this product");
    }
    const bool needs_32_bytes = kKind == Kind::kRms ? !kAdd : kAdd;
    const int64_t last_bytes = x.shape.back() * static_cast<int64_t>(ElementSize(x.type));
    if (needs_32_bytes && last_bytes < 32) {
      refuse("the last axis must be at least 32 bytes on this product, got " + std::to_string(x.shape.back()) +
             " x " + ElementTypeName(x.type));
    }
  }

  // scale / bias: the input's type or float32 (docs/ops.md), shaped like the normalised axes.
  static void CheckWeights(const char* name, const InputTensor& weights, ONNXTensorElementDataType x_type,
                           const Shape& row_shape, const std::string& row_shape_name) {
    if (weights.type != x_type && weights.type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT) {
      throw Error(std::string(name) + " has element type " + ElementTypeName(weights.type) +
                  "; expected float32 or " + ElementTypeName(x_type) + " (the input's type)");
    }
    ExpectShape(name, weights.shape, row_shape_name, row_shape);
  }

  const CannRuntime* rt_;
  AclnnOp<typename Api::GetWorkspace> op_;
  float epsilon_;
  int64_t axis_;
};

template <Kind kKind, bool kAdd, Placement kPlacement>
void AppendNormOp(const char* name, CustomOpList& ops) {
  // Same schema as the CPU kernels (cpu/norm.cc): one OrtCustomOp per element type T.
  for (ONNXTensorElementDataType t : {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16,
                                      ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16}) {
    OpSpec spec{name, ExecutionProviderOf(kPlacement), {}, {}};
    spec.inputs.push_back({t});
    if (kAdd) spec.inputs.push_back({t});
    spec.inputs.push_back({ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED});  // scale
    if (kKind == Kind::kLayer) spec.inputs.push_back({ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED, true});  // bias
    spec.outputs.push_back({t});
    if (kAdd) spec.outputs.push_back({t, true});  // S
    ops.push_back(MakeCustomOp<AscendNormKernel<kKind, kAdd, kPlacement>>(std::move(spec)));
  }
}

template <Placement kPlacement>
void AppendAll(CustomOpList& ops) {
  AppendNormOp<Kind::kRms, false, kPlacement>("RMSNorm", ops);
  AppendNormOp<Kind::kRms, true, kPlacement>("AddRMSNorm", ops);
  AppendNormOp<Kind::kLayer, false, kPlacement>("LayerNorm", ops);
  AppendNormOp<Kind::kLayer, true, kPlacement>("AddLayerNorm", ops);
}

}  // namespace

void AppendAscendNormOps(CustomOpList& ops, Placement placement) {
  if (placement == Placement::kCannEp) {
    AppendAll<Placement::kCannEp>(ops);
  } else {
    AppendAll<Placement::kCpuTestDouble>(ops);
  }
}

}  // namespace otfuse::ascend
