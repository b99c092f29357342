#include "cpu/ort_gemm.h"

#include <memory>
#include <string>

namespace otfuse::cpu {
namespace {

struct OpAttrDeleter {
  void operator()(OrtOpAttr* attr) const { Api().ReleaseOpAttr(attr); }
};
using OpAttrPtr = std::unique_ptr<OrtOpAttr, OpAttrDeleter>;

struct ValueDeleter {
  void operator()(OrtValue* value) const { Api().ReleaseValue(value); }
};
using ValuePtr = std::unique_ptr<OrtValue, ValueDeleter>;

OpAttrPtr IntAttr(const char* name, int64_t value) {
  OrtOpAttr* attr = nullptr;
  ThrowOnError(Api().CreateOpAttr(name, &value, 1, ORT_OP_ATTR_INT, &attr), "CreateOpAttr");
  return OpAttrPtr(attr);
}

OpAttrPtr FloatAttr(const char* name, float value) {
  OrtOpAttr* attr = nullptr;
  ThrowOnError(Api().CreateOpAttr(name, &value, 1, ORT_OP_ATTR_FLOAT, &attr), "CreateOpAttr");
  return OpAttrPtr(attr);
}

const OrtMemoryInfo* CpuMemory() {
  static const OrtMemoryInfo* info = [] {
    OrtMemoryInfo* created = nullptr;
    ThrowOnError(Api().CreateCpuMemoryInfo(OrtDeviceAllocator, OrtMemTypeDefault, &created), "CreateCpuMemoryInfo");
    return created;  // lives as long as the library
  }();
  return info;
}

// A float32 tensor over `data` (not copied, not owned).
ValuePtr Wrap(const float* data, int64_t rows, int64_t cols) {
  const int64_t shape[2] = {rows, cols};
  OrtValue* value = nullptr;
  ThrowOnError(Api().CreateTensorWithDataAsOrtValue(CpuMemory(), const_cast<float*>(data),
                                                    static_cast<size_t>(rows * cols) * sizeof(float), shape, 2,
                                                    ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, &value),
               "CreateTensorWithDataAsOrtValue");
  return ValuePtr(value);
}

ValuePtr WrapRow(const float* data, int64_t n) {
  const int64_t shape[1] = {n};
  OrtValue* value = nullptr;
  ThrowOnError(Api().CreateTensorWithDataAsOrtValue(CpuMemory(), const_cast<float*>(data),
                                                    static_cast<size_t>(n) * sizeof(float), shape, 1,
                                                    ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, &value),
               "CreateTensorWithDataAsOrtValue");
  return ValuePtr(value);
}

}  // namespace

OrtGemm::OrtGemm(const KernelInfo& info, bool transposed, bool with_bias)
    : transposed_(transposed), with_bias_(with_bias) {
  const OpAttrPtr attrs[] = {IntAttr("transA", 0), IntAttr("transB", transposed ? 1 : 0), FloatAttr("alpha", 1.0f),
                             FloatAttr("beta", 1.0f)};
  const OrtOpAttr* attr_values[] = {attrs[0].get(), attrs[1].get(), attrs[2].get(), attrs[3].get()};
  const char* type_names[] = {"T"};
  const ONNXTensorElementDataType type_values[] = {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT};
  // Gemm-13: the CPU EP's float32 kernel of every ORT release we support.
  ThrowOnError(Api().CreateOp(info.raw(), "Gemm", "", 13, type_names, type_values, 1, attr_values, 4,
                              with_bias ? 3 : 2, 1, &op_),
               "creating ONNX Runtime's Gemm kernel (OrtApi::CreateOp)");
}

OrtGemm::~OrtGemm() {
  if (op_ != nullptr) Api().ReleaseOp(op_);
}

void OrtGemm::Run(const KernelContext& ctx, int64_t m, int64_t k, int64_t n, const float* a, const float* w,
                  const float* bias, float* y) const {
  if (m == 0) return;
  if (with_bias_ != (bias != nullptr)) throw Error("internal: Gemm created " + std::string(with_bias_ ? "with" : "without") + " a bias");
  const ValuePtr a_value = Wrap(a, m, k);
  const ValuePtr w_value = transposed_ ? Wrap(w, n, k) : Wrap(w, k, n);
  const ValuePtr y_value = Wrap(y, m, n);
  ValuePtr bias_value;
  if (bias != nullptr) bias_value = WrapRow(bias, n);
  const OrtValue* inputs[] = {a_value.get(), w_value.get(), bias_value.get()};
  OrtValue* outputs[] = {y_value.get()};
  ThrowOnError(Api().InvokeOp(ctx.raw(), op_, inputs, with_bias_ ? 3 : 2, outputs, 1),
               "ONNX Runtime's Gemm (OrtApi::InvokeOp)");
}

}  // namespace otfuse::cpu
