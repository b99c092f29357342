// ORT's own float32 Gemm, run from inside one of our kernels.
//
// The CPU execution provider's Gemm kernel (MLAS, with MLAS's own run-time CPU dispatch) is
// created once per use through OrtApi::CreateOp, when our kernel is created, and run through
// OrtApi::InvokeOp on buffers we own or were handed: no copy of its operands, the caller's
// buffers wrapped as tensors. It runs on the session's intra-op thread pool (InvokeOp passes the
// kernel context's). Both calls exist since ORT 1.12, inside the API version we target.
#pragma once

#include <cstdint>

#include "ort_glue.h"

namespace otfuse::cpu {

class OrtGemm {
 public:
  // Y = A · W (+ bias): A [m, k] float32, W [k, n] or, when `transposed`, [n, k]; with_bias adds
  // a float32 row [n] (Gemm's C, broadcast, beta = 1).
  OrtGemm(const KernelInfo& info, bool transposed, bool with_bias);
  ~OrtGemm();
  OrtGemm(const OrtGemm&) = delete;
  OrtGemm& operator=(const OrtGemm&) = delete;

  // Row strides are the dense ones: lda = k, ldw = n (or k when transposed), ldy = n.
  void Run(const KernelContext& ctx, int64_t m, int64_t k, int64_t n, const float* a, const float* w,
           const float* bias, float* y) const;

 private:
  OrtOp* op_ = nullptr;
  bool transposed_;
  bool with_bias_;
};

}  // namespace otfuse::cpu
