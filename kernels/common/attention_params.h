// Attributes shared by the Attention and RopeAttention kernels of every backend (contract:
// docs/ops.md, "Attention family"): read and checked once here, so the CPU and Ascend kernels
// refuse the same nodes with the same messages. The RoPE attributes stay with each backend.
#pragma once

#include <cstdint>
#include <optional>

#include "common/custom_op.h"
#include "ort_glue.h"

namespace otfuse {

// Storage order of a [B, heads, S, D] tensor.
enum class AttentionLayout { kBnsd, kBsnd };

// Attribute `name` ("BNSD" or "BSND"), or fallback when the node does not set it.
AttentionLayout ParseAttentionLayout(const KernelInfo& info, const char* name, AttentionLayout fallback);

struct AttentionParams {
  int64_t num_heads = 0;
  int64_t kv_num_heads = 0;  // defaults to num_heads
  float scale = 0.0f;        // 0: 1 / sqrt(D)
  bool causal = false;
  int64_t window = 0;
  float softcap = 0.0f;
  AttentionLayout layout = AttentionLayout::kBnsd;
  AttentionLayout output_layout = AttentionLayout::kBnsd;  // defaults to layout
  bool uniform_empty_rows = false;                         // empty_rows = "uniform"
  bool alibi_mask_cumsum = false;  // alibi_positions = "mask_cumsum" (else "index")
  bool alibi_round_half = false;   // alibi_round = 1: float16(slope * float16(k_pos))
};

// B, heads, S, D of a Q/K/V-like input given in `layout`: BNSD needs rank 4 [B, N, S, D]; BSND
// takes rank 4 [B, S, N, D] or rank 3 [B, S, N*D] (rank3, D = last dim / heads). Throws unless
// the shape has no negative dims, does not overflow and holds `heads` (= attribute heads_attr) heads.
struct AttentionHeadDims {
  int64_t batch, heads, seq, d;
  bool rank3;
};
AttentionHeadDims ReadHeadDims(const char* name, const Shape& s, AttentionLayout layout, int64_t heads,
                               const char* heads_attr);

// Q, K, V and past_key / past_value (input `past_key_index` and the next) of one run, checked as
// every backend checks them: one element type; heads per the layout; one batch, one D, one S; the
// past both or neither, [B, Nkv, P, D] and [B, Nkv, P, Dv]; then Skv = P + S and the output shapes,
// whose dims (as every input's) must not overflow int64 even when empty.
struct CheckedAttentionInputs {
  InputTensor q, k, v;
  std::optional<InputTensor> past_key, past_value;
  AttentionHeadDims qh, kh, vh;
  int64_t past = 0;  // P
  int64_t skv = 0;   // P + S
  // The window attribute, capped at max(Skv, 1): the same mask (a query at position t < Skv sees
  // all of [0, t] once window > t), and t - window can no longer overflow.
  int64_t window = 0;
  Shape y, present_key, present_value;
};
CheckedAttentionInputs ReadAttentionInputs(const KernelContext& ctx, const AttentionParams& params,
                                           size_t past_key_index);

// The optional inputs and RopeAttention's tables, each read and checked alone (element type, shape)
// as every backend checks it; each backend calls them in its own order. nullopt when absent.
// attn_bias: Q's type or float32 (its broadcast to [B, N, Sq, Skv] is the backend's check).
std::optional<InputTensor> ReadAttnBias(const KernelContext& ctx, size_t index, ONNXTensorElementDataType q_type);
// key_padding_mask: bool, int32 or int64, [B, Skv].
std::optional<InputTensor> ReadKeyPaddingMask(const KernelContext& ctx, size_t index, int64_t batch, int64_t skv);
// alibi_slopes: float32 [num_heads].
std::optional<InputTensor> ReadAlibiSlopes(const KernelContext& ctx, size_t index, int64_t num_heads);
// sinks: float32 [num_heads], each finite or -inf (-inf: that head has no sink).
std::optional<InputTensor> ReadSinks(const KernelContext& ctx, size_t index, int64_t num_heads);
// cos and sin (required): Q's type or float32, one type and one shape.
struct AttentionRotaryTables {
  InputTensor cos, sin;
};
AttentionRotaryTables ReadAttentionRotaryTables(const KernelContext& ctx, size_t cos_index, size_t sin_index,
                                                ONNXTensorElementDataType q_type);

// num_heads, kv_num_heads, scale, causal, window, softcap, layout, output_layout, empty_rows and
// alibi_positions,
// checked in that order; throws otfuse::Error on the first bad one.
AttentionParams ReadAttentionParams(const KernelInfo& info);

// The schema of Attention (rope = false) or RopeAttention for element type T, shared by every
// backend: Q, K, V [, cos, sin], attn_bias?, key_padding_mask?, past_key?, past_value?,
// alibi_slopes? (float32), sinks? (float32) ->
// Y, present_key?, present_value?. attn_bias, cos and sin (T or float32) and key_padding_mask
// (bool, int32 or int64) are declared UNDEFINED and checked by the kernels.
OpSpec AttentionOpSpec(const char* name, const char* execution_provider, ONNXTensorElementDataType t, bool rope);

}  // namespace otfuse
