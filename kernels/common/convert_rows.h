// Whole-row conversions between a storage type T and float32 buffers.
//
// Kernels widen each row once, do all their float32 math on the buffer, and narrow the result
// once. When compiled with F16C (the AVX2 variant), float16 rows use the hardware conversion
// instructions, which GCC does not generate from the portable code; elsewhere the loops over
// float_types.h auto-vectorise. Both round to nearest even, so the variants agree bit for bit.
// Everything is `static` for the reason given in float_types.h.
#pragma once

#include <cstdint>

#include "common/float_types.h"

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace otfuse {

template <typename T>
static inline void WidenRow(const T* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = ToFloat(in[i]);
}

template <typename T>
static inline void NarrowRow(const float* in, T* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = FromFloat<T>(in[i]);
}

// out = A + B computed in float32 and rounded to T (the value the unfused Add stores).
template <typename T>
static inline void AddRowRounded(const T* a, const T* b, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = RoundTo<T>(ToFloat(a[i]) + ToFloat(b[i]));
}

#if defined(__F16C__)
static inline __m256 Load8Half(const Float16* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

static inline void Store8Half(Float16* p, __m256 v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

template <>
inline void WidenRow<Float16>(const Float16* in, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, Load8Half(in + i));
  for (; i < n; ++i) out[i] = ToFloat(in[i]);
}

template <>
inline void NarrowRow<Float16>(const float* in, Float16* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) Store8Half(out + i, _mm256_loadu_ps(in + i));
  for (; i < n; ++i) out[i] = FromFloat<Float16>(in[i]);
}

template <>
inline void AddRowRounded<Float16>(const Float16* a, const Float16* b, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 sum = _mm256_add_ps(Load8Half(a + i), Load8Half(b + i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm256_cvtps_ph(sum, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
  }
  for (; i < n; ++i) out[i] = RoundTo<Float16>(ToFloat(a[i]) + ToFloat(b[i]));
}
#endif

}  // namespace otfuse
