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

#include "ascend/norm_call.h"
#include "common/shape_check.h"
#include "op_registry.h"

namespace otfuse::ascend {
namespace {

using Kind = NormKind;

InputTensor RequiredInput(const KernelContext& ctx, size_t index, const char* name) {
  std::optional<InputTensor> tensor = ctx.Input(index);
  if (!tensor) throw Error(std::string("input '") + name + "' is required");
  return *tensor;
}

template <Kind kKind, bool kAdd, Placement kPlacement>
class AscendNormKernel {
  using Api = NormApi<kKind, kAdd>;

 public:
  explicit AscendNormKernel(const KernelInfo& info)
      : rt_(&BindRuntime(kPlacement)), op_(BindNormOp<kKind, kAdd>(*rt_)) {
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
    if (rank < 1 || rank > kMaxNormRank) {
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
    std::optional<ONNXTensorElementDataType> bias_type;
    if constexpr (kKind == Kind::kLayer) {
      bias = ctx.Input(scale_index + 1);
      if (bias) {
        CheckWeights("bias", *bias, t, row_shape, row_shape_name);
        bias_type = bias->type;
      }
    }
    CheckNormWeightTypes<kKind, kAdd>(x_name, t, scale.type, bias_type, "bias");
    CheckNormProduct<kKind, kAdd>(rt_->SocName(), t, x.shape.back(), scale.type, bias_type);

    const OutputTensor y = ctx.Output(0, x.shape);
    if (!y) throw Error("output 'Y' is required");
    const OutputTensor sum = kAdd ? ctx.Output(1, x.shape) : OutputTensor{};
    if (elements == 0) return;  // empty tensors: nothing to compute (aclnnAddLayerNorm refuses 0 dims)

    NormTensors tensors;
    tensors.type = t;
    tensors.shape = x.shape;
    tensors.axis = axis;
    tensors.x = x.data;
    tensors.b = b ? b->data : nullptr;
    tensors.scale = scale.data;
    tensors.scale_type = scale.type;
    tensors.bias = bias ? bias->data : nullptr;
    tensors.bias_type = bias ? bias->type : scale.type;
    tensors.y = y.data;
    tensors.sum = sum ? sum.data : nullptr;
    tensors.x_name = x_name;
    AclnnCall call(*rt_, ctx, 0);
    RunNorm<kKind, kAdd>(call, op_, tensors, static_cast<double>(epsilon_));
  }

 private:
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
  NormOp<kKind, kAdd> op_;
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
