// Float32 row reductions with a fixed summation order: 16 interleaved partial sums combined by a
// fixed tree. SSE (4 lanes) and AVX2 (8 lanes) vectorise them without reassociating anything, so
// every CPU variant gets bit-identical results. Everything is `static` (see float_types.h).
#pragma once

#include <cstdint>

namespace otfuse {

constexpr int kReduceLanes = 16;

// Adds term(i) for i in [0, n) into 16 lane sums, then folds them in a fixed order.
template <typename Term>
static inline float FixedOrderSum(int64_t n, const Term& term) {
  float lanes[kReduceLanes] = {};
  int64_t i = 0;
  for (; i + kReduceLanes <= n; i += kReduceLanes) {
    for (int j = 0; j < kReduceLanes; ++j) lanes[j] += term(i + j);
  }
  for (int j = 0; i + j < n; ++j) lanes[j] += term(i + j);
  for (int width = kReduceLanes / 2; width > 0; width /= 2) {
    for (int j = 0; j < width; ++j) lanes[j] += lanes[j + width];
  }
  return lanes[0];
}

static inline float RowSum(const float* x, int64_t n) {
  return FixedOrderSum(n, [x](int64_t i) { return x[i]; });
}

static inline float RowSumOfSquares(const float* x, int64_t n) {
  return FixedOrderSum(n, [x](int64_t i) { return x[i] * x[i]; });
}

static inline float RowSumOfSquaredDeviations(const float* x, float mean, int64_t n) {
  return FixedOrderSum(n, [x, mean](int64_t i) { return (x[i] - mean) * (x[i] - mean); });
}

}  // namespace otfuse
