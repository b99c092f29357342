// Ascend kernels of the attention family: Attention and RopeAttention -> one
// aclnnFusedInferAttentionScoreV3 call (contract and mapping: docs/ops.md, "Attention family",
// "Ascend mapping"), with aclnnInplaceCopy around it for the KV cache (present = past ++ new),
// layout changes, the pseShift expansion and the float32 opt-in casts; RopeAttention rotates Q and
// the new keys first (ascend/rotary_plan.h).
//
// aclnnFusedInferAttentionScoreV3 — hicann/ops-transformer attention/fused_infer_attention_score/
// docs/aclnnFusedInferAttentionScoreV3_en.md (and aclnnFusedInferAttentionScoreV3.md):
//   * query/key/value/attentionOut FLOAT16 or BFLOAT16 (INT8 unused), contiguous; key and value
//     aclTensorLists whose tensors have identical shapes (so Dv = D); inputLayout BSND, BNSD or
//     BNSD_BSND (BSND output, Q_S > 1 only); numHeads = query's N; numKeyValueHeads 0 = numHeads;
//   * pseShift FLOAT16/BFLOAT16 (B, Q_N, Q_S, KV_S) or (1, Q_N, Q_S, KV_S), contiguous;
//   * attenMask BOOL (True = masked); sparseMode 0 (full mask or none), 3 rightDownCausal, 4 band
//     (2, 3, 4 take the compressed (2048, 2048) lower-triangular mask); with Q_S = 1 sparseMode is
//     ignored; preTokens/nextTokens default 2147483647;
//   * innerPrecise bit 1 = invalid row correction (fully masked rows);
//   * Q_S > 1: N <= 256, D <= 512, D 16-byte aligned for FLOAT16/BFLOAT16, B <= 65536.
// anchors.md §3: numHeads / numKeyValueHeads <= 64.
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "ascend/aclnn_call.h"
#include "ascend/rotary_plan.h"
#include "common/attention_params.h"
#include "common/shape_check.h"
#include "contract/attention_index.h"
#include "op_registry.h"

