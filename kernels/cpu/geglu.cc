// CPU kernel of GeGLU: Y = Gelu(gate) * up (erf or tanh form), gate and up given as A and B, or
// as the two halves of A's last axis (docs/ops.md). The element math is in activation_math.h.
#include "cpu/activation_kernel.h"
#include "op_registry.h"

namespace otfuse::cpu {
namespace {

class GeGluKernel {
 public:
  explicit GeGluKernel(const KernelInfo& info) : runner_(ReadGeluApproximate(info)), gate_half_(ReadGateHalf(info)) {}
  void Compute(const KernelContext& ctx) const { runner_.Run(ctx, ReadGatedOperands(ctx, gate_half_)); }

 private:
  ActivationRunner runner_;
  int64_t gate_half_;
};

}  // namespace

void AppendGeGluOps(CustomOpList& ops) {
  AppendPerType<GeGluKernel>(ops, [](ONNXTensorElementDataType t) { return GatedActivationSpec("GeGLU", nullptr, t); });
}

}  // namespace otfuse::cpu
