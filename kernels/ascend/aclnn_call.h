// What every Ascend kernel needs around an aclnn operator call, so that an op family's file
// (norm_ascend.cc, and later rotary/attention/norm+linear) only maps its node onto the aclnn
// arguments:
//
//   * BindRuntime: loads the CANN runtime for the kernel's placement (CANN EP, or the test-only
//     CPU placement that needs otfuse's test double) — called from the kernel's constructor, so
//     a missing runtime fails session creation with the op and node named;
//   * AclnnOp<GetWorkspace>: the two entry points of one operator, resolved once;
//   * AclnnCall: one Compute's call — aclTensors over ORT's buffers, device scratch, the
//     two-phase call on ORT's compute stream, and everything released afterwards. Every failure
//     (a status code, a null tensor, no memory) throws Error with aclGetRecentErrMsg() appended;
//     the trampolines in common/custom_op.h prefix the op and node.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ascend/cann_runtime.h"
#include "ascend/placement.h"
#include "ort_glue.h"

namespace otfuse::ascend {

constexpr const char* kCannExecutionProvider = "CANNExecutionProvider";
constexpr const char* kCpuExecutionProvider = "CPUExecutionProvider";

inline const char* ExecutionProviderOf(Placement placement) {
  return placement == Placement::kCannEp ? kCannExecutionProvider : kCpuExecutionProvider;
}

// Loads the runtime and checks it suits the placement: the test double never runs under the
// CANN EP (its "device" pointers are host pointers), and the CPU placement never uses a real
// CANN runtime.
const CannRuntime& BindRuntime(Placement placement);

aclDataType ToAclDataType(ONNXTensorElementDataType type);
// Bytes per element of the types the Ascend kernels pass (float32, float16, bfloat16, int32,
// int64, bool).
size_t ElementBytes(ONNXTensorElementDataType type);
// Contiguous (row-major) strides of `shape`, in elements.
Shape ContiguousStrides(const Shape& shape);

// aclnnInplaceCopyGetWorkspaceSize(aclTensor* selfRef, const aclTensor* src, workspaceSize,
// executor): selfRef = src, src broadcast to selfRef's shape and converted to its dtype; both may
// be non-contiguous, ND, 1-8 dims. cann/ops-math conversion/view_copy/docs/aclnnInplaceCopy.md
// (the dtype conversion is an internal Cast: cann/ops-math issue 3278). The Ascend kernels use it
// for every copy, transpose, broadcast and cast around their main call.
using InplaceCopyGetWorkspace = aclnnStatus (*)(aclTensor* self_ref, const aclTensor* src, uint64_t* workspace_size,
                                                aclOpExecutor** executor);

// Phase one (GetWorkspace, the op's own signature) and phase two of one aclnn operator.
template <typename GetWorkspace>
struct AclnnOp {
  std::string name;  // "aclnnRmsNorm"
  GetWorkspace get_workspace = nullptr;
  fn::AclnnExecute execute = nullptr;

  static AclnnOp Bind(const CannRuntime& rt, const std::string& name) {
    AclnnOp op;
    op.name = name;
    op.get_workspace = reinterpret_cast<GetWorkspace>(rt.Require((name + "GetWorkspaceSize").c_str()));
    op.execute = reinterpret_cast<fn::AclnnExecute>(rt.Require(name.c_str()));
    return op;
  }
};

class AclnnCall {
 public:
  // `input` is the index of an input whose memory the scratch buffers are allocated beside.
  AclnnCall(const CannRuntime& rt, const KernelContext& ctx, size_t input);
  ~AclnnCall();
  AclnnCall(const AclnnCall&) = delete;
  AclnnCall& operator=(const AclnnCall&) = delete;

  // A contiguous ND aclTensor over `data` (not owned); destroyed with this call.
  aclTensor* Tensor(const void* data, ONNXTensorElementDataType type, const Shape& shape, const char* what);
  // A strided view: `shape` elements at `strides` (in elements) from `data` + `offset` elements.
  aclTensor* View(const void* data, ONNXTensorElementDataType type, const Shape& shape, const Shape& strides,
                  int64_t offset, const char* what);
  aclIntArray* IntArray(const Shape& values, const char* what);
  // aclCreateScalar over a float32 host copy of `value` that lives as long as this call.
  aclScalar* Scalar(float value, const char* what);
  // aclCreateTensorList over tensors created by this call; destroyed with it.
  aclTensorList* TensorList(const std::vector<aclTensor*>& tensors, const char* what);
  // Device memory beside the kernel's input (ORT's allocator for it; aclrtMalloc when ORT
  // has none), released after the call. ZeroedScratch fills it with zero bytes on the stream.
  void* Scratch(size_t bytes, const char* what);
  void* ZeroedScratch(size_t bytes, const char* what);

  aclrtStream stream() const { return stream_; }

  // Phase one, workspace, phase two, on the compute stream.
  template <typename GetWorkspace, typename... Args>
  void Run(const AclnnOp<GetWorkspace>& op, Args... args) {
    uint64_t workspace_size = 0;
    aclOpExecutor* executor = nullptr;
    Check(op.get_workspace(args..., &workspace_size, &executor), op.name + "GetWorkspaceSize");
    void* workspace = workspace_size > 0 ? Scratch(workspace_size, "workspace") : nullptr;
    Check(op.execute(workspace, workspace_size, executor, stream_), op.name);
  }

 private:
  void Check(aclnnStatus status, const std::string& api) const;
  void Release() noexcept;

  const CannRuntime& rt_;
  aclrtStream stream_ = nullptr;
  OrtAllocator* allocator_ = nullptr;  // ORT's allocator for the input's memory, if any
  std::vector<aclTensor*> tensors_;
  std::vector<aclIntArray*> arrays_;
  std::vector<aclTensorList*> lists_;
  std::vector<aclScalar*> scalars_;
  std::vector<std::unique_ptr<float>> scalar_values_;
  std::vector<void*> ort_buffers_;
  std::vector<void*> acl_buffers_;  // aclrtMalloc'd: freed only after the stream has drained
};

}  // namespace otfuse::ascend
