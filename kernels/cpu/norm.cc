// CPU kernels of the normalisation family: RMSNorm, AddRMSNorm, LayerNorm, AddLayerNorm
// (contract: docs/ops.md). This file checks the node and its inputs, widens the weights and
// splits the rows over ORT's thread pool; the row math is in norm_rows.inc.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <memory>
#include <new>
#include <optional>
#include <type_traits>
#include <vector>

#include "common/cpu_features.h"
#include "common/float_types.h"
#include "common/norm_params.h"
#include "common/shape_check.h"
#include "cpu/norm_rows.h"
#include "op_registry.h"

namespace otfuse::cpu {
namespace {

// scale / bias may be T or float32; the row loops always read float32.
template <typename T>
const float* WeightsAsFloat(const InputTensor& weights, int64_t count, std::vector<float>& storage) {
  if (weights.type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT) return weights.As<float>();
  storage.resize(static_cast<size_t>(count));
  const T* source = weights.As<T>();
  for (int64_t i = 0; i < count; ++i) storage[i] = ToFloat(source[i]);
  return storage.data();
}

template <typename T>
NormRowsFn<T> RowsFor(CpuIsa isa) {
#if defined(OTFUSE_HAVE_AVX2_KERNELS)
  if (isa == CpuIsa::kAvx2) return &avx2::NormRows<T>;
#endif
  (void)isa;
  return &baseline::NormRows<T>;
}

template <NormKind kKind, bool kAdd>
class NormKernel {
 public:
  explicit NormKernel(const KernelInfo& info) {
    epsilon_ = ReadNormEpsilon(info, kKind);
    axis_ = info.IntAttribute("axis").value_or(-1);
    isa_ = SelectCpuIsa();
  }

  void Compute(const KernelContext& ctx) const {
    const NormInput input = ReadNormInput(ctx, kAdd);
    const InputTensor& x = input.x;
    const std::optional<InputTensor>& b = input.b;
    const char* x_name = input.x_name;

    const size_t axis = NormalizeAxis(axis_, x.shape.size());
    const int64_t rows = DimProduct(x.shape, 0, axis);
    const int64_t d = DimProduct(x.shape, axis, x.shape.size());
    DimProduct(x.shape, 0, x.shape.size());  // rows * d must not overflow either
    const Shape row_shape = Slice(x.shape, axis);
    const std::string row_shape_name = std::string(x_name) + ".shape[axis:]";

    const size_t scale_index = kAdd ? 2 : 1;
    const InputTensor scale = RequiredInput(ctx, scale_index, "scale");
    CheckNormParameter("scale", scale, x.type, row_shape_name, row_shape);
    std::optional<InputTensor> bias;
    if constexpr (kKind == NormKind::kLayer) {
      bias = ctx.Input(scale_index + 1);
      if (bias) CheckNormParameter("bias", *bias, x.type, row_shape_name, row_shape);
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

    const NormRowsFn<T> rows_fn = RowsFor<T>(isa_);
    const bool needs_scratch = !std::is_same_v<T, float> || job.b != nullptr;
    const RowTasks tasks(rows, d);
    std::atomic<bool> out_of_memory{false};
    ctx.ParallelFor(tasks.count, [&](size_t task) {
      const int64_t begin = static_cast<int64_t>(task) * tasks.rows_per_task;
      const int64_t end = std::min(rows, begin + tasks.rows_per_task);
      // Nothing may throw into ORT's worker threads: a failed allocation is reported afterwards.
      std::unique_ptr<float[]> scratch;
      if (needs_scratch) {
        scratch.reset(new (std::nothrow) float[static_cast<size_t>(d)]);
        if (!scratch) {
          out_of_memory = true;
          return;
        }
      }
      rows_fn(job, begin, end, scratch.get());
    });
    if (out_of_memory) throw Error("out of memory for a " + std::to_string(d) + "-element row buffer");
  }

  float epsilon_;
  int64_t axis_;
  CpuIsa isa_;
};

template <NormKind kKind, bool kAdd>
void AppendNormOp(const char* name, CustomOpList& ops) {
  AppendPerType<NormKernel<kKind, kAdd>>(ops, [name](ONNXTensorElementDataType t) {
    return NormOpSpec(name, nullptr, t, kKind, kAdd);
  });
}

}  // namespace

void AppendNormOps(CustomOpList& ops) {
  AppendNormOp<NormKind::kRms, false>("RMSNorm", ops);
  AppendNormOp<NormKind::kRms, true>("AddRMSNorm", ops);
  AppendNormOp<NormKind::kLayer, false>("LayerNorm", ops);
  AppendNormOp<NormKind::kLayer, true>("AddLayerNorm", ops);
}

}  // namespace otfuse::cpu
