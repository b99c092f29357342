// float16 / bfloat16 storage types and their conversions to and from float32.
//
// Conversions round to nearest, ties to even (as numpy and ml_dtypes do), handle subnormals,
// infinities and NaN, and are written branch-free (selects only) so that row loops containing
// them still auto-vectorise. They never rely on denormal arithmetic, so ORT's flush-to-zero
// setting cannot change their result.
//
// Functions here are `static`: this header is compiled into several ISA variants of the same
// kernels (cpu/norm_rows_*.cc), and internal linkage stops the linker from merging an AVX2
// copy into the baseline code.
#pragma once

#include <onnxruntime_c_api.h>

#include <cstdint>
#include <cstring>

namespace otfuse {

struct Float16 {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};
static_assert(sizeof(Float16) == 2 && sizeof(BFloat16) == 2, "16-bit storage types must be 2 bytes");

static inline uint32_t FloatBits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

static inline float BitsToFloat(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

// All-ones when cond holds: selects written as masks, which GCC if-converts and vectorises
// where nested ?: with float arithmetic on one side would stop it.
static inline uint32_t MaskIf(bool cond) { return 0u - static_cast<uint32_t>(cond); }
static inline uint32_t Select(uint32_t mask, uint32_t if_set, uint32_t if_clear) {
  return (if_set & mask) | (if_clear & ~mask);
}

static inline float ToFloat(float value) { return value; }

static inline float ToFloat(BFloat16 value) { return BitsToFloat(static_cast<uint32_t>(value.bits) << 16); }

static inline float ToFloat(Float16 value) {
  const uint32_t sign = static_cast<uint32_t>(value.bits & 0x8000u) << 16;
  const uint32_t exp_mant = static_cast<uint32_t>(value.bits & 0x7fffu) << 13;  // into float32 position
  const uint32_t exponent = exp_mant & 0x0f800000u;
  const uint32_t normal = exp_mant + ((127u - 15u) << 23);      // re-bias the exponent
  const uint32_t inf_nan = normal + ((128u - 16u) << 23);       // exponent all ones
  // Zero/subnormal: give it the smallest normal exponent, then subtract that power of two
  // (2^-14) so the FPU normalises the mantissa; operands are normal, so FTZ cannot interfere.
  const float subnormal = BitsToFloat(normal + (1u << 23)) - BitsToFloat(113u << 23);
  uint32_t magnitude = Select(MaskIf(exponent == 0), FloatBits(subnormal), normal);
  magnitude = Select(MaskIf(exponent == 0x0f800000u), inf_nan, magnitude);
  return BitsToFloat(sign | magnitude);
}

template <typename T>
static T FromFloat(float value);

template <>
inline float FromFloat<float>(float value) {
  return value;
}

template <>
inline BFloat16 FromFloat<BFloat16>(float value) {
  const uint32_t bits = FloatBits(value);
  const uint32_t lsb = (bits >> 16) & 1u;
  const uint32_t rounded = (bits + 0x7fffu + lsb) >> 16;  // ties to even; overflows to inf correctly
  const uint32_t quiet_nan = (bits >> 16) | 0x0040u;        // keep sign, force a mantissa bit
  const bool is_nan = (bits & 0x7fffffffu) > 0x7f800000u;
  return BFloat16{static_cast<uint16_t>(is_nan ? quiet_nan : rounded)};
}

template <>
inline Float16 FromFloat<Float16>(float value) {
  const uint32_t bits = FloatBits(value);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t magnitude = bits & 0x7fffffffu;

  // Normal range: re-bias, then round the 13 dropped bits to nearest even. A carry out of the
  // mantissa bumps the exponent, which is also how values >= 65520 become inf.
  const uint32_t odd = (magnitude >> 13) & 1u;
  const uint32_t normal = (magnitude - ((127u - 15u) << 23) + 0xfffu + odd) >> 13;

  // Below 2^-14 (fp16 subnormals): adding 0.5 puts the float32 ulp at 2^-24, the fp16
  // subnormal step, so the FPU's own round-to-nearest-even does the rounding.
  const float shifted = BitsToFloat(magnitude) + 0.5f;
  const uint32_t subnormal = FloatBits(shifted) - FloatBits(0.5f);

  const uint32_t overflow = Select(MaskIf(magnitude > 0x7f800000u), 0x7e00u, 0x7c00u);  // NaN stays NaN
  uint32_t result = Select(MaskIf(magnitude < 0x38800000u), subnormal, normal);
  result = Select(MaskIf(magnitude >= 0x47800000u), overflow, result);
  return Float16{static_cast<uint16_t>(sign | result)};
}

// The value `value` has once stored as T (what an unfused graph's intermediate tensor holds).
template <typename T>
static inline float RoundTo(float value) {
  return ToFloat(FromFloat<T>(value));
}

template <typename T>
struct ElementType;
template <>
struct ElementType<float> {
  static constexpr ONNXTensorElementDataType value = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
};
template <>
struct ElementType<Float16> {
  static constexpr ONNXTensorElementDataType value = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
};
template <>
struct ElementType<BFloat16> {
  static constexpr ONNXTensorElementDataType value = ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16;
};

}  // namespace otfuse