namespace otfuse::ascend {
namespace {

using FiaV3GetWorkspace = aclnnStatus (*)(
    const aclTensor* query, const aclTensorList* key, const aclTensorList* value, const aclTensor* pse_shift,
    const aclTensor* atten_mask, const aclIntArray* actual_seq_lengths, const aclIntArray* actual_seq_lengths_kv,
    const aclTensor* deq_scale1, const aclTensor* quant_scale1, const aclTensor* deq_scale2,
    const aclTensor* quant_scale2, const aclTensor* quant_offset2, const aclTensor* antiquant_scale,
    const aclTensor* antiquant_offset, const aclTensor* block_table, const aclTensor* query_padding_size,
    const aclTensor* kv_padding_size, const aclTensor* key_antiquant_scale, const aclTensor* key_antiquant_offset,
    const aclTensor* value_antiquant_scale, const aclTensor* value_antiquant_offset,
    const aclTensor* key_shared_prefix, const aclTensor* value_shared_prefix,
    const aclIntArray* actual_shared_prefix_len, const aclTensor* query_rope, const aclTensor* key_rope,
    const aclTensor* key_rope_antiquant_scale, int64_t num_heads, double scale_value, int64_t pre_tokens,
    int64_t next_tokens, char* input_layout, int64_t num_key_value_heads, int64_t sparse_mode,
    int64_t inner_precise, int64_t block_size, int64_t antiquant_mode, bool softmax_lse_flag,
    int64_t key_antiquant_mode, int64_t value_antiquant_mode, const aclTensor* attention_out,
    const aclTensor* softmax_lse, uint64_t* workspace_size, aclOpExecutor** executor);
// aclnnLogicalNotGetWorkspaceSize(const aclTensor* self, aclTensor* out, ...) and
// aclnnInplaceLogicalOrGetWorkspaceSize(aclTensor* selfRef, const aclTensor* other, ...) (other
// broadcast to selfRef; nonzero = True): CANN 8.0.0 operator API reference,
// https://www.hiascend.com/document/detail/zh/canncommercial/800/apiref/aolapi/context/aclnnLogicalNot%26aclnnInplaceLogicalNot.md
// https://www.hiascend.com/document/detail/zh/canncommercial/800/apiref/aolapi/context/aclnnLogicalOr%26aclnnInplaceLogicalOr.md
// Only for key_padding_mask.
using LogicalNotGetWorkspace = aclnnStatus (*)(const aclTensor* self, aclTensor* out, uint64_t* workspace_size,
                                               aclOpExecutor** executor);
using InplaceLogicalOrGetWorkspace = aclnnStatus (*)(aclTensor* self_ref, const aclTensor* other,
                                                     uint64_t* workspace_size, aclOpExecutor** executor);

constexpr int64_t kMaskSize = 2048;       // the compressed mask of sparse modes 2-4
constexpr int64_t kMaxHeads = 256;        // "The N axis can be less than or equal to 256"
constexpr int64_t kMaxHeadDim = 512;      // "the D axis can be less than or equal to 512"
constexpr int64_t kMaxGroup = 64;         // anchors.md §3: numHeads / numKeyValueHeads <= 64
constexpr int64_t kMaxBatch = 65536;      // "The B axis must be less than or equal to 65536"
constexpr int64_t kAllTokens = 2147483647;

using Layout = AttentionLayout;

// float32 nodes: not registered for the NPU (kCpu: ORT runs the CPU kernel), or run on FIA in
// float16 / bfloat16 when the session opts in (docs/ops.md, "float32 policy").
enum class Fp32 { kCpu, kFloat16, kBFloat16 };

const char* Name(Layout l) { return l == Layout::kBnsd ? "BNSD" : "BSND"; }

InputTensor RequiredInput(const KernelContext& ctx, size_t index, const char* name) {
  std::optional<InputTensor> tensor = ctx.Input(index);
  if (!tensor) throw Error(std::string("input '") + name + "' is required");
  return *tensor;
}

int64_t Numel(const Shape& s) { return DimProduct(s, 0, s.size()); }

// A [B, heads, S, D] tensor stored in `layout`: its shape and strides seen in layout `as`.
struct Heads {
  int64_t b, n, s, d;
  Layout layout;
  Shape Dims(Layout as) const { return as == Layout::kBnsd ? Shape{b, n, s, d} : Shape{b, s, n, d}; }
  Shape Strides(Layout as) const {
    const int64_t sb = n * s * d;
    const int64_t sn = layout == Layout::kBnsd ? s * d : d;
    const int64_t ss = layout == Layout::kBnsd ? d : n * d;
    return as == Layout::kBnsd ? Shape{sb, sn, ss, 1} : Shape{sb, ss, sn, 1};
  }
  // Same memory order in both layouts when S or N is 1.
  bool SameMemory(Layout as) const { return as == layout || s == 1 || n == 1; }
};

Heads ViewHeads(const char* name, const InputTensor& t, Layout layout, int64_t heads, const char* heads_attr) {
  const AttentionHeadDims h = ReadHeadDims(name, t.shape, layout, heads, heads_attr);
  return Heads{h.batch, h.heads, h.seq, h.d, layout};
}

void CheckBroadcast(const char* name, const Shape& shape, const Shape& target, const char* target_name) {
  const std::string message = std::string(name) + " has shape " + ToString(shape) + ", not broadcastable to " +
                              target_name + " = " + ToString(target);
  if (shape.size() > target.size()) throw Error(message);
  Numel(shape);
  for (size_t k = 0; k < shape.size(); ++k) {
    const int64_t dim = shape[shape.size() - 1 - k];
    if (dim != target[target.size() - 1 - k] && dim != 1) throw Error(message);
  }
}

// The compressed 2048 x 2048 bool mask (True above the diagonal = masked), built once per device
// with aclrtMalloc + aclrtMemcpy and kept for the life of the process.
const void* CompressedMask(const CannRuntime& rt) {
  static std::mutex mutex;
  static std::map<std::pair<const CannRuntime*, int32_t>, void*> masks;
  int32_t device = 0;
  if (rt.rt_get_device != nullptr && rt.rt_get_device(&device) != 0) device = 0;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = masks.find({&rt, device});
  if (it != masks.end()) return it->second;
  if (rt.rt_malloc == nullptr || rt.rt_memcpy == nullptr) {
    throw Error("the CANN runtime exports no aclrtMalloc/aclrtMemcpy, needed for the causal mask");
  }
  constexpr size_t kBytes = static_cast<size_t>(kMaskSize) * kMaskSize;
  std::vector<uint8_t> host(kBytes);
  for (int64_t i = 0; i < kMaskSize; ++i) {
    for (int64_t j = 0; j < kMaskSize; ++j) host[i * kMaskSize + j] = j > i ? 1 : 0;
  }
  void* device_mask = nullptr;
  if (rt.rt_malloc(&device_mask, kBytes, ACL_MEM_MALLOC_HUGE_FIRST) != 0 || device_mask == nullptr) {
    throw Error("aclrtMalloc of the 2048 x 2048 causal mask failed: " + rt.RecentErrorMessage());
  }
  if (rt.rt_memcpy(device_mask, kBytes, host.data(), kBytes, ACL_MEMCPY_HOST_TO_DEVICE) != 0) {
    rt.rt_free(device_mask);
    throw Error("aclrtMemcpy of the 2048 x 2048 causal mask failed: " + rt.RecentErrorMessage());
  }
  masks.emplace(std::make_pair(&rt, device), device_mask);
  return device_mask;
}

template <bool kRope, Placement kPlacement, Fp32 kFp32>
class AscendAttentionKernel {
 public:
  explicit AscendAttentionKernel(const KernelInfo& info)
      : rt_(&BindRuntime(kPlacement)),
        fia_(AclnnOp<FiaV3GetWorkspace>::Bind(*rt_, "aclnnFusedInferAttentionScoreV3")),
        copy_(AclnnOp<InplaceCopyGetWorkspace>::Bind(*rt_, "aclnnInplaceCopy")) {
    const AttentionParams params = ReadAttentionParams(info);
    num_heads_ = params.num_heads;
    kv_num_heads_ = params.kv_num_heads;
    scale_ = params.scale;
    causal_ = params.causal;
    window_ = params.window;
    const float softcap = params.softcap;
    layout_ = params.layout;
    output_layout_ = params.output_layout;
    uniform_empty_rows_ = params.uniform_empty_rows;
    if constexpr (kRope) {
      rotary_ = ReadRopeAttentionRotary(info);
      rotary_ops_ = RotaryOps::Bind(*rt_);
    }
    // What aclnnFusedInferAttentionScoreV3 cannot express, known from the attributes alone.
    const char* cpu = " (run this node on CPU: leave it out of the CANN session, or fuse without the attention family)";
    if (softcap > 0.0f) throw Error(std::string("aclnnFusedInferAttentionScoreV3 has no logit soft-capping (softcap > 0)") + cpu);
    if (num_heads_ > kMaxHeads) {
      throw Error("aclnnFusedInferAttentionScoreV3 takes at most 256 query heads, num_heads = " +
                  std::to_string(num_heads_) + cpu);
    }
    if (num_heads_ / kv_num_heads_ > kMaxGroup) {
      throw Error("aclnnFusedInferAttentionScoreV3 takes at most 64 query heads per kv head, num_heads / kv_num_heads = " +
                  std::to_string(num_heads_ / kv_num_heads_) + cpu);
    }
    logical_not_.name = "aclnnLogicalNot";
    logical_not_.get_workspace = reinterpret_cast<LogicalNotGetWorkspace>(rt_->Find("aclnnLogicalNotGetWorkspaceSize"));
    logical_not_.execute = reinterpret_cast<fn::AclnnExecute>(rt_->Find("aclnnLogicalNot"));
    logical_or_.name = "aclnnInplaceLogicalOr";
    logical_or_.get_workspace =
        reinterpret_cast<InplaceLogicalOrGetWorkspace>(rt_->Find("aclnnInplaceLogicalOrGetWorkspaceSize"));
    logical_or_.execute = reinterpret_cast<fn::AclnnExecute>(rt_->Find("aclnnInplaceLogicalOr"));
  }

