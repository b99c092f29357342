// CPU kernels of the Norm + Linear family: RMSNormLinear, AddRMSNormLinear, LayerNormLinear,
// AddLayerNormLinear (contract: docs/ops.md). One node = one normalisation feeding n projections.
//
// The weights are packed once (common/gemm.h) when the kernel is created, straight from the
// constant initializers ORT hands to KernelInfo; a node whose weights are not constants (only a
// hand-built model can have one) packs them on every run. A run normalises the rows with the norm
// family's row kernels (cpu/norm_rows.h: same math, same rounding to T as the standalone norm
// ops), widens them to a float32 A panel, and runs one GEMM over the panels of all projections;
// each finished panel is biased, rounded to T and written into its projection's output.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "common/cpu_features.h"
#include "common/float_types.h"
#include "common/gemm.h"
#include "common/shape_check.h"
#include "cpu/norm_rows.h"
#include "op_registry.h"

namespace otfuse::cpu {
namespace {

bool IsSupportedType(ONNXTensorElementDataType type) {
  return type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT || type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 ||
         type == ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16;
}

PackedType PackedTypeOf(ONNXTensorElementDataType type) {
  if (type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16) return PackedType::kFloat16;
  if (type == ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16) return PackedType::kBFloat16;
  return PackedType::kFloat32;
}

template <typename T>
NormRowsFn<T> RowsFor(CpuIsa isa) {
#if defined(OTFUSE_HAVE_AVX2_KERNELS)
  if (isa == CpuIsa::kAvx2) return &avx2::NormRows<T>;
#endif
  (void)isa;
  return &baseline::NormRows<T>;
}

std::vector<float> AsFloat(const InputTensor& tensor, int64_t count) {
  std::vector<float> values(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    switch (tensor.type) {
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: values[i] = tensor.As<float>()[i]; break;
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: values[i] = ToFloat(tensor.As<Float16>()[i]); break;
      default: values[i] = ToFloat(tensor.As<BFloat16>()[i]); break;
    }
  }
  return values;
}

InputTensor RequiredInput(const KernelContext& ctx, size_t index, const std::string& name) {
  std::optional<InputTensor> tensor = ctx.Input(index);
  if (!tensor) throw Error("input '" + name + "' is required");
  return *tensor;
}

// A scale, a norm bias or a projection bias: T or float32, exactly `shape`.
void CheckParameter(const std::string& name, const InputTensor& tensor, ONNXTensorElementDataType t,
                    const std::string& shape_name, const Shape& shape) {
  if (tensor.type != t && tensor.type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT) {
    throw Error(name + " has element type " + ElementTypeName(tensor.type) + "; expected float32 or " +
                ElementTypeName(t));
  }
  ExpectShape(name, tensor.shape, shape_name, shape);
}

// The packed weights of all projections, and where each projection's panels start.
struct Projections {
  PackedB packed;
  std::vector<int64_t> first_panel;  // per projection
  std::vector<int32_t> owner;        // per panel: its projection
};

template <typename T>
class ProjectionSink final : public GemmSink {
 public:
  ProjectionSink(const Projections& projections, const std::vector<int64_t>& widths,
                 const std::vector<const float*>& biases, const std::vector<T*>& outputs)
      : projections_(projections), widths_(widths), biases_(biases), outputs_(outputs) {}

  void Panel(int64_t panel, int64_t row0, int64_t m, const float* acc) const override {
    const int32_t i = projections_.owner[panel];
    const int64_t n = widths_[i];
    const int64_t col0 = (panel - projections_.first_panel[i]) * kPanelWidth;
    const int64_t width = std::min(kPanelWidth, n - col0);
    const float* bias = biases_[i] != nullptr ? biases_[i] + col0 : nullptr;
    T* out = outputs_[i] + row0 * n + col0;
    for (int64_t r = 0; r < m; ++r) {
      const float* row = acc + r * kPanelWidth;
      T* dst = out + r * n;
      if (bias != nullptr) {
        for (int64_t j = 0; j < width; ++j) dst[j] = FromFloat<T>(row[j] + bias[j]);
      } else {
        for (int64_t j = 0; j < width; ++j) dst[j] = FromFloat<T>(row[j]);
      }
    }
  }

