// Ascend kernels of the rotary embedding family: RotaryEmbedding and RotaryEmbeddingQK (contract
// and argument mapping: docs/ops.md, the "Ascend" line of each op; the reshaping and limits of one
// rotation: ascend/rotary_plan.h).
//
//   RotaryEmbedding   -> aclnnRotaryPositionEmbedding (one call per section; copies around it for a
//                        partial rotary), see rotary_plan.h.
//   RotaryEmbeddingQK -> aclnnApplyRotaryPosEmbV2(queryRef, keyRef, cos, sin, layout, "half"), which
//                        rotates in place: Q and K are first copied into the outputs (aclnnInplaceCopy).
//                        Used only where every version of its doc allows it (below); otherwise two
//                        aclnnRotaryPositionEmbedding rotations, one per tensor.
//
// aclnnApplyRotaryPosEmbV2 — hicann/ops-transformer posembedding/apply_rotary_pos_emb/docs/
// aclnnApplyRotaryPosEmbV2.md and aclnnApplyRotaryPosEmbV2_en.md (they differ; we take what both
// allow): queryRef/keyRef/cos/sin 4-D, one dtype; D = 128 (the English doc also allows 64);
// rotaryMode "half" (the English doc: only "half" is supported); layout 1 = BSND with q (b, s, qn, d),
// k (b, s, kn, d), cos/sin (b, s, 1, d), 3 = BNSD (q and k equal but for N, cos/sin N = 1 and B, S
// as q's); no empty tensors; and its Unified Buffer need
//   ub_required = (qn + kn) * D * castSize * 5 + D * dtypeSize * 4 + cast * D * 8
// (cast = 1, castSize = 4 for bfloat16, else cast = 0, castSize = dtypeSize) must fit the AI
// Core's UB, taken here as 192 KiB (Atlas A2/A3; an assumption: the doc does not give the size).
#include <cstring>
#include <optional>
#include <string>

#include "ascend/aclnn_call.h"
#include "ascend/rotary_plan.h"
#include "common/rotary_params.h"
#include "common/shape_check.h"
#include "op_registry.h"

