// CPU kernels of the rotary embedding family: RotaryEmbedding and RotaryEmbeddingQK (contract:
// docs/ops.md). This file checks the node and its inputs, maps every row of X to its cos/sin row
// (per-dim strides, 0 where cos/sin broadcast; the broadcast is never materialised) and splits
// the rows over ORT's thread pool; the row math is in rotary_rows.inc.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "common/cpu_features.h"
#include "common/float_types.h"
#include "common/rotary_params.h"
#include "common/shape_check.h"
#include "cpu/rotary_rows.h"
#include "op_registry.h"

namespace otfuse::cpu {
namespace {

// cos + sin bytes of one block of positions (BNSD): read from memory for the first head, then
// from cache (a share of a typical L3) for the others. Long runs of positions per head stream
// better than short ones that fit L2: in a standalone run of the rows on X [1, 32, 8192, 128]
// (2 threads, noisy shared machine), blocks of 128 positions were 20-35% slower than 1024+.
constexpr int64_t kCosBlockBytes = 4 << 20;
// Work per task, as RowTasks: big enough that thread-pool overhead stays small.
constexpr int64_t kMinTaskElements = 16384;
// Enough tasks for the pool to balance; a split stops at kMinTaskElements.
constexpr size_t kTargetTasks = 16;
// Outputs at least this large are written with streaming stores (AVX2 variant): they would not
// stay in cache anyway, and streaming saves reading every output line before it is written.
constexpr int64_t kStreamingStoreBytes = 16 << 20;

bool IsSupportedType(ONNXTensorElementDataType type) {
  return type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT || type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 ||
         type == ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16;
}

template <typename T, typename C>
RotaryRowsFn<T, C> RowsFor(CpuIsa isa) {
#if defined(OTFUSE_HAVE_AVX2_KERNELS)
  if (isa == CpuIsa::kAvx2) return &avx2::RotaryRows<T, C>;
#endif
  (void)isa;
  return &baseline::RotaryRows<T, C>;
}

// Collapsed dims of one kind (cos-varying or broadcast), outermost first.
struct DimList {
  std::vector<int64_t> sizes, x_strides, c_strides;

  // Appends an inner dim, merged into the previous one when the pair walks memory as one dim.
  void Append(int64_t size, int64_t x_stride, int64_t c_stride) {
    if (!sizes.empty() && x_strides.back() == x_stride * size && c_strides.back() == c_stride * size) {
      sizes.back() *= size;
      x_strides.back() = x_stride;
      c_strides.back() = c_stride;
      return;
    }
    sizes.push_back(size);
    x_strides.push_back(x_stride);
    c_strides.push_back(c_stride);
  }

  int64_t Total() const {
    int64_t total = 1;
    for (int64_t size : sizes) total *= size;  // <= X's row count, which did not overflow
    return total;
  }

  RotaryDims View(bool with_c) const {
    return {static_cast<int32_t>(sizes.size()), sizes.data(), x_strides.data(), with_c ? c_strides.data() : nullptr};
  }
};

// How the rows of one rotated tensor are visited and split into tasks.
struct RowPlan {
  DimList p;  // dims along which cos/sin vary
  DimList b;  // dims cos/sin are broadcast over
  bool b_inner = false;
  int64_t p_total = 1, b_total = 1;
  int64_t p_block = 1, b_chunk = 1;
  size_t p_blocks = 0, b_chunks = 0;

  size_t TaskCount() const { return p_blocks * b_chunks; }

