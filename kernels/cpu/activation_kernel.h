// What the CPU kernels of the activation family share (gelu.cc, quick_gelu.cc, silu.cc,
// relu_squared.cc, swiglu.cc, geglu.cc: one op each): the CPU variant to run, and running the element loops of
// activation_rows.inc over ORT's thread pool.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>

#include "common/activation_params.h"
#include "cpu/activation_rows.h"

namespace otfuse::cpu {

enum class ActivationIsa { kBaseline, kAvx2, kAvx512 };

// The best variant this CPU runs, or the one OTFUSE_ACTIVATION_ISA=baseline|avx2|avx512 forces
// (an Error when this CPU or build cannot run it); OTFUSE_CPU_ISA=baseline also forces the
// baseline. Read when a session creates its kernels.
ActivationIsa SelectActivationIsa();
const char* ActivationIsaName(ActivationIsa isa);

// One node's activation: its kind and alpha, and the variant chosen at kernel creation.
class ActivationRunner {
 public:
  explicit ActivationRunner(ActivationKind kind, float alpha = 1.0f);
  // Y = act(gate) (* up), over the operands' [rows, width] view; Y allocated here.
  void Run(const KernelContext& ctx, const ActivationOperands& ops) const;

 private:
  template <typename T>
  void RunTyped(const KernelContext& ctx, const ActivationOperands& ops, void* y) const;
  // The float16 one-input ops' table (ActivationJob::half_table), built at the first large run.
  const uint16_t* HalfTable() const;

  ActivationJob job_;
  ActivationIsa isa_;
  mutable std::once_flag half_table_once_;
  mutable std::unique_ptr<uint16_t[]> half_table_;
};

// One registration function per op file; AppendActivationOps (op_registry.h) calls them all.
void AppendGeluOps(CustomOpList& ops);
void AppendQuickGeluOps(CustomOpList& ops);
void AppendSiluOps(CustomOpList& ops);
void AppendReluSquaredOps(CustomOpList& ops);
void AppendSwiGluOps(CustomOpList& ops);
void AppendGeGluOps(CustomOpList& ops);

}  // namespace otfuse::cpu