namespace otfuse::ascend {

// ============================================================================ RotaryPlan

namespace {

constexpr int64_t kMaxRotaryWidth = 896;  // "D < 896 and must be a multiple of 2"
constexpr int64_t kMaxHeadsOrBatch = 1000;

bool IsFloat(ONNXTensorElementDataType t) {
  return t == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT || t == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 ||
         t == ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16;
}

int64_t Numel(const Shape& s) { return DimProduct(s, 0, s.size()); }

struct Pattern {
  const char* kinds;  // slot kinds: 'p' = cos varies along it, 'b' = cos broadcast over it
  const char* name;   // the cos form in the aclnn doc
  bool bsnd;          // N is slot 2 (BSND) rather than slot 1 (BNSD)
  bool interleave_ok;
};

// BSND forms first: the doc attaches extra conditions to BNSD x (B * N <= S * 8 ...) that it does
// not state for BSND.
constexpr Pattern kPatterns[] = {
    {"bpb", "1S1D (BSND)", true, true},  {"ppb", "BS1D (BSND)", true, false}, {"ppp", "BSND (BSND)", true, false},
    {"bbp", "11SD (BNSD)", false, true}, {"pbp", "B1SD (BNSD)", false, false},
};

}  // namespace

RotaryOps RotaryOps::Bind(const CannRuntime& rt) {
  return RotaryOps{AclnnOp<RotaryPositionEmbeddingGetWorkspace>::Bind(rt, "aclnnRotaryPositionEmbedding"),
                   AclnnOp<InplaceCopyGetWorkspace>::Bind(rt, "aclnnInplaceCopy")};
}

RotaryPlan RotaryPlan::Make(const char* x_name, const Shape& x, ONNXTensorElementDataType type, const Shape& cos,
                            ONNXTensorElementDataType cos_type, const RotaryAttributes& attrs, Product product) {
  const char* api = "aclnnRotaryPositionEmbedding";
  if (x.size() < 2) throw Error(std::string(x_name) + " has shape " + ToString(x) + "; expected rank >= 2 ([..., D])");
  Numel(x);
  RotaryPlan plan;
  plan.type_ = type;
  plan.cos_type_ = cos_type;
  plan.d_ = x.back();
  plan.r_ = RotaryWidth(x_name, plan.d_, attrs);
  plan.mode_ = attrs.interleaved ? 1 : 0;

  CheckRotaryBroadcast(x_name, x, cos, plan.r_);
  Numel(cos);
  const size_t n = x.size() - 1;
  const size_t k = cos.size() - 1;

  switch (product) {
    case Product::kAtlasInference:
    case Product::kAtlasTraining:
    case Product::kAtlas200I500A2:
      throw Error(std::string(api) + " is not available on " + ProductName(product) + " (run this node on CPU)");
    default: break;
  }

  // Sections: one call each (interleaved sections are the same as none: docs/ops.md).
  if (attrs.interleaved || attrs.sections.empty()) {
    plan.segments_.push_back({0, plan.r_});
  } else {
    int64_t offset = 0;
    for (int64_t w : attrs.sections) {
      if (w > 0) plan.segments_.push_back({offset, w});
      offset += w;
    }
  }
  for (const Segment& s : plan.segments_) {
    if (s.width >= kMaxRotaryWidth) {
      throw Error(std::string(api) + " rotates at most 894 lanes per call (D < 896); this node rotates " +
                  std::to_string(s.width) + " (run this node on CPU)");
    }
  }
  if (Numel(x) == 0 || plan.r_ == 0) {
    plan.empty_ = Numel(x) == 0;
    plan.x4_ = {1, 1, 1, plan.d_};
    plan.cos4_ = {1, 1, 1, plan.r_};
    if (plan.r_ == 0) plan.segments_.clear();
    return plan;
  }

  // Leading dims of X (size-1 dims dropped), each 'p' (cos varies along it) or 'b' (broadcast).
  std::vector<int64_t> sizes;
  std::string kinds;
  for (size_t j = 0; j < n; ++j) {
    if (x[j] == 1) continue;
    const int64_t c = j >= n - k ? cos[j - (n - k)] : 1;
    sizes.push_back(x[j]);
    kinds.push_back(c == 1 ? 'b' : 'p');
  }
  const size_t m = sizes.size();
  std::string limit_failure;
  for (const Pattern& pattern : kPatterns) {
    if (attrs.interleaved && !pattern.interleave_ok) continue;
    for (size_t i = 0; i <= m; ++i) {
      for (size_t j = i; j <= m; ++j) {
        const size_t bounds[4] = {0, i, j, m};
        int64_t slot[3] = {1, 1, 1};
        bool fits = true;
        for (int s = 0; s < 3 && fits; ++s) {
          for (size_t t = bounds[s]; t < bounds[s + 1]; ++t) {
            if (kinds[t] != pattern.kinds[s]) fits = false;
            slot[s] *= sizes[t];
          }
        }
        if (!fits) continue;
        const int64_t b = slot[0], heads = pattern.bsnd ? slot[2] : slot[1];
        const bool limits_ok = attrs.interleaved ? b * heads < kMaxHeadsOrBatch
                                                 : b < kMaxHeadsOrBatch && heads < kMaxHeadsOrBatch;
        if (!limits_ok) {
          limit_failure = std::string("as ") + pattern.name + " with B = " + std::to_string(b) + ", N = " +
                          std::to_string(heads) + (attrs.interleaved ? " (interleave mode needs B * N < 1000)"
                                                                     : " (half mode needs B, N < 1000)");
          continue;
        }
        plan.x4_ = {slot[0], slot[1], slot[2], plan.d_};
        plan.cos4_ = {pattern.kinds[0] == 'p' ? slot[0] : 1, pattern.kinds[1] == 'p' ? slot[1] : 1,
                      pattern.kinds[2] == 'p' ? slot[2] : 1, plan.r_};
        return plan;
      }
    }
  }
  if (!limit_failure.empty()) {
    throw Error(std::string(api) + " cannot take " + x_name + " " + ToString(x) + " with cos " + ToString(cos) + " " +
                limit_failure + " (run this node on CPU)");
  }
  throw Error(std::string(api) + " cannot express cos/sin " + ToString(cos) + " broadcast over " + x_name + " " +
              ToString(x) + ": it takes cos/sin of the forms " +
              (attrs.interleaved ? "11SD / 1S1D in interleaved mode" : "11SD, B1SD, BNSD, 1S1D, BS1D or BSND") +
              " (run this node on CPU)");
}

void RotaryPlan::Run(AclnnCall& call, const RotaryOps& ops, const void* x, const void* cos, const void* sin,
                     void* y) const {
  if (empty_) return;
  const Shape x_strides = ContiguousStrides(x4_);
  const Shape c_strides = ContiguousStrides(cos4_);
  const Shape lead{x4_[0], x4_[1], x4_[2]};
  const size_t es = ElementBytes(type_);
  if (!segments_.empty() && cos_type_ != type_) {
    // aclnnRotaryPositionEmbedding: cos/sin "consistent with the data type of x".
    const size_t bytes = static_cast<size_t>(Numel(cos4_)) * es;
    void* cos_cast = call.Scratch(bytes, "cos cast to X's type");
    void* sin_cast = call.Scratch(bytes, "sin cast to X's type");
    call.Run(ops.copy, call.Tensor(cos_cast, type_, cos4_, "cos (cast)"), call.Tensor(cos, cos_type_, cos4_, "cos"));
    call.Run(ops.copy, call.Tensor(sin_cast, type_, cos4_, "sin (cast)"), call.Tensor(sin, cos_type_, cos4_, "sin"));
    cos = cos_cast;
    sin = sin_cast;
  }
  const bool whole = segments_.size() == 1 && segments_[0].width == d_;
  for (const Segment& s : segments_) {
    const Shape shape{lead[0], lead[1], lead[2], s.width};
    const Shape cos_shape{cos4_[0], cos4_[1], cos4_[2], s.width};
    aclTensor* xv = whole ? call.Tensor(x, type_, x4_, "x") : call.View(x, type_, shape, x_strides, s.offset, "x lanes");
    aclTensor* cv = call.View(cos, type_, cos_shape, c_strides, s.offset, "cos");
    aclTensor* sv = call.View(sin, type_, cos_shape, c_strides, s.offset, "sin");
    if (whole) {
      call.Run(ops.rope, xv, cv, sv, mode_, call.Tensor(y, type_, x4_, "out"));
      continue;
    }
    // out must be contiguous: rotate into scratch, then copy into Y's lanes.
    void* rotated = call.Scratch(static_cast<size_t>(Numel(shape)) * es, "rotated lanes");
    aclTensor* out = call.Tensor(rotated, type_, shape, "out (rotated lanes)");
    call.Run(ops.rope, xv, cv, sv, mode_, out);
    call.Run(ops.copy, call.View(y, type_, shape, x_strides, s.offset, "Y lanes"), out);
  }
  if (r_ < d_) {
    const Shape pass{lead[0], lead[1], lead[2], d_ - r_};
    call.Run(ops.copy, call.View(y, type_, pass, x_strides, r_, "Y pass-through lanes"),
             call.View(x, type_, pass, x_strides, r_, "X pass-through lanes"));
  }
}

// ============================================================================ kernels

namespace {

// aclnnApplyRotaryPosEmbV2GetWorkspaceSize(queryRef, keyRef, cos, sin, int64_t layout, char* rotaryMode, ...)
using ApplyRotaryPosEmbV2GetWorkspace = aclnnStatus (*)(aclTensor* query_ref, aclTensor* key_ref, const aclTensor* cos,
                                                        const aclTensor* sin, int64_t layout, char* rotary_mode,
                                                        uint64_t* workspace_size, aclOpExecutor** executor);

constexpr int64_t kApplyRopeHeadDim = 128;
constexpr int64_t kUnifiedBufferBytes = 192 * 1024;  // Atlas A2/A3 AI Core UB (assumption, see top)

// cos/sin reshaped for aclnnApplyRotaryPosEmbV2, and the layout, when Q/K/cos qualify.
struct ApplyRopeForm {
  int64_t layout;  // 1 BSND, 3 BNSD
  Shape cos4;      // the exact (b, s, 1, d) / (b, 1, s, d) the doc asks for
};

std::optional<ApplyRopeForm> ApplyRopeFormFor(const Shape& q, const Shape& k, const Shape& cos,
                                              ONNXTensorElementDataType t, const RotaryAttributes& attrs,
                                              Product product) {
  if (attrs.interleaved || attrs.rotary_dim != 0 || !attrs.sections.empty()) return std::nullopt;
  if (product == Product::kAtlasTraining || product == Product::kAtlas200I500A2) return std::nullopt;
  if (product == Product::kAtlasInference && t == ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16) return std::nullopt;
  if (q.size() != 4 || k.size() != 4 || q[3] != kApplyRopeHeadDim || k[3] != kApplyRopeHeadDim) return std::nullopt;
  if (Numel(q) == 0 || Numel(k) == 0) return std::nullopt;
  Shape c(4 - std::min<size_t>(cos.size(), 4), 1);
  c.insert(c.end(), cos.begin(), cos.end());
  if (c.size() != 4) return std::nullopt;
  const int64_t cast = t == ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16 ? 1 : 0;
  const int64_t dtype_size = t == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT ? 4 : 2;
  const int64_t cast_size = cast ? 4 : dtype_size;
  auto ub_fits = [&](int64_t qn, int64_t kn) {
    const int64_t d = kApplyRopeHeadDim;
    const int64_t ub = (qn + kn) * d * cast_size * 2 + d * dtype_size * 4 + (qn + kn) * d * cast_size +
                       (qn + kn) * d * cast_size * 2 + cast * d * 4 * 2;
    return ub <= kUnifiedBufferBytes;
  };
  // BSND: q (b, s, qn, d), k (b, s, kn, d), cos (b or 1, s, 1, d).
  if (k[0] == q[0] && k[1] == q[1] && c[2] == 1 && c[1] == q[1] && (c[0] == q[0] || c[0] == 1) &&
      ub_fits(q[2], k[2])) {
    return ApplyRopeForm{1, Shape{q[0], q[1], 1, q[3]}};
  }
  // BNSD: q (b, qn, s, d), k (b, kn, s, d), cos (b or 1, 1, s, d).
  if (k[0] == q[0] && k[2] == q[2] && c[1] == 1 && c[2] == q[2] && (c[0] == q[0] || c[0] == 1) &&
      ub_fits(q[1], k[1])) {
    return ApplyRopeForm{3, Shape{q[0], 1, q[2], q[3]}};
  }
  return std::nullopt;
}

template <bool kQK, Placement kPlacement>
class AscendRotaryKernel {
 public:
  explicit AscendRotaryKernel(const KernelInfo& info)
      : rt_(&BindRuntime(kPlacement)), ops_(RotaryOps::Bind(*rt_)), attrs_(ReadRotaryAttributes(info, "mode", "sections")) {
    if constexpr (kQK) {
      // Optional: older CANN has no V2; the kernel then always runs two rotations.
      void* get = rt_->Find("aclnnApplyRotaryPosEmbV2GetWorkspaceSize");
      void* exec = rt_->Find("aclnnApplyRotaryPosEmbV2");
      if (get != nullptr && exec != nullptr) {
        apply_.name = "aclnnApplyRotaryPosEmbV2";
        apply_.get_workspace = reinterpret_cast<ApplyRotaryPosEmbV2GetWorkspace>(get);
        apply_.execute = reinterpret_cast<fn::AclnnExecute>(exec);
      }
    }
  }

