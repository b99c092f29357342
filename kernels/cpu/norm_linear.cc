// CPU kernels of the Norm + Linear family: RMSNormLinear, AddRMSNormLinear, LayerNormLinear,
// AddLayerNormLinear (contract: docs/ops.md). One node = one normalisation feeding n projections.
//
// A run normalises the rows with the norm family's row kernels (cpu/norm_rows.h: same math, same
// rounding to T as the standalone norm ops) into float32 A, written by the norm's tasks in the
// layout the GEMM reads (packed row blocks, or row-major rows), then multiplies A by each weight
// exactly as ORT holds it (the initializer: never copied, never packed beyond one block per task
// in flight, so fusing costs no memory): one float32 row on a CPU without AVX-512 goes through
// ORT's own Gemm (cpu/ort_gemm.h: MLAS's single-row kernel, which reads a weight in place as fast
// as the unfused graph's prepacked copy), everything else through common/gemm.h, which reads W
// in the orders that stream fastest and takes float16 / bfloat16 weights as they are (ORT's CPU
// Gemm has no 16-bit kernel: the unfused graph multiplies float32 copies). bench/README.md has
// the figures.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
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
#include "common/thread_floats.h"
#include "cpu/norm_linear.h"
#include "cpu/norm_rows.h"
#include "cpu/ort_gemm.h"
#include "op_registry.h"

namespace otfuse::cpu {
namespace {

using gemm_detail::kRowBlock;

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

template <typename T>
std::unique_ptr<T[]> Allocate(size_t count, const char* what) {
  std::unique_ptr<T[]> buffer(new (std::nothrow) T[count]);
  if (!buffer) throw Error(std::string("out of memory for ") + what);
  return buffer;
}

// Who multiplies float32: ORT's Gemm (MLAS) or ours (common/gemm.h). OTFUSE_NORM_LINEAR_GEMM=ort /
// own forces one (benchmarks, tests); otherwise the measured choice in ChooseGemm. 16-bit weights
// always take ours.
enum class GemmPath { kOrt, kOwn };

std::optional<GemmPath> ForcedGemmPath() {
  const char* value = std::getenv("OTFUSE_NORM_LINEAR_GEMM");
  if (value == nullptr || *value == '\0') return std::nullopt;
  if (std::strcmp(value, "ort") == 0) return GemmPath::kOrt;
  if (std::strcmp(value, "own") == 0) return GemmPath::kOwn;
  throw Error(std::string("OTFUSE_NORM_LINEAR_GEMM must be ort or own, got '") + value + "'");
}

WeightType WeightTypeOf(ONNXTensorElementDataType type) {
  if (type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16) return WeightType::kFloat16;
  if (type == ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16) return WeightType::kBFloat16;
  return WeightType::kFloat32;
}

// W_i packed once: the panels of common/gemm.h's PackWeight (W_i's element type: 4 or 2 bytes
// each), and W_i's type and shape for the run's checks. By PrePack (plugin EP: ORT then frees the
// initializer), or on the custom-op route from a shared constant W_i (ORT keeps it: `in_place`).
struct PackedWeight {
  ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  Shape shape;
  // As 32-bit words (aligned for either element); shared with the session's other kernels of
  // this weight (PackedWeightCache).
  std::shared_ptr<uint32_t[]> panels;
  // W_i is still there to be read in place (the run's input): a run may take either.
  bool in_place = false;
};

// The custom-op route's packed shared weights, for every session of the process (an OrtCustomOp
// has no session-wide state): kernels of one constant share its panels (a merged decoder's two
// branches); the cache checks the panels bit for bit, so a freed and reused address cannot match.
PackedWeightCache& SharedWeightCache() {
  static PackedWeightCache cache;
  return cache;
}

// OTFUSE_NORM_LINEAR_SHARED_PACK=0: a shared W_i is read in place like any other (benchmarks,
// tests: both paths stay testable); anything else or unset: packed once.
bool PacksSharedWeights() {
  const char* value = std::getenv("OTFUSE_NORM_LINEAR_SHARED_PACK");
  return value == nullptr || std::strcmp(value, "0") != 0;
}

size_t ElementBytes(ONNXTensorElementDataType type) { return type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT ? 4 : 2; }

bool IsWeightType(ONNXTensorElementDataType type) {
  return type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT || type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 ||
         type == ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16;
}

template <NormKind kKind, bool kAdd>
class NormLinearKernel {
 public:
  // `with_ort_gemm` false: without ORT's Gemm (a plugin EP's kernel cannot create it: OrtApi::CreateOp
  // looks the op up among that EP's kernels), so float32 always takes ours.
  explicit NormLinearKernel(const KernelInfo& info, bool with_ort_gemm = true) {
    params_ = ReadNormLinearParams(info, kKind, kAdd);
    isa_ = SelectCpuIsa();
    gemm_isa_ = SelectGemmIsa();
    forced_ = ForcedGemmPath();
    one_row_own_ = CpuHasAvx512() || !with_ort_gemm;
    packed_.resize(params_.count());
    if (!with_ort_gemm) {
      if (forced_ == GemmPath::kOrt) throw Error("OTFUSE_NORM_LINEAR_GEMM=ort: no ORT Gemm in the plugin EP's kernels");
      return;
    }
    if (PacksSharedWeights()) PackSharedWeights(info);
    // ORT's Gemm, one per (layout, bias) the projections use (created for every T: the kernel
    // does not know its T yet; only float32 runs them).
    for (size_t i = 0; i < params_.count(); ++i) {
      const bool t = params_.transposed[i] != 0;
      const bool b = params_.has_bias[i] != 0;
      if (!gemm_[t][b]) gemm_[t][b] = std::make_unique<OrtGemm>(info, t, b);
    }
  }

