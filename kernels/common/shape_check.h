// Shape arithmetic and checks shared by the kernels. Each failing check throws otfuse::Error
// with a message that says what was expected; the caller's trampoline adds the op and node.
#pragma once

#include <cstdint>
#include <string>

#include "ort_glue.h"

namespace otfuse {

// Maps axis in [-rank, rank) to [0, rank).
inline size_t NormalizeAxis(int64_t axis, size_t rank) {
  const int64_t r = static_cast<int64_t>(rank);
  if (axis < -r || axis >= r) {
    throw Error("axis " + std::to_string(axis) + " is out of range for a rank-" + std::to_string(rank) +
                " input (valid: [" + std::to_string(-r) + ", " + std::to_string(r - 1) + "])");
  }
  return static_cast<size_t>(axis < 0 ? axis + r : axis);
}

// Product of shape[begin, end), refusing negative dims and overflow. Zero dims are left out of
// the overflow check, not of the result: an empty [0, 2**62, 4] is refused too, because its
// strides (2**62 * 4) overflow. So once DimProduct(s, 0, rank) has passed, every stride and
// partial product of s a kernel computes fits in int64.
inline int64_t DimProduct(const Shape& shape, size_t begin, size_t end) {
  int64_t product = 1;
  bool empty = false;
  for (size_t i = begin; i < end; ++i) {
    if (shape[i] < 0) throw Error("negative dimension in shape " + ToString(shape));
    if (shape[i] == 0) {
      empty = true;
    } else if (__builtin_mul_overflow(product, shape[i], &product)) {
      throw Error("the dims of shape " + ToString(shape) + " overflow int64 (their product, zero dims left out, is "
                  "a stride)");
    }
  }
  return empty ? 0 : product;
}

inline Shape Slice(const Shape& shape, size_t begin) { return Shape(shape.begin() + begin, shape.end()); }

inline void ExpectShape(const std::string& what, const Shape& actual, const std::string& expected_what,
                        const Shape& expected) {
  if (actual != expected) {
    throw Error(what + " has shape " + ToString(actual) + " but must equal " + expected_what + " = " +
                ToString(expected));
  }
}

// Rows of a [rows, row_length] view split into tasks of at least ~min_elements elements each,
// so thread-pool overhead stays small next to the work of one task.
struct RowTasks {
  int64_t rows_per_task;
  size_t count;

  RowTasks(int64_t rows, int64_t row_length, int64_t min_elements = 16384) {
    const int64_t length = row_length > 0 ? row_length : 1;
    rows_per_task = (min_elements + length - 1) / length;
    if (rows_per_task < 1) rows_per_task = 1;
    count = rows > 0 ? static_cast<size_t>((rows + rows_per_task - 1) / rows_per_task) : 0;
  }
};

}  // namespace otfuse
