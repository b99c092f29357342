#include "ort_glue.h"

#include <atomic>
#include <memory>

namespace otfuse {
namespace {

std::atomic<const OrtApi*> g_api{nullptr};

struct TypeShapeDeleter {
  void operator()(OrtTensorTypeAndShapeInfo* info) const { Api().ReleaseTensorTypeAndShapeInfo(info); }
};
using TypeShapePtr = std::unique_ptr<OrtTensorTypeAndShapeInfo, TypeShapeDeleter>;

// Returns true when the call succeeded; swallows the error status otherwise.
bool Succeeded(OrtStatus* status) {
  if (status == nullptr) return true;
  Api().ReleaseStatus(status);
  return false;
}

void ReadTypeAndShape(const OrtValue* value, ONNXTensorElementDataType* type, Shape* shape) {
  OrtTensorTypeAndShapeInfo* raw = nullptr;
  ThrowOnError(Api().GetTensorTypeAndShape(value, &raw));
  TypeShapePtr info(raw);
  ThrowOnError(Api().GetTensorElementType(info.get(), type));
  size_t rank = 0;
  ThrowOnError(Api().GetDimensionsCount(info.get(), &rank));
  shape->assign(rank, 0);
  if (rank > 0) ThrowOnError(Api().GetDimensions(info.get(), shape->data(), rank));
}

}  // namespace

const OrtApi& Api() { return *g_api.load(std::memory_order_acquire); }

void SetApi(const OrtApi* api) { g_api.store(api, std::memory_order_release); }

void ThrowOnError(OrtStatus* status, const std::string& what) {
  if (status == nullptr) return;
  std::string message = Api().GetErrorMessage(status);
  Api().ReleaseStatus(status);
  throw Error(what.empty() ? message : what + ": " + message);
}

OrtStatus* MakeStatus(const std::string& message, OrtErrorCode code) {
  return Api().CreateStatus(code, message.c_str());
}

std::string ToString(const Shape& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(shape[i]);
  }
  return text + "]";
}

const char* ElementTypeName(ONNXTensorElementDataType type) {
  switch (type) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return "float32";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return "float16";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: return "bfloat16";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE: return "float64";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8: return "int8";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8: return "uint8";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: return "int32";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: return "int64";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL: return "bool";
    default: return "an unsupported element type";
  }
}

KernelInfo::KernelInfo(const OrtKernelInfo* info, const char* op_name) : info_(info), op_name_(op_name) {
  size_t size = 0;
  if (Succeeded(Api().KernelInfo_GetNodeName(info_, nullptr, &size)) && size > 0) {
    std::string name(size, '\0');
    if (Succeeded(Api().KernelInfo_GetNodeName(info_, name.data(), &size))) {
      name.resize(size > 0 ? size - 1 : 0);  // size counts the terminating NUL
      node_name_ = name;
    }
  }
}

std::string KernelInfo::Where() const { return op_name_ + " (node '" + node_name_ + "')"; }

// The C API cannot tell "absent" from "wrong type", so a failed read is retried with the other
// type: if that succeeds the attribute exists with the wrong type.
std::optional<float> KernelInfo::FloatAttribute(const char* name) const {
  float value = 0.0f;
  if (Succeeded(Api().KernelInfoGetAttribute_float(info_, name, &value))) return value;
  int64_t as_int = 0;
  if (Succeeded(Api().KernelInfoGetAttribute_int64(info_, name, &as_int))) {
    throw Error(std::string("attribute '") + name + "' must be a float, got an int");
  }
  return std::nullopt;
}

std::optional<int64_t> KernelInfo::IntAttribute(const char* name) const {
  int64_t value = 0;
  if (Succeeded(Api().KernelInfoGetAttribute_int64(info_, name, &value))) return value;
  float as_float = 0.0f;
  if (Succeeded(Api().KernelInfoGetAttribute_float(info_, name, &as_float))) {
    throw Error(std::string("attribute '") + name + "' must be an int, got a float");
  }
  return std::nullopt;
}

// What `name` is when it is not of the type just asked for: "" when absent (or an empty list).
// The scalar getters check the attribute's type; the array getters read any other type as an
// empty list, so only a non-empty list identifies a list type.
static const char* OtherAttributeType(const OrtKernelInfo* info, const char* name) {
  int64_t as_int = 0;
  float as_float = 0.0f;
  size_t size = 0;
  if (Succeeded(Api().KernelInfoGetAttribute_int64(info, name, &as_int))) return "an int";
  if (Succeeded(Api().KernelInfoGetAttribute_float(info, name, &as_float))) return "a float";
  if (Succeeded(Api().KernelInfoGetAttribute_string(info, name, nullptr, &size))) return "a string";
  size = 0;
  if (Succeeded(Api().KernelInfoGetAttributeArray_int64(info, name, nullptr, &size)) && size > 0) {
    return "a list of ints";
  }
  size = 0;
  if (Succeeded(Api().KernelInfoGetAttributeArray_float(info, name, nullptr, &size)) && size > 0) {
    return "a list of floats";
  }
  return "";
}

