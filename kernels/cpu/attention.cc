// CPU kernels of the attention family: Attention and RopeAttention (contract: docs/ops.md,
// "Attention family"). This file checks the node and its inputs, builds an AttentionJob and runs
// its phases on ORT's thread pool; the tile math is in attention_tiles.inc (and its parts).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/attention_params.h"
#include "common/cpu_features.h"
#include "common/float_types.h"
#include "common/rotary_params.h"
#include "common/shape_check.h"
#include "common/thread_floats.h"
#include "contract/attention_index.h"
#include "cpu/attention_isa.h"
#include "cpu/attention_tiles.h"
#include "op_registry.h"

namespace otfuse::cpu {
namespace {

// Tile sizes, chosen by measurement (bench/attention_kernel.py, docs/ops.md "CPU kernel"):
// 64 query rows x 128 keys keeps a task's Q, S, O tiles and the packed K/V panels it streams
// (~230 KiB with D = 128) inside a 1 MiB L2.
constexpr int64_t kBlockQ = 64;
constexpr int64_t kBlockKv = 128;
// Fewer query rows than this (decoding) read K/V rows in place instead of packing them first:
// packing costs a pass over the whole cache that so few rows cannot amortise.
constexpr int64_t kMinRowsForPacking = 8;
// The direct path splits the keys of too few row blocks (decoding: one per kv head) into ranges of
// at least kMinSplitTiles key tiles, up to kSplitTasks tasks in all (bench/README.md, "Decode,
// session 9").
constexpr int64_t kSplitTasks = 16;
constexpr int64_t kMinSplitTiles = 4;

using Layout = AttentionLayout;

bool IsSupportedType(ONNXTensorElementDataType type) {
  return type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT || type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 ||
         type == ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16;
}

// Q, K or V seen as [B, heads, S, D] with element strides.
struct HeadView {
  int64_t batch, heads, seq, d;
  int64_t sb, sh, ss;
  bool rank3;  // a BSND tensor given as [B, S, heads * D]
};

// Strides of a tensor whose dims ReadAttentionInputs has checked (so they cannot overflow).
HeadView ViewHeads(const InputTensor& t, const AttentionHeadDims& h, Layout layout) {
  const Shape& s = t.shape;
  if (h.rank3) return HeadView{h.batch, h.heads, h.seq, h.d, s[1] * s[2], h.d, s[2], true};
  if (layout == Layout::kBnsd) return HeadView{s[0], s[1], s[2], s[3], s[1] * s[2] * s[3], s[2] * s[3], s[3], false};
  return HeadView{s[0], s[2], s[1], s[3], s[1] * s[2] * s[3], s[3], s[2] * s[3], false};
}

// Strides (in elements) of `shape` broadcast to `target` with numpy rules (aligned right);
// a broadcast dim gets stride 0.
std::vector<int64_t> BroadcastStrides(const char* name, const Shape& shape, const Shape& target,
                                      const std::string& target_name) {
  // Built only when a check fails (this runs on every call of the op).
  const auto message = [&] {
    return std::string(name) + " has shape " + ToString(shape) + ", not broadcastable to " + target_name + " = " +
           ToString(target);
  };
  if (shape.size() > target.size()) throw Error(message() + " (rank " + std::to_string(shape.size()) + ")");
  DimProduct(shape, 0, shape.size());
  std::vector<int64_t> strides(target.size(), 0);
  int64_t stride = 1;
  for (size_t k = 0; k < shape.size(); ++k) {
    const size_t from_end = shape.size() - 1 - k;
    const size_t t = target.size() - 1 - k;
    const int64_t dim = shape[from_end];
    if (dim != target[t] && dim != 1) throw Error(message());
    strides[t] = (dim == 1 && target[t] != 1) ? 0 : stride;
    stride *= dim;
  }
  return strides;
}

// One rotation table: lane i < r of the rotated row is cos[i]*x[i] + sin[i]*(sign[i]*x[src[i]]).
void BuildRotation(bool interleaved, const std::vector<int64_t>& sections, int64_t r, std::vector<int32_t>& src,
                   std::vector<float>& sign) {
  src.assign(static_cast<size_t>(r), 0);
  sign.assign(static_cast<size_t>(r), 1.0f);
  if (interleaved) {
    for (int64_t i = 0; i < r; i += 2) {
      src[i] = static_cast<int32_t>(i + 1);
      sign[i] = -1.0f;
      src[i + 1] = static_cast<int32_t>(i);
    }
    return;
  }
  int64_t offset = 0;
  const std::vector<int64_t> widths = sections.empty() ? std::vector<int64_t>{r} : sections;
  for (int64_t width : widths) {
    const int64_t half = width / 2;
    for (int64_t i = 0; i < width; ++i) {
      const bool first = i < half;
      src[offset + i] = static_cast<int32_t>(offset + (first ? i + half : i - half));
      sign[offset + i] = first ? -1.0f : 1.0f;
    }
    offset += width;
  }
}

struct Tiles {
  int64_t block_q = kBlockQ;
  int64_t block_kv = kBlockKv;
  int force_path = 0;  // 0: by row count, 1: direct, 2: packed
  bool lazy_pack = true;  // pack each key tile in the first task that reads it (else phase 2)
};

// OTFUSE_ATTENTION_TILES="64x128", OTFUSE_ATTENTION_PATH=direct|packed and
// OTFUSE_ATTENTION_PACK=phase are tuning and test knobs (docs/ops.md); read when a session creates
// its kernels.
Tiles ReadTiles() {
  Tiles tiles;
  if (const char* text = std::getenv("OTFUSE_ATTENTION_TILES")) {
    long bq = 0, bkv = 0;
    if (std::sscanf(text, "%ldx%ld", &bq, &bkv) == 2 && bq >= 1 && bq <= 1024 && bkv >= kPanel && bkv <= 4096 &&
        bkv % kPanel == 0) {
      tiles.block_q = bq;
      tiles.block_kv = bkv;
    } else {
      throw Error(std::string("OTFUSE_ATTENTION_TILES=") + text +
                  " is not QxKV with 1 <= Q <= 1024 and KV a multiple of 16 in [16, 4096]");
    }
  }
  if (const char* path = std::getenv("OTFUSE_ATTENTION_PATH")) {
    if (std::strcmp(path, "direct") == 0) tiles.force_path = 1;
    else if (std::strcmp(path, "packed") == 0) tiles.force_path = 2;
  }
  if (const char* pack = std::getenv("OTFUSE_ATTENTION_PACK")) tiles.lazy_pack = std::strcmp(pack, "phase") != 0;
  return tiles;
}

// k_pos of alibi_positions = "mask_cumsum" (docs/ops.md): (m[b,0] + ... + m[b,j] - 1) * m[b,j]
// with m the integer mask (all ones without one), as float32. O(B * Skv).
std::vector<float> CumsumKeyPositions(const void* mask, MaskType type, int64_t batch, int64_t skv) {
  std::vector<float> pos(static_cast<size_t>(batch * skv));
  for (int64_t b = 0; b < batch; ++b) {
    int64_t running = 0;
    for (int64_t j = 0; j < skv; ++j) {
      const int64_t at = b * skv + j;
      int64_t m = 1;
      switch (type) {
        case MaskType::kBool: m = static_cast<const uint8_t*>(mask)[at] != 0; break;
        case MaskType::kInt32: m = static_cast<const int32_t*>(mask)[at]; break;
        case MaskType::kInt64: m = static_cast<const int64_t*>(mask)[at]; break;
        default: break;
      }
      running += m;
      pos[static_cast<size_t>(at)] = static_cast<float>((running - 1) * m);
    }
  }
  return pos;
}

// Scratch floats from ORT's CPU allocator, which is the session's arena unless the session turned
// it off: the arena keeps the memory from run to run, where a fresh new[] of the packed panels
// (16-32 MiB at S = 2048, above malloc's mmap threshold) was mapped and page-faulted anew on every
// run (the kernel's clear_page_erms: 6% of an fp16 causal run's samples at S = 2048). Falls back to
// new[] when ORT gives no allocator.
class ArenaFloats {
 public:
  ArenaFloats() = default;
  ArenaFloats(const ArenaFloats&) = delete;
  ArenaFloats& operator=(const ArenaFloats&) = delete;
  ~ArenaFloats() {
    if (allocator_ != nullptr) {
      if (data_ != nullptr) allocator_->Free(allocator_, data_);
      Api().ReleaseAllocator(allocator_);
    }
  }

