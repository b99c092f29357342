#include "ascend/aclnn_call.h"

namespace otfuse::ascend {

const CannRuntime& BindRuntime(Placement placement) {
  const CannRuntime& rt = CannRuntime::Load();
  if (placement == Placement::kCannEp && rt.is_test_double()) {
    throw Error("the CANN runtime found in " + rt.directory() +
                " is otfuse's CPU test double (tests/fake_cann), which cannot run on an NPU; point "
                "ASCEND_HOME_PATH (or OTFUSE_CANN_LIB_DIR) at a real CANN toolkit");
  }
  if (placement == Placement::kCpuTestDouble && !rt.is_test_double()) {
    throw Error("session config otfuse.ascend_ep.fake_mode is test-only: it runs the Ascend kernels on CPU "
                "memory and needs otfuse's CPU test double of the CANN runtime (tests/fake_cann), but " +
                rt.directory() + " holds a real CANN runtime; use the CANNExecutionProvider instead");
  }
  return rt;
}

aclDataType ToAclDataType(ONNXTensorElementDataType type) {
  switch (type) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return ACL_FLOAT;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return ACL_FLOAT16;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: return ACL_BF16;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: return ACL_INT64;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: return ACL_INT32;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL: return ACL_BOOL;
    default: throw Error(std::string("no aclDataType for ") + ElementTypeName(type));
  }
}

size_t ElementBytes(ONNXTensorElementDataType type) {
  switch (type) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: return 4;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: return 2;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: return 8;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL: return 1;
    default: throw Error(std::string("no element size for ") + ElementTypeName(type));
  }
}

Shape ContiguousStrides(const Shape& shape) {
  Shape strides(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) strides[i - 1] = strides[i] * shape[i];
  return strides;
}

AclnnCall::AclnnCall(const CannRuntime& rt, const KernelContext& ctx, size_t input) : rt_(rt) {
  OrtKernelContext* raw = ctx.raw();
  void* stream = nullptr;
  // The EP's compute stream (an aclrtStream under the CANN EP); null under the CPU EP.
  ThrowOnError(Api().KernelContext_GetGPUComputeStream(raw, &stream), "compute stream");
  stream_ = stream;
  const OrtValue* value = nullptr;
  ThrowOnError(Api().KernelContext_GetInput(raw, input, &value), "input " + std::to_string(input));
  const OrtMemoryInfo* memory = nullptr;
  if (value != nullptr && Api().GetTensorMemoryInfo(value, &memory) == nullptr && memory != nullptr) {
    OrtStatus* status = Api().KernelContext_GetAllocator(raw, memory, &allocator_);
    if (status != nullptr) {  // no ORT allocator for that device: fall back to aclrtMalloc
      Api().ReleaseStatus(status);
      allocator_ = nullptr;
    }
  }
}

AclnnCall::~AclnnCall() { Release(); }

void AclnnCall::Release() noexcept {
  for (aclTensor* tensor : tensors_) rt_.destroy_tensor(tensor);
  // Lists first: they refer to tensors destroyed below.
  for (aclTensorList* list : lists_) rt_.destroy_tensor_list(list);
  lists_.clear();
  for (aclIntArray* array : arrays_) rt_.destroy_int_array(array);
  for (aclScalar* scalar : scalars_) rt_.destroy_scalar(scalar);
  scalars_.clear();
  scalar_values_.clear();
  tensors_.clear();
  arrays_.clear();
  // ORT's allocator hands out stream-ordered memory (as for ORT's own CANN kernels): later
  // kernels reuse it on the same stream, after this one's work.
  for (void* buffer : ort_buffers_) allocator_->Free(allocator_, buffer);
  ort_buffers_.clear();
  if (!acl_buffers_.empty()) {
    if (rt_.rt_synchronize_stream != nullptr) rt_.rt_synchronize_stream(stream_);
    for (void* buffer : acl_buffers_) rt_.rt_free(buffer);
    acl_buffers_.clear();
  }
  if (allocator_ != nullptr) {
    Api().ReleaseAllocator(allocator_);
    allocator_ = nullptr;
  }
}

aclTensor* AclnnCall::Tensor(const void* data, ONNXTensorElementDataType type, const Shape& shape,
                             const char* what) {
  Shape strides(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) strides[i - 1] = strides[i] * shape[i];
  aclTensor* tensor = rt_.create_tensor(shape.data(), shape.size(), ToAclDataType(type), strides.data(), 0,
                                        ACL_FORMAT_ND, shape.data(), shape.size(), const_cast<void*>(data));
  if (tensor == nullptr) {
    const std::string detail = rt_.RecentErrorMessage();
    throw Error(std::string("aclCreateTensor failed for ") + what + " " + ToString(shape) +
                (detail.empty() ? "" : ": " + detail));
  }
  tensors_.push_back(tensor);
  return tensor;
}