  // W_i packed into panels when `input` is a W_i of a weight type (float32, float16, bfloat16)
  // and its contract shape; false (nothing kept) for any other input, which the run then reads
  // and checks as usual (a W_i whose type is not x's fails the run's checks either way).
  bool PrePack(size_t input, const InputTensor& tensor, PackedWeightCache& cache) {
    if (input < params_.first_weight || input >= params_.first_weight + params_.count()) return false;
    return Pack(input - params_.first_weight, tensor, cache, /*in_place=*/false);
  }

  void Compute(const KernelContext& ctx) const {
    const NormInput input = ReadNormInput(ctx, kAdd);
    const InputTensor& x = input.x;
    const NormLinearRows dims = ReadNormLinearRows(input);
    const NormLinearNormParams norm = ReadNormLinearNormParams(ctx, input, dims.k, kKind, kAdd);
    const std::vector<InputTensor> weights = Weights(ctx);
    CheckProjectionWeights(weights, x.type, dims.k, params_);
    const std::vector<std::optional<InputTensor>> biases = ReadProjectionBiases(ctx, x.type, params_);
    const NormLinearOutputs outputs = AllocateNormLinearOutputs(ctx, params_, x.shape, kAdd);
    if (dims.rows == 0) return;

    switch (x.type) {
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return Run<float>(ctx, input, norm, dims, weights, biases, outputs);
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16:
        return Run<Float16>(ctx, input, norm, dims, weights, biases, outputs);
      default: return Run<BFloat16>(ctx, input, norm, dims, weights, biases, outputs);
    }
  }

 private:
  template <typename T>
  void Run(const KernelContext& ctx, const NormInput& input, const NormLinearNormParams& norm,
           const NormLinearRows& dims, const std::vector<InputTensor>& weights,
           const std::vector<std::optional<InputTensor>>& biases, const NormLinearOutputs& outputs) const {
    const int64_t rows = dims.rows, d = dims.k;
    std::vector<std::vector<float>> bias_storage(params_.count());
    std::vector<const float*> bias_f(params_.count(), nullptr);
    for (size_t i = 0; i < params_.count(); ++i) {
      if (!biases[i]) continue;
      if (biases[i]->type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT) {
        bias_f[i] = biases[i]->As<float>();
      } else {
        bias_storage[i] = AsFloat(*biases[i], params_.widths[i]);
        bias_f[i] = bias_storage[i].data();
      }
    }
    std::vector<GemmProduct> products;
    for (size_t i = 0; i < params_.count(); ++i) {
      products.push_back({weights[i].data, WeightTypeOf(input.x.type), params_.transposed[i] != 0, params_.widths[i],
                          bias_f[i], outputs.ys[i].data, packed_[i].panels.get()});
    }
    // ORT's Gemm reads A row-major; ours the layouts its plan names (the packed row blocks
    // written by the norm's tasks directly).
    const bool ort_gemm = std::is_same_v<T, float> && ChooseGemm(rows) == GemmPath::kOrt && !AnyPacked();
    const GemmALayouts layouts = ort_gemm ? GemmALayouts{true, false} : GemmReadsA(gemm_isa_, rows, products);
    const GemmA a = Normalize<T>(ctx, input, norm, rows, d, layouts, outputs);
    if (!ort_gemm) return GemmInPlace(ctx, gemm_isa_, rows, d, a, products);
    for (size_t i = 0; i < params_.count(); ++i) {
      gemm_[params_.transposed[i] != 0][bias_f[i] != nullptr]->Run(ctx, rows, d, params_.widths[i], a.rows,
                                                                   weights[i].As<float>(), bias_f[i],
                                                                   outputs.ys[i].As<float>());
    }
  }

