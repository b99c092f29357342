// Element math of the activation family, compiled once per CPU variant (activation_rows_baseline.cc,
// activation_rows_avx2.cc, activation_rows_avx512.cc); the op files (gelu.cc, silu.cc, ...) check
// the node and call ActivationSpans through activation_kernel.h.
#pragma once

#include <cstdint>

#include "common/activation_kind.h"
#include "common/float_types.h"

namespace otfuse::cpu {

// What one call computes. Plain data only: it crosses between translation units built for
// different ISAs.
struct ActivationJob {
  ActivationKind kind;
  float alpha;  // QuickGelu's alpha
  // float16 one-input rows: when set, y = half_table[x's bits], the 65536 results this variant's
  // float16 math gives (built by running it over every bit pattern, so the same bits either way).
  const uint16_t* half_table = nullptr;
};

// Rows [begin, end) of `width` elements: y[r] = act(gate[r]) (* up[r] when up is not null).
// Row r of gate, up and y starts at r * gate_stride, r * up_stride and r * width elements.
template <typename T>
struct ActivationRows {
  const T* gate;
  const T* up;  // null: the plain (ungated) activation
  T* y;
  int64_t width;
  int64_t gate_stride;
  int64_t up_stride;
};

template <typename T>
using ActivationRowsFn = void (*)(const ActivationJob& job, const ActivationRows<T>& rows, int64_t begin,
                                  int64_t end);

#define OTFUSE_DECLARE_ACTIVATION_ROWS(isa)                                                         \
  namespace isa {                                                                                   \
  template <typename T>                                                                             \
  void ActivationRowsRun(const ActivationJob& job, const ActivationRows<T>& rows, int64_t begin, int64_t end); \
  }
OTFUSE_DECLARE_ACTIVATION_ROWS(baseline)
OTFUSE_DECLARE_ACTIVATION_ROWS(avx2)
OTFUSE_DECLARE_ACTIVATION_ROWS(avx512)
#undef OTFUSE_DECLARE_ACTIVATION_ROWS

}  // namespace otfuse::cpu