  RotaryTask Task(size_t index) const {
    const int64_t pi = static_cast<int64_t>(index / b_chunks);
    const int64_t bi = static_cast<int64_t>(index % b_chunks);
    return {pi * p_block, std::min(p_total, (pi + 1) * p_block), bi * b_chunk,
            std::min(b_total, (bi + 1) * b_chunk)};
  }
};

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Plans the walk over x's rows, once cos (shape already equal to sin's) is known to broadcast to
// x.shape[:-1] + [r]. `x_name` names x in errors.
RowPlan PlanRows(const char* x_name, const Shape& x_shape, const Shape& cos_shape, int64_t r, size_t cos_bytes) {
  CheckRotaryBroadcast(x_name, x_shape, cos_shape, r);
  const size_t n = x_shape.size() - 1;  // leading dims of X
  const size_t k = cos_shape.size() - 1;  // leading dims of cos, aligned right with X's
  RowPlan plan;
  int64_t x_stride = 1;  // in rows of X
  std::vector<int64_t> x_strides(n), c_strides(n, 0);
  for (size_t j = n; j-- > 0;) {
    x_strides[j] = x_stride;
    x_stride *= x_shape[j];
  }
  int64_t c_stride = 1;  // in rows of cos
  for (size_t i = k; i-- > 0;) {
    const size_t j = i + (n - k);
    if (cos_shape[i] != 1) c_strides[j] = c_stride;
    c_stride *= cos_shape[i];
  }
  bool last_is_broadcast = false;
  for (size_t j = 0; j < n; ++j) {
    if (x_shape[j] == 1) continue;  // no effect on any offset
    last_is_broadcast = c_strides[j] == 0;
    (last_is_broadcast ? plan.b : plan.p).Append(x_shape[j], x_strides[j], c_strides[j]);
  }
  plan.b_inner = last_is_broadcast;
  plan.p_total = plan.p.Total();
  plan.b_total = plan.b.Total();
  if (plan.p_total == 0 || plan.b_total == 0) return plan;  // no rows: no tasks

  // Tasks: blocks of positions (sized for the cache when heads are visited around them) times
  // chunks of heads, split further until there are enough tasks or they would get too small.
  // The split keeps X's runs long: heads first when each head is a run of positions (BNSD),
  // positions first when heads are X's innermost dim (BSND).
  const int64_t row_elements = std::max<int64_t>(x_shape.back(), 1);
  plan.p_block = plan.p_total;
  if (!plan.b_inner) {
    const int64_t cos_row_bytes = std::max<int64_t>(2 * r * static_cast<int64_t>(cos_bytes), 1);
    plan.p_block = std::clamp<int64_t>(kCosBlockBytes / cos_row_bytes, 1, plan.p_total);
  }
  plan.b_chunk = plan.b_total;
  auto task_count = [&] { return CeilDiv(plan.p_total, plan.p_block) * CeilDiv(plan.b_total, plan.b_chunk); };
  while (task_count() < static_cast<int64_t>(kTargetTasks) &&
         plan.p_block * plan.b_chunk * row_elements >= 2 * kMinTaskElements) {
    int64_t& first = plan.b_inner ? plan.p_block : plan.b_chunk;
    int64_t& second = plan.b_inner ? plan.b_chunk : plan.p_block;
    if (first > 1) {
      first = CeilDiv(first, 2);
    } else if (second > 1) {
      second = CeilDiv(second, 2);
    } else {
      break;
    }
  }
  plan.p_blocks = static_cast<size_t>(CeilDiv(plan.p_total, plan.p_block));
  plan.b_chunks = static_cast<size_t>(CeilDiv(plan.b_total, plan.b_chunk));
  return plan;
}

// One rotated tensor of the node: X, or Q / K.
struct Rotated {
  const char* name;
  InputTensor x;
  OutputTensor y;
  int64_t d = 0, r = 0;
  RowPlan plan;
};

template <bool kQK>
class RotaryKernel {
 public:
  explicit RotaryKernel(const KernelInfo& info)
      : attrs_(ReadRotaryAttributes(info, "mode", "sections")), isa_(SelectCpuIsa()) {}

  void Compute(const KernelContext& ctx) const {
    constexpr size_t kCount = kQK ? 2 : 1;
    static constexpr const char* kNames[2] = {kQK ? "Q" : "X", "K"};
    Rotated rotated[kCount];
    for (size_t i = 0; i < kCount; ++i) {
      rotated[i].name = kNames[i];
      rotated[i].x = RequiredInput(ctx, i, kNames[i]);
      const InputTensor& x = rotated[i].x;
      if (!IsSupportedType(x.type)) {
        throw Error(std::string(kNames[i]) + " has element type " + ElementTypeName(x.type) +
                    "; expected float32, float16 or bfloat16");
      }
      if (i > 0 && x.type != rotated[0].x.type) {
        throw Error(std::string("K has element type ") + ElementTypeName(x.type) + " but Q has " +
                    ElementTypeName(rotated[0].x.type));
      }
      if (x.shape.size() < 2) {
        throw Error(std::string(kNames[i]) + " has shape " + ToString(x.shape) + "; expected rank >= 2 ([..., D])");
      }
      DimProduct(x.shape, 0, x.shape.size());  // negative dims, element count overflow
    }
    const ONNXTensorElementDataType t = rotated[0].x.type;
    const InputTensor cos = RequiredInput(ctx, kCount, "cos");
    const InputTensor sin = RequiredInput(ctx, kCount + 1, "sin");
    CheckRotaryTables(cos, sin, t);
    DimProduct(cos.shape, 0, cos.shape.size());
    if constexpr (kQK) {
      if (rotated[0].x.shape.back() != rotated[1].x.shape.back()) {
        throw Error("Q has head dim " + std::to_string(rotated[0].x.shape.back()) + " (last dim) but K has " +
                    std::to_string(rotated[1].x.shape.back()) + "; they must be equal");
      }
    }
    const size_t cos_bytes = cos.type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT ? 4 : 2;
    for (Rotated& item : rotated) {
      item.d = item.x.shape.back();
      item.r = RotaryWidth(item.name, item.d, attrs_);
      item.plan = PlanRows(item.name, item.x.shape, cos.shape, item.r, cos_bytes);
    }
    for (size_t i = 0; i < kCount; ++i) {
      rotated[i].y = ctx.Output(i, rotated[i].x.shape);
      if (!rotated[i].y) throw Error(std::string("output ") + std::to_string(i) + " is required");
    }

    const bool c_float = cos.type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
    switch (t) {
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT:
        return Run<float, float>(ctx, rotated, kCount, cos, sin);
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16:
        return c_float ? Run<Float16, float>(ctx, rotated, kCount, cos, sin)
                       : Run<Float16, Float16>(ctx, rotated, kCount, cos, sin);
      default:
        return c_float ? Run<BFloat16, float>(ctx, rotated, kCount, cos, sin)
                       : Run<BFloat16, BFloat16>(ctx, rotated, kCount, cos, sin);
    }
  }

