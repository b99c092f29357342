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
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

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
// Attention sinks are not mapped (docs/ops.md, "Ascend mapping"): V3 has no sink input; V4/V5's
// learnableSinkOptional is documented as (Q_N) bfloat16 (float16 in later revisions), V_D 64/128
// only, without PSE or left padding, and its formula is not stated.
constexpr const char* kNoSinks =
    "attention sinks are not mapped to aclnnFusedInferAttentionScoreV3, which has no sink input (V4/V5's "
    "learnableSinkOptional takes bfloat16/float16 sinks, V_D 64/128 only, no PSE or left padding)";

using Layout = AttentionLayout;

// float32 nodes: not registered for the NPU (kCpu: ORT runs the CPU kernel), or run on FIA in
// float16 / bfloat16 when the session opts in (docs/ops.md, "float32 policy").
enum class Fp32 { kCpu, kFloat16, kBFloat16 };

const char* Name(Layout l) { return l == Layout::kBnsd ? "BNSD" : "BSND"; }

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

Heads ViewHeads(const AttentionHeadDims& h, Layout layout) { return Heads{h.batch, h.heads, h.seq, h.d, layout}; }

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

// key_padding_mask's prefix counts, from its `es`-byte elements on the host: kept[b * (Skv + 1) + j]
// = the keys before position j that batch row b attends to.
std::vector<int64_t> KeptPrefix(const std::vector<uint8_t>& host, size_t es, int64_t batch, int64_t skv) {
  std::vector<int64_t> kept(static_cast<size_t>(batch * (skv + 1)), 0);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t j = 0; j < skv; ++j) {
      const uint8_t* e = host.data() + static_cast<size_t>(b * skv + j) * es;
      bool nonzero = false;
      for (size_t k = 0; k < es; ++k) nonzero = nonzero || e[k] != 0;
      kept[b * (skv + 1) + j + 1] = kept[b * (skv + 1) + j] + (nonzero ? 1 : 0);
    }
  }
  return kept;
}

// Device scratch for `elements` (at least one) of `bytes_per` bytes each.
void* ElementScratch(AclnnCall& call, int64_t elements, size_t bytes_per, const char* what) {
  return call.Scratch(static_cast<size_t>(std::max<int64_t>(elements, 1)) * bytes_per, what);
}

// What the checks of one run refuse with, besides their reason.
constexpr const char* kRunOnCpu = " (run this node on CPU)";

// One run's checked inputs and dims.
struct RunInputs {
  CheckedAttentionInputs in;
  ONNXTensorElementDataType t = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;   // the node's type
  ONNXTensorElementDataType ft = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;  // FIA's compute type
  size_t es = 0, fes = 0;                                                  // their element bytes
  Heads qh{}, kh{}, vh{};
  int64_t batch = 0, sq = 0, s_new = 0, d = 0, dv = 0, nq = 0, nkv = 0, past = 0, skv = 0, window = 0;
  std::optional<InputTensor> bias, slopes, pad, cos, sin;
  std::optional<RotaryPlan> q_rot, k_rot;  // RopeAttention
  Product product = Product::kUnknown;
};

// Q and the new K as FIA's staging reads them (rotated for RopeAttention), and the KV cache:
// present_* = past ++ new (BNSD) when cached.
struct KeysValues {
  const void* q;
  const void* k;
  bool cached;
  Heads present;  // [B, Nkv, Skv, D], BNSD
  const void* k_all;
  const void* v_all;
};

// FIA's operands in its type and input layout, and where it writes.
struct FiaOperands {
  Layout in = Layout::kBnsd;
  std::string layout_name;  // inputLayout
  Layout out_layout = Layout::kBnsd;
  Heads q_heads{}, kv_heads{}, val_heads{}, out_heads{}, y_heads{};
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* out = nullptr;
  bool direct = true;  // FIA writes Y itself
};

// attenMask with its sparseMode, preTokens and nextTokens.
struct FiaMask {
  aclTensor* mask = nullptr;
  int64_t sparse_mode = 0, pre_tokens = kAllTokens, next_tokens = kAllTokens;
};

