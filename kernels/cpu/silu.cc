// CPU kernel of SiLU: Y = X * sigmoid(X) (docs/ops.md). The element math is in activation_math.h.
#include "cpu/activation_kernel.h"
#include "op_registry.h"

namespace otfuse::cpu {
namespace {

class SiluKernel {
 public:
  explicit SiluKernel(const KernelInfo&) : runner_(ActivationKind::kSilu) {}
  void Compute(const KernelContext& ctx) const { runner_.Run(ctx, ReadUnaryOperands(ctx)); }

 private:
  ActivationRunner runner_;
};

}  // namespace

void AppendSiluOps(CustomOpList& ops) {
  AppendPerType<SiluKernel>(ops, [](ONNXTensorElementDataType t) { return UnaryActivationSpec("SiLU", nullptr, t); });
}

}  // namespace otfuse::cpu
