// Ascend kernels of the activation family: Gelu, QuickGelu, SiLU, SwiGLU, GeGLU (contract and
// argument mapping: docs/ops.md, "Ascend mapping (activation family)").
//
//   Gelu       -> aclnnGeluV2(x, approximate 0 "none" / 1 "tanh", y)
//   QuickGelu  -> aclnnSwish(self, betaOptional = alpha, out): x * sigmoid(beta x)
//   SiLU       -> aclnnSilu(self, out)
//   SwiGLU     -> aclnnSwiGlu(x, dim = -1, out) for one input with the gate first (Swish(A) * B, A
//                 the first half), on Atlas A2/A3; otherwise aclnnSilu(gate) into Y, then
//                 aclnnInplaceMul(Y, up), over strided views of the halves
//   GeGLU      -> aclnnGeGlu(self, dim = -1, approximate, out, outGelu) for one input with the
//                 gate second (A * Gelu(B)); otherwise aclnnGeluV2(gate) into Y, then
//                 aclnnInplaceMul(Y, up). (aclnnGeGluV3's activateLeft would cover the gate-first
//                 half, but its doc versions disagree on what true means: not used.)
//
// Every tensor is passed as a 2-D [rows, width] view (element-wise ops do not care about the
// shape), so any rank, 0 included, fits the documented 1-8 dims. The node is checked exactly as
// on CPU (common/activation_params.h); what a product's aclnn documents exclude is refused before
// the call, with the reason. Documents (hicann/ops-nn activation/, English versions where they
// exist): gelu_v2/docs/aclnnGeluV2_en.md, swish (aclnnSwish, CANN operator API reference),
// silu (aclnnSilu, CANN operator API reference), swi_glu/docs/aclnnSwiGlu.md,
// ge_glu_v2/docs/aclnnGeGlu_en.md and aclnnGeGluV3_en.md; hicann/ops-math
// math/mul/docs/aclnnMul&aclnnInplaceMul_en.md.
#include <string>

#include "ascend/aclnn_call.h"
#include "common/activation_params.h"
#include "op_registry.h"

