// Tile math of the attention family (Attention, RopeAttention), compiled once per CPU variant
// (attention_tiles_baseline.cc, attention_tiles_avx2.cc,
// attention_tiles_avx512.cc); attention.cc validates the node, fills
// an AttentionJob and schedules the phases below on ORT's thread pool.
//
// Phases of one Compute:
//   1. KvRows (per batch x kv head, RopeAttention only): the rotated new keys into present_key's
//      new rows, or without present_key into a scratch tensor of K's size. Afterwards every key
//      is read from one place per segment and never rotated again.
//   2. PackKv (per batch x kv head x key tile, "packed" path only): keys widened to float32 and
//      transposed once into panels the micro-kernels stream (O(Skv * D) floats); values too,
//      unless they are float32 rows of a multiple of 16 lanes, which are read in place.
//      By default (pack_state set) not a phase of its own: Attend packs each tile when the first
//      task reaches it (EnsurePacked in attention_tiles.inc).
//   3. Attend (per batch x head x query tile): flash attention with an online softmax; key tiles
//      wholly outside the causal/window band are skipped, only tiles that straddle its edges are
//      masked element by element.
//   4. FillEmptyRows (per batch x kv head, empty_rows = "uniform" only): when some row of that kv
//      head's query heads saw no key, the mean of V over all keys is computed once and written
//      into those rows; nothing is read for a kv head without such rows.
//   5. WritePresentRest (per batch x kv head, present_* outputs only): the present rows of the key
//      tiles no task reached; the others were copied by the task that packed them (packed path)
//      or first read them (direct path), see AttentionJob::present_state.
// The "direct" path (few query rows, e.g. decoding) skips phase 2, reads the key/value rows where
// they are and serves all query heads of a kv head in one task (each row read once per group).
#pragma once

#include <cstdint>

#include "common/float_types.h"

namespace otfuse::cpu {

// Element type of key_padding_mask.
enum class MaskType : int32_t { kNone, kBool, kInt32, kInt64 };

// Column width of a packed panel: the micro-kernels work on 16 floats (two AVX2 registers).
constexpr int64_t kPanel = 16;

// Everything the phases need. Plain data only: it crosses between translation units built for
// different ISAs. Strides are in elements. Row (b, h, i) of a [.., D] tensor starts at
// base + b*sb + h*sh + i*ss and its D elements are contiguous.
template <typename T>
struct AttentionJob {
  int64_t batch;
  int64_t q_heads;
  int64_t kv_heads;
  int64_t group;  // q_heads / kv_heads: query head h reads kv head h / group
  int64_t sq;     // query rows
  int64_t skv;    // keys in total (past + new)
  int64_t d;      // head size of Q and K
  int64_t dv;     // head size of V and Y
  int64_t causal_offset;  // query row i sits at absolute position causal_offset + i (= skv - sq)
  bool causal;
  int64_t window;  // 0: none; else key j is seen from position t iff t - window < j <= t
  float scale;
  float softcap;  // 0: none
  // empty_rows = "uniform": [B, N, Sq] flags, zeroed by the caller; Attend sets the flag of each
  // row that saw no key (and stores 0 there), FillEmptyRows then writes the mean of V into those
  // rows. null: empty_rows = "zero".
  uint8_t* empty_flags;

  const T* q;
  int64_t q_sb, q_sh, q_ss;

  // Keys and values [0, past_len) come from a BNSD tensor [B, Nkv, past_len, D] (past_key);
  // keys [past_len, skv) from the new tensor (RopeAttention: rotated, in present_key or scratch).
  const T* k_past;
  const T* v_past;
  int64_t k_past_len;
  int64_t v_past_len;
  const T* k_new;
  int64_t k_sb, k_sh, k_ss;
  const T* v_new;
  int64_t v_sb, v_sh, v_ss;

  // attn_bias broadcast to [B, N, Sq, Skv]: element at bias + b*sb + h*sh + i*si + j*sj.
  const void* bias;  // null: none
  bool bias_is_float;  // else T
  int64_t bias_sb, bias_sh, bias_si, bias_sj;

  const void* key_mask;  // [B, Skv], nonzero = attend; null: none
  MaskType key_mask_type;