template <bool kRope, Placement kPlacement, Fp32 kFp32>
class AscendAttentionKernel {
 public:
  explicit AscendAttentionKernel(const KernelInfo& info)
      : rt_(&BindRuntime(kPlacement)),
        fia_(AclnnOp<FiaV3GetWorkspace>::Bind(*rt_, "aclnnFusedInferAttentionScoreV3")),
        copy_(AclnnOp<InplaceCopyGetWorkspace>::Bind(*rt_, "aclnnInplaceCopy")) {
    params_ = ReadAttentionParams(info);
    const AttentionParams& params = params_;
    num_heads_ = params.num_heads;
    kv_num_heads_ = params.kv_num_heads;
    scale_ = params.scale;
    causal_ = params.causal;
    const float softcap = params.softcap;
    layout_ = params.layout;
    output_layout_ = params.output_layout;
    uniform_empty_rows_ = params.uniform_empty_rows;
    alibi_mask_cumsum_ = params.alibi_mask_cumsum;
    alibi_round_half_ = params.alibi_round_half;
    if constexpr (kRope) {
      rotary_ = ReadRotaryAttributes(info, "rotary_mode", "rotary_sections");
      rotary_ops_ = RotaryOps::Bind(*rt_);
    }
    // What aclnnFusedInferAttentionScoreV3 cannot express, known from the attributes alone.
    const char* cpu = " (run this node on CPU: leave it out of the CANN session, or fuse without the attention family)";
    if (softcap > 0.0f) throw Error(std::string("aclnnFusedInferAttentionScoreV3 has no logit soft-capping (softcap > 0)") + cpu);
    // The node names a sinks input (the last one: ops.py drops trailing empty inputs).
    if (info.InputCount() > kIn.sinks) throw Error(std::string(kNoSinks) + cpu);
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

  // Compute's steps, in order. Q, K, V, the past and the optional inputs, checked; RopeAttention's
  // rotation planned.
  RunInputs ReadInputs(const KernelContext& ctx) const;
  // What aclnnFusedInferAttentionScoreV3 cannot take, known once the shapes are.
  static void CheckFiaLimits(const RunInputs& r);
  // RopeAttention: rotated Q and new K (contiguous, in `layout`), exactly RotaryEmbedding's values.
  KeysValues Rotate(AclnnCall& call, const RunInputs& r) const;
  // present_* = past ++ new (BNSD), when asked for or when there is a past to attend to.
  void WritePresent(AclnnCall& call, const RunInputs& r, const OutputTensor& present_k, const OutputTensor& present_v,
                    KeysValues& kv) const;
  // No key: Y = 0.
  void ZeroY(AclnnCall& call, const RunInputs& r, const OutputTensor& y) const;
  // Q, K and V in FIA's type and layout, and its output (Y itself when it can be).
  FiaOperands Stage(AclnnCall& call, const RunInputs& r, const KeysValues& kv, const OutputTensor& y) const;
  // pseShift: the bias in FIA's type, (B or 1, N, Sq, Skv); null without one.
  aclTensor* PseShift(AclnnCall& call, const RunInputs& r, const std::optional<InputTensor>& bias) const;
  // Sparse modes 3 (causal) and 4 (window) with the compressed mask while Sq > 1; a full mask with
  // key_padding_mask, or for a window while decoding (Q_S = 1 ignores sparseMode).
  FiaMask Masks(AclnnCall& call, const RunInputs& r) const;
  // The aclnnFusedInferAttentionScoreV3 call, then Y = its output when it did not write Y.
  void RunFia(AclnnCall& call, const RunInputs& r, const FiaOperands& fia, const std::optional<InputTensor>& bias,
              const OutputTensor& y) const;
  // empty_rows = "uniform": the mean of V per (batch, kv head) in FIA's type and layout, and the
  // flagged rows of Y set to it.
  void* MeanOfV(AclnnCall& call, const RunInputs& r, const FiaOperands& fia) const;
  void FillEmptyRows(AclnnCall& call, const RunInputs& r, const void* mean, const std::vector<uint8_t>& empty,
                     const OutputTensor& y) const;

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
  aclTensor* FullMask(AclnnCall& call, int64_t batch, int64_t sq, int64_t skv, int64_t window,
                      const std::optional<InputTensor>& pad) const;

  // empty_rows = "uniform": [B, N, Sq] flags of the rows that see no key (causal, window,
  // key_padding_mask, a -inf attn_bias), worked out on the host; empty when there is none. Reads
  // key_padding_mask and attn_bias back after synchronising the stream.
  std::vector<uint8_t> EmptyRows(AclnnCall& call, int64_t batch, int64_t sq, int64_t skv, int64_t window,
                                 const std::optional<InputTensor>& pad, const std::optional<InputTensor>& bias) const;
  // A device tensor's bytes on the host (the stream already synchronised).
  std::vector<uint8_t> ReadBack(const InputTensor& tensor, const char* what) const;

  // alibi_slopes: FIA V3 has no generated ALiBi, only pseShift, so the bias is built on the host
  // as a float32 [B or 1, N, Sq, Skv] device tensor (docs/ops.md, "Ascend mapping").
  InputTensor AlibiBias(AclnnCall& call, const InputTensor& slopes, const std::optional<InputTensor>& pad,
                        int64_t batch, int64_t sq, int64_t skv) const;

  const CannRuntime* rt_;
  AclnnOp<FiaV3GetWorkspace> fia_;
  AclnnOp<InplaceCopyGetWorkspace> copy_;
  AclnnOp<LogicalNotGetWorkspace> logical_not_;
  AclnnOp<InplaceLogicalOrGetWorkspace> logical_or_;
  AttentionParams params_;
  RotaryOps rotary_ops_{};
  RotaryAttributes rotary_;
  int64_t num_heads_ = 0, kv_num_heads_ = 0;
  float scale_ = 0.0f;
  bool causal_ = false;
  bool uniform_empty_rows_ = false;  // empty_rows = "uniform"
  bool alibi_mask_cumsum_ = false;   // alibi_positions = "mask_cumsum"
  bool alibi_round_half_ = false;    // alibi_round = 1: refused (not built on the host)
  Layout layout_ = Layout::kBnsd, output_layout_ = Layout::kBnsd;
};

template <bool kRope, Placement kPlacement, Fp32 kFp32>
aclTensor* AscendAttentionKernel<kRope, kPlacement, kFp32>::FullMask(AclnnCall& call, int64_t batch, int64_t sq,
                                                                     int64_t skv, int64_t window,
                                                                     const std::optional<InputTensor>& pad) const {
  constexpr auto kBool = ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL;
  const bool geometry = causal_ || window > 0;
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
  if (window > 0) {
    // masked iff j < i + c - window + 1 = i + w: M[j][i + w] (a transposed view). The rows i < -w
    // have no such key and are left out: shifting the view down by -w rows instead would read past
    // the 2048 x 2048 mask once Sq + window > 2049.
    const int64_t w = c - window + 1;
    const int64_t first = std::max<int64_t>(0, -w), a = std::max<int64_t>(0, w);
    if (first < sq) {
      aclTensor* rows = first == 0 ? mask
                                   : call.View(data, kBool, Shape{batch, 1, sq - first, skv},
                                               Shape{sq * skv, sq * skv, skv, 1}, first * skv, "attenMask rows");
      call.Run(logical_or_, rows, call.View(m, kBool, Shape{1, 1, sq - first, skv}, Shape{0, 0, 1, kMaskSize}, a,
                                            "window part of the compressed mask"));
    }
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
InputTensor AscendAttentionKernel<kRope, kPlacement, kFp32>::AlibiBias(AclnnCall& call, const InputTensor& slopes,
                                                                      const std::optional<InputTensor>& pad,
                                                                      int64_t batch, int64_t sq, int64_t skv) const {
  if (rt_->rt_synchronize_stream == nullptr || rt_->rt_memcpy == nullptr) {
    throw Error("alibi_slopes builds the ALiBi bias on the host, which needs aclrtSynchronizeStream and aclrtMemcpy");
  }
  if (rt_->rt_synchronize_stream(call.stream()) != 0) {
    throw Error("aclrtSynchronizeStream failed: " + rt_->RecentErrorMessage());
  }
  auto to_host = [&](void* host, size_t bytes, const void* device, const char* what) {
    if (bytes > 0 && rt_->rt_memcpy(host, bytes, device, bytes, ACL_MEMCPY_DEVICE_TO_HOST) != 0) {
      throw Error(std::string("aclrtMemcpy of ") + what + " to the host failed: " + rt_->RecentErrorMessage());
    }
  };
  const int64_t nq = num_heads_;
  std::vector<float> slope(static_cast<size_t>(nq));
  to_host(slope.data(), slope.size() * sizeof(float), slopes.data, "alibi_slopes");
  // k_pos per (batch row, key): j ("index", or "mask_cumsum" without a mask), else BLOOM's
  // (cumsum(m) - 1) * m of the integer mask.
  const bool per_batch = alibi_mask_cumsum_ && pad.has_value();
  const int64_t bk = per_batch ? batch : 1;
  std::vector<int64_t> k_pos(static_cast<size_t>(bk * skv));
  for (int64_t j = 0; j < skv; ++j) k_pos[j] = j;
  if (per_batch) {
    std::vector<uint8_t> host(static_cast<size_t>(Numel(pad->shape)) * ElementBytes(pad->type));
    to_host(host.data(), host.size(), pad->data, "key_padding_mask");
    for (int64_t b = 0; b < batch; ++b) {
      int64_t running = 0;
      for (int64_t j = 0; j < skv; ++j) {
        const size_t at = static_cast<size_t>(b * skv + j);
        int64_t m = 0;
        if (pad->type == ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL) m = host[at] != 0;
        else if (pad->type == ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32) m = reinterpret_cast<const int32_t*>(host.data())[at];
        else m = reinterpret_cast<const int64_t*>(host.data())[at];
        running += m;
        k_pos[at] = (running - 1) * m;
      }
    }
  }
  // Each row is shifted by its query's own term, q_pos = t ("index", the contract's) or the row's
  // k_pos at t ("mask_cumsum": a per-row constant the softmax cancels), so the scores near the
  // diagonal stay small in FIA's float16.
  std::vector<float> host(static_cast<size_t>(bk * nq * sq * skv));
  for (int64_t b = 0; b < bk; ++b) {
    for (int64_t i = 0; i < sq; ++i) {
      const int64_t t = skv - sq + i;
      const int64_t q_pos = !alibi_mask_cumsum_ ? t : (t >= 0 && t < skv ? k_pos[b * skv + t] : 0);
      for (int64_t h = 0; h < nq; ++h) {
        float* row = host.data() + ((b * nq + h) * sq + i) * skv;
        for (int64_t j = 0; j < skv; ++j) row[j] = slope[h] * static_cast<float>(k_pos[b * skv + j] - q_pos);
      }
    }
  }
  const size_t bytes = std::max<size_t>(host.size(), 1) * sizeof(float);
  void* device = call.Scratch(bytes, "ALiBi bias");
  if (rt_->rt_memcpy(device, bytes, host.data(), bytes, ACL_MEMCPY_HOST_TO_DEVICE) != 0) {
    throw Error("aclrtMemcpy of the ALiBi bias to the device failed: " + rt_->RecentErrorMessage());
  }
  return InputTensor{ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, Shape{bk, nq, sq, skv}, device};
}

template <bool kRope, Placement kPlacement, Fp32 kFp32>
std::vector<uint8_t> AscendAttentionKernel<kRope, kPlacement, kFp32>::ReadBack(const InputTensor& tensor,
                                                                             const char* what) const {
  std::vector<uint8_t> host(static_cast<size_t>(Numel(tensor.shape)) * ElementBytes(tensor.type));
  if (!host.empty() &&
      rt_->rt_memcpy(host.data(), host.size(), tensor.data, host.size(), ACL_MEMCPY_DEVICE_TO_HOST) != 0) {
    throw Error(std::string("aclrtMemcpy of ") + what + " to the host failed: " + rt_->RecentErrorMessage());
  }
  return host;
}

template <bool kRope, Placement kPlacement, Fp32 kFp32>
std::vector<uint8_t> AscendAttentionKernel<kRope, kPlacement, kFp32>::EmptyRows(
    AclnnCall& call, int64_t batch, int64_t sq, int64_t skv, int64_t window, const std::optional<InputTensor>& pad,
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
  const int64_t nq = num_heads_, c = skv - sq;  // query row i sits at position i + c
  // Keys visible per batch row by key_padding_mask.
  const std::vector<int64_t> kept =
      pad ? KeptPrefix(ReadBack(*pad, "key_padding_mask"), ElementBytes(pad->type), batch, skv) : std::vector<int64_t>{};
  // attn_bias broadcast to [B, N, Sq, Skv]: its element strides (0 along broadcast dims), and
  // whether an element is -inf.
  std::vector<uint8_t> bias_host;
  Shape bs(4, 0);
  size_t bes = 0;
  if (bias) {
    bias_host = ReadBack(*bias, "attn_bias");
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
      const int64_t lo = window > 0 ? std::max<int64_t>(0, t - window + 1) : 0;
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
  const RunInputs r = ReadInputs(ctx);
  CheckFiaLimits(r);
  // Outputs.
  const OutputTensor y = ctx.Output(0, r.in.y);
  if (!y) throw Error("output 'Y' is required");
  const OutputTensor present_k = ctx.Output(1, r.in.present_key);
  const OutputTensor present_v = ctx.Output(2, r.in.present_value);
  if (Numel(r.in.present_key) == 0 && Numel(r.in.y) == 0) return;

  AclnnCall call(*rt_, ctx, 0);
  KeysValues kv = Rotate(call, r);
  WritePresent(call, r, present_k, present_v, kv);
  if (r.batch == 0 || r.nq == 0 || r.sq == 0 || r.dv == 0) return;
  if (r.skv == 0) return ZeroY(call, r, y);  // no key: every row is 0 (contract)
  const FiaOperands fia = Stage(call, r, kv, y);
  // pseShift: attn_bias, or the ALiBi bias built on the host.
  const std::optional<InputTensor> bias =
      r.slopes ? std::optional<InputTensor>(AlibiBias(call, *r.slopes, r.pad, r.batch, r.sq, r.skv)) : r.bias;
  RunFia(call, r, fia, bias, y);

  // empty_rows = "uniform": FIA's invalid-row correction left 0 in the rows that see no key; they
  // get the mean of V over all keys. Which rows those are is worked out on the host (the
  // key_padding_mask and attn_bias are read back after a stream synchronisation); nothing more
  // happens when there are none.
  if (uniform_empty_rows_ && (r.pad || bias || (causal_ && r.sq > r.skv))) {
    const std::vector<uint8_t> empty = EmptyRows(call, r.batch, r.sq, r.skv, r.window, r.pad, bias);
    if (empty.empty()) return;
    FillEmptyRows(call, r, MeanOfV(call, r, fia), empty, y);
  }
}

template <bool kRope, Placement kPlacement, Fp32 kFp32>
RunInputs AscendAttentionKernel<kRope, kPlacement, kFp32>::ReadInputs(const KernelContext& ctx) const {
  RunInputs r;
  r.in = ReadAttentionInputs(ctx, params_, kIn.past_key);
  r.t = r.in.q.type;
  r.qh = ViewHeads(r.in.qh, layout_);
  r.kh = ViewHeads(r.in.kh, layout_);
  r.vh = ViewHeads(r.in.vh, layout_);
  r.batch = r.qh.b, r.sq = r.qh.s, r.s_new = r.kh.s, r.d = r.qh.d, r.dv = r.vh.d;
  r.nq = num_heads_, r.nkv = kv_num_heads_;
  r.past = r.in.past, r.skv = r.in.skv, r.window = r.in.window;
  r.bias = ReadAttnBias(ctx, kIn.bias, r.t);
  if (r.bias) CheckBroadcast("attn_bias", r.bias->shape, Shape{r.batch, r.nq, r.sq, r.skv}, "[B, N, Sq, Skv]");
  r.slopes = ReadAlibiSlopes(ctx, kIn.alibi_slopes, r.nq);
  if (r.slopes && alibi_round_half_) {
    throw Error("alibi_round = 1 (the ALiBi product rounded to float16) is not built by the Ascend kernel's host "
                "bias (run this node on CPU: leave it out of the CANN session)");
  }
  if (r.slopes && r.bias) {
    // FIA V3 takes one pseShift; adding the two would need an elementwise add on the device.
    throw Error("aclnnFusedInferAttentionScoreV3 takes one pseShift: alibi_slopes together with attn_bias is not "
                "mapped (run this node on CPU: leave it out of the CANN session, or fuse without the attention "
                "family)");
  }
  if (ctx.Input(kIn.sinks)) {
    throw Error(std::string(kNoSinks) + " (run this node on CPU: leave it out of the CANN session)");
  }
  r.pad = ReadKeyPaddingMask(ctx, kIn.key_mask, r.batch, r.skv);
  r.product = ClassifySoc(rt_->SocName());
  if constexpr (kRope) {
    const AttentionRotaryTables tables = ReadAttentionRotaryTables(ctx, kIn.cos, kIn.sin, r.t);
    r.cos = tables.cos;
    r.sin = tables.sin;
    r.q_rot = RotaryPlan::Make("Q", r.qh.Dims(layout_), r.t, r.cos->shape, r.cos->type, rotary_, r.product);
    r.k_rot = RotaryPlan::Make("K", r.kh.Dims(layout_), r.t, r.cos->shape, r.cos->type, rotary_, r.product);
  }
  r.ft = ComputeType(r.t);
  r.es = ElementBytes(r.t);
  r.fes = ElementBytes(r.ft);
  return r;
}

template <bool kRope, Placement kPlacement, Fp32 kFp32>
void AscendAttentionKernel<kRope, kPlacement, kFp32>::CheckFiaLimits(const RunInputs& r) {
  const char* cpu = kRunOnCpu;
  const Product product = r.product;
  if (product == Product::kAtlasInference || product == Product::kAtlasTraining ||
      product == Product::kAtlas200I500A2) {
    throw Error(std::string("aclnnFusedInferAttentionScoreV3 is not available on ") + ProductName(product) + cpu);
  }
  if (r.dv != r.d) {
    throw Error("aclnnFusedInferAttentionScoreV3 needs key and value of one shape, but V's head size Dv = " +
                std::to_string(r.dv) + " differs from D = " + std::to_string(r.d) + cpu);
  }
  if (r.d > kMaxHeadDim) {
    throw Error("aclnnFusedInferAttentionScoreV3 takes head sizes up to 512, D = " + std::to_string(r.d) + cpu);
  }
  if (r.sq > 1 && (r.d * 2) % 16 != 0) {
    throw Error("aclnnFusedInferAttentionScoreV3 needs D 16-byte aligned (a multiple of 8 in float16/bfloat16) when "
                "Sq > 1, D = " + std::to_string(r.d) + cpu);
  }
  if (r.batch > kMaxBatch) {
    throw Error("aclnnFusedInferAttentionScoreV3 takes B <= 65536, B = " + std::to_string(r.batch) + cpu);
  }
}

template <bool kRope, Placement kPlacement, Fp32 kFp32>
KeysValues AscendAttentionKernel<kRope, kPlacement, kFp32>::Rotate(AclnnCall& call, const RunInputs& r) const {
  KeysValues kv{};
  kv.q = r.in.q.data;
  kv.k = r.in.k.data;
  if constexpr (kRope) {
    void* q_rotated = ElementScratch(call, Numel(r.in.q.shape), r.es, "rotated Q");
    void* k_rotated = ElementScratch(call, Numel(r.in.k.shape), r.es, "rotated K");
    r.q_rot->Run(call, rotary_ops_, r.in.q.data, r.cos->data, r.sin->data, q_rotated);
    r.k_rot->Run(call, rotary_ops_, r.in.k.data, r.cos->data, r.sin->data, k_rotated);
    kv.q = q_rotated;
    kv.k = k_rotated;
  }
  return kv;
}

template <bool kRope, Placement kPlacement, Fp32 kFp32>
void AscendAttentionKernel<kRope, kPlacement, kFp32>::WritePresent(AclnnCall& call, const RunInputs& r,
                                                                   const OutputTensor& present_k,
                                                                   const OutputTensor& present_v,
                                                                   KeysValues& kv) const {
  kv.cached = r.in.past_key.has_value() || present_k || present_v;
  kv.present = Heads{r.batch, r.nkv, r.skv, r.d, Layout::kBnsd};
  if (!kv.cached) return;
  const ONNXTensorElementDataType t = r.t;
  const Heads& present_heads = kv.present;
  void* pk = present_k ? present_k.data : ElementScratch(call, Numel(present_heads.Dims(Layout::kBnsd)), r.es, "keys");
  void* pv =
      present_v ? present_v.data : ElementScratch(call, Numel(present_heads.Dims(Layout::kBnsd)), r.es, "values");
  if (r.past > 0 && r.batch * r.nkv * r.d > 0) {
    const Heads past_heads{r.batch, r.nkv, r.past, r.d, Layout::kBnsd};
    Copy(call, pk, t, present_heads, r.in.past_key->data, t, past_heads, 0, "present_key[:, :, :P]");
    Copy(call, pv, t, present_heads, r.in.past_value->data, t, past_heads, 0, "present_value[:, :, :P]");
  }
  if (r.s_new > 0 && r.batch * r.nkv * r.d > 0) {
    Copy(call, pk, t, present_heads, kv.k, t, r.kh, r.past, "present_key[:, :, P:]");
    Copy(call, pv, t, present_heads, r.in.v.data, t, r.vh, r.past, "present_value[:, :, P:]");
  }
  kv.k_all = pk;
  kv.v_all = pv;
}

template <bool kRope, Placement kPlacement, Fp32 kFp32>
void AscendAttentionKernel<kRope, kPlacement, kFp32>::ZeroY(AclnnCall& call, const RunInputs& r,
                                                            const OutputTensor& y) const {
  if (rt_->rt_memset_async == nullptr) throw Error("the CANN runtime exports no aclrtMemsetAsync, needed to zero Y");
  const size_t bytes = static_cast<size_t>(Numel(r.in.y)) * r.es;
  if (rt_->rt_memset_async(y.data, bytes, 0, bytes, call.stream()) != 0) {
    throw Error("aclrtMemsetAsync of Y failed: " + rt_->RecentErrorMessage());
  }
}

template <bool kRope, Placement kPlacement, Fp32 kFp32>
FiaOperands AscendAttentionKernel<kRope, kPlacement, kFp32>::Stage(AclnnCall& call, const RunInputs& r,
                                                                   const KeysValues& kv, const OutputTensor& y) const {
  // FIA's layout: the node's own when K/V are the inputs, BNSD when they are present_*.
  FiaOperands f;
  f.in = kv.cached ? Layout::kBnsd : layout_;
  f.kv_heads = kv.cached ? kv.present : r.kh;
  f.val_heads = kv.cached ? Heads{r.batch, r.nkv, r.skv, r.dv, Layout::kBnsd} : r.vh;
  auto staged = [&](const void* src, const Heads& h, const char* what) -> const void* {
    if (r.t == r.ft && h.SameMemory(f.in)) return src;  // already FIA's type and layout
    void* out = ElementScratch(call, Numel(h.Dims(f.in)), r.fes, what);
    const Heads dst{h.b, h.n, h.s, h.d, f.in};
    Copy(call, out, r.ft, dst, src, r.t, h, 0, what);
    return out;
  };
  f.q_heads = Heads{r.batch, r.nq, r.sq, r.d, layout_};
  f.q = staged(kv.q, f.q_heads, "query");
  f.k = staged(kv.cached ? kv.k_all : kv.k, f.kv_heads, "key");
  f.v = staged(kv.cached ? kv.v_all : r.in.v.data, f.val_heads, "value");

  // Output: FIA writes Y directly when its layout can be expressed (BNSD_BSND needs Sq > 1).
  f.y_heads = Heads{r.batch, r.nq, r.sq, r.dv, output_layout_};
  f.layout_name = Name(f.in);
  f.direct = r.t == r.ft;
  f.out_layout = f.in;
  if (output_layout_ != f.in) {
    if (f.y_heads.SameMemory(f.in)) {
      // Sq = 1 (or N = 1): the two layouts are the same memory.
    } else if (f.in == Layout::kBnsd) {
      f.layout_name = "BNSD_BSND";
      f.out_layout = Layout::kBsnd;
    } else {
      f.direct = false;  // BSND in, BNSD out: FIA has no BSND_BNSD; transposed after
    }
  }
  f.out_heads = Heads{r.batch, r.nq, r.sq, r.dv, f.out_layout};
  f.out = f.direct ? y.data : ElementScratch(call, Numel(r.in.y), r.fes, "attention output");
  return f;
}

template <bool kRope, Placement kPlacement, Fp32 kFp32>
aclTensor* AscendAttentionKernel<kRope, kPlacement, kFp32>::PseShift(AclnnCall& call, const RunInputs& r,
                                                                     const std::optional<InputTensor>& bias) const {
  if (!bias) return nullptr;
  Shape b4(4 - bias->shape.size(), 1);
  b4.insert(b4.end(), bias->shape.begin(), bias->shape.end());
  const Shape pse_shape{b4[0] == r.batch ? r.batch : 1, r.nq, r.sq, r.skv};
  if (bias->type == r.ft && b4 == pse_shape) return call.Tensor(bias->data, r.ft, pse_shape, "pseShift");
  aclTensor* pse = call.Tensor(ElementScratch(call, Numel(pse_shape), r.fes, "pseShift"), r.ft, pse_shape, "pseShift");
  call.Run(copy_, pse, call.Tensor(bias->data, bias->type, b4, "attn_bias"));
  return pse;
}

template <bool kRope, Placement kPlacement, Fp32 kFp32>
FiaMask AscendAttentionKernel<kRope, kPlacement, kFp32>::Masks(AclnnCall& call, const RunInputs& r) const {
  FiaMask m;
  if (r.pad || (r.window > 0 && r.sq == 1 && r.skv > r.window)) {
    m.mask = FullMask(call, r.batch, r.sq, r.skv, r.window, r.pad);
  } else if (causal_ && r.sq > 1) {
    const void* compressed = CompressedMask(*rt_);
    m.mask = call.Tensor(compressed, ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL, Shape{kMaskSize, kMaskSize}, "attenMask");
    if (r.window > 0) {
      m.sparse_mode = 4;
      m.pre_tokens = r.window - 1;
      m.next_tokens = 0;
    } else {
      m.sparse_mode = 3;
    }
  }
  return m;
}

template <bool kRope, Placement kPlacement, Fp32 kFp32>
void AscendAttentionKernel<kRope, kPlacement, kFp32>::RunFia(AclnnCall& call, const RunInputs& r,
                                                             const FiaOperands& fia,
                                                             const std::optional<InputTensor>& bias,
                                                             const OutputTensor& y) const {
  const ONNXTensorElementDataType ft = r.ft;
  aclTensor* pse = PseShift(call, r, bias);
  const FiaMask m = Masks(call, r);
  const bool rows_may_be_empty = r.pad.has_value() || bias.has_value() || r.window > 0 || (causal_ && r.sq > r.skv);
  const int64_t inner_precise = rows_may_be_empty ? 2 : 0;

  aclTensor* query = call.Tensor(fia.q, ft, fia.q_heads.Dims(fia.in), "query");
  aclTensorList* key = call.TensorList({call.Tensor(fia.k, ft, fia.kv_heads.Dims(fia.in), "key")}, "key");
  aclTensorList* value = call.TensorList({call.Tensor(fia.v, ft, fia.val_heads.Dims(fia.in), "value")}, "value");
  aclTensor* attention_out = call.Tensor(fia.out, ft, fia.out_heads.Dims(fia.out_layout), "attentionOut");
  const double scale = scale_ != 0.0f ? static_cast<double>(scale_) : 1.0 / std::sqrt(static_cast<double>(r.d));
  std::string layout_name = fia.layout_name;
  const int64_t nq = r.nq, nkv = r.nkv;
  const aclTensor* none = nullptr;
  const aclIntArray* no_array = nullptr;
  call.Run(fia_, static_cast<const aclTensor*>(query), static_cast<const aclTensorList*>(key),
           static_cast<const aclTensorList*>(value), static_cast<const aclTensor*>(pse),
           static_cast<const aclTensor*>(m.mask), no_array, no_array, none, none, none, none, none, none, none, none,
           none, none, none, none, none, none, none, none, no_array, none, none, none, nq, scale, m.pre_tokens,
           m.next_tokens, layout_name.data(), nkv == nq ? int64_t{0} : nkv, m.sparse_mode, inner_precise, int64_t{0},
           int64_t{0}, false, int64_t{0}, int64_t{0}, static_cast<const aclTensor*>(attention_out), none);
  if (!fia.direct) {
    // Y = out: cast back to float32 and/or transpose BSND -> BNSD.
    Copy(call, y.data, r.t, fia.y_heads, fia.out, ft, fia.out_heads, 0, "Y");
  }
}

template <bool kRope, Placement kPlacement, Fp32 kFp32>
void* AscendAttentionKernel<kRope, kPlacement, kFp32>::MeanOfV(AclnnCall& call, const RunInputs& r,
                                                               const FiaOperands& fia) const {
  // FIA over the same key/value lists with a zero query row per kv head (every score 0, so every
  // key weighs 1/Skv), no mask, no bias.
  const ONNXTensorElementDataType ft = r.ft;
  const Layout in = fia.in;
  const Heads zero_heads{r.batch, r.nkv, 1, r.d, in}, mean_heads{r.batch, r.nkv, 1, r.dv, in};
  void* zero_q = call.ZeroedScratch(static_cast<size_t>(Numel(zero_heads.Dims(in))) * r.fes, "zero query");
  void* mean = ElementScratch(call, Numel(mean_heads.Dims(in)), r.fes, "mean of V");
  aclTensorList* mean_key = call.TensorList({call.Tensor(fia.k, ft, fia.kv_heads.Dims(in), "key")}, "key");
  aclTensorList* mean_value = call.TensorList({call.Tensor(fia.v, ft, fia.val_heads.Dims(in), "value")}, "value");
  std::string mean_layout = Name(in);
  const aclTensor* none = nullptr;
  const aclIntArray* no_array = nullptr;
  call.Run(fia_, static_cast<const aclTensor*>(call.Tensor(zero_q, ft, zero_heads.Dims(in), "zero query")),
           static_cast<const aclTensorList*>(mean_key), static_cast<const aclTensorList*>(mean_value), none, none,
           no_array, no_array, none, none, none, none, none, none, none, none, none, none, none, none, none, none,
           none, none, no_array, none, none, none, r.nkv, 1.0, kAllTokens, kAllTokens, mean_layout.data(),
           int64_t{0}, int64_t{0}, int64_t{0}, int64_t{0}, int64_t{0}, false, int64_t{0}, int64_t{0},
           static_cast<const aclTensor*>(call.Tensor(mean, ft, mean_heads.Dims(in), "mean of V")), none);
  return mean;
}

template <bool kRope, Placement kPlacement, Fp32 kFp32>
void AscendAttentionKernel<kRope, kPlacement, kFp32>::FillEmptyRows(AclnnCall& call, const RunInputs& r,
                                                                    const void* mean,
                                                                    const std::vector<uint8_t>& empty,
                                                                    const OutputTensor& y) const {
  // Y's rows (b, h, i): one broadcast copy per run of positions whose every head is empty (the
  // usual case: key_padding_mask, causal), else one per head and position (a -inf bias).
  const int64_t nq = r.nq, nkv = r.nkv, sq = r.sq, dv = r.dv;
  const Shape ys = output_layout_ == Layout::kBnsd ? Shape{nq * sq * dv, sq * dv, dv}  // Y's b, h, i strides
                                                   : Shape{sq * nq * dv, dv, nq * dv};
  const int64_t group = nq / nkv;
  auto fill = [&](int64_t b, int64_t h, int64_t heads, int64_t i, int64_t run) {
    const int64_t kv = heads == nq ? nkv : 1, per_kv = heads == nq ? group : 1;
    call.Run(copy_, call.View(y.data, r.t, Shape{kv, per_kv, run, dv}, Shape{group * ys[1], ys[1], ys[2], 1},
                              b * ys[0] + h * ys[1] + i * ys[2], "Y (rows that see no key)"),
             call.View(mean, r.ft, Shape{kv, 1, 1, dv}, Shape{dv, dv, dv, 1}, (b * nkv + h / group) * dv,
                       "mean of V"));
  };
  for (int64_t b = 0; b < r.batch; ++b) {
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