  // W_i packed into panels (PackedWeight, in `cache`'s set when it has them already) when it is
  // of a weight type and its contract shape; false (nothing kept) otherwise.
  bool Pack(size_t i, const InputTensor& tensor, PackedWeightCache& cache, bool in_place) {
    const bool t = params_.transposed[i] != 0;
    if (!IsWeightType(tensor.type) || tensor.shape.size() != 2) return false;
    const int64_t k = tensor.shape[t ? 1 : 0], n = tensor.shape[t ? 0 : 1];
    if (n != params_.widths[i] || k <= 0) return false;
    std::shared_ptr<uint32_t[]> panels = cache.Find(tensor, t, k, n);
    if (!panels) {
      const size_t bytes = static_cast<size_t>(PackedWeightElements(k, n)) * ElementBytes(tensor.type);
      panels = Allocate<uint32_t>((bytes + 3) / 4, "a packed weight");
      PackWeight(tensor.data, WeightTypeOf(tensor.type), t, k, n, panels.get());
      cache.Add(tensor, t, panels);
    }
    packed_[i] = PackedWeight{tensor.type, tensor.shape, std::move(panels), in_place};
    return true;
  }

  // The custom-op route (no pre-pack hook): a W_i the rule marks shared_weight (another node reads
  // it, so ORT keeps it for the session whatever this node does) packed once here, from the kernel
  // info's constant, as PrePack packs it on the plugin-EP route. The unfused session holds that
  // constant and MLAS's packed copy of it, so the panels cost no memory the unfused model did not
  // take (bench/README.md, "LM heads, session 17"). An unmarked W_i is never copied.
  void PackSharedWeights(const KernelInfo& info) {
    for (size_t i = 0; i < params_.count(); ++i) {
      if (params_.shared_weight[i] == 0) continue;
      const std::optional<InputTensor> w = info.ConstantInput(params_.first_weight + i);
      if (w) Pack(i, *w, SharedWeightCache(), /*in_place=*/true);
    }
  }

  // W_i as the run reads it: its packed panels (and the shape it had) where PrePack took it (the
  // panels of a shared W_i packed here are read at every row count too: on the AVX-512 Xeon they
  // ran 1.03-1.30x the unfused time at 1-16 rows, 0.99-1.27x at 64-128 and no slower than the table
  // in place at 512-2048, bench/README.md "LM heads, session 17"; the check reads the input).
  std::vector<InputTensor> Weights(const KernelContext& ctx) const {
    std::vector<InputTensor> weights;
    for (size_t i = 0; i < params_.count(); ++i) {
      if (packed_[i].panels && !packed_[i].in_place) {
        weights.push_back({packed_[i].type, packed_[i].shape, packed_[i].panels.get()});
      } else {
        weights.push_back(RequiredInput(ctx, params_.first_weight + i, "W" + std::to_string(i + 1)));
      }
    }
    return weights;
  }

  // ORT's Gemm reads W_i itself, which is gone once packed by PrePack.
  bool AnyPacked() const {
    for (const PackedWeight& w : packed_) {
      if (w.panels && !w.in_place) return true;
    }
    return false;
  }

  // float32 from two rows on: ours (MLAS on the unpacked initializer packs W on every call:
  // 0.37-0.44x the unfused time at M = 16, 0.81-0.86x at 512, 0.80x at 2048). One row: both
  // stream W, and which reads it faster depends on the CPU (bench/README.md): MLAS's single-row kernel on the
  // Zen 3 measured (ours 0.83x in CPU time), ours on the AVX-512 Xeon (ours 1.10-1.56x, MLAS
  // 0.89-1.10x). The CPU class decides (CpuHasAvx512), not the forced micro-kernels nor the
  // AVX-512 FMA rate: one row is bound by reading W. A node with packed panels takes ours at one
  // row too (as the plugin EP does): on the Xeon as an AVX2 machine ours over the panels ran
  // 1.41-1.44x the unfused time where MLAS on the initializer ran 1.05-1.14x (GPT-2's and Qwen2's
  // tied heads, bench/README.md "LM heads, session 17").
  GemmPath ChooseGemm(int64_t rows) const {
    if (forced_) return *forced_;
    return rows == 1 && !one_row_own_ && !AnyPanels() ? GemmPath::kOrt : GemmPath::kOwn;
  }