  // `count` floats, or null when out of memory. Once per object.
  float* Allocate(const KernelContext& ctx, size_t count) {
    OrtMemoryInfo* info = nullptr;
    if (Api().CreateCpuMemoryInfo(OrtArenaAllocator, OrtMemTypeDefault, &info) == nullptr) {
      OrtStatus* status = Api().KernelContext_GetAllocator(ctx.raw(), info, &allocator_);
      Api().ReleaseMemoryInfo(info);
      if (status == nullptr && allocator_ != nullptr) {
        data_ = static_cast<float*>(allocator_->Alloc(allocator_, count * sizeof(float)));
        return data_;
      }
      if (status != nullptr) Api().ReleaseStatus(status);
      allocator_ = nullptr;
    }
    fallback_.reset(new (std::nothrow) float[count]);
    return fallback_.get();
  }

 private:
  OrtAllocator* allocator_ = nullptr;
  float* data_ = nullptr;
  std::unique_ptr<float[]> fallback_;
};

// What one run owns and its AttentionJob points into: host tables and scratch.
template <typename T>
struct RunBuffers {
  std::vector<float> alibi_key_pos;  // alibi_positions = "mask_cumsum"
  std::vector<int32_t> rot_src;      // RopeAttention's rotation table
  std::vector<float> rot_sign;
  std::unique_ptr<T[]> rotated;         // the rotated new keys, when there is no present_key
  ArenaFloats packed_kv;                // phase 2's panels
  ArenaFloats staged_values;            // float32 values off 64-byte lines, for P·V
  std::unique_ptr<int32_t[]> pack_state;  // lazy packing: a state per key tile
  std::unique_ptr<uint8_t[]> empty_flags;  // empty_rows = "uniform"
  std::unique_ptr<int32_t[]> present_state;  // a claim per key tile of present
};

template <bool kRope>
class AttentionKernel {
 public:
  explicit AttentionKernel(const KernelInfo& info) {
    params_ = ReadAttentionParams(info);
    const AttentionParams& params = params_;
    num_heads_ = params.num_heads;
    kv_num_heads_ = params.kv_num_heads;
    scale_ = params.scale;
    causal_ = params.causal;
    softcap_ = params.softcap;
    layout_ = params.layout;
    output_layout_ = params.output_layout;
    uniform_empty_rows_ = params.uniform_empty_rows;
    alibi_mask_cumsum_ = params.alibi_mask_cumsum;
    alibi_round_half_ = params.alibi_round_half;
    if constexpr (kRope) rotary_ = ReadRotaryAttributes(info, "rotary_mode", "rotary_sections");
    const CpuIsa isa = SelectCpuIsa();
    use_avx2_ = isa == CpuIsa::kAvx2 && __builtin_cpu_supports("fma");
    use_avx512_ = use_avx2_ && AttentionUsesAvx512();
    tiles_ = ReadTiles();
  }

