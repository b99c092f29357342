// How the Ascend kernels rotate one tensor with aclnnRotaryPositionEmbedding (contract: docs/ops.md,
// "Rotary embedding family", Ascend lines). Shared by rotary_ascend.cc (RotaryEmbedding,
// RotaryEmbeddingQK) and attention_ascend.cc (RopeAttention).
//
// aclnnRotaryPositionEmbedding(x, cos, sin, int64 mode, out) — hicann/ops-transformer
// posembedding/rotary_position_embedding/docs/aclnnRotaryPositionEmbedding_en.md:
//   * mode 0 = half, 1 = interleave (the A2/A3 values); x, cos, sin, out of one dtype (BF16, FP16,
//     FP32); x, cos, sin may be non-contiguous, out may not; x and out 4-D here;
//   * the layout is read from the cos/sin broadcast shape: half mode BNSD x with 11SD/B1SD/BNSD
//     cos, BSND x with 1S1D/BS1D/BSND cos (B, N < 1000); interleave mode only 11SD / 1S1D cos
//     (B * N < 1000); D (the rotated width) even and < 896;
//   * not on Atlas inference, training or 200I/500 A2 products.
// Our X may have any rank >= 2 and cos/sin any numpy-broadcastable shape: the plan reshapes both to
// 4-D (merging dims, never copying) into one of the documented cos forms, or refuses with the reason.
// A partial rotary (r < D) or sections rotate strided views of X (one call per section) into a
// contiguous scratch, copied into Y's lanes with aclnnInplaceCopy; the pass-through lanes are copied
// the same way. float32 cos/sin with float16/bfloat16 X are cast to X's type first (aclnnInplaceCopy).
#pragma once

#include <string>
#include <vector>

#include "ascend/aclnn_call.h"
#include "common/rotary_params.h"

namespace otfuse::ascend {

// aclnnRotaryPositionEmbeddingGetWorkspaceSize(x, cos, sin, int64_t mode, out, workspaceSize, executor)
using RotaryPositionEmbeddingGetWorkspace = aclnnStatus (*)(const aclTensor* x, const aclTensor* cos,
                                                            const aclTensor* sin, int64_t mode, aclTensor* out,
                                                            uint64_t* workspace_size, aclOpExecutor** executor);

using ::otfuse::RotaryAttributes;  // common/rotary_params.h

// The aclnn operators a rotation needs, bound once per kernel.
struct RotaryOps {
  AclnnOp<RotaryPositionEmbeddingGetWorkspace> rope;
  AclnnOp<InplaceCopyGetWorkspace> copy;
  static RotaryOps Bind(const CannRuntime& rt);
};

class RotaryPlan {
 public:
  // Checks (as the contract and the aclnn doc say) and plans rotating X (`x_name`, shape, type)
  // by cos/sin of `cos_shape` / `cos_type`. Throws Error with the reason when it cannot.
  static RotaryPlan Make(const char* x_name, const Shape& x_shape, ONNXTensorElementDataType type,
                         const Shape& cos_shape, ONNXTensorElementDataType cos_type, const RotaryAttributes& attrs,
                         Product product);

  // Y (contiguous, X's shape) = rotation of X. Y must not alias X.
  void Run(AclnnCall& call, const RotaryOps& ops, const void* x, const void* cos, const void* sin, void* y) const;

  bool empty() const { return empty_; }
  int64_t r() const { return r_; }

 private:
  struct Segment {
    int64_t offset, width;
  };
  ONNXTensorElementDataType type_ = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  ONNXTensorElementDataType cos_type_ = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  Shape x4_;    // [A, B, C, D]: X reshaped
  Shape cos4_;  // [a, b, c, r]: cos reshaped (a in {1, A}, ...)
  int64_t d_ = 0, r_ = 0;
  int64_t mode_ = 0;
  std::vector<Segment> segments_;
  bool empty_ = false;
};

}  // namespace otfuse::ascend