  bool AnyPanels() const {
    for (const PackedWeight& w : packed_) {
      if (w.panels) return true;
    }
    return false;
  }

  // Rows of the norm (T, as the standalone norm rounds them; and S) as the products' A: rounded
  // to T and widened back exactly, in the layouts asked for. Tasks of whole row blocks, each
  // block normalised into Yn when the node has it, else into a row block of the task's thread,
  // then packed from there while it is in L1 / L2 (common/gemm.h, GemmA). Every buffer is kept per
  // thread (common/thread_floats.h): no M x K buffer is faulted in per call.
  template <typename T>
  GemmA Normalize(const KernelContext& ctx, const NormInput& input, const NormLinearNormParams& norm, int64_t rows,
                  int64_t d, GemmALayouts layouts, const NormLinearOutputs& outputs) const {
    constexpr bool kFloat = std::is_same_v<T, float>;
    const std::vector<float> scale_f = AsFloat(norm.scale, d);
    const std::vector<float> bias_f = norm.norm_bias ? AsFloat(*norm.norm_bias, d) : std::vector<float>{};
    NormJob<T> job{};
    job.kind = kKind;
    job.d = d;
    job.epsilon = params_.epsilon;
    job.x = input.x.As<T>();
    job.b = input.b ? input.b->As<T>() : nullptr;
    job.scale = scale_f.data();
    job.bias = norm.norm_bias ? bias_f.data() : nullptr;
    job.sum = outputs.sum ? outputs.sum.As<T>() : nullptr;
    T* const yn = outputs.normalized ? outputs.normalized.As<T>() : nullptr;
    const size_t elements = static_cast<size_t>(rows) * static_cast<size_t>(d);
    float* a_rows = nullptr;  // float32 Yn is row-major A itself
    if (layouts.rows) {
      a_rows = kFloat && yn != nullptr ? reinterpret_cast<float*>(yn)
                                       : CallerFloats<ThreadSlot::kCallerRowsA>(elements, "the normalised rows");
    }
    float* const a_packed =
        layouts.packed ? CallerFloats<ThreadSlot::kCallerPackedA>(elements, "the packed normalised rows") : nullptr;

    const NormRowsFn<T> rows_fn = RowsFor<T>(isa_);
    const int64_t blocks = (rows + kRowBlock - 1) / kRowBlock;
    const RowTasks tasks(blocks, kRowBlock * d);  // its "rows" are row blocks here
    // Per thread: the norm's scratch row, a row block of float32 A, a row block in T.
    const size_t block_floats = static_cast<size_t>(d) * (1 + kRowBlock + (kFloat ? 0 : kRowBlock));
    std::atomic<bool> out_of_memory{false};
    ctx.ParallelFor(tasks.count, [&](size_t task) {
      float* const scratch = ThreadFloats<ThreadSlot::kNormBlock>(block_floats);
      if (scratch == nullptr) {
        out_of_memory = true;
        return;
      }
      const int64_t first = static_cast<int64_t>(task) * tasks.rows_per_task;
      for (int64_t block = first; block < std::min(blocks, first + tasks.rows_per_task); ++block) {
        const int64_t row0 = block * kRowBlock;
        NormalizeBlock(job, rows_fn, row0, std::min(kRowBlock, rows - row0), yn, a_rows, a_packed, scratch);
      }
    });
    if (out_of_memory) throw Error("out of memory for a " + std::to_string(block_floats) + "-float row block");
    return GemmA{a_rows, a_packed};
  }

  // Rows [row0, row0 + count) of the norm (one row block): in T into Yn, or else into row-major
  // A (float32) or the thread's block; widened into row-major A (unless already there) and packed.
  // `scratch`: d floats for the norm, kRowBlock * d floats of A, kRowBlock * d T.
  template <typename T>
  static void NormalizeBlock(const NormJob<T>& whole, NormRowsFn<T> rows_fn, int64_t row0, int64_t count, T* yn,
                             float* a_rows, float* a_packed, float* scratch) {
    constexpr bool kFloat = std::is_same_v<T, float>;
    const int64_t d = whole.d, offset = row0 * d;
    float* const block_a = scratch + d;
    float* a = block_a;  // this block of float32 A
    if (a_rows != nullptr) {
      a = a_rows + offset;
    } else if constexpr (kFloat) {
      if (yn != nullptr) a = yn + offset;
    }
    NormJob<T> job = whole;
    job.x += offset;
    if (job.b != nullptr) job.b += offset;
    if (job.sum != nullptr) job.sum += offset;
    if (yn != nullptr) {
      job.y = yn + offset;
    } else if constexpr (kFloat) {
      job.y = a;
    } else {
      job.y = reinterpret_cast<T*>(block_a + kRowBlock * d);
    }
    rows_fn(job, 0, count, scratch);
    if (static_cast<const void*>(job.y) != static_cast<const void*>(a)) {
      // The rounded values widened back exactly: what the unfused MatMul reads.
      for (int64_t i = 0; i < count * d; ++i) a[i] = ToFloat(job.y[i]);
    }
    if (a_packed != nullptr) PackRowBlock(a, count, d, a_packed + offset);
  }

