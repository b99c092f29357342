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
#include "common/norm_params.h"
#include "common/shape_check.h"
#include "cpu/norm_rows.h"
#include "op_registry.h"

namespace otfuse::cpu {
namespace {

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
    params_ = ReadNormLinearParams(info, kKind, kAdd);
    isa_ = SelectCpuIsa();

    // Constant weights (the rewriter only fuses those): pack them now, once per session.
    std::vector<InputTensor> weights;
    for (size_t i = 0; i < params_.count(); ++i) {
      std::optional<InputTensor> w = info.ConstantInput(params_.first_weight + i);
      if (!w) return;
      weights.push_back(*w);
    }
    packed_ = std::make_shared<const Projections>(Pack(weights, std::nullopt));
  }

  void Compute(const KernelContext& ctx) const {
    const NormInput input = ReadNormInput(ctx, kAdd);
    const InputTensor& x = input.x;
    const NormLinearRows dims = ReadNormLinearRows(input);
    const int64_t rows = dims.rows, d = dims.k;
    const NormLinearNormParams norm = ReadNormLinearNormParams(ctx, input, d, kKind, kAdd);

    // Weights: checked against X on every run (cheap), packed only when not done at creation.
    const size_t count = params_.count();
    const std::vector<InputTensor> weights = ReadProjectionWeights(ctx, params_);
    std::optional<Projections> packed_now;
    if (!packed_) packed_now.emplace(Pack(weights, d));
    const Projections& projections = packed_ ? *packed_ : *packed_now;
    CheckProjectionWeights(weights, x.type, d, params_);

    const std::vector<std::optional<InputTensor>> bias_inputs = ReadProjectionBiases(ctx, x.type, params_);
    std::vector<std::vector<float>> bias_storage(count);
    std::vector<const float*> biases(count, nullptr);
    for (size_t i = 0; i < count; ++i) {
      if (!bias_inputs[i]) continue;
      bias_storage[i] = AsFloat(*bias_inputs[i], params_.widths[i]);
      biases[i] = bias_storage[i].data();
    }

    const auto [ys, sum, normalized] = AllocateNormLinearOutputs(ctx, params_, x.shape, kAdd);
    if (rows == 0) return;

    switch (x.type) {
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT:
        return Run<float>(ctx, input, norm, projections, biases, ys, sum, normalized, rows, d);
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16:
        return Run<Float16>(ctx, input, norm, projections, biases, ys, sum, normalized, rows, d);
      default:
        return Run<BFloat16>(ctx, input, norm, projections, biases, ys, sum, normalized, rows, d);
    }
  }

 private:
  Projections Pack(const std::vector<InputTensor>& weights, std::optional<int64_t> k_from_x) const {
    const InputTensor& first = weights.front();
    if (!IsNormType(first.type)) {
      throw Error("W1 has element type " + std::string(ElementTypeName(first.type)) +
                  "; expected float32, float16 or bfloat16");
    }
    if (first.shape.size() != 2) throw Error("W1 must be a matrix, got shape " + ToString(first.shape));
    const int64_t k = k_from_x ? *k_from_x : first.shape[params_.transposed[0] ? 1 : 0];
    CheckProjectionWeights(weights, first.type, k, params_);
    Projections projections;
    projections.packed = PackedB(k, PackedTypeOf(first.type));
    for (size_t i = 0; i < weights.size(); ++i) {
      const int64_t panel = projections.packed.Append(weights[i].data, params_.widths[i], params_.transposed[i] != 0);
      projections.first_panel.push_back(panel);
      projections.owner.resize(static_cast<size_t>(projections.packed.panels()), static_cast<int32_t>(i));
    }
    return projections;
  }

  template <typename T>
  void Run(const KernelContext& ctx, const NormInput& input, const NormLinearNormParams& norm,
           const Projections& projections, const std::vector<const float*>& biases,
           const std::vector<OutputTensor>& ys, const OutputTensor& sum, const OutputTensor& normalized, int64_t rows,
           int64_t d) const {
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
    const InputTensor& x = input.x;
    const std::optional<InputTensor>& b = input.b;
    const std::optional<InputTensor>& norm_bias = norm.norm_bias;
    const std::vector<float> scale_f = AsFloat(norm.scale, d);
    const std::vector<float> bias_f = norm_bias ? AsFloat(*norm_bias, d) : std::vector<float>{};
    NormJob<T> job{};
    job.kind = kKind;
    job.d = d;
    job.epsilon = params_.epsilon;
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
    GemmPacked(ctx, rows, a, d, projections.packed, ProjectionSink<T>(projections, params_.widths, biases, outs));
  }

  NormLinearParams params_;
  CpuIsa isa_ = CpuIsa::kBaseline;
  std::shared_ptr<const Projections> packed_;  // null: weights are not constants, packed per run
};

template <NormKind kKind, bool kAdd>
void AppendNormLinearOp(const char* name, CustomOpList& ops) {
  AppendPerType<NormLinearKernel<kKind, kAdd>>(ops, [name](ONNXTensorElementDataType t) {
    return NormLinearOpSpec(name, nullptr, t, kKind, kAdd);
  });
}

}  // namespace

void AppendNormLinearOps(CustomOpList& ops) {
  AppendNormLinearOp<NormKind::kRms, false>("RMSNormLinear", ops);
  AppendNormLinearOp<NormKind::kRms, true>("AddRMSNormLinear", ops);
  AppendNormLinearOp<NormKind::kLayer, false>("LayerNormLinear", ops);
  AppendNormLinearOp<NormKind::kLayer, true>("AddLayerNormLinear", ops);
}

}  // namespace otfuse::cpu
