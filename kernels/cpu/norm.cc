// CPU kernels of the normalisation family: RMSNorm, AddRMSNorm, LayerNorm, AddLayerNorm
// (contract: docs/ops.md). Rows of D elements are independent; each row is widened to float32,
// reduced and scaled in float32 and rounded to T once, at the store.
#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "common/float_types.h"
#include "common/shape_check.h"
#include "op_registry.h"

namespace otfuse::cpu {
namespace {

enum class NormKind { kRms, kLayer };

// One row of the normalised input, as float32.
template <typename T>
struct InputRow {
  const T* x;
  float operator()(int64_t i) const { return ToFloat(x[i]); }
};

// One row of A + B, rounded to T as the unfused graph's Add output is, then widened again.
template <typename T>
struct SumRow {
  const T* a;
  const T* b;
  float operator()(int64_t i) const { return RoundTo<T>(ToFloat(a[i]) + ToFloat(b[i])); }
};

template <typename T, typename Row>
void RmsNormRow(const Row& x, int64_t d, float epsilon, const float* scale, T* y) {
  float sum_sq = 0.0f;
#pragma omp simd reduction(+ : sum_sq)
  for (int64_t i = 0; i < d; ++i) {
    const float v = x(i);
    sum_sq += v * v;
  }
  const float inv_rms = 1.0f / std::sqrt(sum_sq / static_cast<float>(d) + epsilon);
  for (int64_t i = 0; i < d; ++i) y[i] = FromFloat<T>(x(i) * inv_rms * scale[i]);
}

template <typename T, bool kHasBias, typename Row>
void LayerNormRow(const Row& x, int64_t d, float epsilon, const float* scale, const float* bias, T* y) {
  // Two passes (mean, then variance around it): no catastrophic cancellation for large means.
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < d; ++i) sum += x(i);
  const float mean = sum / static_cast<float>(d);
  float sum_sq = 0.0f;
#pragma omp simd reduction(+ : sum_sq)
  for (int64_t i = 0; i < d; ++i) {
    const float centred = x(i) - mean;
    sum_sq += centred * centred;
  }
  const float inv_std = 1.0f / std::sqrt(sum_sq / static_cast<float>(d) + epsilon);
  for (int64_t i = 0; i < d; ++i) {
    float v = (x(i) - mean) * inv_std * scale[i];
    if constexpr (kHasBias) v += bias[i];
    y[i] = FromFloat<T>(v);
  }
}

template <typename T, typename Row>
void StoreRow(const Row& x, int64_t d, T* out) {
  for (int64_t i = 0; i < d; ++i) out[i] = FromFloat<T>(x(i));
}

// Everything one call needs, with the weights already widened to float32.
template <typename T>
struct NormJob {
  NormKind kind;
  int64_t d;
  float epsilon;
  const T* x;         // X, or A for the Add* ops
  const T* b;         // B for the Add* ops, else null
  const float* scale;
  const float* bias;  // null when absent
  T* y;
  T* sum;             // the optional residual-sum output S, else null

  void Rows(int64_t begin, int64_t end) const {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t offset = r * d;
      if (b != nullptr) {
        const SumRow<T> row{x + offset, b + offset};
        NormaliseRow(row, y + offset);
        if (sum != nullptr) StoreRow(row, d, sum + offset);
      } else {
        NormaliseRow(InputRow<T>{x + offset}, y + offset);
      }
    }
  }

  template <typename Row>
  void NormaliseRow(const Row& row, T* out) const {
    if (kind == NormKind::kRms) {
      RmsNormRow(row, d, epsilon, scale, out);
    } else if (bias != nullptr) {
      LayerNormRow<T, true>(row, d, epsilon, scale, bias, out);
    } else {
      LayerNormRow<T, false>(row, d, epsilon, scale, nullptr, out);
    }
  }
};

// scale / bias may be T or float32; the row loops always read float32.
template <typename T>
const float* WeightsAsFloat(const InputTensor& weights, int64_t count, std::vector<float>& storage) {
  if (weights.type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT) return weights.As<float>();
  storage.resize(static_cast<size_t>(count));
  const T* source = weights.As<T>();
  for (int64_t i = 0; i < count; ++i) storage[i] = ToFloat(source[i]);
  return storage.data();
}

bool IsSupportedType(ONNXTensorElementDataType type) {
  return type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT || type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 ||
         type == ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16;
}

InputTensor RequiredInput(const KernelContext& ctx, size_t index, const char* name) {
  std::optional<InputTensor> tensor = ctx.Input(index);
  if (!tensor) throw Error(std::string("input '") + name + "' is required");
  return *tensor;
}

template <NormKind kKind, bool kAdd>
class NormKernel {
 public:
  explicit NormKernel(const KernelInfo& info) {
    const float default_epsilon = kKind == NormKind::kRms ? 1e-6f : 1e-5f;
    epsilon_ = info.FloatAttribute("epsilon").value_or(default_epsilon);
    if (!(epsilon_ >= 0.0f) || !std::isfinite(epsilon_)) {
      throw Error("attribute 'epsilon' must be a finite number >= 0, got " + std::to_string(epsilon_));
    }
    axis_ = info.IntAttribute("axis").value_or(-1);
  }