  void Compute(const KernelContext& ctx) const;

 private:
  static constexpr AttentionInputIndex kIn = AttentionInputs<kRope>();

  // FIA's compute type for node type t.
  static ONNXTensorElementDataType ComputeType(ONNXTensorElementDataType t) {
    if (t != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT) return t;
    return kFp32 == Fp32::kBFloat16 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16 : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
  }

  // dst (a [B, N, S, D] view in `as`) = src, converting type and layout.
  void Copy(AclnnCall& call, void* dst, ONNXTensorElementDataType dst_type, const Heads& dst_heads, const void* src,
            ONNXTensorElementDataType src_type, const Heads& src_heads, int64_t dst_seq_offset, const char* what) const {
    const Layout as = Layout::kBnsd;
    Shape dst_strides = dst_heads.Strides(as);
    const int64_t offset = dst_seq_offset * dst_strides[2];
    call.Run(copy_, call.View(dst, dst_type, src_heads.Dims(as), dst_strides, offset, what),
             call.View(src, src_type, src_heads.Dims(as), src_heads.Strides(as), 0, what));
  }

  // The [B, 1, Sq, Skv] bool mask (True = masked) of causal / window / key_padding_mask, built on
  // the device from views of the compressed mask.
  aclTensor* FullMask(AclnnCall& call, int64_t batch, int64_t sq, int64_t skv, const std::optional<InputTensor>& pad) const;

  // empty_rows = "uniform": [B, N, Sq] flags of the rows that see no key (causal, window,
  // key_padding_mask, a -inf attn_bias), worked out on the host; empty when there is none. Reads
  // key_padding_mask and attn_bias back after synchronising the stream.
  std::vector<uint8_t> EmptyRows(AclnnCall& call, int64_t batch, int64_t sq, int64_t skv,
                                 const std::optional<InputTensor>& pad, const std::optional<InputTensor>& bias) const;