  void Compute(const KernelContext& ctx) const {
    const InputTensor q = RequiredInput(ctx, 0, "Q");
    if (!IsSupportedType(q.type)) {
      throw Error(std::string("Q has element type ") + ElementTypeName(q.type) +
                  "; expected float32, float16 or bfloat16");
    }
    switch (q.type) {
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return Run<float>(ctx, q);
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return Run<Float16>(ctx, q);
      default: return Run<BFloat16>(ctx, q);
    }
  }

 private:
  static constexpr AttentionInputIndex kIn = AttentionInputs<kRope>();

  // present_key and present_value, when the node asks for them.
  struct Presents {
    OutputTensor key, value;
  };

  template <typename T>
  AttentionFns<T> Functions() const {
#if defined(OTFUSE_HAVE_AVX2_KERNELS)
    if (use_avx512_) return avx512::AttentionFunctions<T>();
    if (use_avx2_) return avx2::AttentionFunctions<T>();
#endif
    return baseline::AttentionFunctions<T>();
  }

  // One run: the checked inputs become an AttentionJob, whose phases (cpu/attention_tiles.h) then
  // run on ORT's thread pool.
  template <typename T>
  void Run(const KernelContext& ctx, const InputTensor& q) const {
    const CheckedAttentionInputs in = ReadAttentionInputs(ctx, params_, kIn.past_key);
    const HeadView qv = ViewHeads(q, in.qh, layout_);
    const HeadView kv = ViewHeads(in.k, in.kh, layout_);
    const HeadView vv = ViewHeads(in.v, in.vh, layout_);
    AttentionJob<T> job = PlanJob<T>(q, in, qv, kv, vv);
    RunBuffers<T> buffers;
    KvRowsJob<T> rows{};
    ReadBias(ctx, q.type, job);
    ReadKeyMask(ctx, job);
    ReadAlibi(ctx, job, buffers);
    ReadSinkLogits(ctx, job);
    if constexpr (kRope) ReadRotary(ctx, q.type, qv, kv, job, rows, buffers);
    const Presents present = PlanOutputs(ctx, in, job);
    PlanTiles(job);
    const AttentionFns<T> fns = Functions<T>();

    PlanPresent(present, job, buffers);
    StageMisalignedValues(ctx, job, buffers);
    RotateNewKeys(ctx, fns, present, kv.seq, job, rows, buffers);
    const bool attend = job.batch > 0 && job.q_heads > 0 && job.sq > 0 && job.dv > 0;
    if (attend) {
      PackKv(ctx, fns, job, buffers);
      FlagEmptyRows(job, buffers);
      Attend(ctx, fns, job);
    }
    WritePresentRest(ctx, fns, job);  // before FillEmptyRows, which may read present_value
    if (attend) FillEmptyRows(ctx, fns, job);
  }

  // The job's dims, scale and the Q, past and new K/V it reads.
  template <typename T>
  AttentionJob<T> PlanJob(const InputTensor& q, const CheckedAttentionInputs& in, const HeadView& qv,
                          const HeadView& kv, const HeadView& vv) const {
    const int64_t d = qv.d;
    AttentionJob<T> job{};
    job.batch = qv.batch;
    job.q_heads = num_heads_;
    job.kv_heads = kv_num_heads_;
    job.group = num_heads_ / kv_num_heads_;
    job.sq = qv.seq;
    job.skv = in.skv;
    job.d = d;
    job.dv = vv.d;
    job.causal_offset = in.skv - qv.seq;
    job.causal = causal_;
    job.window = in.window;
    job.scale = scale_ != 0.0f ? scale_ : (d > 0 ? 1.0f / std::sqrt(static_cast<float>(d)) : 1.0f);
    job.softcap = softcap_;
    job.q = q.As<T>();
    job.q_sb = qv.sb, job.q_sh = qv.sh, job.q_ss = qv.ss;
    job.k_past = in.past_key ? in.past_key->As<T>() : nullptr;
    job.v_past = in.past_value ? in.past_value->As<T>() : nullptr;
    job.k_past_len = job.v_past_len = in.past;
    job.k_new = in.k.As<T>();
    job.k_sb = kv.sb, job.k_sh = kv.sh, job.k_ss = kv.ss;
    job.v_new = in.v.As<T>();
    job.v_sb = vv.sb, job.v_sh = vv.sh, job.v_ss = vv.ss;
    return job;
  }