aclTensor* AclnnCall::View(const void* data, ONNXTensorElementDataType type, const Shape& shape,
                           const Shape& strides, int64_t offset, const char* what) {
  // The storage a view reads: one flat run of elements from the buffer start to its last element.
  int64_t last = offset;
  bool empty = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 0) empty = true;
    else last += (shape[i] - 1) * strides[i];
  }
  const Shape storage{empty ? 0 : last + 1};
  aclTensor* tensor = rt_.create_tensor(shape.data(), shape.size(), ToAclDataType(type), strides.data(), offset,
                                        ACL_FORMAT_ND, storage.data(), storage.size(), const_cast<void*>(data));
  if (tensor == nullptr) {
    const std::string detail = rt_.RecentErrorMessage();
    throw Error(std::string("aclCreateTensor failed for ") + what + " " + ToString(shape) + " (strides " +
                ToString(strides) + ")" + (detail.empty() ? "" : ": " + detail));
  }
  tensors_.push_back(tensor);
  return tensor;
}

aclTensorList* AclnnCall::TensorList(const std::vector<aclTensor*>& tensors, const char* what) {
  if (rt_.create_tensor_list == nullptr || rt_.destroy_tensor_list == nullptr) {
    throw Error("the CANN runtime in " + rt_.directory() + " exports no aclCreateTensorList/aclDestroyTensorList");
  }
  aclTensorList* list = rt_.create_tensor_list(tensors.data(), tensors.size());
  if (list == nullptr) {
    const std::string detail = rt_.RecentErrorMessage();
    throw Error(std::string("aclCreateTensorList failed for ") + what + (detail.empty() ? "" : ": " + detail));
  }
  lists_.push_back(list);
  return list;
}

aclIntArray* AclnnCall::IntArray(const Shape& values, const char* what) {
  aclIntArray* array = rt_.create_int_array(values.data(), values.size());
  if (array == nullptr) throw Error(std::string("aclCreateIntArray failed for ") + what + " " + ToString(values));
  arrays_.push_back(array);
  return array;
}

aclScalar* AclnnCall::Scalar(float value, const char* what) {
  if (rt_.create_scalar == nullptr || rt_.destroy_scalar == nullptr) {
    throw Error("the CANN runtime in " + rt_.directory() + " exports no aclCreateScalar/aclDestroyScalar");
  }
  scalar_values_.push_back(std::make_unique<float>(value));
  aclScalar* scalar = rt_.create_scalar(scalar_values_.back().get(), ACL_FLOAT);
  if (scalar == nullptr) {
    const std::string detail = rt_.RecentErrorMessage();
    throw Error(std::string("aclCreateScalar failed for ") + what + (detail.empty() ? "" : ": " + detail));
  }
  scalars_.push_back(scalar);
  return scalar;
}

void* AclnnCall::Scratch(size_t bytes, const char* what) {
  if (allocator_ != nullptr) {
    void* buffer = allocator_->Alloc(allocator_, bytes);
    if (buffer == nullptr) throw Error("out of device memory for the " + std::to_string(bytes) + "-byte " + what);
    ort_buffers_.push_back(buffer);
    return buffer;
  }
  if (rt_.rt_malloc == nullptr || rt_.rt_free == nullptr) {
    throw Error(std::string("no allocator for the ") + what + ": ORT offers none for this device and the CANN "
                "runtime exports no aclrtMalloc/aclrtFree");
  }
  void* buffer = nullptr;
  const aclError status = rt_.rt_malloc(&buffer, bytes, ACL_MEM_MALLOC_HUGE_FIRST);
  if (status != 0 || buffer == nullptr) {
    const std::string detail = rt_.RecentErrorMessage();
    throw Error("aclrtMalloc of " + std::to_string(bytes) + " bytes for the " + what + " returned " +
                std::to_string(status) + (detail.empty() ? "" : ": " + detail));
  }
  acl_buffers_.push_back(buffer);
  return buffer;
}

void* AclnnCall::ZeroedScratch(size_t bytes, const char* what) {
  void* buffer = Scratch(bytes, what);
  if (rt_.rt_memset_async == nullptr) {
    throw Error(std::string("the CANN runtime exports no aclrtMemsetAsync, needed to zero the ") + what);
  }
  const aclError status = rt_.rt_memset_async(buffer, bytes, 0, bytes, stream_);
  if (status != 0) {
    const std::string detail = rt_.RecentErrorMessage();
    throw Error(std::string("aclrtMemsetAsync for the ") + what + " returned " + std::to_string(status) +
                (detail.empty() ? "" : ": " + detail));
  }
  return buffer;
}

void AclnnCall::Check(aclnnStatus status, const std::string& api) const {
  if (status == 0) return;
  const char* name = AclnnStatusName(status);
  const std::string detail = rt_.RecentErrorMessage();
  throw Error(api + " returned " + std::to_string(status) + (*name ? std::string(" (") + name + ")" : "") +
              (detail.empty() ? "" : ": " + detail));
}

}  // namespace otfuse::ascend
