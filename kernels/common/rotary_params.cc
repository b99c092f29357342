// The rotary attribute and cos / sin checks every rotary kernel shares (common/rotary_params.h).
#include "common/rotary_params.h"

namespace otfuse {

RotaryAttributes ReadRotaryAttributes(const KernelInfo& info, const char* mode_name, const char* sections_name) {
  RotaryAttributes attrs;
  attrs.sections_name = sections_name;
  const std::string mode = info.StringAttribute(mode_name).value_or("half");
  if (mode != "half" && mode != "interleaved") {
    throw Error(std::string("attribute '") + mode_name + "' must be \"half\" or \"interleaved\", got \"" + mode + "\"");
  }
  attrs.interleaved = mode == "interleaved";
  attrs.rotary_dim = info.IntAttribute("rotary_dim").value_or(0);
  if (attrs.rotary_dim < 0 || attrs.rotary_dim % 2 != 0) {
    throw Error("attribute 'rotary_dim' must be even and >= 0 (0 means the whole last dim), got " +
                std::to_string(attrs.rotary_dim));
  }
  attrs.sections = info.IntsAttribute(sections_name).value_or(std::vector<int64_t>{});
  for (int64_t width : attrs.sections) {
    if (width < 0 || width % 2 != 0) {
      throw Error(std::string("attribute '") + sections_name + "' " + ToString(attrs.sections) +
                  " must hold even widths >= 0, got " + std::to_string(width));
    }
    if (__builtin_add_overflow(attrs.sections_sum, width, &attrs.sections_sum)) {
      throw Error(std::string("attribute '") + sections_name + "' sum overflows int64");
    }
  }
  if (!attrs.sections.empty() && attrs.rotary_dim > 0 && attrs.sections_sum != attrs.rotary_dim) {
    throw Error(std::string("attribute '") + sections_name + "' " + ToString(attrs.sections) + " sums to " +
                std::to_string(attrs.sections_sum) + " but must sum to rotary_dim = " + std::to_string(attrs.rotary_dim));
  }
  return attrs;
}

int64_t RotaryWidth(const char* x_name, int64_t d, const RotaryAttributes& attrs) {
  if (attrs.rotary_dim > d) {
    throw Error("rotary_dim " + std::to_string(attrs.rotary_dim) + " is larger than " + x_name +
                "'s last dim D = " + std::to_string(d));
  }
  const int64_t r = attrs.rotary_dim > 0 ? attrs.rotary_dim : d;
  if (r % 2 != 0) {
    throw Error(std::string("rotary_dim 0 rotates all of ") + x_name + "'s last dim D = " + std::to_string(d) +
                ", which is odd; r must be even");
  }
  if (!attrs.sections.empty() && attrs.sections_sum != r) {
    throw Error(std::string("attribute '") + attrs.sections_name + "' " + ToString(attrs.sections) + " sums to " +
                std::to_string(attrs.sections_sum) + " but must sum to r = " + std::to_string(r) + " (rotary_dim 0: " +
                x_name + "'s last dim)");
  }
  return r;
}

void CheckRotaryBroadcast(const char* x_name, const Shape& x_shape, const Shape& cos_shape, int64_t r) {
  const size_t n = x_shape.size() - 1;  // leading dims of X (rank >= 2 checked by the caller)
  if (cos_shape.empty()) throw Error("cos must have rank >= 1 (its last dim is r), got a scalar");
  if (cos_shape.size() > x_shape.size()) {
    throw Error("cos has shape " + ToString(cos_shape) + " of rank " + std::to_string(cos_shape.size()) +
                ", more than " + x_name + "'s rank " + std::to_string(x_shape.size()) + "; cos/sin broadcast to " +
                x_name + ".shape[:-1] + [r] and cannot add dims");
  }
  const size_t k = cos_shape.size() - 1;  // leading dims of cos, aligned right with X's
  Shape target(x_shape.begin(), x_shape.end() - 1);
  target.push_back(r);
  if (cos_shape.back() != r) {
    throw Error("cos has shape " + ToString(cos_shape) + " but its last dim must be r = " + std::to_string(r) +
                " (cos/sin broadcast to " + x_name + ".shape[:-1] + [r] = " + ToString(target) + ")");
  }
  for (size_t i = 0; i < k; ++i) {
    const size_t j = i + (n - k);
    if (cos_shape[i] != x_shape[j] && cos_shape[i] != 1) {
      std::string message = "cos has shape " + ToString(cos_shape) + ", which does not broadcast to " + x_name +
                            ".shape[:-1] + [r] = " + ToString(target) + ": its dim " + std::to_string(i) + " is " +
                            std::to_string(cos_shape[i]) + ", not " + std::to_string(x_shape[j]) + " or 1";
      if (cos_shape[i] < x_shape[j]) {
        message += " (cos/sin cover " + std::to_string(cos_shape[i]) + " positions along " + x_name + "'s dim " +
                   std::to_string(j) + " of " + std::to_string(x_shape[j]) + ")";
      }
      throw Error(message);
    }
  }
}

}  // namespace otfuse
