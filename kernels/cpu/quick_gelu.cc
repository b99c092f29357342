// CPU kernel of QuickGelu: Y = X * sigmoid(alpha * X) (docs/ops.md). The element math is in
// activation_math.h.
#include "cpu/activation_kernel.h"
#include "op_registry.h"

namespace otfuse::cpu {
namespace {

class QuickGeluKernel {
 public:
  explicit QuickGeluKernel(const KernelInfo& info) : runner_(ActivationKind::kQuickGelu, ReadQuickGeluAlpha(info)) {}
  void Compute(const KernelContext& ctx) const { runner_.Run(ctx, ReadUnaryOperands(ctx)); }

 private:
  ActivationRunner runner_;
};

}  // namespace

void AppendQuickGeluOps(CustomOpList& ops) {
  AppendPerType<QuickGeluKernel>(
      ops, [](ONNXTensorElementDataType t) { return UnaryActivationSpec("QuickGelu", nullptr, t); });
}

}  // namespace otfuse::cpu
