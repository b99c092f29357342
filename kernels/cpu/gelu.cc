// CPU kernel of Gelu: Y = X * Phi(X), Phi from erf (approximate = "none") or its tanh
// approximation (docs/ops.md). The element math is in activation_math.h.
#include "cpu/activation_kernel.h"
#include "op_registry.h"

namespace otfuse::cpu {
namespace {

class GeluKernel {
 public:
  explicit GeluKernel(const KernelInfo& info) : runner_(ReadGeluApproximate(info)) {}
  void Compute(const KernelContext& ctx) const { runner_.Run(ctx, ReadUnaryOperands(ctx)); }

 private:
  ActivationRunner runner_;
};

}  // namespace

void AppendGeluOps(CustomOpList& ops) {
  AppendPerType<GeluKernel>(ops, [](ONNXTensorElementDataType t) { return UnaryActivationSpec("Gelu", nullptr, t); });
}

}  // namespace otfuse::cpu