  const CannRuntime* rt_;
  AclnnOp<FiaV3GetWorkspace> fia_;
  AclnnOp<InplaceCopyGetWorkspace> copy_;
  AclnnOp<LogicalNotGetWorkspace> logical_not_;
  AclnnOp<InplaceLogicalOrGetWorkspace> logical_or_;
  RotaryOps rotary_ops_{};
  RotaryAttributes rotary_;
  int64_t num_heads_ = 0, kv_num_heads_ = 0;
  float scale_ = 0.0f;
  bool causal_ = false;
  int64_t window_ = 0;
  bool uniform_empty_rows_ = false;  // empty_rows = "uniform"
  Layout layout_ = Layout::kBnsd, output_layout_ = Layout::kBnsd;
};

template <bool kRope, Placement kPlacement, Fp32 kFp32>
aclTensor* AscendAttentionKernel<kRope, kPlacement, kFp32>::FullMask(AclnnCall& call, int64_t batch, int64_t sq,
                                                                     int64_t skv,
                                                                     const std::optional<InputTensor>& pad) const {
  constexpr auto kBool = ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL;
  const bool geometry = causal_ || window_ > 0;
  if (geometry && (sq > kMaskSize || skv > kMaskSize)) {
    throw Error("a causal/window mask combined with key_padding_mask (or a window while decoding) is built from the "
                "compressed 2048 x 2048 mask, so Sq and Skv must be <= 2048; got Sq = " + std::to_string(sq) +
                ", Skv = " + std::to_string(skv) + " (run this node on CPU)");
  }
  if (pad && (logical_not_.execute == nullptr || logical_or_.execute == nullptr || logical_not_.get_workspace == nullptr ||
              logical_or_.get_workspace == nullptr)) {
    throw Error("key_padding_mask needs aclnnLogicalNot and aclnnInplaceLogicalOr, which the CANN libraries in " +
                rt_->directory() + " do not export");
  }
  const Shape shape{batch, 1, sq, skv};
  void* data = call.Scratch(static_cast<size_t>(Numel(shape)), "attention mask");
  aclTensor* mask = call.Tensor(data, kBool, shape, "attenMask");
  const void* m = geometry ? CompressedMask(*rt_) : nullptr;
  const int64_t c = skv - sq;  // query row i sits at position i + c
  if (causal_) {
    // masked iff j > i + c: M[i + a][j + b] with a - b = c.
    const int64_t a = c >= 0 ? c : 0, b = c >= 0 ? 0 : -c;
    call.Run(copy_, mask, call.View(m, kBool, Shape{1, 1, sq, skv}, Shape{0, 0, kMaskSize, 1}, a * kMaskSize + b,
                                    "causal part of the compressed mask"));
  }
  if (window_ > 0) {
    // masked iff j < i + c - window + 1 = i + w: M[j + b][i + a] (transposed view) with a - b = w.
    const int64_t w = c - window_ + 1;
    const int64_t a = w >= 0 ? w : 0, b = w >= 0 ? 0 : -w;
    call.Run(logical_or_, mask, call.View(m, kBool, Shape{1, 1, sq, skv}, Shape{0, 0, 1, kMaskSize},
                                          b * kMaskSize + a, "window part of the compressed mask"));
  }
  if (pad) {
    void* not_pad = call.Scratch(static_cast<size_t>(batch * skv), "padding mask");
    aclTensor* not_pad_t = call.Tensor(not_pad, kBool, Shape{batch, skv}, "NOT key_padding_mask");
    call.Run(logical_not_, call.Tensor(pad->data, pad->type, pad->shape, "key_padding_mask"), not_pad_t);
    aclTensor* per_key = call.Tensor(not_pad, kBool, Shape{batch, 1, 1, skv}, "NOT key_padding_mask");
    if (causal_) {
      call.Run(logical_or_, mask, per_key);
    } else {
      call.Run(copy_, mask, per_key);
    }
  }
  return mask;
}

template <bool kRope, Placement kPlacement, Fp32 kFp32>
std::vector<uint8_t> AscendAttentionKernel<kRope, kPlacement, kFp32>::EmptyRows(
    AclnnCall& call, int64_t batch, int64_t sq, int64_t skv, const std::optional<InputTensor>& pad,
    const std::optional<InputTensor>& bias) const {
  // Device tensors to the host, once the stream has produced them (one synchronisation).
  if (pad || bias) {
    if (rt_->rt_synchronize_stream == nullptr || rt_->rt_memcpy == nullptr) {
      throw Error("empty_rows = \"uniform\" reads key_padding_mask / attn_bias on the host, which needs "
                  "aclrtSynchronizeStream and aclrtMemcpy");
    }
    if (rt_->rt_synchronize_stream(call.stream()) != 0) {
      throw Error("aclrtSynchronizeStream failed: " + rt_->RecentErrorMessage());
    }
  }
  auto read_back = [&](const InputTensor& tensor, const char* what) {
    std::vector<uint8_t> host(static_cast<size_t>(Numel(tensor.shape)) * ElementBytes(tensor.type));
    if (!host.empty() &&
        rt_->rt_memcpy(host.data(), host.size(), tensor.data, host.size(), ACL_MEMCPY_DEVICE_TO_HOST) != 0) {
      throw Error(std::string("aclrtMemcpy of ") + what + " to the host failed: " + rt_->RecentErrorMessage());
    }
    return host;
  };
  const int64_t nq = num_heads_, c = skv - sq;  // query row i sits at position i + c
  // Keys visible per batch row by key_padding_mask: a prefix count over the positions.
  std::vector<int64_t> kept;
  if (pad) {
    const std::vector<uint8_t> host = read_back(*pad, "key_padding_mask");
    const size_t es = ElementBytes(pad->type);
    kept.assign(static_cast<size_t>(batch * (skv + 1)), 0);
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t j = 0; j < skv; ++j) {
        const uint8_t* e = host.data() + static_cast<size_t>(b * skv + j) * es;
        bool nonzero = false;
        for (size_t k = 0; k < es; ++k) nonzero = nonzero || e[k] != 0;
        kept[b * (skv + 1) + j + 1] = kept[b * (skv + 1) + j] + (nonzero ? 1 : 0);
      }
    }
  }
  // attn_bias broadcast to [B, N, Sq, Skv]: its element strides (0 along broadcast dims), and
  // whether an element is -inf.
  std::vector<uint8_t> bias_host;
  Shape bs(4, 0);
  size_t bes = 0;
  if (bias) {
    bias_host = read_back(*bias, "attn_bias");
    bes = ElementBytes(bias->type);
    Shape b4(4 - bias->shape.size(), 1);
    b4.insert(b4.end(), bias->shape.begin(), bias->shape.end());
    const Shape contiguous = ContiguousStrides(b4);
    for (size_t k = 0; k < 4; ++k) bs[k] = b4[k] == 1 ? 0 : contiguous[k];
  }
  auto minus_inf = [&](int64_t index) {
    const uint8_t* e = bias_host.data() + static_cast<size_t>(index) * bes;
    if (bes == 4) {
      uint32_t bits;
      std::memcpy(&bits, e, 4);
      return bits == 0xFF800000u;
    }
    uint16_t bits;
    std::memcpy(&bits, e, 2);
    return bits == (bias->type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 ? 0xFC00u : 0xFF80u);
  };
  std::vector<uint8_t> empty(static_cast<size_t>(batch * nq * sq), 0);
  bool any = false;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < sq; ++i) {
      const int64_t t = i + c;
      const int64_t lo = window_ > 0 ? std::max<int64_t>(0, t - window_ + 1) : 0;
      const int64_t hi = causal_ ? std::min(skv, t + 1) : skv;
      const int64_t visible = hi <= lo ? 0 : pad ? kept[b * (skv + 1) + hi] - kept[b * (skv + 1) + lo] : hi - lo;
      for (int64_t h = 0; h < nq; ++h) {
        bool none = visible == 0;
        if (!none && bias) {  // every visible key at -inf? (stops at the first that is not)
          none = true;
          const int64_t row = b * bs[0] + h * bs[1] + i * bs[2];
          for (int64_t j = lo; j < hi && none; ++j) {
            if (pad && kept[b * (skv + 1) + j + 1] == kept[b * (skv + 1) + j]) continue;  // padded out
            none = minus_inf(row + j * bs[3]);
          }
        }
        if (none) empty[(b * nq + h) * sq + i] = 1;
        any = any || none;
      }
    }
  }
  if (!any) empty.clear();
  return empty;
}