  // attn_bias: T or float32, broadcastable to [B, N, Sq, Skv].
  template <typename T>
  static void ReadBias(const KernelContext& ctx, ONNXTensorElementDataType q_type, AttentionJob<T>& job) {
    const std::optional<InputTensor> bias = ReadAttnBias(ctx, kIn.bias, q_type);
    if (!bias) return;
    const Shape scores_shape{job.batch, job.q_heads, job.sq, job.skv};
    const std::vector<int64_t> st = BroadcastStrides("attn_bias", bias->shape, scores_shape, "[B, N, Sq, Skv]");
    job.bias = bias->data;
    job.bias_is_float = bias->type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
    job.bias_sb = st[0], job.bias_sh = st[1], job.bias_si = st[2], job.bias_sj = st[3];
  }

  // key_padding_mask: [B, Skv], nonzero = attend.
  template <typename T>
  static void ReadKeyMask(const KernelContext& ctx, AttentionJob<T>& job) {
    const std::optional<InputTensor> mask = ReadKeyPaddingMask(ctx, kIn.key_mask, job.batch, job.skv);
    if (!mask) return;
    switch (mask->type) {
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL: job.key_mask_type = MaskType::kBool; break;
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: job.key_mask_type = MaskType::kInt32; break;
      default: job.key_mask_type = MaskType::kInt64; break;  // the reader let nothing else through
    }
    job.key_mask = mask->data;
  }

  // alibi_slopes: float32 [N]; the bias is generated inside the tiles.
  template <typename T>
  void ReadAlibi(const KernelContext& ctx, AttentionJob<T>& job, RunBuffers<T>& buffers) const {
    const std::optional<InputTensor> slopes = ReadAlibiSlopes(ctx, kIn.alibi_slopes, job.q_heads);
    if (!slopes) return;
    job.alibi_slopes = slopes->As<float>();
    if (alibi_mask_cumsum_) {
      buffers.alibi_key_pos = CumsumKeyPositions(job.key_mask, job.key_mask_type, job.batch, job.skv);
      if (alibi_round_half_) {  // float16(k_pos), as the float16 graph casts its positions
        for (float& pos : buffers.alibi_key_pos) pos = ToFloat(FromFloat<Float16>(pos));
      }
      job.alibi_key_pos = buffers.alibi_key_pos.data();
      job.alibi_round_half = alibi_round_half_;
    }
  }

  // sinks: float32 [N], each finite or -inf; the tiles start every row's online softmax from it.
  template <typename T>
  static void ReadSinkLogits(const KernelContext& ctx, AttentionJob<T>& job) {
    const std::optional<InputTensor> sinks = ReadSinks(ctx, kIn.sinks, job.q_heads);
    if (!sinks) return;
    const float* logits = sinks->As<float>();
    for (int64_t h = 0; h < job.q_heads; ++h) {
      if (std::isnan(logits[h]) || logits[h] == std::numeric_limits<float>::infinity()) {
        throw Error("sinks[" + std::to_string(h) + "] = " + std::to_string(logits[h]) +
                    "; expected a finite number or -inf");
      }
    }
    job.sinks = logits;
  }

  // Rotary embedding: cos/sin broadcast against Q's and K's [.., r] in the input layout.
  template <typename T>
  void ReadRotary(const KernelContext& ctx, ONNXTensorElementDataType q_type, const HeadView& qv, const HeadView& kv,
                  AttentionJob<T>& job, KvRowsJob<T>& rows, RunBuffers<T>& buffers) const {
    const AttentionRotaryTables tables = ReadAttentionRotaryTables(ctx, kIn.cos, kIn.sin, q_type);
    const InputTensor& cos = tables.cos;
    const int64_t d = job.d;
    const int64_t r = RotaryWidth("Q", d, rotary_);
    BuildRotation(rotary_.interleaved, rotary_.sections, r, buffers.rot_src, buffers.rot_sign);
    // The rank-4 views of Q and K in the layout, with D (checked as RotaryEmbedding's X) or r lanes.
    const auto view = [&](const HeadView& hv, int64_t lanes) {
      return layout_ == Layout::kBnsd ? Shape{hv.batch, hv.heads, hv.seq, lanes}
                                      : Shape{hv.batch, hv.seq, hv.heads, lanes};
    };
    CheckRotaryBroadcast("Q", view(qv, d), cos.shape, r);
    CheckRotaryBroadcast("K", view(kv, d), cos.shape, r);
    const std::vector<int64_t> cq = BroadcastStrides("cos", cos.shape, view(qv, r), "Q's view");
    const std::vector<int64_t> ck = BroadcastStrides("cos", cos.shape, view(kv, r), "K's view");
    const bool bnsd = layout_ == Layout::kBnsd;
    job.rotary_dim = r;
    job.cos = cos.data;
    job.sin = tables.sin.data;
    job.cos_is_float = cos.type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
    job.cq_sb = cq[0], job.cq_sh = bnsd ? cq[1] : cq[2], job.cq_ss = bnsd ? cq[2] : cq[1];
    rows.ck_sb = ck[0], rows.ck_sh = bnsd ? ck[1] : ck[2], rows.ck_ss = bnsd ? ck[2] : ck[1];
    job.rot_src = buffers.rot_src.data();
    job.rot_sign = buffers.rot_sign.data();
  }

