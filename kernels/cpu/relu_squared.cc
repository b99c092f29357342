// CPU kernel of ReluSquared: Y = max(X, 0)^2 (docs/ops.md). The element math is in activation_math.h.
#include "cpu/activation_kernel.h"
#include "op_registry.h"

namespace otfuse::cpu {
namespace {

class ReluSquaredKernel {
 public:
  explicit ReluSquaredKernel(const KernelInfo&) : runner_(ActivationKind::kReluSquared) {}
  void Compute(const KernelContext& ctx) const { runner_.Run(ctx, ReadUnaryOperands(ctx)); }

 private:
  ActivationRunner runner_;
};

}  // namespace

void AppendReluSquaredOps(CustomOpList& ops) {
  AppendPerType<ReluSquaredKernel>(
      ops, [](ONNXTensorElementDataType t) { return UnaryActivationSpec("ReluSquared", nullptr, t); });
}

}  // namespace otfuse::cpu