template <bool kRope, Placement kPlacement, Fp32 kFp32>
void AscendAttentionKernel<kRope, kPlacement, kFp32>::Compute(const KernelContext& ctx) const {
  const char* cpu = " (run this node on CPU)";
  const InputTensor q = RequiredInput(ctx, 0, "Q");
  const InputTensor k = RequiredInput(ctx, 1, "K");
  const InputTensor v = RequiredInput(ctx, 2, "V");
  const ONNXTensorElementDataType t = q.type;
  for (const InputTensor* in : {&k, &v}) {
    if (in->type != t) {
      throw Error(std::string(in == &k ? "K" : "V") + " has element type " + ElementTypeName(in->type) + " but Q has " +
                  ElementTypeName(t));
    }
  }
  const Heads qh = ViewHeads("Q", q, layout_, num_heads_, "num_heads");
  const Heads kh = ViewHeads("K", k, layout_, kv_num_heads_, "kv_num_heads");
  const Heads vh = ViewHeads("V", v, layout_, kv_num_heads_, "kv_num_heads");
  const int64_t batch = qh.b, sq = qh.s, s_new = kh.s, d = qh.d, dv = vh.d, nq = num_heads_, nkv = kv_num_heads_;
  if (kh.b != batch || vh.b != batch) {
    throw Error("batch sizes differ: Q " + std::to_string(batch) + ", K " + std::to_string(kh.b) + ", V " +
                std::to_string(vh.b));
  }
  if (kh.d != d) throw Error("K's head size D = " + std::to_string(kh.d) + " differs from Q's D = " + std::to_string(d));
  if (vh.s != s_new) throw Error("V has " + std::to_string(vh.s) + " positions but K has " + std::to_string(s_new));

  const std::optional<InputTensor> past_k = ctx.Input(kIn.past_key);
  const std::optional<InputTensor> past_v = ctx.Input(kIn.past_value);
  if (past_k.has_value() != past_v.has_value()) {
    throw Error(std::string("past_key and past_value must be given together; only ") +
                (past_k ? "past_key" : "past_value") + " is");
  }
  int64_t past = 0;
  if (past_k) {
    for (const InputTensor* p : {&*past_k, &*past_v}) {
      if (p->type != t) {
        throw Error(std::string(p == &*past_k ? "past_key" : "past_value") + " has element type " +
                    ElementTypeName(p->type) + " but Q has " + ElementTypeName(t));
      }
    }
    if (past_k->shape.size() != 4) {
      throw Error("past_key has shape " + ToString(past_k->shape) + "; expected rank 4 [B, Nkv, P, D]");
    }
    past = past_k->shape[2];
    ExpectShape("past_key", past_k->shape, "[B, kv_num_heads, P, D]", Shape{batch, nkv, past, d});
    ExpectShape("past_value", past_v->shape, "[B, kv_num_heads, P, Dv]", Shape{batch, nkv, past, dv});
  }
  const int64_t skv = past + s_new;
  const Shape scores{batch, nq, sq, skv};
  const std::optional<InputTensor> bias = ctx.Input(kIn.bias);
  if (bias) {
    if (bias->type != t && bias->type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT) {
      throw Error(std::string("attn_bias has element type ") + ElementTypeName(bias->type) +
                  "; expected float32 or Q's type " + ElementTypeName(t));
    }
    CheckBroadcast("attn_bias", bias->shape, scores, "[B, N, Sq, Skv]");
  }
  const std::optional<InputTensor> pad = ctx.Input(kIn.key_mask);
  if (pad) {
    if (pad->type != ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL && pad->type != ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32 &&
        pad->type != ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64) {
      throw Error(std::string("key_padding_mask has element type ") + ElementTypeName(pad->type) +
                  "; expected bool, int32 or int64");
    }
    ExpectShape("key_padding_mask", pad->shape, "[B, Skv]", Shape{batch, skv});
  }
  const Product product = ClassifySoc(rt_->SocName());
  std::optional<RotaryPlan> q_rot, k_rot;
  std::optional<InputTensor> cos, sin;
  if constexpr (kRope) {
    cos = RequiredInput(ctx, kIn.cos, "cos");
    sin = RequiredInput(ctx, kIn.sin, "sin");
    if (cos->type != t && cos->type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT) {
      throw Error(std::string("cos has element type ") + ElementTypeName(cos->type) + "; expected float32 or Q's type " +
                  ElementTypeName(t));
    }
    if (sin->type != cos->type) {
      throw Error(std::string("sin has element type ") + ElementTypeName(sin->type) + " but cos has " +
                  ElementTypeName(cos->type));
    }
    ExpectShape("sin", sin->shape, "cos.shape", cos->shape);
    q_rot = RotaryPlan::Make("Q", qh.Dims(layout_), t, cos->shape, cos->type, rotary_, product);
    k_rot = RotaryPlan::Make("K", kh.Dims(layout_), t, cos->shape, cos->type, rotary_, product);
  }

  // aclnnFusedInferAttentionScoreV3's limits.
  const ONNXTensorElementDataType ft = ComputeType(t);
  if (product == Product::kAtlasInference || product == Product::kAtlasTraining ||
      product == Product::kAtlas200I500A2) {
    throw Error(std::string("aclnnFusedInferAttentionScoreV3 is not available on ") + ProductName(product) + cpu);
  }
  if (dv != d) {
    throw Error("aclnnFusedInferAttentionScoreV3 needs key and value of one shape, but V's head size Dv = " +
                std::to_string(dv) + " differs from D = " + std::to_string(d) + cpu);
  }
  if (d > kMaxHeadDim) {
    throw Error("aclnnFusedInferAttentionScoreV3 takes head sizes up to 512, D = " + std::to_string(d) + cpu);
  }
  if (sq > 1 && (d * 2) % 16 != 0) {
    throw Error("aclnnFusedInferAttentionScoreV3 needs D 16-byte aligned (a multiple of 8 in float16/bfloat16) when "
                "Sq > 1, D = " + std::to_string(d) + cpu);
  }
  if (batch > kMaxBatch) {
    throw Error("aclnnFusedInferAttentionScoreV3 takes B <= 65536, B = " + std::to_string(batch) + cpu);
  }

  // Outputs.
  Shape y_shape;
  if (output_layout_ == Layout::kBnsd) {
    y_shape = {batch, nq, sq, dv};
  } else {
    y_shape = q.shape.size() == 3 ? Shape{batch, sq, nq * dv} : Shape{batch, sq, nq, dv};
  }
  const OutputTensor y = ctx.Output(0, y_shape);
  if (!y) throw Error("output 'Y' is required");
  const OutputTensor present_k = ctx.Output(1, Shape{batch, nkv, skv, d});
  const OutputTensor present_v = ctx.Output(2, Shape{batch, nkv, skv, dv});
  if (Numel(Shape{batch, nkv, skv, d}) == 0 && Numel(y_shape) == 0) return;

  AclnnCall call(*rt_, ctx, 0);
  const size_t es = ElementBytes(t), fes = ElementBytes(ft);
  auto scratch = [&](int64_t elements, size_t bytes_per, const char* what) {
    return call.Scratch(static_cast<size_t>(std::max<int64_t>(elements, 1)) * bytes_per, what);
  };

  // RopeAttention: rotated Q and new K (contiguous, in `layout`), exactly RotaryEmbedding's values.
  const void* q_src = q.data;
  const void* k_src = k.data;
  if constexpr (kRope) {
    void* q_rotated = scratch(Numel(q.shape), es, "rotated Q");
    void* k_rotated = scratch(Numel(k.shape), es, "rotated K");
    q_rot->Run(call, rotary_ops_, q.data, cos->data, sin->data, q_rotated);
    k_rot->Run(call, rotary_ops_, k.data, cos->data, sin->data, k_rotated);
    q_src = q_rotated;
    k_src = k_rotated;
  }

  // present_* = past ++ new (BNSD), when asked for or when there is a past to attend to.
  const bool cached = past_k.has_value() || present_k || present_v;
  const Heads present_heads{batch, nkv, skv, d, Layout::kBnsd};
  const void* k_all = nullptr;
  const void* v_all = nullptr;
  if (cached) {
    void* pk = present_k ? present_k.data : scratch(Numel(present_heads.Dims(Layout::kBnsd)), es, "keys");
    void* pv = present_v ? present_v.data : scratch(Numel(present_heads.Dims(Layout::kBnsd)), es, "values");
    if (past > 0 && batch * nkv * d > 0) {
      const Heads past_heads{batch, nkv, past, d, Layout::kBnsd};
      Copy(call, pk, t, present_heads, past_k->data, t, past_heads, 0, "present_key[:, :, :P]");
      Copy(call, pv, t, present_heads, past_v->data, t, past_heads, 0, "present_value[:, :, :P]");
    }
    if (s_new > 0 && batch * nkv * d > 0) {
      Copy(call, pk, t, present_heads, k_src, t, kh, past, "present_key[:, :, P:]");
      Copy(call, pv, t, present_heads, v.data, t, vh, past, "present_value[:, :, P:]");
    }
    k_all = pk;
    v_all = pv;
  }
  if (batch == 0 || nq == 0 || sq == 0 || dv == 0) return;
  if (skv == 0) {  // no key: every row is 0 (contract)
    if (rt_->rt_memset_async == nullptr) throw Error("the CANN runtime exports no aclrtMemsetAsync, needed to zero Y");
    const size_t bytes = static_cast<size_t>(Numel(y_shape)) * es;
    if (rt_->rt_memset_async(y.data, bytes, 0, bytes, call.stream()) != 0) {
      throw Error("aclrtMemsetAsync of Y failed: " + rt_->RecentErrorMessage());
    }
    return;
  }

  // FIA's layout: the node's own when K/V are the inputs, BNSD when they are present_*.
  const Layout in = cached ? Layout::kBnsd : layout_;
  const Heads kv_heads = cached ? present_heads : kh;
  const Heads val_heads = cached ? Heads{batch, nkv, skv, dv, Layout::kBnsd} : vh;
  auto staged = [&](const void* src, const Heads& h, const char* what) -> const void* {
    if (t == ft && h.SameMemory(in)) return src;  // already FIA's type and layout
    void* out = scratch(Numel(h.Dims(in)), fes, what);
    const Heads dst{h.b, h.n, h.s, h.d, in};
    Copy(call, out, ft, dst, src, t, h, 0, what);
    return out;
  };
  const Heads q_heads{batch, nq, sq, d, layout_};
  const void* q_fia = staged(q_src, q_heads, "query");
  const void* k_fia = staged(cached ? k_all : k_src, kv_heads, "key");
  const void* v_fia = staged(cached ? v_all : v.data, val_heads, "value");

  // Output: FIA writes Y directly when its layout can be expressed (BNSD_BSND needs Sq > 1).
  const Heads y_heads{batch, nq, sq, dv, output_layout_};
  std::string layout_name = Name(in);
  bool direct = t == ft;
  Layout out_layout = in;
  if (output_layout_ != in) {
    if (y_heads.SameMemory(in)) {
      // Sq = 1 (or N = 1): the two layouts are the same memory.
    } else if (in == Layout::kBnsd) {
      layout_name = "BNSD_BSND";
      out_layout = Layout::kBsnd;
    } else {
      direct = false;  // BSND in, BNSD out: FIA has no BSND_BNSD; transposed after
    }
  }
  const Heads fia_out_heads{batch, nq, sq, dv, out_layout};
  void* out = direct ? y.data : scratch(Numel(y_shape), fes, "attention output");

  // pseShift: attn_bias in FIA's type, (B or 1, N, Sq, Skv).
  aclTensor* pse = nullptr;
  if (bias) {
    Shape b4(4 - bias->shape.size(), 1);
    b4.insert(b4.end(), bias->shape.begin(), bias->shape.end());
    const Shape pse_shape{b4[0] == batch ? batch : 1, nq, sq, skv};
    if (bias->type == ft && b4 == pse_shape) {
      pse = call.Tensor(bias->data, ft, pse_shape, "pseShift");
    } else {
      pse = call.Tensor(scratch(Numel(pse_shape), fes, "pseShift"), ft, pse_shape, "pseShift");
      call.Run(copy_, pse, call.Tensor(bias->data, bias->type, b4, "attn_bias"));
    }
  }

  // Masks: sparse modes 3 (causal) and 4 (window) with the compressed mask while Sq > 1; a full
  // mask with key_padding_mask, or for a window while decoding (Q_S = 1 ignores sparseMode).
  int64_t sparse_mode = 0, pre_tokens = kAllTokens, next_tokens = kAllTokens;
  aclTensor* mask = nullptr;
  if (pad || (window_ > 0 && sq == 1 && skv > window_)) {
    mask = FullMask(call, batch, sq, skv, pad);
  } else if (causal_ && sq > 1) {
    const void* m = CompressedMask(*rt_);
    mask = call.Tensor(m, ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL, Shape{kMaskSize, kMaskSize}, "attenMask");
    if (window_ > 0) {
      sparse_mode = 4;
      pre_tokens = window_ - 1;
      next_tokens = 0;
    } else {
      sparse_mode = 3;
    }
  }
  const bool rows_may_be_empty = pad.has_value() || bias.has_value() || window_ > 0 || (causal_ && sq > skv);
  const int64_t inner_precise = rows_may_be_empty ? 2 : 0;

  aclTensor* query = call.Tensor(q_fia, ft, q_heads.Dims(in), "query");
  aclTensorList* key = call.TensorList({call.Tensor(k_fia, ft, kv_heads.Dims(in), "key")}, "key");
  aclTensorList* value = call.TensorList({call.Tensor(v_fia, ft, val_heads.Dims(in), "value")}, "value");
  aclTensor* attention_out = call.Tensor(out, ft, fia_out_heads.Dims(out_layout), "attentionOut");
  const double scale = scale_ != 0.0f ? static_cast<double>(scale_) : 1.0 / std::sqrt(static_cast<double>(d));
  const aclTensor* none = nullptr;
  const aclIntArray* no_array = nullptr;
  call.Run(fia_, static_cast<const aclTensor*>(query), static_cast<const aclTensorList*>(key),
           static_cast<const aclTensorList*>(value), static_cast<const aclTensor*>(pse),
           static_cast<const aclTensor*>(mask), no_array, no_array, none, none, none, none, none, none, none, none, none,
           none, none, none, none, none, none, none, no_array, none, none, none, nq, scale, pre_tokens, next_tokens,
           layout_name.data(), nkv == nq ? int64_t{0} : nkv, sparse_mode, inner_precise, int64_t{0}, int64_t{0}, false,
           int64_t{0}, int64_t{0}, static_cast<const aclTensor*>(attention_out), none);
  if (!direct) {
    // Y = out: cast back to float32 and/or transpose BSND -> BNSD.
    Copy(call, y.data, t, y_heads, out, ft, fia_out_heads, 0, "Y");
  }

  // empty_rows = "uniform": FIA's invalid-row correction left 0 in the rows that see no key; they
  // get the mean of V over all keys. Which rows those are is worked out on the host (the
  // key_padding_mask and attn_bias are read back after a stream synchronisation); nothing more
  // happens when there are none.
  if (uniform_empty_rows_ && (pad || bias || (causal_ && sq > skv))) {
    const std::vector<uint8_t> empty = EmptyRows(call, batch, sq, skv, pad, bias);
    if (empty.empty()) return;
    // The mean of V per (batch, kv head): FIA over the same key/value lists with a zero query
    // row per kv head (every score 0, so every key weighs 1/Skv), no mask, no bias.
    const Heads zero_heads{batch, nkv, 1, d, in}, mean_heads{batch, nkv, 1, dv, in};
    void* zero_q = call.ZeroedScratch(static_cast<size_t>(Numel(zero_heads.Dims(in))) * fes, "zero query");
    void* mean = scratch(Numel(mean_heads.Dims(in)), fes, "mean of V");
    aclTensorList* mean_key = call.TensorList({call.Tensor(k_fia, ft, kv_heads.Dims(in), "key")}, "key");
    aclTensorList* mean_value = call.TensorList({call.Tensor(v_fia, ft, val_heads.Dims(in), "value")}, "value");
    std::string mean_layout = Name(in);
    call.Run(fia_, static_cast<const aclTensor*>(call.Tensor(zero_q, ft, zero_heads.Dims(in), "zero query")),
             static_cast<const aclTensorList*>(mean_key), static_cast<const aclTensorList*>(mean_value), none, none,
             no_array, no_array, none, none, none, none, none, none, none, none, none, none, none, none, none, none,
             none, none, no_array, none, none, none, nkv, 1.0, kAllTokens, kAllTokens, mean_layout.data(),
             int64_t{0}, int64_t{0}, int64_t{0}, int64_t{0}, int64_t{0}, false, int64_t{0}, int64_t{0},
             static_cast<const aclTensor*>(call.Tensor(mean, ft, mean_heads.Dims(in), "mean of V")), none);
    // Y's rows (b, h, i): one broadcast copy per run of positions whose every head is empty (the
    // usual case: key_padding_mask, causal), else one per head and position (a -inf bias).
    const Shape ys = output_layout_ == Layout::kBnsd ? Shape{nq * sq * dv, sq * dv, dv}   // Y's b, h, i strides
                                                     : Shape{sq * nq * dv, dv, nq * dv};
    const int64_t group = nq / nkv;
    auto fill = [&](int64_t b, int64_t h, int64_t heads, int64_t i, int64_t run) {
      const int64_t kv = heads == nq ? nkv : 1, per_kv = heads == nq ? group : 1;
      call.Run(copy_, call.View(y.data, t, Shape{kv, per_kv, run, dv}, Shape{group * ys[1], ys[1], ys[2], 1},
                                b * ys[0] + h * ys[1] + i * ys[2], "Y (rows that see no key)"),
               call.View(mean, ft, Shape{kv, 1, 1, dv}, Shape{dv, dv, dv, 1}, (b * nkv + h / group) * dv,
                         "mean of V"));
    };
    for (int64_t b = 0; b < batch; ++b) {
      const uint8_t* rows = empty.data() + b * nq * sq;  // [N][Sq]
      auto flagged = [&](int64_t i) {
        int64_t heads = 0;
        for (int64_t h = 0; h < nq; ++h) heads += rows[h * sq + i];
        return heads;
      };
      for (int64_t i = 0; i < sq;) {
        if (flagged(i) == nq) {
          int64_t end = i + 1;
          while (end < sq && flagged(end) == nq) ++end;
          fill(b, 0, nq, i, end - i);
          i = end;
          continue;
        }
        for (int64_t h = 0; h < nq; ++h) {
          if (rows[h * sq + i]) fill(b, h, 1, i, 1);
        }
        ++i;
      }
    }
  }
}