  void Compute(const KernelContext& ctx) const {
    constexpr size_t kCount = kQK ? 2 : 1;
    static constexpr const char* kNames[2] = {kQK ? "Q" : "X", "K"};
    InputTensor x[kCount];
    for (size_t i = 0; i < kCount; ++i) {
      x[i] = RequiredInput(ctx, i, kNames[i]);
      if (!IsFloat(x[i].type)) {
        throw Error(std::string(kNames[i]) + " has element type " + ElementTypeName(x[i].type) +
                    "; expected float32, float16 or bfloat16");
      }
      if (i > 0 && x[i].type != x[0].type) {
        throw Error(std::string("K has element type ") + ElementTypeName(x[i].type) + " but Q has " +
                    ElementTypeName(x[0].type));
      }
      if (x[i].shape.size() < 2) {
        throw Error(std::string(kNames[i]) + " has shape " + ToString(x[i].shape) + "; expected rank >= 2 ([..., D])");
      }
    }
    const ONNXTensorElementDataType t = x[0].type;
    const InputTensor cos = RequiredInput(ctx, kCount, "cos");
    const InputTensor sin = RequiredInput(ctx, kCount + 1, "sin");
    CheckRotaryTables(cos, sin, t);
    if (kQK && x[0].shape.back() != x[1].shape.back()) {
      throw Error("Q has head dim " + std::to_string(x[0].shape.back()) + " (last dim) but K has " +
                  std::to_string(x[1].shape.back()) + "; they must be equal");
    }
    // The contract's checks come first, whichever call runs: aclnnApplyRotaryPosEmbV2's path would
    // broadcast a cos of last dim 1 over the 128 lanes instead of refusing it.
    for (size_t i = 0; i < kCount; ++i) {
      DimProduct(x[i].shape, 0, x[i].shape.size());
      CheckRotaryBroadcast(kNames[i], x[i].shape, cos.shape, RotaryWidth(kNames[i], x[i].shape.back(), attrs_));
    }
    const Product product = ClassifySoc(rt_->SocName());
    OutputTensor y[kCount];

    if constexpr (kQK) {
      if (apply_.execute != nullptr) {
        if (const auto form = ApplyRopeFormFor(x[0].shape, x[1].shape, cos.shape, t, attrs_, product)) {
          for (size_t i = 0; i < kCount; ++i) y[i] = ctx.Output(i, x[i].shape);
          RunApplyRope(ctx, x, y, cos, sin, *form);
          return;
        }
      }
    }
    std::optional<RotaryPlan> plans[kCount];
    for (size_t i = 0; i < kCount; ++i) {
      plans[i] = RotaryPlan::Make(kNames[i], x[i].shape, t, cos.shape, cos.type, attrs_, product);
    }
    for (size_t i = 0; i < kCount; ++i) {
      y[i] = ctx.Output(i, x[i].shape);
      if (!y[i]) throw Error("output " + std::to_string(i) + " is required");
    }
    AclnnCall call(*rt_, ctx, 0);
    for (size_t i = 0; i < kCount; ++i) plans[i]->Run(call, ops_, x[i].data, cos.data, sin.data, y[i].data);
  }

