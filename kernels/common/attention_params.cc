#include "common/attention_params.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

#include "common/shape_check.h"
#include "contract/contract_spec.h"

namespace otfuse {

AttentionLayout ParseAttentionLayout(const KernelInfo& info, const char* name, AttentionLayout fallback) {
  const std::optional<std::string> value = info.StringAttribute(name);
  if (!value) return fallback;
  if (*value == "BNSD") return AttentionLayout::kBnsd;
  if (*value == "BSND") return AttentionLayout::kBsnd;
  throw Error(std::string("attribute '") + name + "' must be \"BNSD\" or \"BSND\", got \"" + *value + "\"");
}

AttentionHeadDims ReadHeadDims(const char* name, const Shape& s, AttentionLayout layout, int64_t heads,
                               const char* heads_attr) {
  DimProduct(s, 0, s.size());  // no negative dims, no overflow
  const char* layout_name = layout == AttentionLayout::kBnsd ? "BNSD" : "BSND";
  // Built only when a check fails (this runs on every call of the op).
  const auto what = [&] { return std::string(name) + " has shape " + ToString(s) + " but layout " + layout_name; };
  AttentionHeadDims h{};
  if (layout == AttentionLayout::kBnsd) {
    if (s.size() != 4) throw Error(what() + " needs rank 4 [B, N, S, D]");
    h = AttentionHeadDims{s[0], s[1], s[2], s[3], false};
  } else if (s.size() == 4) {
    h = AttentionHeadDims{s[0], s[2], s[1], s[3], false};
  } else if (s.size() == 3) {
    if (heads == 0 || s[2] % heads != 0) {
      throw Error(what() + " [B, S, N*D]: the last dim " + std::to_string(s[2]) + " is not a multiple of " + heads_attr +
                  " = " + std::to_string(heads));
    }
    h = AttentionHeadDims{s[0], heads, s[1], s[2] / heads, true};
  } else {
    throw Error(what() + " needs rank 4 [B, S, N, D] or rank 3 [B, S, N*D]");
  }
  if (h.heads != heads) {
    throw Error(std::string(name) + " has shape " + ToString(s) + ": " + std::to_string(h.heads) + " heads in layout " +
                layout_name + " but " + heads_attr + " = " + std::to_string(heads));
  }
  return h;
}

namespace {

void ExpectType(const char* name, const InputTensor& tensor, ONNXTensorElementDataType expected) {
  if (tensor.type != expected) {
    throw Error(std::string(name) + " has element type " + ElementTypeName(tensor.type) + " but Q has " +
                ElementTypeName(expected));
  }
}

// `shape`, once its dims are known not to overflow as strides (DimProduct).
Shape OutputShape(const char* name, Shape shape) {
  try {
    DimProduct(shape, 0, shape.size());
  } catch (const Error& e) {
    throw Error(std::string("output ") + name + ": " + e.what());
  }
  return shape;
}

}  // namespace

CheckedAttentionInputs ReadAttentionInputs(const KernelContext& ctx, const AttentionParams& p,
                                           size_t past_key_index) {
  CheckedAttentionInputs in;
  in.q = RequiredInput(ctx, 0, "Q");
  in.k = RequiredInput(ctx, 1, "K");
  in.v = RequiredInput(ctx, 2, "V");
  in.past_key = ctx.Input(past_key_index);
  in.past_value = ctx.Input(past_key_index + 1);
  const ONNXTensorElementDataType t = in.q.type;
  ExpectType("K", in.k, t);
  ExpectType("V", in.v, t);
  in.qh = ReadHeadDims("Q", in.q.shape, p.layout, p.num_heads, "num_heads");
  in.kh = ReadHeadDims("K", in.k.shape, p.layout, p.kv_num_heads, "kv_num_heads");
  in.vh = ReadHeadDims("V", in.v.shape, p.layout, p.kv_num_heads, "kv_num_heads");
  const int64_t batch = in.qh.batch, d = in.qh.d, dv = in.vh.d;
  if (in.kh.batch != batch || in.vh.batch != batch) {
    throw Error("batch sizes differ: Q " + std::to_string(batch) + ", K " + std::to_string(in.kh.batch) + ", V " +
                std::to_string(in.vh.batch));
  }
  if (in.kh.d != d) {
    throw Error("K's head size D = " + std::to_string(in.kh.d) + " differs from Q's D = " + std::to_string(d));
  }
  if (in.vh.seq != in.kh.seq) {
    throw Error("V has " + std::to_string(in.vh.seq) + " positions but K has " + std::to_string(in.kh.seq));
  }
  if (in.past_key.has_value() != in.past_value.has_value()) {
    throw Error(std::string("past_key and past_value must be given together; only ") +
                (in.past_key ? "past_key" : "past_value") + " is");
  }
  if (in.past_key) {
    ExpectType("past_key", *in.past_key, t);
    ExpectType("past_value", *in.past_value, t);
    if (in.past_key->shape.size() != 4) {
      throw Error("past_key has shape " + ToString(in.past_key->shape) + "; expected rank 4 [B, Nkv, P, D]");
    }
    DimProduct(in.past_key->shape, 0, 4);
    in.past = in.past_key->shape[2];
    ExpectShape("past_key", in.past_key->shape, "[B, kv_num_heads, P, D]", Shape{batch, p.kv_num_heads, in.past, d});
    ExpectShape("past_value", in.past_value->shape, "[B, kv_num_heads, P, Dv]",
                Shape{batch, p.kv_num_heads, in.past, dv});
  }
  if (__builtin_add_overflow(in.past, in.kh.seq, &in.skv)) throw Error("past + new sequence length overflows");
  in.window = p.window > 0 ? std::min(p.window, std::max<int64_t>(in.skv, 1)) : 0;

  const int64_t nq = p.num_heads, sq = in.qh.seq;
  int64_t y_last = dv;  // [B, Sq, N*Dv] when Q was given as [B, Sq, N*D]
  const bool rank3 = p.output_layout == AttentionLayout::kBsnd && in.qh.rank3;
  if (rank3 && __builtin_mul_overflow(nq, dv, &y_last)) {
    throw Error("output Y's last dim num_heads * Dv = " + std::to_string(nq) + " * " + std::to_string(dv) +
                " overflows int64");
  }
  in.y = OutputShape("Y", p.output_layout == AttentionLayout::kBnsd ? Shape{batch, nq, sq, dv}
                          : rank3                                   ? Shape{batch, sq, y_last}
                                                                    : Shape{batch, sq, nq, dv});
  in.present_key = OutputShape("present_key", Shape{batch, p.kv_num_heads, in.skv, d});
  in.present_value = OutputShape("present_value", Shape{batch, p.kv_num_heads, in.skv, dv});
  return in;
}

std::optional<InputTensor> ReadAttnBias(const KernelContext& ctx, size_t index, ONNXTensorElementDataType q_type) {
  std::optional<InputTensor> bias = ctx.Input(index);
  if (bias && bias->type != q_type && bias->type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT) {
    throw Error(std::string("attn_bias has element type ") + ElementTypeName(bias->type) +
                "; expected float32 or Q's type " + ElementTypeName(q_type));
  }
  return bias;
}

std::optional<InputTensor> ReadKeyPaddingMask(const KernelContext& ctx, size_t index, int64_t batch, int64_t skv) {
  std::optional<InputTensor> mask = ctx.Input(index);
  if (!mask) return mask;
  if (mask->type != ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL && mask->type != ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32 &&
      mask->type != ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64) {
    throw Error(std::string("key_padding_mask has element type ") + ElementTypeName(mask->type) +
                "; expected bool, int32 or int64");
  }
  ExpectShape("key_padding_mask", mask->shape, "[B, Skv]", Shape{batch, skv});
  return mask;
}

std::optional<InputTensor> ReadAlibiSlopes(const KernelContext& ctx, size_t index, int64_t num_heads) {
  std::optional<InputTensor> slopes = ctx.Input(index);
  if (!slopes) return slopes;
  if (slopes->type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT) {
    throw Error(std::string("alibi_slopes has element type ") + ElementTypeName(slopes->type) + "; expected float32");
  }
  ExpectShape("alibi_slopes", slopes->shape, "[num_heads]", Shape{num_heads});
  return slopes;
}

std::optional<InputTensor> ReadSinks(const KernelContext& ctx, size_t index, int64_t num_heads) {
  std::optional<InputTensor> sinks = ctx.Input(index);
  if (!sinks) return sinks;
  if (sinks->type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT) {
    throw Error(std::string("sinks has element type ") + ElementTypeName(sinks->type) + "; expected float32");
  }
  ExpectShape("sinks", sinks->shape, "[num_heads]", Shape{num_heads});
  return sinks;
}

AttentionRotaryTables ReadAttentionRotaryTables(const KernelContext& ctx, size_t cos_index, size_t sin_index,
                                                ONNXTensorElementDataType q_type) {
  AttentionRotaryTables tables{RequiredInput(ctx, cos_index, "cos"), RequiredInput(ctx, sin_index, "sin")};
  const InputTensor& cos = tables.cos;
  const InputTensor& sin = tables.sin;
  if (cos.type != q_type && cos.type != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT) {
    throw Error(std::string("cos has element type ") + ElementTypeName(cos.type) + "; expected float32 or Q's type " +
                ElementTypeName(q_type));
  }
  if (sin.type != cos.type) {
    throw Error(std::string("sin has element type ") + ElementTypeName(sin.type) + " but cos has " +
                ElementTypeName(cos.type));
  }
  ExpectShape("sin", sin.shape, "cos.shape", cos.shape);
  return tables;
}

AttentionParams ReadAttentionParams(const KernelInfo& info) {
  AttentionParams p;
  const std::optional<int64_t> heads = info.IntAttribute("num_heads");
  if (!heads) throw Error("attribute 'num_heads' is required");
  p.num_heads = *heads;
  p.kv_num_heads = info.IntAttribute("kv_num_heads").value_or(p.num_heads);
  if (p.num_heads < 1 || p.kv_num_heads < 1) {
    throw Error("num_heads and kv_num_heads must be >= 1, got " + std::to_string(p.num_heads) + " and " +
                std::to_string(p.kv_num_heads));
  }
  if (p.num_heads % p.kv_num_heads != 0) {
    throw Error("num_heads = " + std::to_string(p.num_heads) + " is not a multiple of kv_num_heads = " +
                std::to_string(p.kv_num_heads));
  }
  p.scale = info.FloatAttribute("scale").value_or(0.0f);
  if (!std::isfinite(p.scale)) throw Error("attribute 'scale' must be finite");
  const int64_t causal = info.IntAttribute("causal").value_or(0);
  if (causal != 0 && causal != 1) throw Error("attribute 'causal' must be 0 or 1, got " + std::to_string(causal));
  p.causal = causal == 1;
  p.window = info.IntAttribute("window").value_or(0);
  if (p.window < 0) throw Error("attribute 'window' must be >= 0, got " + std::to_string(p.window));
  if (p.window > 0 && !p.causal) throw Error("attribute 'window' > 0 needs causal = 1");
  p.softcap = info.FloatAttribute("softcap").value_or(0.0f);
  if (!(p.softcap >= 0.0f) || !std::isfinite(p.softcap)) {
    throw Error("attribute 'softcap' must be a finite number >= 0, got " + std::to_string(p.softcap));
  }
  p.layout = ParseAttentionLayout(info, "layout", AttentionLayout::kBnsd);
  p.output_layout = ParseAttentionLayout(info, "output_layout", p.layout);
  const std::string empty_rows = info.StringAttribute("empty_rows").value_or("zero");
  if (empty_rows != "zero" && empty_rows != "uniform") {
    throw Error("attribute 'empty_rows' must be \"zero\" or \"uniform\", got \"" + empty_rows + "\"");
  }
  p.uniform_empty_rows = empty_rows == "uniform";
  const std::string positions = info.StringAttribute("alibi_positions").value_or("index");
  if (positions != "index" && positions != "mask_cumsum") {
    throw Error("attribute 'alibi_positions' must be \"index\" or \"mask_cumsum\", got \"" + positions + "\"");
  }
  p.alibi_mask_cumsum = positions == "mask_cumsum";
  const int64_t round = info.IntAttribute("alibi_round").value_or(0);
  if (round != 0 && round != 1) throw Error("attribute 'alibi_round' must be 0 or 1, got " + std::to_string(round));
  // The rounded form is key-only (float16 exports' BLOOM bias); "index"'s relative j - t would
  // round differently from the graph's slope * j, which the softmax no longer cancels exactly.
  if (round == 1 && !p.alibi_mask_cumsum) throw Error("alibi_round = 1 needs alibi_positions = \"mask_cumsum\"");
  p.alibi_round_half = round == 1;
  return p;
}

OpSpec AttentionOpSpec(const char* name, const char* execution_provider, ONNXTensorElementDataType t, bool) {
  return ContractOpSpec(name, execution_provider, t);
}

}  // namespace otfuse
