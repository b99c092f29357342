// What the GEMM micros (bench/gemm_task_micro.cc, bench/gemm_half_micro.cc,
// bench/gemm_ystore_micro.cc, bench/gemm_node_threads.cc) share: the clocks, a cache flush, a
// median, the library's row-block layout of A and PackWeight's panel layout for one column range. Included after common/gemm.h (kTileWidth, EvenDepth).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <ctime>
#include <vector>

// Thread CPU seconds: a turn preempted by the host counts only the time it ran.
inline double Now() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

// Wall seconds (what a node's caller waits): against Now(), the time the host took the vCPU away.
inline double WallNow() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

// Every line of [p, p + bytes) out of the caches (a run that reads W or Y cold, as a node does).
inline void Flush(const void* p, size_t bytes) {
  for (size_t i = 0; i < bytes; i += 64) _mm_clflush(static_cast<const char*>(p) + i);
  _mm_mfence();
}

// The median of per-turn figures (the upper one of an even count).
inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A [m, k] as the library packs it: row blocks of kRowBlock rows, [k][rows] each (gemm.cc).
inline std::vector<float> PackRowBlocks(const std::vector<float>& a, int64_t m, int64_t k) {
  using otfuse::gemm_detail::kRowBlock;
  std::vector<float> packed(m * k);
  for (int64_t r0 = 0; r0 < m; r0 += kRowBlock) {
    const int64_t rows = std::min(kRowBlock, m - r0);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t kk = 0; kk < k; ++kk) packed[r0 * k + kk * rows + r] = a[(r0 + r) * k + kk];
    }
  }
  return packed;
}

// PackWeight's layout of columns [0, cols) (one column range) of a [k, n] weight (depth: its k
// blocks' rows; 0: PackWeight's, EvenDepth; 256: before session 20).
template <typename E>
std::vector<E> PackRange(const E* w, int64_t k, int64_t n, int64_t cols, int64_t depth = 0) {
  using otfuse::gemm_detail::kTileWidth;
  const int64_t tiles = (cols + kTileWidth - 1) / kTileWidth;
  std::vector<E> panels(tiles * kTileWidth * k, E{});
  if (depth == 0) depth = otfuse::gemm_detail::EvenDepth(k);
  for (int64_t k0 = 0; k0 < k; k0 += depth) {
    const int64_t kc = std::min(depth, k - k0);
    for (int64_t t = 0; t < tiles; ++t) {
      for (int64_t kk = 0; kk < kc; ++kk) {
        for (int64_t j = 0; j < kTileWidth && t * kTileWidth + j < cols; ++j) {
          panels[k0 * tiles * kTileWidth + (t * kc + kk) * kTileWidth + j] = w[(k0 + kk) * n + t * kTileWidth + j];
        }
      }
    }
  }
  return panels;
}
