#include "common/attention_params.h"

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
  const std::string what = std::string(name) + " has shape " + ToString(s) + " but layout " + layout_name;
  AttentionHeadDims h{};
  if (layout == AttentionLayout::kBnsd) {
    if (s.size() != 4) throw Error(what + " needs rank 4 [B, N, S, D]");
    h = AttentionHeadDims{s[0], s[1], s[2], s[3], false};
  } else if (s.size() == 4) {
    h = AttentionHeadDims{s[0], s[2], s[1], s[3], false};
  } else if (s.size() == 3) {
    if (heads == 0 || s[2] % heads != 0) {
      throw Error(what + " [B, S, N*D]: the last dim " + std::to_string(s[2]) + " is not a multiple of " + heads_attr +
                  " = " + std::to_string(heads));
    }
    h = AttentionHeadDims{s[0], heads, s[1], s[2] / heads, true};
  } else {
    throw Error(what + " needs rank 4 [B, S, N, D] or rank 3 [B, S, N*D]");
  }
  if (h.heads != heads) {
    throw Error(std::string(name) + " has shape " + ToString(s) + ": " + std::to_string(h.heads) + " heads in layout " +
                layout_name + " but " + heads_attr + " = " + std::to_string(heads));
  }
  return h;
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
  return p;
}

OpSpec AttentionOpSpec(const char* name, const char* execution_provider, ONNXTensorElementDataType t, bool) {
  return ContractOpSpec(name, execution_provider, t);
}

}  // namespace otfuse