namespace otfuse::ascend {
namespace {

using GeluV2GetWorkspace = aclnnStatus (*)(const aclTensor* x, int64_t approximate, aclTensor* y, uint64_t* size,
                                           aclOpExecutor** executor);
using SwishGetWorkspace = aclnnStatus (*)(const aclTensor* self, const aclScalar* beta, aclTensor* out,
                                          uint64_t* size, aclOpExecutor** executor);
using SiluGetWorkspace = aclnnStatus (*)(const aclTensor* self, aclTensor* out, uint64_t* size,
                                         aclOpExecutor** executor);
using SwiGluGetWorkspace = aclnnStatus (*)(const aclTensor* x, int64_t dim, const aclTensor* out, uint64_t* size,
                                           aclOpExecutor** executor);
using GeGluGetWorkspace = aclnnStatus (*)(const aclTensor* self, int64_t dim, int64_t approximate, aclTensor* out,
                                          aclTensor* out_gelu, uint64_t* size, aclOpExecutor** executor);
using InplaceMulGetWorkspace = aclnnStatus (*)(aclTensor* self_ref, const aclTensor* other, uint64_t* size,
                                               aclOpExecutor** executor);

bool IsGelu(ActivationKind kind) { return kind == ActivationKind::kGeluErf || kind == ActivationKind::kGeluTanh; }

// The aclnn call that applies the node's activation to one tensor.
const char* ActivationApi(ActivationKind kind) {
  if (IsGelu(kind)) return "aclnnGeluV2";
  return kind == ActivationKind::kSilu ? "aclnnSilu" : "aclnnSwish";
}

// The element-wise calls (aclnnGeluV2, aclnnSwish, aclnnSilu, aclnnInplaceMul) run on Atlas A2/A3,
// Ascend 950, Atlas inference and training products (the last two without bfloat16), not on
// Atlas 200I/500 A2. An unknown SoC is left to CANN.
void CheckProduct(const std::string& soc, const char* api, ONNXTensorElementDataType t) {
  const Product product = ClassifySoc(soc);
  if (product == Product::kAtlas200I500A2) {
    throw Error(std::string(api) + " is not supported on " + ProductName(product) + " (" + soc +
                "); run this node on CPU");
  }
  if ((product == Product::kAtlasInference || product == Product::kAtlasTraining) &&
      t == ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16) {
    throw Error(std::string(api) + " on " + ProductName(product) + " (" + soc +
                ") takes float16 or float32, not bfloat16; run this node on CPU");
  }
}

// aclnnSwiGlu's doc lists Atlas A2/A3 with every float type (and Atlas inference with a 64-byte
// shape rule we do not rely on); aclnnGeGlu's lists Atlas A2/A3, Ascend 950 and inference products.
bool HasSwiGlu(Product p) { return p == Product::kAtlasA2A3 || p == Product::kUnknown; }
bool HasGeGlu(Product p) {
  return p == Product::kAtlasA2A3 || p == Product::kAscend950 || p == Product::kAtlasInference ||
         p == Product::kUnknown;
}

struct ActivationCalls {
  AclnnOp<GeluV2GetWorkspace> gelu;
  AclnnOp<SwishGetWorkspace> swish;
  AclnnOp<SiluGetWorkspace> silu;
  AclnnOp<SwiGluGetWorkspace> swiglu;
  AclnnOp<GeGluGetWorkspace> geglu;
  AclnnOp<InplaceMulGetWorkspace> mul;
};

// Binds only what the node can call: a CANN without aclnnGeGlu still runs SiLU.
ActivationCalls BindCalls(const CannRuntime& rt, ActivationKind kind, bool gated) {
  ActivationCalls calls;
  if (IsGelu(kind)) calls.gelu = AclnnOp<GeluV2GetWorkspace>::Bind(rt, "aclnnGeluV2");
  if (kind == ActivationKind::kQuickGelu) calls.swish = AclnnOp<SwishGetWorkspace>::Bind(rt, "aclnnSwish");
  if (kind == ActivationKind::kSilu) calls.silu = AclnnOp<SiluGetWorkspace>::Bind(rt, "aclnnSilu");
  if (gated) {
    calls.mul = AclnnOp<InplaceMulGetWorkspace>::Bind(rt, "aclnnInplaceMul");
    if (kind == ActivationKind::kSilu) calls.swiglu = AclnnOp<SwiGluGetWorkspace>::Bind(rt, "aclnnSwiGlu");
    if (IsGelu(kind)) calls.geglu = AclnnOp<GeGluGetWorkspace>::Bind(rt, "aclnnGeGlu");
  }
  return calls;
}

template <Placement kPlacement>
class AscendActivationKernel {
 public:
  AscendActivationKernel(ActivationKind kind, float alpha, bool gated, int64_t gate_half)
      : rt_(&BindRuntime(kPlacement)),
        calls_(BindCalls(*rt_, kind, gated)),
        kind_(kind),
        alpha_(alpha),
        gated_(gated),
        gate_half_(gate_half) {}

  void Compute(const KernelContext& ctx) const {
    const ActivationOperands ops = gated_ ? ReadGatedOperands(ctx, gate_half_) : ReadUnaryOperands(ctx);
    const ONNXTensorElementDataType t = ops.x.type;
    const std::string soc = rt_->SocName();
    CheckProduct(soc, ActivationApi(kind_), t);
    const OutputTensor y = ctx.Output(0, ops.y_shape);
    if (!y) throw Error("output 'Y' is required");
    if (ops.elements() == 0) return;  // no call: not every aclnn activation takes empty tensors
    AclnnCall call(*rt_, ctx, 0);
    const Shape rows{ops.rows, ops.width};
    aclTensor* out = call.Tensor(y.data, t, rows, "Y");
    const Product product = ClassifySoc(soc);
    if (ops.split && kind_ == ActivationKind::kSilu && gate_half_ == 0 && HasSwiGlu(product)) {
      call.Run(calls_.swiglu, call.Tensor(ops.x.data, t, {ops.rows, 2 * ops.width}, "A"), int64_t{-1}, out);
      return;
    }
    if (ops.split && IsGelu(kind_) && gate_half_ == 1 && HasGeGlu(product)) {
      void* gelu_scratch = call.Scratch(static_cast<size_t>(ops.elements()) * ElementBytes(t), "outGelu");
      call.Run(calls_.geglu, call.Tensor(ops.x.data, t, {ops.rows, 2 * ops.width}, "A"), int64_t{-1}, Approximate(),
               out, call.Tensor(gelu_scratch, t, rows, "outGelu"));
      return;
    }
    Activate(call, call.View(ops.x.data, t, rows, {ops.gate_stride, 1}, ops.gate_offset, "gate"), out);
    if (!ops.gated()) return;
    const void* up_data = ops.split ? ops.x.data : ops.b->data;
    call.Run(calls_.mul, out, call.View(up_data, t, rows, {ops.up_stride, 1}, ops.up_offset, "up"));
  }