  // Y (its strides in output_layout), present_key and present_value.
  template <typename T>
  Presents PlanOutputs(const KernelContext& ctx, const CheckedAttentionInputs& in, AttentionJob<T>& job) const {
    const int64_t nq = job.q_heads, sq = job.sq, dv = job.dv;
    if (output_layout_ == Layout::kBnsd) {
      job.y_sb = nq * sq * dv, job.y_sh = sq * dv, job.y_ss = dv;
    } else {
      job.y_sb = sq * nq * dv, job.y_sh = dv, job.y_ss = nq * dv;
    }
    const OutputTensor y = ctx.Output(0, in.y);
    if (!y) throw Error("output 'Y' is required");
    job.y = y.As<T>();
    return Presents{ctx.Output(1, in.present_key), ctx.Output(2, in.present_value)};
  }

  // Tiling and scratch sizes.
  template <typename T>
  void PlanTiles(AttentionJob<T>& job) const {
    job.block_q = tiles_.block_q;
    job.block_kv = tiles_.block_kv;
    job.kv_tiles = (job.skv + job.block_kv - 1) / job.block_kv;
    job.dv_padded = (job.dv + kPanel - 1) / kPanel * kPanel;
    job.k_tile_floats = job.block_kv * job.d;
    job.v_tile_floats = job.block_kv * job.dv_padded;
  }

  // present_key / present_value: the Attend tasks copy each key tile's rows there from past and
  // new as they first read the tile (AttentionJob::present_state), so the copy overlaps the tiles
  // and reads nothing twice; WritePresentRest copies the tiles no task reached.
  template <typename T>
  static void PlanPresent(const Presents& present, AttentionJob<T>& job, RunBuffers<T>& buffers) {
    const OutputTensor& key = present.key;
    const OutputTensor& value = present.value;
    job.present_key = key ? key.As<T>() : nullptr;
    job.present_value = value ? value.As<T>() : nullptr;
    job.present_keys_written = job.skv;
    job.present_value_source = job.v_past;
    job.present_past_len = job.v_past_len;
    if ((!key && !value) || job.skv == 0) return;
    const size_t states = static_cast<size_t>(DimProduct(Shape{job.batch, job.kv_heads, job.kv_tiles}, 0, 3));
    buffers.present_state.reset(new (std::nothrow) int32_t[states]());
    if (!buffers.present_state) throw Error("out of memory for the present states (" + std::to_string(states) + ")");
    job.present_state = buffers.present_state.get();
  }

  // The packed path, without present_value: float32 value rows that do not all start on a 64-byte
  // line (numpy puts its arrays 16-48 bytes off one) are copied tile by tile, as present_value's
  // are, into an aligned arena buffer by the task that packs the tile, and P·V reads them there:
  // a load of 16 lanes then never spans two lines (bench/README.md, "Session 12, KV cache": staged
  // over in place, one process, 1.01-1.06 on the KV cache, BSND, causal, dense and GQA paths). The
  // same sums as in place. AVX-512 kernels only (their 64-byte loads split a line at every row; the AVX2
  // machine's no-present KV cache measured 0.95 in one run). Not with uniform empty rows, which
  // read every value, staged or not.
  template <typename T>
  void StageMisalignedValues(const KernelContext& ctx, AttentionJob<T>& job, RunBuffers<T>& buffers) const {
    if (!use_avx512_ || !std::is_same_v<T, float> || job.present_value != nullptr || job.skv == 0 ||
        job.dv % kPanel != 0 || !PackedPath(job.sq) || uniform_empty_rows_ || job.batch == 0 || job.q_heads == 0 ||
        ValuesOnLines(job)) {
      return;
    }
    const Shape values{job.batch, job.kv_heads, job.skv, job.dv};
    float* staged = buffers.staged_values.Allocate(ctx, static_cast<size_t>(DimProduct(values, 0, 4)));
    if (staged == nullptr) return;  // P·V reads the values in place
    if (job.present_state == nullptr) {  // else present_key's claims serve the values too
      const size_t states = static_cast<size_t>(DimProduct(Shape{job.batch, job.kv_heads, job.kv_tiles}, 0, 3));
      buffers.present_state.reset(new (std::nothrow) int32_t[states]());
      if (!buffers.present_state) return;
      job.present_state = buffers.present_state.get();
    }
    job.present_value = reinterpret_cast<T*>(staged);
    job.values_staged = true;
  }