 private:
  const Projections& projections_;
  const std::vector<int64_t>& widths_;
  const std::vector<const float*>& biases_;
  const std::vector<T*>& outputs_;
};

template <NormKind kKind, bool kAdd>
class NormLinearKernel {
 public:
  explicit NormLinearKernel(const KernelInfo& info) {
    const float default_epsilon = kKind == NormKind::kRms ? 1e-6f : 1e-5f;
    epsilon_ = info.FloatAttribute("epsilon").value_or(default_epsilon);
    if (!(epsilon_ >= 0.0f) || !std::isfinite(epsilon_)) {
      throw Error("attribute 'epsilon' must be a finite number >= 0, got " + std::to_string(epsilon_));
    }
    const int64_t axis = info.IntAttribute("axis").value_or(-1);
    if (axis != -1) throw Error("attribute 'axis' must be -1, got " + std::to_string(axis));
    widths_ = info.IntsAttribute("out_features").value_or(std::vector<int64_t>{});
    if (widths_.empty()) throw Error("attribute 'out_features' is required (one width per projection)");
    for (int64_t n : widths_) {
      if (n <= 0) throw Error("every entry of 'out_features' must be > 0, got " + std::to_string(n));
    }
    const size_t count = widths_.size();
    transposed_ = ReadFlags(info, "transposed", count);
    has_bias_ = ReadFlags(info, "has_bias", count);
    first_weight_ = (kAdd ? 3 : 2) + (kKind == NormKind::kLayer ? 1 : 0);
    bias_count_ = static_cast<size_t>(std::count(has_bias_.begin(), has_bias_.end(), 1));
    const size_t expected_inputs = first_weight_ + count + bias_count_;
    if (info.InputCount() != expected_inputs) {
      throw Error("expected " + std::to_string(expected_inputs) + " inputs (" + std::to_string(first_weight_) +
                  " norm inputs, " + std::to_string(count) + " weights, " + std::to_string(bias_count_) +
                  " biases), got " + std::to_string(info.InputCount()));
    }
    isa_ = SelectCpuIsa();

    // Constant weights (the rewriter only fuses those): pack them now, once per session.
    std::vector<InputTensor> weights;
    for (size_t i = 0; i < count; ++i) {
      std::optional<InputTensor> w = info.ConstantInput(first_weight_ + i);
      if (!w) return;
      weights.push_back(*w);
    }
    packed_ = std::make_shared<const Projections>(Pack(weights, std::nullopt));
  }