 private:
  int64_t Approximate() const { return kind_ == ActivationKind::kGeluTanh ? 1 : 0; }

  // out = act(gate), one aclnn call.
  void Activate(AclnnCall& call, aclTensor* gate, aclTensor* out) const {
    if (IsGelu(kind_)) return call.Run(calls_.gelu, gate, Approximate(), out);
    if (kind_ == ActivationKind::kSilu) return call.Run(calls_.silu, gate, out);
    call.Run(calls_.swish, gate, call.Scalar(alpha_, "beta"), out);
  }

  const CannRuntime* rt_;
  ActivationCalls calls_;
  ActivationKind kind_;
  float alpha_;
  bool gated_;
  int64_t gate_half_;
};

template <Placement P>
struct AscendGelu : AscendActivationKernel<P> {
  explicit AscendGelu(const KernelInfo& info) : AscendActivationKernel<P>(ReadGeluApproximate(info), 1.0f, false, 0) {}
};
template <Placement P>
struct AscendQuickGelu : AscendActivationKernel<P> {
  explicit AscendQuickGelu(const KernelInfo& info)
      : AscendActivationKernel<P>(ActivationKind::kQuickGelu, ReadQuickGeluAlpha(info), false, 0) {}
};
template <Placement P>
struct AscendSilu : AscendActivationKernel<P> {
  explicit AscendSilu(const KernelInfo&) : AscendActivationKernel<P>(ActivationKind::kSilu, 1.0f, false, 0) {}
};
template <Placement P>
struct AscendSwiGlu : AscendActivationKernel<P> {
  explicit AscendSwiGlu(const KernelInfo& info)
      : AscendActivationKernel<P>(ActivationKind::kSilu, 1.0f, true, ReadGateHalf(info)) {}
};
template <Placement P>
struct AscendGeGlu : AscendActivationKernel<P> {
  explicit AscendGeGlu(const KernelInfo& info)
      : AscendActivationKernel<P>(ReadGeluApproximate(info), 1.0f, true, ReadGateHalf(info)) {}
};

template <Placement P>
void AppendAll(CustomOpList& ops) {
  const char* ep = ExecutionProviderOf(P);
  AppendPerType<AscendGelu<P>>(ops, [ep](ONNXTensorElementDataType t) { return UnaryActivationSpec("Gelu", ep, t); });
  AppendPerType<AscendQuickGelu<P>>(
      ops, [ep](ONNXTensorElementDataType t) { return UnaryActivationSpec("QuickGelu", ep, t); });
  AppendPerType<AscendSilu<P>>(ops, [ep](ONNXTensorElementDataType t) { return UnaryActivationSpec("SiLU", ep, t); });
  AppendPerType<AscendSwiGlu<P>>(ops,
                                 [ep](ONNXTensorElementDataType t) { return GatedActivationSpec("SwiGLU", ep, t); });
  AppendPerType<AscendGeGlu<P>>(ops, [ep](ONNXTensorElementDataType t) { return GatedActivationSpec("GeGLU", ep, t); });
}

}  // namespace

void AppendAscendActivationOps(CustomOpList& ops, Placement placement) {
  if (placement == Placement::kCannEp) {
    AppendAll<Placement::kCannEp>(ops);
  } else {
    AppendAll<Placement::kCpuTestDouble>(ops);
  }
}

}  // namespace otfuse::ascend