  // Every value row, past and new, starts on a 64-byte line (dv % 16 == 0 given).
  template <typename T>
  static bool ValuesOnLines(const AttentionJob<T>& job) {
    const auto on_line = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 64 == 0; };
    const bool past = job.v_past_len == 0 || on_line(job.v_past);
    const bool fresh = job.skv == job.v_past_len ||
                       (on_line(job.v_new) && job.v_sb % kPanel == 0 && job.v_sh % kPanel == 0 && job.v_ss % kPanel == 0);
    return past && fresh;
  }

  // Whether the job's tiles run on the packed path (packed K panels) rather than the direct one.
  bool PackedPath(int64_t sq) const {
    return tiles_.force_path == 2 || (tiles_.force_path == 0 && sq >= kMinRowsForPacking);
  }

  // Phase 1 (RopeAttention): the new keys rotated, into present_key's new rows when the node has
  // that output (the tasks copy the past ones), else into scratch; afterwards every key is read
  // from one place per segment and never rotated again.
  template <typename T>
  static void RotateNewKeys(const KernelContext& ctx, const AttentionFns<T>& fns, const Presents& present,
                            int64_t s_new, AttentionJob<T>& job, KvRowsJob<T>& rows, RunBuffers<T>& buffers) {
    if (!kRope || s_new == 0) return;
    const int64_t batch = job.batch, nkv = job.kv_heads, d = job.d, past = job.k_past_len, skv = job.skv;
    rows.past_len = past;
    rows.new_len = s_new;
    const OutputTensor& present_key = present.key;
    if (present_key) {
      rows.present_key = present_key.As<T>();
    } else {
      buffers.rotated.reset(new (std::nothrow) T[static_cast<size_t>(DimProduct(Shape{batch, nkv, s_new, d}, 0, 4))]);
      if (!buffers.rotated) throw Error("out of memory for the rotated keys");
      rows.rotated_key = buffers.rotated.get();
    }
    RunTasks(ctx, batch * nkv, KvRowsScratchFloats(job), [&](int64_t task, float* scratch) {
      fns.kv_rows(job, rows, task / nkv, task % nkv, scratch);
    });
    if (present_key) {
      job.k_new = rows.present_key + past * d;
      job.k_sb = nkv * skv * d, job.k_sh = skv * d, job.k_ss = d;
      job.present_keys_written = past;
    } else {
      job.k_new = buffers.rotated.get();
      job.k_sb = nkv * s_new * d, job.k_sh = s_new * d, job.k_ss = d;
    }
  }

  // The keys any query row may see, [first, end): up to the last row's position when causal, from
  // the first row's window start.
  template <typename T>
  static std::pair<int64_t, int64_t> VisibleKeys(const AttentionJob<T>& job) {
    const int64_t end = job.causal ? std::min(job.skv, std::max<int64_t>(job.causal_offset + job.sq, 0)) : job.skv;
    const int64_t first = job.window > 0 ? std::max<int64_t>(0, job.causal_offset - job.window + 1) : 0;
    return {first, end};
  }

  // Phase 2 (packed path): the float32 panels of the used key/value tiles; packed here, or (lazy
  // packing, the default) each by the first Attend task that reads it, which overlaps the packing
  // with the other thread's tiles (bench/README.md, "Every path, session 9": AVX-512 window S/4
  // 4% faster).
  template <typename T>
  void PackKv(const KernelContext& ctx, const AttentionFns<T>& fns, AttentionJob<T>& job,
              RunBuffers<T>& buffers) const {
    const int64_t batch = job.batch, nkv = job.kv_heads, sq = job.sq;
    // Tiles outside the keys any query may see are never packed nor read.
    const auto [first_key, end_key] = VisibleKeys(job);
    if (!PackedPath(sq) || first_key >= end_key) return;
    // float32 values whose rows fill whole 16-lane panels are read in place, except new rows not
    // dv apart (BSND inputs) when P·V does not read them from present_value: those tiles packed.
    const bool pack_all_values = !std::is_same_v<T, float> || job.dv % kPanel != 0;
    const bool strided_new_values = job.v_ss != job.dv && job.skv > job.v_past_len && job.present_value == nullptr;
    const bool pack_values = pack_all_values || strided_new_values;
    job.v_packed_from = pack_all_values ? 0 : job.v_past_len / job.block_kv * job.block_kv;
    const int64_t per_tile = job.k_tile_floats + (pack_values ? job.v_tile_floats : 0);
    const int64_t total = DimProduct(Shape{batch, nkv, job.kv_tiles, per_tile}, 0, 4);
    float* packed_kv = buffers.packed_kv.Allocate(ctx, static_cast<size_t>(total));
    if (packed_kv == nullptr) {
      throw Error("out of memory for the packed keys and values (" + std::to_string(total) + " floats)");
    }
    job.k_packed = packed_kv;
    job.v_packed = pack_values ? packed_kv + batch * nkv * job.kv_tiles * job.k_tile_floats : nullptr;
    if (!pack_values && job.present_value != nullptr) {
      // P·V reads the values from present_value, which the packing tasks write (AttentionJob).
      job.present_value_read = true;
      job.v_past = job.present_value;
      job.v_past_len = job.skv;
    }
    if (tiles_.lazy_pack) {
      const size_t states = static_cast<size_t>(DimProduct(Shape{batch, nkv, job.kv_tiles}, 0, 3));
      buffers.pack_state.reset(new (std::nothrow) int32_t[states]());
      if (!buffers.pack_state) throw Error("out of memory for the packing states (" + std::to_string(states) + ")");
      job.pack_state = buffers.pack_state.get();
      return;
    }
    const int64_t tile_begin = first_key / job.block_kv;
    const int64_t tile_count = (end_key + job.block_kv - 1) / job.block_kv - tile_begin;
    RunTasks(ctx, batch * nkv * tile_count, PackScratchFloats(job), [&](int64_t task, float* scratch) {
      const int64_t bg = task / tile_count;
      fns.pack_kv(job, bg / nkv, bg % nkv, tile_begin + task % tile_count, scratch);
    });
  }

