// Row math of the norm family, compiled once per CPU variant (norm_rows_baseline.cc,
// norm_rows_avx2.cc); norm.cc validates the node and picks the variant.
#pragma once

#include <cstdint>

#include "common/float_types.h"
#include "common/norm_kind.h"

namespace otfuse::cpu {

using ::otfuse::NormKind;

// Everything one call needs, with the weights already widened to float32. Plain data only:
// it crosses between translation units built for different ISAs.
template <typename T>
struct NormJob {
  NormKind kind;
  int64_t d;  // row length
  float epsilon;
  const T* x;  // X, or A for the Add* ops
  const T* b;  // B for the Add* ops, else null
  const float* scale;
  const float* bias;  // null when absent
  T* y;
  T* sum;  // the optional residual-sum output S, else null
};

// Rows [begin, end) of the job. `scratch` holds job.d floats (unused for float32 without B).
template <typename T>
using NormRowsFn = void (*)(const NormJob<T>& job, int64_t begin, int64_t end, float* scratch);

namespace baseline {
template <typename T>
void NormRows(const NormJob<T>& job, int64_t begin, int64_t end, float* scratch);
}
namespace avx2 {
template <typename T>
void NormRows(const NormJob<T>& job, int64_t begin, int64_t end, float* scratch);
}

}  // namespace otfuse::cpu
