// Turns a C++ kernel class into an OrtCustomOp (the C struct ORT reads the op's schema from).
//
// A kernel class provides
//   explicit Kernel(const KernelInfo& info);      // reads and checks attributes; may throw Error
//   void Compute(const KernelContext& ctx) const; // may throw Error
// and the trampolines below turn every Error into an OrtStatus naming the op and the node.
#pragma once

#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ort_glue.h"

namespace otfuse {

struct IoSpec {
  // UNDEFINED accepts any element type; the kernel then checks it at run time.
  ONNXTensorElementDataType type;
  bool optional = false;
  // Only the last input / output may be variadic: it takes every remaining value of the node
  // (at least 1). A variadic input of type UNDEFINED accepts mixed types (checked at run time).
  bool variadic = false;
};

struct OpSpec {
  const char* name;
  const char* execution_provider;  // nullptr: CPUExecutionProvider
  std::vector<IoSpec> inputs;
  std::vector<IoSpec> outputs;
};

template <typename Kernel>
class CustomOp final : public OrtCustomOp {
 public:
  explicit CustomOp(OpSpec spec) : OrtCustomOp{}, spec_(std::move(spec)) {
    // ORT reads only the fields that existed in this API version; V2 callbacks need >= 16.
    version = kOrtApiVersion;
    GetName = [](const OrtCustomOp* op) { return Self(op).spec_.name; };
    GetExecutionProviderType = [](const OrtCustomOp* op) { return Self(op).spec_.execution_provider; };
    GetInputTypeCount = [](const OrtCustomOp* op) { return Self(op).spec_.inputs.size(); };
    GetOutputTypeCount = [](const OrtCustomOp* op) { return Self(op).spec_.outputs.size(); };
    GetInputType = [](const OrtCustomOp* op, size_t i) { return Self(op).spec_.inputs.at(i).type; };
    GetOutputType = [](const OrtCustomOp* op, size_t i) { return Self(op).spec_.outputs.at(i).type; };
    GetInputCharacteristic = [](const OrtCustomOp* op, size_t i) {
      return Characteristic(Self(op).spec_.inputs.at(i));
    };
    GetOutputCharacteristic = [](const OrtCustomOp* op, size_t i) {
      return Characteristic(Self(op).spec_.outputs.at(i));
    };
    GetInputMemoryType = [](const OrtCustomOp*, size_t) { return OrtMemTypeDefault; };
    // Variadic inputs of type UNDEFINED may mix types; typed ones (and outputs) are homogeneous.
    GetVariadicInputMinArity = [](const OrtCustomOp*) { return 1; };
    GetVariadicInputHomogeneity = [](const OrtCustomOp* op) {
      const auto& inputs = Self(op).spec_.inputs;
      return static_cast<int>(inputs.empty() || !inputs.back().variadic ||
                              inputs.back().type != ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED);
    };
    GetVariadicOutputMinArity = [](const OrtCustomOp*) { return 1; };
    GetVariadicOutputHomogeneity = [](const OrtCustomOp*) { return 1; };
    CreateKernelV2 = &CreateInstance;
    KernelComputeV2 = &ComputeInstance;
    KernelDestroy = [](void* instance) { delete static_cast<Instance*>(instance); };
  }

  CustomOp(const CustomOp&) = delete;
  CustomOp& operator=(const CustomOp&) = delete;

 private:
  struct Instance {
    std::string where;
    Kernel kernel;
  };

  static const CustomOp& Self(const OrtCustomOp* op) { return *static_cast<const CustomOp*>(op); }

  static OrtCustomOpInputOutputCharacteristic Characteristic(const IoSpec& io) {
    if (io.variadic) return INPUT_OUTPUT_VARIADIC;
    return io.optional ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
  }

  static OrtStatus* CreateInstance(const OrtCustomOp* op, const OrtApi*, const OrtKernelInfo* info,
                                   void** out) {
    std::string where = Self(op).spec_.name;
    try {
      KernelInfo kernel_info(info, Self(op).spec_.name);
      where = kernel_info.Where();
      *out = new Instance{where, Kernel(kernel_info)};
      return nullptr;
    } catch (const std::exception& e) {
      return MakeStatus(where + ": " + e.what());
    } catch (...) {
      return MakeStatus(where + ": unknown error", ORT_FAIL);
    }
  }

  static OrtStatus* ComputeInstance(void* instance, OrtKernelContext* context) {
    const auto& self = *static_cast<const Instance*>(instance);
    try {
      self.kernel.Compute(KernelContext(context));
      return nullptr;
    } catch (const Error& e) {
      return MakeStatus(self.where + ": " + e.what());
    } catch (const std::exception& e) {
      return MakeStatus(self.where + ": " + e.what(), ORT_FAIL);
    } catch (...) {
      return MakeStatus(self.where + ": unknown error", ORT_FAIL);
    }
  }

  OpSpec spec_;
};

// shared_ptr keeps CustomOp<Kernel>'s own deleter (OrtCustomOp has no virtual destructor).
using CustomOpPtr = std::shared_ptr<const OrtCustomOp>;
using CustomOpList = std::vector<CustomOpPtr>;

template <typename Kernel>
CustomOpPtr MakeCustomOp(OpSpec spec) {
  return std::make_shared<const CustomOp<Kernel>>(std::move(spec));
}

// The element types T every op is registered for: one OrtCustomOp per T, which ORT merges into
// one schema, picking the kernel whose T matches the node's input.
inline constexpr ONNXTensorElementDataType kFloatTypes[] = {
    ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16, ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16};

// Appends Kernel once per T in kFloatTypes (or in `types`), its schema from make_spec(T).
template <typename Kernel, typename MakeSpec>
void AppendPerType(CustomOpList& ops, MakeSpec&& make_spec) {
  for (ONNXTensorElementDataType t : kFloatTypes) ops.push_back(MakeCustomOp<Kernel>(make_spec(t)));
}
template <typename Kernel, typename MakeSpec>
void AppendPerType(CustomOpList& ops, const std::vector<ONNXTensorElementDataType>& types, MakeSpec&& make_spec) {
  for (ONNXTensorElementDataType t : types) ops.push_back(MakeCustomOp<Kernel>(make_spec(t)));
}

}  // namespace otfuse