  // empty_rows = "uniform": Attend flags the rows that see no key, phase 4 fills them.
  template <typename T>
  void FlagEmptyRows(AttentionJob<T>& job, RunBuffers<T>& buffers) const {
    if (!uniform_empty_rows_ || job.skv <= 0) return;
    const size_t rows = static_cast<size_t>(DimProduct(Shape{job.batch, job.q_heads, job.sq}, 0, 3));
    buffers.empty_flags.reset(new (std::nothrow) uint8_t[rows]);
    if (!buffers.empty_flags) throw Error("out of memory for the empty-row flags (" + std::to_string(rows) + " bytes)");
    std::memset(buffers.empty_flags.get(), 0, rows);
    job.empty_flags = buffers.empty_flags.get();
  }

  // Phase 3: attention, one task per (batch, head, query tile). Head by head, so that the two
  // threads stream the same head's keys and values through the shared cache (25% faster at
  // S = 2048 than handing out all heads' last tiles first); within a head the last query tiles,
  // which see the most keys under a causal mask, go first.
  template <typename T>
  static void Attend(const KernelContext& ctx, const AttentionFns<T>& fns, const AttentionJob<T>& job) {
    const int64_t batch = job.batch, nq = job.q_heads, nkv = job.kv_heads, sq = job.sq;
    if (job.k_packed != nullptr) {
      const int64_t q_tiles = (sq + job.block_q - 1) / job.block_q;
      RunTasks(ctx, batch * nq * q_tiles, AttendScratchFloats(job), [&](int64_t task, float* scratch) {
        const int64_t bh = task / q_tiles;
        const int64_t i0 = (q_tiles - 1 - task % q_tiles) * job.block_q;
        fns.attend(job, bh / nq, bh % nq, 1, i0, std::min(job.block_q, sq - i0), 0, scratch);
      });
      return;
    }
    // Direct path: a task takes up to block_q rows = the query heads of one kv head (or a slice
    // of them) x a few positions, and one split of their keys.
    const int64_t heads_per_task = std::min(job.group, job.block_q);
    const int64_t head_chunks = (job.group + heads_per_task - 1) / heads_per_task;
    const int64_t positions = std::max<int64_t>(1, job.block_q / heads_per_task);
    const int64_t q_chunks = (sq + positions - 1) / positions;
    const int64_t row_blocks = batch * nkv * head_chunks * q_chunks;
    AttentionJob<T> split_job = job;
    std::unique_ptr<float[]> partials;
    PlanKeySplits(split_job, row_blocks, partials);
    const int64_t splits = split_job.kv_splits;
    // The last split of a row block to finish merges the block's partials.
    std::unique_ptr<std::atomic<int64_t>[]> finished(splits > 1 ? new std::atomic<int64_t>[row_blocks]() : nullptr);
    RunTasks(ctx, row_blocks * splits, AttendScratchFloats(job), [&](int64_t task, float* scratch) {
      const int64_t block = task / splits, split = task % splits;
      const int64_t q_chunk = block % q_chunks;
      const int64_t head_chunk = block / q_chunks % head_chunks;
      const int64_t bg = block / q_chunks / head_chunks;
      const int64_t h0 = bg % nkv * job.group + head_chunk * heads_per_task;
      const int64_t i0 = q_chunk * positions;
      const int64_t heads = std::min(heads_per_task, job.group - head_chunk * heads_per_task);
      fns.attend(split_job, bg / nkv, h0, heads, i0, std::min(positions, sq - i0), split, scratch);
      if (splits > 1 && finished[block].fetch_add(1, std::memory_order_acq_rel) == splits - 1) {
        fns.combine_splits(split_job, bg / nkv, h0, heads, i0, std::min(positions, sq - i0), scratch);
      }
    });
  }

