// Row math of the rotary embedding family, compiled once per CPU variant (rotary_rows_baseline.cc,
// rotary_rows_avx2.cc); rotary.cc validates the node, maps rows to cos/sin rows and picks the
// variant.
#pragma once

#include <cstdint>

#include "common/float_types.h"

namespace otfuse::cpu {

// Collapsed dims of X's leading shape (outermost first) that a flat index walks over: each has
// its size, its stride in X rows and its stride in cos/sin rows (0 where cos/sin broadcast).
struct RotaryDims {
  int32_t count;
  const int64_t* sizes;
  const int64_t* x_strides;
  const int64_t* c_strides;  // null for the broadcast dims (all 0)
};

// The rows of X are visited as pairs (p, b): p walks the dims along which cos/sin vary, b the
// dims they are broadcast over (X row = x_offset(p) + x_offset(b), cos row = c_offset(p)).
// Plain data only: it crosses between translation units built for different ISAs.
template <typename T, typename C>
struct RotaryJob {
  int64_t d;  // X's last dim (row length)
  int64_t r;  // rotary lanes; lanes [r, d) are copied unchanged
  bool interleaved;
  const int64_t* sections;  // widths of the half-mode sections, summing to r (one entry r if none)
  int64_t section_count;
  const T* x;
  T* y;
  const C* cos;  // rows of r elements
  const C* sin;
  RotaryDims p_dims;
  RotaryDims b_dims;
  bool b_inner;  // visit b innermost (X's innermost leading dim is a broadcast dim)
  // Write Y with non-temporal (streaming) stores where the vector stores are aligned: set for
  // outputs much larger than the cache; only the AVX2 variant uses it.
  bool stream_stores;
};

// Rows (p, b) for p in [p_begin, p_end), b in [b_begin, b_end).
struct RotaryTask {
  int64_t p_begin, p_end, b_begin, b_end;
};

// `scratch` holds 4 * job.r floats: row buffers of the baseline variant for float16/bfloat16
// (float32 rows, and every row of the AVX2 variant, are rotated in place of the tensors).
template <typename T, typename C>
using RotaryRowsFn = void (*)(const RotaryJob<T, C>& job, const RotaryTask& task, float* scratch);

namespace baseline {
template <typename T, typename C>
void RotaryRows(const RotaryJob<T, C>& job, const RotaryTask& task, float* scratch);
}
namespace avx2 {
template <typename T, typename C>
void RotaryRows(const RotaryJob<T, C>& job, const RotaryTask& task, float* scratch);
}

}  // namespace otfuse::cpu
