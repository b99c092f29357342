// Where Attention's and RopeAttention's optional inputs are, by contract name (otfuse/ops.py):
// both backends read them through this, so a new input in the contract moves them in one place.
#pragma once

#include <cstddef>

#include "contract/ops_contract.h"

namespace otfuse {

struct AttentionInputIndex {
  size_t cos, sin, bias, key_mask, past_key, past_value, alibi_slopes, sinks;  // cos / sin: RopeAttention only (else 0)
};

template <bool kRope>
constexpr AttentionInputIndex AttentionInputs() {
  namespace rope = contract::RopeAttention::in;
  namespace plain = contract::Attention::in;
  if constexpr (kRope) {
    return {rope::kCos,    rope::kSin,     rope::kAttnBias, rope::kKeyPaddingMask,
            rope::kPastKey, rope::kPastValue, rope::kAlibiSlopes, rope::kSinks};
  }
  return {0, 0, plain::kAttnBias, plain::kKeyPaddingMask, plain::kPastKey, plain::kPastValue, plain::kAlibiSlopes,
          plain::kSinks};
}

}  // namespace otfuse
