// Float buffers kept per thread from one call to the next (ORT's pool threads, and the thread
// that runs a session, live as long as the session). A fresh large buffer per call gets fresh
// zeroed pages every time once glibc has handed the last one back to the kernel: at M = 2048,
// K = 2048 A's packed copy allocated per call made a norm + N = 1024 node run 0.80x the unfused
// time, 0.96x with glibc told not to trim (bench/README.md, "Issue 12, session 12").
//
// One slot per use that can be live at the same time on one thread: the thread that calls a
// kernel also runs that kernel's parallel tasks, so the caller's buffers and the tasks' differ.
// Baseline code only (no ISA-specific TU includes this), so the inline template is safe to share.
#pragma once

#include <cstddef>
#include <memory>
#include <new>
#include <string>

#include "ort_glue.h"

namespace otfuse {

enum class ThreadSlot {
  kGemmTask,         // a GEMM task's stage and accumulators (common/gemm.cc)
  kCallerPackedA,    // the caller's A in packed row blocks (common/gemm.h, GemmA::packed)
  kCallerLanesA,     // the caller's A in groups of 16 rows for the lane form (common/gemm.cc)
  kCallerRowsA,      // the caller's row-major A where it has no other home (cpu/norm_linear.cc)
  kNormBlock,        // a norm task's scratch row and row block (cpu/norm_linear.cc)
  kAttentionTask,    // an attention task's scratch (cpu/attention.cc, RunTasks)
};

// At least `floats` floats for this thread and slot, grown when a call needs more (the old buffer
// freed first: never both at once); null when that allocation fails.
template <ThreadSlot>
float* ThreadFloats(size_t floats) {
  thread_local std::unique_ptr<float[]> buffer;
  thread_local size_t capacity = 0;
  if (capacity < floats) {
    buffer.reset();
    buffer.reset(new (std::nothrow) float[floats]);
    capacity = buffer ? floats : 0;
  }
  return buffer.get();
}

// The calling thread's buffer of a slot, or Error naming `what` when out of memory.
template <ThreadSlot kSlot>
float* CallerFloats(size_t floats, const char* what) {
  float* buffer = ThreadFloats<kSlot>(floats);
  if (buffer == nullptr) throw Error("out of memory for " + std::to_string(floats) + " floats of " + what);
  return buffer;
}

}  // namespace otfuse