 private:
  // Streaming stores need every 8-lane store 16-byte aligned: Y and its rows, and (half mode)
  // the first and second half of every section.
  bool StreamStores(const Rotated& item, size_t t_bytes, const std::vector<int64_t>& sections) const {
    const int64_t tb = static_cast<int64_t>(t_bytes);
    int64_t y_bytes = 0;
    if (__builtin_mul_overflow(DimProduct(item.x.shape, 0, item.x.shape.size()), tb, &y_bytes) ||
        y_bytes < kStreamingStoreBytes) {
      return false;
    }
    if (reinterpret_cast<uintptr_t>(item.y.data) % 16 != 0 || (item.d * tb) % 16 != 0) return false;
    if (attrs_.interleaved) return true;  // stores at multiples of 8 lanes from the row start
    int64_t offset = 0;
    for (int64_t width : sections) {
      if ((offset * tb) % 16 != 0 || ((offset + width / 2) * tb) % 16 != 0) return false;
      offset += width;
    }
    return true;
  }

  template <typename T, typename C>
  void Run(const KernelContext& ctx, const Rotated* rotated, size_t count, const InputTensor& cos,
           const InputTensor& sin) const {
    const std::vector<int64_t> whole{rotated[0].r};
    const std::vector<int64_t>& sections = attrs_.sections.empty() ? whole : attrs_.sections;
    std::vector<RotaryJob<T, C>> jobs(count);
    std::vector<size_t> first_task(count + 1, 0);
    for (size_t i = 0; i < count; ++i) {
      const Rotated& item = rotated[i];
      RotaryJob<T, C>& job = jobs[i];
      job.d = item.d;
      job.r = item.r;
      job.interleaved = attrs_.interleaved;
      job.sections = sections.data();
      job.section_count = static_cast<int64_t>(sections.size());
      job.x = item.x.As<T>();
      job.y = item.y.As<T>();
      job.cos = cos.As<C>();
      job.sin = sin.As<C>();
      job.p_dims = item.plan.p.View(true);
      job.b_dims = item.plan.b.View(false);
      job.b_inner = item.plan.b_inner;
      job.stream_stores = StreamStores(item, sizeof(T), sections);
      // Empty tensors (a zero dim, D included) have no tasks.
      first_task[i + 1] = first_task[i] + (item.d == 0 ? 0 : item.plan.TaskCount());
    }

    const RotaryRowsFn<T, C> rows_fn = RowsFor<T, C>(isa_);
    const bool needs_scratch = !std::is_same_v<T, float>;
    const size_t scratch_floats = static_cast<size_t>(4 * rotated[0].r);
    std::atomic<bool> out_of_memory{false};
    ctx.ParallelFor(first_task[count], [&](size_t task) {
      size_t i = 0;
      while (task >= first_task[i + 1]) ++i;
      // Nothing may throw into ORT's worker threads: a failed allocation is reported afterwards.
      std::unique_ptr<float[]> scratch;
      if (needs_scratch && scratch_floats > 0) {
        scratch.reset(new (std::nothrow) float[scratch_floats]);
        if (!scratch) {
          out_of_memory = true;
          return;
        }
      }
      rows_fn(jobs[i], rotated[i].plan.Task(task - first_task[i]), scratch.get());
    });
    if (out_of_memory) throw Error("out of memory for a " + std::to_string(scratch_floats) + "-float row buffer");
  }

  RotaryAttributes attrs_;
  CpuIsa isa_;
};

template <bool kQK>
void AppendRotaryOp(const char* name, CustomOpList& ops) {
  AppendPerType<RotaryKernel<kQK>>(ops, [name](ONNXTensorElementDataType t) {
    return RotaryOpSpec(name, nullptr, t, kQK);
  });
}

}  // namespace

void AppendRotaryOps(CustomOpList& ops) {
  AppendRotaryOp<false>("RotaryEmbedding", ops);
  AppendRotaryOp<true>("RotaryEmbeddingQK", ops);
}

}  // namespace otfuse::cpu
