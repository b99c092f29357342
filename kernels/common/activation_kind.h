// The element-wise activations of the activation family (docs/ops.md, "Activation family"): what
// the CPU rows, the kernels of every backend and the shared checks (activation_params.h) agree on.
#pragma once

namespace otfuse {

enum class ActivationKind {
  kGeluErf,    // x * Phi(x), Phi from erf: Gelu(approximate = "none"), GeGLU's gate
  kGeluTanh,   // Gelu(approximate = "tanh")
  kQuickGelu,  // x * sigmoid(alpha * x)
  kSilu,       // x * sigmoid(x): SiLU, SwiGLU's gate
  kReluSquared,  // max(x, 0)^2: ReluSquared
};

}  // namespace otfuse
