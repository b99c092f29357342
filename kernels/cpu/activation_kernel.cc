#include "cpu/activation_kernel.h"

#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

#include "common/cpu_features.h"
#include "common/shape_check.h"
#include "op_registry.h"

namespace otfuse::cpu {
namespace {

bool CpuRuns(ActivationIsa isa) {
#if defined(OTFUSE_HAVE_AVX2_KERNELS)
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  // libgcc's avx512f check includes the OS saving the zmm state.
  if (isa == ActivationIsa::kAvx512) return avx2 && __builtin_cpu_supports("avx512f");
  if (isa == ActivationIsa::kAvx2) return avx2;
#endif
  return isa == ActivationIsa::kBaseline;
}

template <typename T>
ActivationRowsFn<T> RowsFor(ActivationIsa isa) {
#if defined(OTFUSE_HAVE_AVX2_KERNELS)
  if (isa == ActivationIsa::kAvx512) return &avx512::ActivationRowsRun<T>;
  if (isa == ActivationIsa::kAvx2) return &avx2::ActivationRowsRun<T>;
#endif
  (void)isa;
  return &baseline::ActivationRowsRun<T>;
}

constexpr int64_t kFlatBlock = 16384;  // elements per row when a tensor is processed flat

// float16 one-input ops look their results up from this many elements on (ActivationJob::
// half_table): the table costs one pass of the math over 65536 values and 128 KiB of cache, and
// a lookup is cheaper than the math (measured on an Emerald Rapids Xeon, 2026-12-02, [8192, 5632],
// 2 threads, CPU ms: GELU-erf 41.1 -> 21.3 at 8 lanes and 23.4 -> 17.2 at 16, GELU-tanh 36.1 -> 27.9
// at 8, SiLU 22.0 -> 19.7 at 16).
// Below it they compute; both give the same bits.
constexpr int64_t kHalfTableMinElements = int64_t{1} << 18;

}  // namespace

ActivationIsa SelectActivationIsa() {
  if (const char* forced = std::getenv("OTFUSE_ACTIVATION_ISA")) {
    for (ActivationIsa isa : {ActivationIsa::kBaseline, ActivationIsa::kAvx2, ActivationIsa::kAvx512}) {
      if (std::strcmp(forced, ActivationIsaName(isa)) != 0) continue;
      if (!CpuRuns(isa)) {
        throw Error(std::string("OTFUSE_ACTIVATION_ISA=") + forced + ": this CPU (or this build) cannot run it");
      }
      return isa;
    }
    throw Error(std::string("OTFUSE_ACTIVATION_ISA=") + forced + " is not baseline, avx2 or avx512");
  }
  if (SelectCpuIsa() == CpuIsa::kBaseline) return ActivationIsa::kBaseline;
  // AVX-512 only where 512-bit FMAs run at full rate (common/cpu_features.h).
  if (Avx512AtFullRate() && CpuRuns(ActivationIsa::kAvx512)) return ActivationIsa::kAvx512;
  return CpuRuns(ActivationIsa::kAvx2) ? ActivationIsa::kAvx2 : ActivationIsa::kBaseline;
}

const char* ActivationIsaName(ActivationIsa isa) {
  switch (isa) {
    case ActivationIsa::kAvx512: return "avx512";
    case ActivationIsa::kAvx2: return "avx2";
    default: return "baseline";
  }
}

ActivationRunner::ActivationRunner(ActivationKind kind, float alpha)
    : job_{kind, alpha}, isa_(SelectActivationIsa()) {}

void ActivationRunner::Run(const KernelContext& ctx, const ActivationOperands& ops) const {
  const OutputTensor y = ctx.Output(0, ops.y_shape);
  if (!y) throw Error("output 'Y' is required");
  if (ops.elements() == 0) return;
  switch (ops.x.type) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return RunTyped<float>(ctx, ops, y.data);
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return RunTyped<Float16>(ctx, ops, y.data);
    default: return RunTyped<BFloat16>(ctx, ops, y.data);
  }
}

const uint16_t* ActivationRunner::HalfTable() const {
  std::call_once(half_table_once_, [this] {
    constexpr int64_t kValues = 65536;
    auto bits = std::make_unique<Float16[]>(kValues);
    for (int64_t i = 0; i < kValues; ++i) bits[i].bits = static_cast<uint16_t>(i);
    auto table = std::make_unique<uint16_t[]>(kValues);
    const ActivationRows<Float16> all{bits.get(), nullptr, reinterpret_cast<Float16*>(table.get()), kValues, kValues, 0};
    RowsFor<Float16>(isa_)(job_, all, 0, 1);  // job_ has no table: the math
    half_table_ = std::move(table);
  });
  return half_table_.get();
}

// The split form runs row by row (gate and up interleave in A's rows); otherwise the tensors are
// contiguous and are cut into rows of kFlatBlock elements, whatever their shape, plus a tail.
template <typename T>
void ActivationRunner::RunTyped(const KernelContext& ctx, const ActivationOperands& ops, void* y) const {
  const T* a = ops.x.As<T>();
  const T* up = ops.split ? a + ops.up_offset : ops.b ? ops.b->As<T>() + ops.up_offset : nullptr;
  ActivationRows<T> rows{a + ops.gate_offset, up, static_cast<T*>(y), ops.width, ops.gate_stride, ops.up_stride};
  int64_t row_count = ops.rows;
  ActivationRows<T> tail{};
  int64_t tail_rows = 0;
  if (!ops.split) {
    const int64_t n = ops.elements();
    const int64_t block = n < kFlatBlock ? n : kFlatBlock;
    row_count = n / block;
    rows.width = rows.gate_stride = rows.up_stride = block;
    if (n % block != 0) {
      const int64_t done = row_count * block;
      tail = ActivationRows<T>{rows.gate + done, up ? up + done : nullptr, rows.y + done, n % block, 0, 0};
      tail_rows = 1;
    }
  }
  ActivationJob job = job_;
  if constexpr (std::is_same_v<T, Float16>) {
    // ReluSquared's math (a max and a product) costs less than the lookup.
    if (up == nullptr && job.kind != ActivationKind::kReluSquared && ops.elements() >= kHalfTableMinElements) {
      job.half_table = HalfTable();
    }
  }
  const ActivationRowsFn<T> run = RowsFor<T>(isa_);
  const RowTasks tasks(row_count, rows.width);
  ctx.ParallelFor(tasks.count + static_cast<size_t>(tail_rows), [&](size_t task) {
    if (task == tasks.count) return run(job, tail, 0, 1);
    const int64_t begin = static_cast<int64_t>(task) * tasks.rows_per_task;
    const int64_t end = begin + tasks.rows_per_task < row_count ? begin + tasks.rows_per_task : row_count;
    run(job, rows, begin, end);
  });
}

void AppendActivationOps(CustomOpList& ops) {
  AppendGeluOps(ops);
  AppendQuickGeluOps(ops);
  AppendSiluOps(ops);
  AppendReluSquaredOps(ops);
  AppendSwiGluOps(ops);
  AppendGeGluOps(ops);
}

}  // namespace otfuse::cpu