  // ALiBi (docs/ops.md): s += alibi_slopes[h] * (k_pos - q_pos), generated per score, never
  // stored. alibi_key_pos: [B, Skv] k_pos with q_pos = 0 ("mask_cumsum"); null: k_pos = j,
  // q_pos = causal_offset + i ("index"). alibi_slopes null: no ALiBi.
  const float* alibi_slopes;  // [N]
  const float* alibi_key_pos;
  bool alibi_round_half;  // alibi_round = 1: the product rounded to float16 (RNE), k_pos already

  // Attention sinks (docs/ops.md): [N] logits, one per query head, each finite or -inf. A row's
  // running max starts at sinks[h] and its running sum at exp(sinks[h] - sinks[h]) = 1 (0 for
  // -inf: no sink), so the sink joins the softmax's denominator with a zero value row. null: none.
  const float* sinks;

  // Rotary embedding of the queries (RopeAttention; rotary_dim == 0: none). cos/sin rows of
  // rotary_dim elements, broadcast over Q's (b, h, i) with the strides below; lane i < rotary_dim
  // of the rotated row is cos[i]*x[i] + sin[i]*(rot_sign[i]*x[rot_src[i]]).
  int64_t rotary_dim;
  const void* cos;
  const void* sin;
  bool cos_is_float;  // else T
  int64_t cq_sb, cq_sh, cq_ss;
  const int32_t* rot_src;
  const float* rot_sign;

  T* y;
  int64_t y_sb, y_sh, y_ss;

  // Tiling. Packed keys of tile t of (b, kv head g): k_packed + ((b*kv_heads + g)*kv_tiles + t)
  // * k_tile_floats, laid out [panel][d][kPanel]; values likewise [panel of dv][key][kPanel].
  int64_t block_q;   // query rows per task
  int64_t block_kv;  // keys per tile, a multiple of kPanel
  int64_t kv_tiles;
  int64_t dv_padded;  // dv rounded up to kPanel
  int64_t k_tile_floats;
  int64_t v_tile_floats;
  float* k_packed;  // null: direct path
  float* v_packed;  // null on the packed path: float32 values with dv % 16 == 0, read in place
  // The tiles starting at key v_packed_from or later have packed values; 0 when v_packed is set for
  // all of them. float32 values read in place except their new rows, whose row stride (BSND: N*Dv)
  // is not Dv: those tiles' values are packed (in place, 8 KiB apart, a panel pair's lines fell in
  // 2-3 L1 sets: P·V 145 GFLOP/s against 169 packed, one tile, bench/README.md "Session 10, P·V").
  int64_t v_packed_from;
  // Lazy packing: [B][kv_heads][kv_tiles] states (0 not packed, 1 being packed, 2 packed), zeroed
  // by the caller; Attend packs each tile when the first task reaches it (EnsurePacked). null:
  // the tiles were packed beforehand (phase 2).
  int32_t* pack_state;

  // Direct path split over the keys (flash decoding): with `partials` set, Attend's task `split`
  // sees only keys [kv_split0 + split * kv_split_len, + kv_split_len) (kv_split0 and
  // kv_split_len multiples of block_kv) and leaves each row's unnormalised O, running max and
  // sum in partials + (((b * q_heads + h) * sq + i) * kv_splits + split) * PartialFloats(job);
  // CombineSplits then merges a row's kv_splits partials into Y. null: no split.
  float* partials;
  int64_t kv_splits;
  int64_t kv_split0;
  int64_t kv_split_len;

