// Ascend kernels of the Norm + Linear family: RMSNormLinear, AddRMSNormLinear, LayerNormLinear,
// AddLayerNormLinear (contract and argument mapping: docs/ops.md, "Norm + Linear family").
//
// One node = the norm op's own aclnn call (ascend/norm_call.h, exactly as norm_ascend.cc makes it)
// writing the normalised rows, rounded to T, into the Yn output (or scratch), then one call per
// projection reading them:
//   no bias: aclnnMatmul(self = Yn [rows, K], mat2 = W_i, out = Y_i [rows, N_i], cubeMathType 0)
//   bias:    aclnnAddmm(self = bias_i [N_i], mat1 = Yn, mat2 = W_i, beta = 1, alpha = 1, out = Y_i,
//                       cubeMathType 0)
// X is passed to every call as the same memory [rows, K] (axis is -1 by contract), so the norm's
// rank limit never applies and the GEMMs are plain 2-D ones. A transposed W_i (stored [N_i, K]) is
// passed as the strided view [K, N_i] with strides (1, K), which both operators accept
// ("non-contiguous tensor" for mat2); nothing is copied or packed, unlike the CPU kernel.
//
// aclnn documents (hicann/ops-nn): matmul/mat_mul_v3/docs/aclnnMatmul_en.md (and aclnnMatmul.md),
// matmul/mat_mul_v3/docs/aclnnAddmm&aclnnInplaceAddmm_en.md; aclCreateScalar / aclDestroyScalar:
// CANN operator API reference (ascend/cann_runtime.h). What they say and this file relies on:
//   * self / mat1 / mat2 / out: FLOAT32, FLOAT16, BFLOAT16, ND; Matmul ranks 1-6, Addmm self 1-2
//     dims (broadcast to [m, n]), mat1 / mat2 / out 2-D; inputs may be non-contiguous, out not;
//   * one dtype throughout here (bfloat16 does not deduce with float16 or float32 on A2/A3), so a
//     float32 projection bias of a float16/bfloat16 node is first cast to T (aclnnInplaceCopy);
//   * cubeMathType 0 = KEEP_DTYPE: compute in the input type (float32 stays float32);
//   * Atlas training / inference products: no BFLOAT16, and FLOAT32 with cubeMathType 0 is an
//     error (1 would compute in FLOAT16): such nodes are refused; Atlas 200I/500 A2 has neither
//     operator.
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "ascend/norm_call.h"
#include "common/norm_params.h"
#include "common/shape_check.h"
#include "op_registry.h"

namespace otfuse::ascend {
namespace {

// aclnnMatmulGetWorkspaceSize(const aclTensor* self, const aclTensor* mat2, aclTensor* out,
//                             int8_t cubeMathType, uint64_t* workspaceSize, aclOpExecutor** executor)
using MatmulGetWorkspace = aclnnStatus (*)(const aclTensor* self, const aclTensor* mat2, aclTensor* out,
                                           int8_t cube_math_type, uint64_t* workspace_size,
                                           aclOpExecutor** executor);
// aclnnAddmmGetWorkspaceSize(const aclTensor* self, const aclTensor* mat1, const aclTensor* mat2,
//                            const aclScalar* beta, const aclScalar* alpha, aclTensor* out,
//                            int8_t cubeMathType, uint64_t* workspaceSize, aclOpExecutor** executor)
using AddmmGetWorkspace = aclnnStatus (*)(const aclTensor* self, const aclTensor* mat1, const aclTensor* mat2,
                                          const aclScalar* beta, const aclScalar* alpha, aclTensor* out,
                                          int8_t cube_math_type, uint64_t* workspace_size,
                                          aclOpExecutor** executor);

constexpr int8_t kKeepDtype = 0;  // cubeMathType 0: KEEP_DTYPE

// aclnnMatmul / aclnnAddmm on product lines other than Atlas A2/A3 and Ascend 950 (an unknown SoC
// is left to CANN).
void CheckMatmulProduct(const std::string& soc, ONNXTensorElementDataType t) {
  const Product product = ClassifySoc(soc);
  auto refuse = [&](const std::string& why) {
    throw Error(std::string("aclnnMatmul/aclnnAddmm on ") + ProductName(product) + " (" + soc + "): " + why +
                " (run this node on CPU)");
  };
  if (product == Product::kAtlas200I500A2) refuse("these operators are not supported on this product");
  if (product != Product::kAtlasInference && product != Product::kAtlasTraining) return;
  if (t == ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16) refuse("bfloat16 is not supported on this product");
  if (t == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT) {
    refuse("float32 needs cubeMathType 0 (KEEP_DTYPE), which this product refuses for FLOAT32 (cubeMathType 1 "
           "would compute in float16, short of the float32 contract)");
  }
}

template <NormKind kKind, bool kAdd, Placement kPlacement>
class AscendNormLinearKernel {
  using Norm = NormApi<kKind, kAdd>;

 public:
  explicit AscendNormLinearKernel(const KernelInfo& info)
      : rt_(&BindRuntime(kPlacement)),
        norm_(BindNormOp<kKind, kAdd>(*rt_)),
        matmul_(AclnnOp<MatmulGetWorkspace>::Bind(*rt_, "aclnnMatmul")) {
    params_ = ReadNormLinearParams(info, kKind, kAdd);
    if (params_.bias_count > 0) {
      addmm_ = AclnnOp<AddmmGetWorkspace>::Bind(*rt_, "aclnnAddmm");
      copy_ = AclnnOp<InplaceCopyGetWorkspace>::Bind(*rt_, "aclnnInplaceCopy");
    }
  }