  void Compute(const KernelContext& ctx) const {
    const std::string x_name = kAdd ? "A" : "X";
    const InputTensor x = RequiredInput(ctx, 0, x_name);
    if (!IsSupportedType(x.type)) {
      throw Error(x_name + " has element type " + ElementTypeName(x.type) +
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
    if (x.shape.empty()) throw Error(x_name + " must have rank >= 1");
    const size_t rank = x.shape.size();
    const int64_t rows = DimProduct(x.shape, 0, rank - 1);
    const int64_t d = x.shape.back();
    DimProduct(x.shape, 0, rank);
    if (d == 0) throw Error(x_name + " has an empty last dimension; the normalised rows must not be empty");
    const Shape row_shape{d};
    const std::string row_name = x_name + ".shape[-1:]";

    const size_t scale_index = kAdd ? 2 : 1;
    const InputTensor scale = RequiredInput(ctx, scale_index, "scale");
    CheckParameter("scale", scale, x.type, row_name, row_shape);
    std::optional<InputTensor> norm_bias;
    if constexpr (kKind == NormKind::kLayer) {
      norm_bias = ctx.Input(scale_index + 1);
      if (norm_bias) CheckParameter("norm_bias", *norm_bias, x.type, row_name, row_shape);
    }

    // Weights: checked against X on every run (cheap), packed only when not done at creation.
    const size_t count = widths_.size();
    std::vector<InputTensor> weights;
    for (size_t i = 0; i < count; ++i) {
      weights.push_back(RequiredInput(ctx, first_weight_ + i, "W" + std::to_string(i + 1)));
    }
    std::optional<Projections> packed_now;
    if (!packed_) packed_now.emplace(Pack(weights, d));
    const Projections& projections = packed_ ? *packed_ : *packed_now;
    CheckWeights(weights, x.type, d);

    std::vector<std::vector<float>> bias_storage(count);
    std::vector<const float*> biases(count, nullptr);
    size_t next_bias = first_weight_ + count;
    for (size_t i = 0; i < count; ++i) {
      if (!has_bias_[i]) continue;
      const std::string name = "bias" + std::to_string(i + 1);
      const InputTensor bias = RequiredInput(ctx, next_bias++, name);
      CheckParameter(name, bias, x.type, "[out_features[" + std::to_string(i) + "]]", Shape{widths_[i]});
      bias_storage[i] = AsFloat(bias, widths_[i]);
      biases[i] = bias_storage[i].data();
    }

    const size_t outputs = ctx.OutputCount();
    const size_t fixed = count + (kAdd ? 1 : 0);
    if (outputs != fixed && outputs != fixed + 1) {
      throw Error("expected " + std::to_string(fixed) + " or " + std::to_string(fixed + 1) + " outputs, got " +
                  std::to_string(outputs));
    }
    std::vector<OutputTensor> ys;
    for (size_t i = 0; i < count; ++i) {
      Shape shape = x.shape;
      shape.back() = widths_[i];
      ys.push_back(ctx.Output(i, shape));
      if (!ys.back()) throw Error("output 'Y" + std::to_string(i + 1) + "' is required");
    }
    const OutputTensor sum = kAdd ? ctx.Output(count, x.shape) : OutputTensor{};
    const OutputTensor normalized = outputs == fixed + 1 ? ctx.Output(fixed, x.shape) : OutputTensor{};
    if (rows == 0) return;

    switch (x.type) {
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT:
        return Run<float>(ctx, x, b, scale, norm_bias, projections, biases, ys, sum, normalized, rows, d);
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16:
        return Run<Float16>(ctx, x, b, scale, norm_bias, projections, biases, ys, sum, normalized, rows, d);
      default:
        return Run<BFloat16>(ctx, x, b, scale, norm_bias, projections, biases, ys, sum, normalized, rows, d);
    }
  }

 private:
  static std::vector<int64_t> ReadFlags(const KernelInfo& info, const char* name, size_t count) {
    std::vector<int64_t> flags = info.IntsAttribute(name).value_or(std::vector<int64_t>(count, 0));
    if (flags.size() != count) {
      throw Error(std::string("attribute '") + name + "' has " + std::to_string(flags.size()) +
                  " entries; expected one per projection (" + std::to_string(count) + ")");
    }
    for (int64_t flag : flags) {
      if (flag != 0 && flag != 1) throw Error(std::string("attribute '") + name + "' entries must be 0 or 1");
    }
    return flags;
  }

  // Checks each weight's type and shape; K is the rows' length (from X at run time, from the
  // first weight at creation).
  void CheckWeights(const std::vector<InputTensor>& weights, ONNXTensorElementDataType t, int64_t k) const {
    for (size_t i = 0; i < weights.size(); ++i) {
      const std::string name = "W" + std::to_string(i + 1);
      if (weights[i].type != t) {
        throw Error(name + " has element type " + ElementTypeName(weights[i].type) + "; expected " +
                    ElementTypeName(t) + " (the input's type)");
      }
      const Shape expected = transposed_[i] ? Shape{widths_[i], k} : Shape{k, widths_[i]};
      ExpectShape(name, weights[i].shape, transposed_[i] ? "[out_features, K]" : "[K, out_features]", expected);
    }
  }

  Projections Pack(const std::vector<InputTensor>& weights, std::optional<int64_t> k_from_x) const {
    const InputTensor& first = weights.front();
    if (!IsSupportedType(first.type)) {
      throw Error("W1 has element type " + std::string(ElementTypeName(first.type)) +
                  "; expected float32, float16 or bfloat16");
    }
    if (first.shape.size() != 2) throw Error("W1 must be a matrix, got shape " + ToString(first.shape));
    const int64_t k = k_from_x ? *k_from_x : first.shape[transposed_[0] ? 1 : 0];
    CheckWeights(weights, first.type, k);
    Projections projections;
    projections.packed = PackedB(k, PackedTypeOf(first.type));
    for (size_t i = 0; i < weights.size(); ++i) {
      const int64_t panel = projections.packed.Append(weights[i].data, widths_[i], transposed_[i] != 0);
      projections.first_panel.push_back(panel);
      projections.owner.resize(static_cast<size_t>(projections.packed.panels()), static_cast<int32_t>(i));
    }
    return projections;
  }

  template <typename T>
  void Run(const KernelContext& ctx, const InputTensor& x, const std::optional<InputTensor>& b,
           const InputTensor& scale, const std::optional<InputTensor>& norm_bias, const Projections& projections,
           const std::vector<const float*>& biases, const std::vector<OutputTensor>& ys, const OutputTensor& sum,
           const OutputTensor& normalized, int64_t rows, int64_t d) const {
    if (projections.packed.k() != d) {
      throw Error("the packed weights have K = " + std::to_string(projections.packed.k()) + " but " +
                  (kAdd ? "A" : "X") + " has rows of " + std::to_string(d));
    }
    constexpr bool kFloat = std::is_same_v<T, float>;
    const size_t elements = static_cast<size_t>(rows) * static_cast<size_t>(d);
    // The normalised rows in T: into the Ynorm output when the node has one, else a buffer (for
    // float32 that buffer is the GEMM's A panel itself).
    std::unique_ptr<T[]> y_storage;
    T* y = normalized ? normalized.As<T>() : nullptr;
    if (y == nullptr) {
      y_storage.reset(new (std::nothrow) T[elements]);
      if (!y_storage) throw Error("out of memory for the normalised rows");
      y = y_storage.get();
    }
    const std::vector<float> scale_f = AsFloat(scale, d);
    const std::vector<float> bias_f = norm_bias ? AsFloat(*norm_bias, d) : std::vector<float>{};
    NormJob<T> job{};
    job.kind = kKind;
    job.d = d;
    job.epsilon = epsilon_;
    job.x = x.As<T>();
    job.b = b ? b->As<T>() : nullptr;
    job.scale = scale_f.data();
    job.bias = norm_bias ? bias_f.data() : nullptr;
    job.y = y;
    job.sum = sum ? sum.As<T>() : nullptr;

    // float32 for the GEMM: the normalised values rounded to T, widened back exactly.
    std::unique_ptr<float[]> a_storage;
    float* a = nullptr;
    if constexpr (kFloat) {
      a = y;
    } else {
      a_storage.reset(new (std::nothrow) float[elements]);
      if (!a_storage) throw Error("out of memory for the float32 GEMM panel");
      a = a_storage.get();
    }

    const NormRowsFn<T> rows_fn = RowsFor<T>(isa_);
    const bool needs_scratch = !kFloat || job.b != nullptr;
    const RowTasks tasks(rows, d);
    std::atomic<bool> out_of_memory{false};
    ctx.ParallelFor(tasks.count, [&](size_t task) {
      const int64_t begin = static_cast<int64_t>(task) * tasks.rows_per_task;
      const int64_t end = std::min(rows, begin + tasks.rows_per_task);
      std::unique_ptr<float[]> scratch;
      if (needs_scratch) {
        scratch.reset(new (std::nothrow) float[static_cast<size_t>(d)]);
        if (!scratch) {
          out_of_memory = true;
          return;
        }
      }
      rows_fn(job, begin, end, scratch.get());
      if constexpr (!kFloat) {
        for (int64_t i = begin * d; i < end * d; ++i) a[i] = ToFloat(y[i]);
      }
    });
    if (out_of_memory) throw Error("out of memory for a " + std::to_string(d) + "-element row buffer");

    std::vector<T*> outs;
    for (const OutputTensor& out : ys) outs.push_back(out.As<T>());
    GemmPacked(ctx, rows, a, d, projections.packed, ProjectionSink<T>(projections, widths_, biases, outs));
  }

  float epsilon_ = 0.0f;
  std::vector<int64_t> widths_;
  std::vector<int64_t> transposed_;
  std::vector<int64_t> has_bias_;
  size_t first_weight_ = 0;
  size_t bias_count_ = 0;
  CpuIsa isa_ = CpuIsa::kBaseline;
  std::shared_ptr<const Projections> packed_;  // null: weights are not constants, packed per run
};

template <NormKind kKind, bool kAdd>
void AppendNormLinearOp(const char* name, CustomOpList& ops) {
  // One OrtCustomOp per T (X / A, B and every output). The weights and biases are the variadic
  // tail, typed UNDEFINED (biases may be float32 in a T model); the kernel checks them.
  for (ONNXTensorElementDataType t : {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16,
                                      ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16}) {
    OpSpec spec{name, nullptr, {}, {}};
    spec.inputs.push_back({t});
    if (kAdd) spec.inputs.push_back({t});
    spec.inputs.push_back({ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED});  // scale
    if (kKind == NormKind::kLayer) spec.inputs.push_back({ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED, true});  // norm_bias
    spec.inputs.push_back({ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED, false, true});  // W_1..W_n, biases
    spec.outputs.push_back({t, false, true});  // Y_1..Y_n, [S], [Ynorm]
    ops.push_back(MakeCustomOp<NormLinearKernel<kKind, kAdd>>(std::move(spec)));
  }
}

}  // namespace

void AppendNormLinearOps(CustomOpList& ops) {
  AppendNormLinearOp<NormKind::kRms, false>("RMSNormLinear", ops);
  AppendNormLinearOp<NormKind::kRms, true>("AddRMSNormLinear", ops);
  AppendNormLinearOp<NormKind::kLayer, false>("LayerNormLinear", ops);
  AppendNormLinearOp<NormKind::kLayer, true>("AddLayerNormLinear", ops);
}

}  // namespace otfuse::cpu