  // present_key / present_value = past ++ new, written by the tasks (WritePresentTile): the first
  // task to pack key tile t of (b, kv head g), or on the direct path to read it, claims
  // present_state[(b*kv_heads + g)*kv_tiles + t] and copies the tile's key and value rows there
  // while they are read anyway, with streaming stores; WritePresentRest copies the tiles no task
  // reached. Keys [present_keys_written, skv) are there already (RopeAttention's rotated new keys,
  // written by phase 1). present_state null: no present output.
  // present_value_read: the packed path's P·V reads float32 values in place from present_value
  // (v_past = present_value, v_past_len = skv): each tile's values are written, with ordinary
  // stores, by the task that packs the tile, before any task reads it; present_value_source and
  // present_past_len keep past_value as given. present_value is 64-byte aligned (ORT's
  // allocator), the caller's past_value need not be (numpy's: 16 bytes), and P·V's loads then
  // split cache lines (perf: TilePv +10% at 16-byte offsets).
  T* present_key;    // [B, Nkv, skv, D] or null
  T* present_value;  // [B, Nkv, skv, Dv] or null
  int64_t present_keys_written;
  int32_t* present_state;  // zeroed by the caller
  bool present_value_read;
  const T* present_value_source;
  int64_t present_past_len;
  // present_value is not an output but an arena buffer: float32 values off 64-byte lines staged
  // there for P·V (attention.cc, StageMisalignedValues); the tiles no task reads are not copied
  // there (only present_key's, when it is an output).
  bool values_staged;
};

// Phase 1 inputs: where the rotated new keys go, into present_key's new rows (the Attend tasks
// copy the past ones, see AttentionJob::present_state) or else rotated_key; their rotation.
template <typename T>
struct KvRowsJob {
  T* present_key;  // [B, Nkv, past + new, D] or null
  T* rotated_key;  // [B, Nkv, new, D] scratch, used when present_key is null
  int64_t past_len;
  int64_t new_len;
  // cos/sin broadcast over K's (b, kv head, i); rotary_dim == 0: no rotation.
  int64_t ck_sb, ck_sh, ck_ss;
};

// Floats of per-task scratch each phase needs (the regions of Attend's start on 16-float
// boundaries; see CarveScratch in attention_tiles.inc). `static`: this header is compiled into
// several ISA variants (see common/float_types.h).
static inline int64_t RoundUp16(int64_t n) { return (n + 15) / 16 * 16; }

template <typename T>
static int64_t AttendScratchFloats(const AttentionJob<T>& job) {
  const int64_t bq = job.block_q, bkv = job.block_kv;
  const int64_t widest = job.d > job.dv ? job.d : job.dv;
  // The direct path (k_packed null) also widens a tile of values: [block_kv][dv_padded].
  return RoundUp16(bq * job.d) + RoundUp16(bq * bkv) + RoundUp16(bq * job.dv_padded) + 4 * RoundUp16(bq) +
         2 * RoundUp16(bkv) + RoundUp16(bkv + bq) + RoundUp16(widest + 2 * job.rotary_dim) +
         (job.k_packed == nullptr ? bkv * job.dv_padded : 0);
}

// One row's partial result of a key split: O [dv_padded], then the running max and sum.
template <typename T>
static int64_t PartialFloats(const AttentionJob<T>& job) {
  return job.dv_padded + 2;
}

template <typename T>
static int64_t KvRowsScratchFloats(const AttentionJob<T>& job) {
  return 2 * job.d + 2 * job.rotary_dim;
}

template <typename T>
static int64_t PackScratchFloats(const AttentionJob<T>& job) {
  return job.d > job.dv ? job.d : job.dv;
}

template <typename T>
static int64_t FillEmptyScratchFloats(const AttentionJob<T>& job) {
  return 2 * job.dv;
}

template <typename T>
struct AttentionFns {
  void (*kv_rows)(const AttentionJob<T>& job, const KvRowsJob<T>& rows, int64_t b, int64_t g, float* scratch);
  void (*pack_kv)(const AttentionJob<T>& job, int64_t b, int64_t g, int64_t tile, float* scratch);
  // Query rows (b, h0 + hh, i0 + ii), hh < heads, ii < positions, heads * positions <= block_q,
  // all heads of one kv head; `split`: the key split (0 when job.partials is null).
  void (*attend)(const AttentionJob<T>& job, int64_t b, int64_t h0, int64_t heads, int64_t i0, int64_t positions,
                 int64_t split, float* scratch);
  // The same rows once every key split has attended: their partials merged into Y.
  void (*combine_splits)(const AttentionJob<T>& job, int64_t b, int64_t h0, int64_t heads, int64_t i0,
                         int64_t positions, float* scratch);
  void (*fill_empty_rows)(const AttentionJob<T>& job, int64_t b, int64_t g, float* scratch);
  // The present rows of (b, g)'s key tiles that no Attend task claimed.
  void (*write_present_rest)(const AttentionJob<T>& job, int64_t b, int64_t g);
};

namespace baseline {
template <typename T>
AttentionFns<T> AttentionFunctions();
}
namespace avx2 {
template <typename T>
AttentionFns<T> AttentionFunctions();
}
namespace avx512 {
template <typename T>
AttentionFns<T> AttentionFunctions();
}

}  // namespace otfuse::cpu