  // Direct path: too few row blocks to keep the threads busy and balanced (decoding: one per kv
  // head) split the keys the job sees into kv_splits ranges of whole tiles, up to kSplitTasks
  // tasks in all and at least kMinSplitTiles tiles each; partials gets their results. One split
  // leaves the job unchanged. The split depends on the shapes and tiles only: the same result on
  // any number of threads.
  template <typename T>
  static void PlanKeySplits(AttentionJob<T>& job, int64_t row_blocks, std::unique_ptr<float[]>& partials) {
    job.partials = nullptr;
    job.kv_splits = 1;
    const auto [first_key, end_key] = VisibleKeys(job);
    const int64_t split0 = first_key / job.block_kv * job.block_kv;
    const int64_t tiles = (end_key - split0 + job.block_kv - 1) / job.block_kv;
    const int64_t wanted = (kSplitTasks + row_blocks - 1) / row_blocks;
    int64_t splits = std::min(wanted, tiles / kMinSplitTiles);
    if (splits <= 1) return;
    const int64_t split_tiles = (tiles + splits - 1) / splits;
    splits = (tiles + split_tiles - 1) / split_tiles;
    const size_t floats = static_cast<size_t>(DimProduct(Shape{job.batch, job.q_heads, job.sq, splits}, 0, 4) *
                                              PartialFloats(job));
    partials.reset(new (std::nothrow) float[floats]);
    if (!partials) throw Error("out of memory for the key splits' partials (" + std::to_string(floats) + " floats)");
    job.partials = partials.get();
    job.kv_splits = splits;
    job.kv_split0 = split0;
    job.kv_split_len = split_tiles * job.block_kv;
  }

  // Phase 4 (empty_rows = "uniform"): the mean of V into the flagged rows, per (batch, kv head);
  // the mean is computed only for kv heads with such a row.
  template <typename T>
  static void FillEmptyRows(const KernelContext& ctx, const AttentionFns<T>& fns, const AttentionJob<T>& job) {
    const int64_t batch = job.batch, nkv = job.kv_heads;
    const size_t flag_count = job.empty_flags != nullptr ? static_cast<size_t>(batch * job.q_heads * job.sq) : 0;
    if (flag_count > 0 && std::memchr(job.empty_flags, 1, flag_count) != nullptr) {
      RunTasks(ctx, batch * nkv, FillEmptyScratchFloats(job), [&](int64_t task, float* scratch) {
        fns.fill_empty_rows(job, task / nkv, task % nkv, scratch);
      });
    }
  }

  // Last phase: the present rows of the key tiles no Attend task claimed, per (batch, kv head);
  // nothing when the tasks claimed them all (every tile some row sees), nor for staged values alone.
  template <typename T>
  static void WritePresentRest(const KernelContext& ctx, const AttentionFns<T>& fns, const AttentionJob<T>& job) {
    if (job.present_state == nullptr || (job.values_staged && job.present_key == nullptr)) return;
    const int64_t nkv = job.kv_heads, states = job.batch * nkv * job.kv_tiles;
    if (std::find(job.present_state, job.present_state + states, 0) == job.present_state + states) return;
    RunTasks(ctx, job.batch * nkv, 0, [&](int64_t task, float*) { fns.write_present_rest(job, task / nkv, task % nkv); });
  }

  // Runs fn(task, scratch) for every task on ORT's thread pool with `scratch_floats` floats of
  // scratch per task: the running thread's buffer, kept from one task and call to the next
  // (common/thread_floats.h). A new[] / delete[] per task (~130 KiB at D = 128) put malloc / free
  // in a short decode's profile (with the error texts built lazily, decode fp16 over 64 keys ran
  // 0.968x the time). Nothing may throw into ORT's workers: a failed allocation is reported after.
  template <typename Fn>
  static void RunTasks(const KernelContext& ctx, int64_t count, int64_t scratch_floats, const Fn& fn) {
    if (count <= 0) return;
    std::atomic<bool> out_of_memory{false};
    ctx.ParallelFor(static_cast<size_t>(count), [&](size_t task) {
      float* scratch = ThreadFloats<ThreadSlot::kAttentionTask>(static_cast<size_t>(std::max<int64_t>(scratch_floats, 1)));
      if (scratch == nullptr) {
        out_of_memory = true;
        return;
      }
      fn(static_cast<int64_t>(task), scratch);
    });
    if (out_of_memory) throw Error("out of memory for " + std::to_string(scratch_floats) + " floats of scratch");
  }

  AttentionParams params_;
  int64_t num_heads_ = 0;
  int64_t kv_num_heads_ = 0;
  float scale_ = 0.0f;
  bool causal_ = false;
  float softcap_ = 0.0f;
  Layout layout_ = Layout::kBnsd;
  Layout output_layout_ = Layout::kBnsd;
  bool uniform_empty_rows_ = false;  // empty_rows = "uniform"
  RotaryAttributes rotary_;  // RopeAttention
  bool alibi_mask_cumsum_ = false;   // alibi_positions = "mask_cumsum"
  bool alibi_round_half_ = false;    // alibi_round = 1
  bool use_avx2_ = false;
  bool use_avx512_ = false;
  Tiles tiles_;
};

template <bool kRope>
void AppendAttentionOp(const char* name, CustomOpList& ops) {
  AppendPerType<AttentionKernel<kRope>>(ops, [name](ONNXTensorElementDataType t) {
    return AttentionOpSpec(name, nullptr, t, kRope);
  });
}

}  // namespace

void AppendAttentionOps(CustomOpList& ops) {
  AppendAttentionOp<false>("Attention", ops);
  AppendAttentionOp<true>("RopeAttention", ops);
}

}  // namespace otfuse::cpu
