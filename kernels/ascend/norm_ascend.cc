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
#include "common/norm_params.h"
#include "common/shape_check.h"
#include "op_registry.h"

namespace otfuse::ascend {
namespace {

using Kind = NormKind;

template <Kind kKind, bool kAdd, Placement kPlacement>
class AscendNormKernel {
  using Api = NormApi<kKind, kAdd>;

 public:
  explicit AscendNormKernel(const KernelInfo& info)
      : rt_(&BindRuntime(kPlacement)), op_(BindNormOp<kKind, kAdd>(*rt_)) {
    epsilon_ = ReadNormEpsilon(info, kKind);
    axis_ = info.IntAttribute("axis").value_or(-1);
  }

  void Compute(const KernelContext& ctx) const {
    const NormInput input = ReadNormInput(ctx, kAdd);
    const InputTensor& x = input.x;
    const std::optional<InputTensor>& b = input.b;
    const char* x_name = input.x_name;
    const ONNXTensorElementDataType t = x.type;
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
    CheckNormParameter("scale", scale, t, row_shape_name, row_shape);
    std::optional<InputTensor> bias;
    std::optional<ONNXTensorElementDataType> bias_type;
    if constexpr (kKind == Kind::kLayer) {
      bias = ctx.Input(scale_index + 1);
      if (bias) {
        CheckNormParameter("bias", *bias, t, row_shape_name, row_shape);
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
  const CannRuntime* rt_;
  NormOp<kKind, kAdd> op_;
  float epsilon_;
  int64_t axis_;
};

template <Kind kKind, bool kAdd, Placement kPlacement>
void AppendNormOp(const char* name, CustomOpList& ops) {
  AppendPerType<AscendNormKernel<kKind, kAdd, kPlacement>>(ops, [name](ONNXTensorElementDataType t) {
    return NormOpSpec(name, ExecutionProviderOf(kPlacement), t, kKind, kAdd);
  });
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