 private:
  void RunApplyRope(const KernelContext& ctx, const InputTensor* x, const OutputTensor* y, const InputTensor& cos,
                    const InputTensor& sin, const ApplyRopeForm& form) const {
    const ONNXTensorElementDataType t = x[0].type;
    AclnnCall call(*rt_, ctx, 0);
    // In place: Q_out = Q, K_out = K first.
    aclTensor* q_ref = call.Tensor(y[0].data, t, x[0].shape, "Q_out");
    aclTensor* k_ref = call.Tensor(y[1].data, t, x[1].shape, "K_out");
    call.Run(ops_.copy, q_ref, call.Tensor(x[0].data, t, x[0].shape, "Q"));
    call.Run(ops_.copy, k_ref, call.Tensor(x[1].data, t, x[1].shape, "K"));
    // cos/sin: exactly (b, s, 1, d) / (b, 1, s, d) of Q's type; broadcast over B or cast when needed.
    Shape cos_given(4 - std::min<size_t>(cos.shape.size(), 4), 1);
    cos_given.insert(cos_given.end(), cos.shape.begin(), cos.shape.end());
    const void* tables[2] = {cos.data, sin.data};
    aclTensor* acl_tables[2];
    for (int i = 0; i < 2; ++i) {
      const char* what = i == 0 ? "cos" : "sin";
      if (cos.type == t && cos_given == form.cos4) {
        acl_tables[i] = call.Tensor(tables[i], t, form.cos4, what);
        continue;
      }
      void* exact = call.Scratch(static_cast<size_t>(Numel(form.cos4)) * ElementBytes(t), what);
      acl_tables[i] = call.Tensor(exact, t, form.cos4, what);
      call.Run(ops_.copy, acl_tables[i], call.Tensor(tables[i], cos.type, cos_given, what));
    }
    char mode[] = "half";
    call.Run(apply_, q_ref, k_ref, static_cast<const aclTensor*>(acl_tables[0]),
             static_cast<const aclTensor*>(acl_tables[1]), form.layout, mode);
  }

  const CannRuntime* rt_;
  RotaryOps ops_;
  AclnnOp<ApplyRotaryPosEmbV2GetWorkspace> apply_;
  RotaryAttributes attrs_;
};

template <bool kQK, Placement kPlacement>
void AppendRotaryOp(const char* name, CustomOpList& ops) {
  AppendPerType<AscendRotaryKernel<kQK, kPlacement>>(ops, [name](ONNXTensorElementDataType t) {
    return RotaryOpSpec(name, ExecutionProviderOf(kPlacement), t, kQK);
  });
}

template <Placement kPlacement>
void AppendAll(CustomOpList& ops) {
  AppendRotaryOp<false, kPlacement>("RotaryEmbedding", ops);
  AppendRotaryOp<true, kPlacement>("RotaryEmbeddingQK", ops);
}

}  // namespace

void AppendAscendRotaryOps(CustomOpList& ops, Placement placement) {
  if (placement == Placement::kCannEp) {
    AppendAll<Placement::kCannEp>(ops);
  } else {
    AppendAll<Placement::kCpuTestDouble>(ops);
  }
}

}  // namespace otfuse::ascend
