// The Norm + Linear kernels (cpu/norm_linear.cc) as the plugin EP's kernels use them
// (cpu/norm_linear_ep.cc): the same computation as the OrtCustomOps, plus pre-packing.
#pragma once

#include <cstddef>
#include <memory>

#include "ort_glue.h"

namespace otfuse::cpu {

class NormLinearOp {
 public:
  virtual ~NormLinearOp() = default;
  // Throws Error, like the OrtCustomOp kernels.
  virtual void Compute(const KernelContext& ctx) const = 0;
  // Packs a float32 W_i (input index `input`) once, for every later run (common/gemm.h,
  // PackWeight): true when it did, so ORT may free the tensor. Throws Error when out of memory.
  virtual bool PrePack(size_t input, const InputTensor& tensor) = 0;
};

// RMSNormLinear, AddRMSNormLinear, LayerNormLinear, AddLayerNormLinear, in this order.
extern const char* const kNormLinearOpNames[4];

// The kernel of the op info.op_name() names (one of kNormLinearOpNames; Error otherwise).
std::unique_ptr<NormLinearOp> MakeNormLinearOp(const KernelInfo& info);

}  // namespace otfuse::cpu