  void Compute(const KernelContext& ctx) const {
    const NormInput input = ReadNormInput(ctx, kAdd);
    const InputTensor& x = input.x;
    const std::optional<InputTensor>& b = input.b;
    const char* x_name = input.x_name;
    const ONNXTensorElementDataType t = x.type;
    const auto [rows, d] = ReadNormLinearRows(input);
    const auto [scale, norm_bias] = ReadNormLinearNormParams(ctx, input, d, kKind, kAdd);
    std::optional<ONNXTensorElementDataType> norm_bias_type;
    if (norm_bias) norm_bias_type = norm_bias->type;

    const size_t count = params_.count();
    const std::vector<InputTensor> weights = ReadProjectionWeights(ctx, params_);
    CheckProjectionWeights(weights, t, d, params_);
    const std::vector<std::optional<InputTensor>> biases = ReadProjectionBiases(ctx, t, params_);

    // What the aclnn operators cannot do, refused before any call.
    CheckNormWeightTypes<kKind, kAdd>(x_name, t, scale.type, norm_bias_type, "norm_bias");
    const std::string soc = rt_->SocName();
    CheckNormProduct<kKind, kAdd>(soc, t, d, scale.type, norm_bias_type);
    CheckMatmulProduct(soc, t);

    const auto [ys, sum, normalized] = AllocateNormLinearOutputs(ctx, params_, x.shape, kAdd);
    if (rows == 0) return;  // nothing to compute (aclnnAddLayerNorm refuses zero dims)

    const size_t es = ElementBytes(t);
    const Shape a_shape{rows, d};
    AclnnCall call(*rt_, ctx, 0);
    // The normalised rows, rounded to T by the norm call: into Yn, or into scratch.
    void* yn = normalized ? normalized.data
                          : call.Scratch(static_cast<size_t>(rows) * static_cast<size_t>(d) * es, "normalised rows");
    NormTensors tensors;
    tensors.type = t;
    tensors.shape = a_shape;
    tensors.axis = 1;
    tensors.x = x.data;
    tensors.b = b ? b->data : nullptr;
    tensors.scale = scale.data;
    tensors.scale_type = scale.type;
    tensors.bias = norm_bias ? norm_bias->data : nullptr;
    tensors.bias_type = norm_bias ? norm_bias->type : scale.type;
    tensors.y = yn;
    tensors.sum = sum ? sum.data : nullptr;
    tensors.x_name = x_name;
    RunNorm<kKind, kAdd>(call, norm_, tensors, static_cast<double>(params_.epsilon));

    for (size_t i = 0; i < count; ++i) {
      const int64_t n = params_.widths[i];
      aclTensor* a = call.Tensor(yn, t, a_shape, "Yn");
      aclTensor* w = params_.transposed[i]
                         ? call.View(weights[i].data, t, Shape{d, n}, Shape{1, d}, 0, "W (transposed)")
                         : call.Tensor(weights[i].data, t, Shape{d, n}, "W");
      aclTensor* out = call.Tensor(ys[i].data, t, Shape{rows, n}, "Y");
      if (!biases[i]) {
        call.Run(matmul_, a, w, out, kKeepDtype);
        continue;
      }
      const void* bias = biases[i]->data;
      if (biases[i]->type != t) {  // one dtype for aclnnAddmm: the float32 bias rounded to T
        void* cast = call.Scratch(static_cast<size_t>(n) * es, "bias cast to T");
        call.Run(copy_, call.Tensor(cast, t, Shape{n}, "bias (cast)"),
                 call.Tensor(bias, biases[i]->type, Shape{n}, "bias"));
        bias = cast;
      }
      aclTensor* self = call.Tensor(bias, t, Shape{n}, "bias");
      aclScalar* beta = call.Scalar(1.0f, "beta");
      aclScalar* alpha = call.Scalar(1.0f, "alpha");
      call.Run(addmm_, self, a, w, beta, alpha, out, kKeepDtype);
    }
  }

 private:
  const CannRuntime* rt_;
  NormOp<kKind, kAdd> norm_;
  AclnnOp<MatmulGetWorkspace> matmul_;
  AclnnOp<AddmmGetWorkspace> addmm_;        // bound when a projection has a bias
  AclnnOp<InplaceCopyGetWorkspace> copy_;   // likewise (float32 bias of a float16/bfloat16 node)
  NormLinearParams params_;
};

template <NormKind kKind, bool kAdd, Placement kPlacement>
void AppendNormLinearOp(const char* name, CustomOpList& ops) {
  AppendPerType<AscendNormLinearKernel<kKind, kAdd, kPlacement>>(ops, [name](ONNXTensorElementDataType t) {
    return NormLinearOpSpec(name, ExecutionProviderOf(kPlacement), t, kKind, kAdd);
  });
}

template <Placement kPlacement>
void AppendAll(CustomOpList& ops) {
  AppendNormLinearOp<NormKind::kRms, false, kPlacement>("RMSNormLinear", ops);
  AppendNormLinearOp<NormKind::kRms, true, kPlacement>("AddRMSNormLinear", ops);
  AppendNormLinearOp<NormKind::kLayer, false, kPlacement>("LayerNormLinear", ops);
  AppendNormLinearOp<NormKind::kLayer, true, kPlacement>("AddLayerNormLinear", ops);
}

}  // namespace

void AppendAscendNormLinearOps(CustomOpList& ops, Placement placement) {
  if (placement == Placement::kCannEp) {
    AppendAll<Placement::kCannEp>(ops);
  } else {
    AppendAll<Placement::kCpuTestDouble>(ops);
  }
}

}  // namespace otfuse::ascend