  void Compute(const KernelContext& ctx) const {
    const char* x_name = kAdd ? "A" : "X";
    const InputTensor x = RequiredInput(ctx, 0, x_name);
    if (!IsSupportedType(x.type)) {
      throw Error(std::string(x_name) + " has element type " + ElementTypeName(x.type) +
                  "; expected float32, float16 or bfloat16");
    }
    std::optional<InputTensor> b;
    if constexpr (kAdd) {
      b = RequiredInput(ctx, 1, "B");
      if (b->type != x.type) {
        throw Error(std::string("B has element type ") + ElementTypeName(b->type) + " but A has " +
                    ElementTypeName(x.type));
      }
      ExpectShape("B", b->shape, "A.shape", x.shape);
    }

    const size_t axis = NormalizeAxis(axis_, x.shape.size());
    const int64_t rows = DimProduct(x.shape, 0, axis);
    const int64_t d = DimProduct(x.shape, axis, x.shape.size());
    DimProduct(x.shape, 0, x.shape.size());  // rows * d must not overflow either
    const Shape row_shape = Slice(x.shape, axis);
    const std::string row_shape_name = std::string(x_name) + ".shape[axis:]";

    const size_t scale_index = kAdd ? 2 : 1;
    const InputTensor scale = RequiredInput(ctx, scale_index, "scale");
    CheckWeights("scale", scale, x.type, row_shape, row_shape_name);
    std::optional<InputTensor> bias;
    if constexpr (kKind == NormKind::kLayer) {
      bias = ctx.Input(scale_index + 1);
      if (bias) CheckWeights("bias", *bias, x.type, row_shape, row_shape_name);
    }

    const OutputTensor y = ctx.Output(0, x.shape);
    if (!y) throw Error("output 'Y' is required");
    const OutputTensor sum = kAdd ? ctx.Output(1, x.shape) : OutputTensor{};

    if (rows == 0 || d == 0) return;  // empty tensors: nothing to compute
    switch (x.type) {
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT:
        return Run<float>(ctx, x, b, scale, bias, y, sum, rows, d);
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16:
        return Run<Float16>(ctx, x, b, scale, bias, y, sum, rows, d);
      default:
        return Run<BFloat16>(ctx, x, b, scale, bias, y, sum, rows, d);
    }
  }

 private:
  static void CheckWeights(const char* name, const InputTensor& weights, ONNXTensorElementDataType x_type,
                           const Shape& row_shape, const std::string& row_shape_name) {
    if (weights.type != x_type && weights.type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT) {
      const std::string expected = x_type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT
                                       ? "float32"
                                       : std::string("float32 or ") + ElementTypeName(x_type) + " (the input's type)";
      throw Error(std::string(name) + " has element type " + ElementTypeName(weights.type) + "; expected " +
                  expected);
    }
    ExpectShape(name, weights.shape, row_shape_name, row_shape);
  }

  template <typename T>
  void Run(const KernelContext& ctx, const InputTensor& x, const std::optional<InputTensor>& b,
           const InputTensor& scale, const std::optional<InputTensor>& bias, const OutputTensor& y,
           const OutputTensor& sum, int64_t rows, int64_t d) const {
    std::vector<float> scale_storage, bias_storage;
    NormJob<T> job{};
    job.kind = kKind;
    job.d = d;
    job.epsilon = epsilon_;
    job.x = x.As<T>();
    job.b = b ? b->As<T>() : nullptr;
    job.scale = WeightsAsFloat<T>(scale, d, scale_storage);
    job.bias = bias ? WeightsAsFloat<T>(*bias, d, bias_storage) : nullptr;
    job.y = y.As<T>();
    job.sum = sum ? sum.As<T>() : nullptr;

    const RowTasks tasks(rows, d);
    ctx.ParallelFor(tasks.count, [&job, &tasks, rows](size_t task) {
      const int64_t begin = static_cast<int64_t>(task) * tasks.rows_per_task;
      job.Rows(begin, std::min(rows, begin + tasks.rows_per_task));
    });
  }

  float epsilon_;
  int64_t axis_;
};

template <NormKind kKind, bool kAdd>
void AppendNormOp(const char* name, CustomOpList& ops) {
  // One OrtCustomOp per element type T of X (A, B), Y (S): ORT merges them into one schema and
  // infers each output's type from the kernel whose X type matches. scale and bias are declared
  // UNDEFINED (any type) because they may be T or float32; the kernel checks them.
  for (ONNXTensorElementDataType t : {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16,
                                      ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16}) {
    OpSpec spec{name, nullptr, {}, {}};
    spec.inputs.push_back({t});
    if (kAdd) spec.inputs.push_back({t});
    spec.inputs.push_back({ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED});                 // scale
    if (kKind == NormKind::kLayer) spec.inputs.push_back({ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED, true});  // bias
    spec.outputs.push_back({t});
    if (kAdd) spec.outputs.push_back({t, true});  // S
    ops.push_back(MakeCustomOp<NormKernel<kKind, kAdd>>(std::move(spec)));
  }
}

}  // namespace

void AppendNormOps(CustomOpList& ops) {
  AppendNormOp<NormKind::kRms, false>("RMSNorm", ops);
  AppendNormOp<NormKind::kRms, true>("AddRMSNorm", ops);
  AppendNormOp<NormKind::kLayer, false>("LayerNorm", ops);
  AppendNormOp<NormKind::kLayer, true>("AddLayerNorm", ops);
}

}  // namespace otfuse::cpu