  NormLinearParams params_;
  CpuIsa isa_ = CpuIsa::kBaseline;
  GemmIsa gemm_isa_ = GemmIsa::kBaseline;
  std::optional<GemmPath> forced_;
  bool one_row_own_ = false;  // float32 with one row through ours (ChooseGemm; always without ORT's Gemm)
  std::unique_ptr<OrtGemm> gemm_[2][2];  // [transposed][with bias]
  std::vector<PackedWeight> packed_;     // per projection; empty unless PrePack took W_i
};

// The kernel behind the plugin EP's OrtKernelImpl (cpu/norm_linear_ep.cc).
template <NormKind kKind, bool kAdd>
class NormLinearOpOf final : public NormLinearOp {
 public:
  explicit NormLinearOpOf(const KernelInfo& info) : kernel_(info, /*with_ort_gemm=*/false) {}
  void Compute(const KernelContext& ctx) const override { kernel_.Compute(ctx); }
  bool PrePack(size_t input, const InputTensor& tensor, PackedWeightCache& cache) override {
    return kernel_.PrePack(input, tensor, cache);
  }

 private:
  NormLinearKernel<kKind, kAdd> kernel_;
};

template <NormKind kKind, bool kAdd>
void AppendNormLinearOp(const char* name, CustomOpList& ops) {
  AppendPerType<NormLinearKernel<kKind, kAdd>>(ops, [name](ONNXTensorElementDataType t) {
    return NormLinearOpSpec(name, nullptr, t, kKind, kAdd);
  });
}

}  // namespace

std::shared_ptr<uint32_t[]> PackedWeightCache::Find(const InputTensor& w, bool transposed, int64_t k, int64_t n) {
  const std::lock_guard<std::mutex> lock(mutex_);
  for (const Entry& entry : entries_) {
    if (entry.data != w.data || entry.type != w.type || entry.shape != w.shape || entry.transposed != transposed) continue;
    std::shared_ptr<uint32_t[]> panels = entry.panels.lock();
    if (panels && PackedWeightHolds(w.data, WeightTypeOf(w.type), transposed, k, n, panels.get())) return panels;
  }
  return nullptr;
}

void PackedWeightCache::Add(const InputTensor& w, bool transposed, const std::shared_ptr<uint32_t[]>& panels) {
  const std::lock_guard<std::mutex> lock(mutex_);
  entries_.push_back({w.data, w.type, w.shape, transposed, panels});
}

const char* const kNormLinearOpNames[4] = {"RMSNormLinear", "AddRMSNormLinear", "LayerNormLinear",
                                           "AddLayerNormLinear"};

std::unique_ptr<NormLinearOp> MakeNormLinearOp(const KernelInfo& info) {
  const std::string& op = info.op_name();
  if (op == kNormLinearOpNames[0]) return std::make_unique<NormLinearOpOf<NormKind::kRms, false>>(info);
  if (op == kNormLinearOpNames[1]) return std::make_unique<NormLinearOpOf<NormKind::kRms, true>>(info);
  if (op == kNormLinearOpNames[2]) return std::make_unique<NormLinearOpOf<NormKind::kLayer, false>>(info);
  if (op == kNormLinearOpNames[3]) return std::make_unique<NormLinearOpOf<NormKind::kLayer, true>>(info);
  throw Error("not a Norm + Linear op: " + op);
}

void AppendNormLinearOps(CustomOpList& ops) {
  AppendNormLinearOp<NormKind::kRms, false>(kNormLinearOpNames[0], ops);
  AppendNormLinearOp<NormKind::kRms, true>(kNormLinearOpNames[1], ops);
  AppendNormLinearOp<NormKind::kLayer, false>(kNormLinearOpNames[2], ops);
  AppendNormLinearOp<NormKind::kLayer, true>(kNormLinearOpNames[3], ops);
}

}  // namespace otfuse::cpu