std::optional<std::string> KernelInfo::StringAttribute(const char* name) const {
  size_t size = 0;
  if (Succeeded(Api().KernelInfoGetAttribute_string(info_, name, nullptr, &size))) {
    std::string value(size, '\0');
    ThrowOnError(Api().KernelInfoGetAttribute_string(info_, name, value.data(), &size),
                 std::string("attribute '") + name + "'");
    value.resize(size > 0 ? size - 1 : 0);  // size counts the terminating NUL
    return value;
  }
  const std::string other = OtherAttributeType(info_, name);
  if (!other.empty()) throw Error(std::string("attribute '") + name + "' must be a string, got " + other);
  return std::nullopt;
}

std::optional<std::vector<int64_t>> KernelInfo::IntsAttribute(const char* name) const {
  size_t size = 0;
  if (Succeeded(Api().KernelInfoGetAttributeArray_int64(info_, name, nullptr, &size))) {
    if (size == 0) {  // an empty list, or an attribute of another type read as one
      const std::string other = OtherAttributeType(info_, name);
      if (!other.empty()) throw Error(std::string("attribute '") + name + "' must be a list of ints, got " + other);
    }
    std::vector<int64_t> values(size);
    if (size > 0) {
      ThrowOnError(Api().KernelInfoGetAttributeArray_int64(info_, name, values.data(), &size),
                   std::string("attribute '") + name + "'");
    }
    return values;
  }
  const std::string other = OtherAttributeType(info_, name);
  if (!other.empty()) throw Error(std::string("attribute '") + name + "' must be a list of ints, got " + other);
  return std::nullopt;
}

size_t KernelInfo::InputCount() const {
  size_t count = 0;
  ThrowOnError(Api().KernelInfo_GetInputCount(info_, &count));
  return count;
}

std::optional<InputTensor> KernelInfo::ConstantInput(size_t index) const {
  int is_constant = 0;
  const OrtValue* value = nullptr;
  if (!Succeeded(Api().KernelInfoGetConstantInput_tensor(info_, index, &is_constant, &value)) || !is_constant ||
      value == nullptr) {
    return std::nullopt;
  }
  InputTensor tensor;
  ReadTypeAndShape(value, &tensor.type, &tensor.shape);
  void* data = nullptr;
  ThrowOnError(Api().GetTensorMutableData(const_cast<OrtValue*>(value), &data));
  tensor.data = data;
  return tensor;
}

size_t KernelContext::InputCount() const {
  size_t count = 0;
  ThrowOnError(Api().KernelContext_GetInputCount(context_, &count));
  return count;
}

size_t KernelContext::OutputCount() const {
  size_t count = 0;
  ThrowOnError(Api().KernelContext_GetOutputCount(context_, &count));
  return count;
}

std::optional<InputTensor> KernelContext::Input(size_t index) const {
  if (index >= InputCount()) return std::nullopt;
  const OrtValue* value = nullptr;
  ThrowOnError(Api().KernelContext_GetInput(context_, index, &value));
  if (value == nullptr) return std::nullopt;
  int is_tensor = 0;
  ThrowOnError(Api().IsTensor(value, &is_tensor));
  if (!is_tensor) throw Error("input " + std::to_string(index) + " is not a tensor");
  InputTensor tensor;
  ReadTypeAndShape(value, &tensor.type, &tensor.shape);
  // GetTensorMutableData is the only data accessor in API 17; we never write through it.
  void* data = nullptr;
  ThrowOnError(Api().GetTensorMutableData(const_cast<OrtValue*>(value), &data));
  tensor.data = data;
  return tensor;
}

OutputTensor KernelContext::Output(size_t index, const Shape& shape) const {
  OutputTensor tensor;
  tensor.shape = shape;
  if (index >= OutputCount()) return tensor;
  OrtValue* value = nullptr;
  ThrowOnError(Api().KernelContext_GetOutput(context_, index, shape.data(), shape.size(), &value));
  if (value == nullptr) return tensor;
  ThrowOnError(Api().GetTensorMutableData(value, &tensor.data));
  if (tensor.data == nullptr) {
    // A tensor with no elements may have no buffer; hand back a non-null, never-dereferenced
    // pointer so the caller still sees the output as present.
    static char empty_buffer = 0;
    tensor.data = &empty_buffer;
  }
  return tensor;
}

InputTensor RequiredInput(const KernelContext& ctx, size_t index, const std::string& name) {
  std::optional<InputTensor> tensor = ctx.Input(index);
  if (!tensor) throw Error("input '" + name + "' is required");
  return *tensor;
}

}  // namespace otfuse
