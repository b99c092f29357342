// Small C++17 helpers over the ONNX Runtime C API (our own; ORT's C++ header is not used).
//
// Kernels throw otfuse::Error for anything wrong with the model or its inputs; the OrtCustomOp
// trampolines (common/custom_op.h) turn it into an OrtStatus prefixed with the op and node name,
// so nothing escapes into ORT.
// Only functions present in OrtApi version kOrtApiVersion may be called, so that every ORT
// release from 1.17 on can load the library.
#pragma once

#include <onnxruntime_c_api.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace otfuse {

// KernelContext_ParallelFor is the newest function we use: it arrived in API version 17 (ORT 1.17).
constexpr uint32_t kOrtApiVersion = 17;
static_assert(ORT_API_VERSION >= kOrtApiVersion, "onnxruntime_c_api.h is older than ORT 1.17");

// The OrtApi table handed to RegisterCustomOps; set once, before any kernel exists.
const OrtApi& Api();
void SetApi(const OrtApi* api);

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Throws Error carrying ORT's message (prefixed by `what`) when `status` is an error.
void ThrowOnError(OrtStatus* status, const std::string& what = "");

OrtStatus* MakeStatus(const std::string& message, OrtErrorCode code = ORT_INVALID_ARGUMENT);

using Shape = std::vector<int64_t>;
std::string ToString(const Shape& shape);
const char* ElementTypeName(ONNXTensorElementDataType type);

// Read-only view of a kernel input.
struct InputTensor {
  ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  Shape shape;
  const void* data = nullptr;

  template <typename T>
  const T* As() const { return static_cast<const T*>(data); }
};

// Writable view of a kernel output; data is null when the node does not produce that output.
struct OutputTensor {
  Shape shape;
  void* data = nullptr;

  explicit operator bool() const { return data != nullptr; }
  template <typename T>
  T* As() const { return static_cast<T*>(data); }
};

class KernelInfo {
 public:
  KernelInfo(const OrtKernelInfo* info, const char* op_name);

  const std::string& op_name() const { return op_name_; }
  const std::string& node_name() const { return node_name_; }
  // The raw info, for C API calls this wrapper does not cover (e.g. OrtApi::CreateOp).
  const OrtKernelInfo* raw() const { return info_; }
  // "RMSNorm (node 'foo')": the prefix the trampolines put on every error this node reports.
  std::string Where() const;

  // nullopt when the attribute is absent; Error when present with another type.
  std::optional<float> FloatAttribute(const char* name) const;
  std::optional<int64_t> IntAttribute(const char* name) const;
  // Number of inputs of the node (variadic ones included).
  size_t InputCount() const;
  // The input's value when it is a constant initializer (ORT keeps it alive for the session),
  // else nullopt: the kernel must read it from the KernelContext on every run.
  std::optional<InputTensor> ConstantInput(size_t index) const;
  std::optional<std::string> StringAttribute(const char* name) const;
  std::optional<std::vector<int64_t>> IntsAttribute(const char* name) const;

 private:
  const OrtKernelInfo* info_;
  std::string op_name_;
  std::string node_name_;
};

class KernelContext {
 public:
  explicit KernelContext(OrtKernelContext* context) : context_(context) {}
  // The raw context, for C API calls this wrapper does not cover (e.g. the compute stream).
  OrtKernelContext* raw() const { return context_; }

  size_t InputCount() const;
  size_t OutputCount() const;
  // nullopt when an optional input is absent (index past the end or an empty name).
  std::optional<InputTensor> Input(size_t index) const;
  // Allocates output `index`; the result is empty when the node leaves that output out.
  OutputTensor Output(size_t index, const Shape& shape) const;

  // Calls fn(i) for i in [0, total) on ORT's intra-op thread pool; serially if there is none.
  // fn must not throw.
  template <typename Fn>
  void ParallelFor(size_t total, const Fn& fn) const {
    if (total > 1) {
      auto trampoline = [](void* data, size_t i) { (*static_cast<const Fn*>(data))(i); };
      OrtStatus* status = Api().KernelContext_ParallelFor(context_, trampoline, total, 0,
                                                          const_cast<Fn*>(&fn));
      if (status == nullptr) return;
      Api().ReleaseStatus(status);  // no thread pool: fall through to the serial loop
    }
    for (size_t i = 0; i < total; ++i) fn(i);
  }

 private:
  OrtKernelContext* context_;
};

// Input `index`, or Error "input '<name>' is required" when the node leaves it out.
InputTensor RequiredInput(const KernelContext& ctx, size_t index, const std::string& name);

}  // namespace otfuse
