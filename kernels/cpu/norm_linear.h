// The Norm + Linear kernels (cpu/norm_linear.cc) as the plugin EP's kernels use them
// (cpu/norm_linear_ep.cc): the same computation as the OrtCustomOps, plus pre-packing.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

#include "ort_glue.h"

namespace otfuse::cpu {

// One session's packed weights, so that kernels packing the same initializer share one set of
// panels: a merged decoder's two branches (an If's bodies) read the same outer-scope weights, and
// ORT frees the initializer only once, so separate packings would double it. An entry is found by
// the initializer's address, element type, shape and layout, and used only when its panels hold
// that tensor's values bit for bit (PackedWeightHolds): an address ORT freed and reused can never
// match wrongly.
class PackedWeightCache {
 public:
  std::shared_ptr<uint32_t[]> Find(const InputTensor& w, bool transposed, int64_t k, int64_t n);
  void Add(const InputTensor& w, bool transposed, const std::shared_ptr<uint32_t[]>& panels);

 private:
  struct Entry {
    const void* data;
    ONNXTensorElementDataType type;
    Shape shape;
    bool transposed;
    std::weak_ptr<uint32_t[]> panels;  // owned by the kernels (PackWeight's panels as 32-bit words)
  };
  std::mutex mutex_;
  std::vector<Entry> entries_;
};

class NormLinearOp {
 public:
  virtual ~NormLinearOp() = default;
  // Throws Error, like the OrtCustomOp kernels.
  virtual void Compute(const KernelContext& ctx) const = 0;
  // Packs a W_i (input index `input`: float32, float16 or bfloat16) once, for every later run
  // (common/gemm.h, PackWeight), or takes the panels `cache` already holds for it: true when it
  // did, so ORT may free the tensor. Throws Error when out of memory.
  virtual bool PrePack(size_t input, const InputTensor& tensor, PackedWeightCache& cache) = 0;
};

// RMSNormLinear, AddRMSNormLinear, LayerNormLinear, AddLayerNormLinear, in this order.
extern const char* const kNormLinearOpNames[4];

// The kernel of the op info.op_name() names (one of kNormLinearOpNames; Error otherwise).
std::unique_ptr<NormLinearOp> MakeNormLinearOp(const KernelInfo& info);

}  // namespace otfuse::cpu