template <bool kRope, Placement kPlacement, Fp32 kFp32>
void AppendAttentionOp(const char* name, CustomOpList& ops) {
  // Same schema as the CPU kernels, but float32 only with the opt-in.
  std::vector<ONNXTensorElementDataType> types{ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16,
                                               ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16};
  if (kFp32 != Fp32::kCpu) types.push_back(ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT);
  AppendPerType<AscendAttentionKernel<kRope, kPlacement, kFp32>>(ops, types, [name](ONNXTensorElementDataType t) {
    return AttentionOpSpec(name, ExecutionProviderOf(kPlacement), t, kRope);
  });
}

template <Placement kPlacement, Fp32 kFp32>
void AppendAll(CustomOpList& ops) {
  AppendAttentionOp<false, kPlacement, kFp32>("Attention", ops);
  AppendAttentionOp<true, kPlacement, kFp32>("RopeAttention", ops);
}

template <Placement kPlacement>
void AppendForPlacement(CustomOpList& ops, AttentionFp32 fp32) {
  switch (fp32) {
    case AttentionFp32::kFloat16: return AppendAll<kPlacement, Fp32::kFloat16>(ops);
    case AttentionFp32::kBFloat16: return AppendAll<kPlacement, Fp32::kBFloat16>(ops);
    default: return AppendAll<kPlacement, Fp32::kCpu>(ops);
  }
}

}  // namespace

void AppendAscendAttentionOps(CustomOpList& ops, Placement placement, AttentionFp32 fp32) {
  if (placement == Placement::kCannEp) {
    AppendForPlacement<Placement::kCannEp>(ops, fp32);
  } else {
    AppendForPlacement<Placement::kCpuTestDouble>(ops, fp32);
  }
}

}  // namespace otfuse::ascend
