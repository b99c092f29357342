#include "contract/contract_spec.h"

#include <cstring>
#include <string>
#include <vector>

namespace otfuse {
namespace {

bool IsT(const contract::Formal& formal) { return std::strcmp(formal.types, "T") == 0; }

// One concrete type name of the contract ("float32", "int64", ...) or UNDEFINED for anything else.
ONNXTensorElementDataType Concrete(const char* types) {
  struct Named {
    const char* name;
    ONNXTensorElementDataType type;
  };
  static constexpr Named kNamed[] = {
      {"float32", ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT},   {"float16", ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16},
      {"bfloat16", ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16}, {"int64", ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64},
      {"int32", ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32},     {"bool", ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL},
  };
  for (const Named& named : kNamed) {
    if (std::strcmp(types, named.name) == 0) return named.type;
  }
  return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
}

std::vector<IoSpec> Formals(const contract::Formal* formals, size_t count, ONNXTensorElementDataType t) {
  std::vector<IoSpec> specs;
  for (size_t i = 0; i < count; ++i) {
    if (formals[i].variadic) {
      bool all_t = true;
      for (size_t j = i; j < count; ++j) all_t = all_t && IsT(formals[j]);
      specs.push_back({all_t ? t : ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED, false, true});
      break;
    }
    specs.push_back({IsT(formals[i]) ? t : Concrete(formals[i].types), formals[i].optional});
  }
  return specs;
}

}  // namespace

const contract::OpContract& FindContract(const char* name) {
  for (const contract::OpContract& op : contract::kOps) {
    if (std::strcmp(op.name, name) == 0) return op;
  }
  throw Error(std::string("otfuse/ops.py declares no op ") + name);
}

OpSpec ContractOpSpec(const char* name, const char* execution_provider, ONNXTensorElementDataType t) {
  const contract::OpContract& op = FindContract(name);
  return OpSpec{op.name, execution_provider, Formals(op.inputs, op.input_count, t),
                Formals(op.outputs, op.output_count, t)};
}

}  // namespace otfuse
