// Vectorised float32 math of the activation family (docs/ops.md, "Activation family"), written
// once with GCC vector extensions and compiled per CPU variant (activation_rows_<isa>.cc): 16
// lanes with AVX-512, 8 with AVX2 (both with FMA), 4 otherwise (no FMA: a*b+c rounded twice).
// The variants differ in those roundings, and float32 GELU-erf in the FMA variants takes a shorter
// path for |x| < 12.5 (GeluErfNarrow); the error bounds in docs/ops.md hold for each.
//
// The pieces (their float32 errors measured against float64 in tests/kernels/activation):
//   ExpParts(a, b)  e^(a+b) = m * 2^n: Cody-Waite reduction with ln2 in two parts, then a
//                   degree-6 polynomial on |r| <= ln2/2 fitted for relative error (1.9e-9).
//   Erfcx(z)        erfc(z) e^(z^2) / 2 = t P(t), t = 1 / (1 + z/2), P of degree 8 fitted for
//                   relative error on z in [0, 13.5] (4.6e-8).
//   TwoProduct      a * b = p + e exactly (FMA, or Dekker's splitting without it), so the
//                   arguments alpha*x and -x^2/2 reach the exponential without rounding.
// Each op has a fast path, taken when every lane of a vector is in the usual range, and an
// exact tail path (sigmoid arguments below -87, |x| >= 13 for the erf form) that applies the
// exponent last, in factors that are each normal: results down to the subnormal range keep
// their relative accuracy, infinite inputs give the limits, and nothing overflows.
//
// Everything here has internal linkage (static): one copy per ISA variant (see float_types.h).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

namespace otfuse::cpu {
namespace activation_math {

#if defined(__AVX512F__)
constexpr int kLanes = 16;
#elif defined(__AVX2__)
constexpr int kLanes = 8;
#else
constexpr int kLanes = 4;
#endif

// Inlined everywhere: a call per vector costs as much as the math (GCC would not inline the
// larger functions by itself).
#define OTFUSE_MATH_INLINE inline __attribute__((always_inline))

typedef float VF __attribute__((vector_size(kLanes * 4)));
typedef int32_t VI __attribute__((vector_size(kLanes * 4)));

static OTFUSE_MATH_INLINE VF Load(const float* p) {
  VF v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

static OTFUSE_MATH_INLINE void Store(float* p, VF v) { std::memcpy(p, &v, sizeof v); }

// value in every lane (by its bits: VF{} + value would turn -0 into +0).
static OTFUSE_MATH_INLINE VF Splat(float value) {
  int32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return (VF)(VI{} + bits);
}

static OTFUSE_MATH_INLINE VF Abs(VF v) { return (VF)((VI)v & 0x7fffffff); }

static OTFUSE_MATH_INLINE VF CopySign(VF magnitude, VF sign) {
  return (VF)(((VI)magnitude & 0x7fffffff) | ((VI)sign & (int32_t)0x80000000));
}

// a * b + c: one rounding with FMA hardware, two without.
static OTFUSE_MATH_INLINE VF Fma(VF a, VF b, VF c) {
#if defined(__AVX512F__)
  return _mm512_fmadd_ps(a, b, c);
#elif defined(__FMA__)
  return _mm256_fmadd_ps(a, b, c);
#else
  return a * b + c;
#endif
}

// a * b = p + e exactly (|a * b| below 2^100 and above 2^-100, else e is approximate).
static OTFUSE_MATH_INLINE void TwoProduct(VF a, VF b, VF* p, VF* e) {
  *p = a * b;
#if defined(__AVX512F__) || defined(__FMA__)
  *e = Fma(a, b, -*p);
#else
  const VF ca = a * 4097.0f, cb = b * 4097.0f;  // Dekker: split into 12-bit halves
  const VF ah = ca - (ca - a), bh = cb - (cb - b);
  const VF al = a - ah, bl = b - bh;
  const VF error = ((ah * bh - *p) + ah * bl + al * bh) + al * bl;
  // The split overflows for |a| or |b| above ~2^115 (inf - inf: NaN), even where the product is
  // exact (b = 0: QuickGelu's alpha = 0): e is then dropped, as approximate as the FMA's there.
  *e = Abs(error) < __builtin_inff() ? error : Splat(0.0f);
#endif
}

// Whether any lane of a comparison result is set.
static OTFUSE_MATH_INLINE bool AnyTrue(VI mask) {
#if defined(__AVX512F__)
  return _mm512_test_epi32_mask((__m512i)mask, (__m512i)mask) != 0;
#elif defined(__AVX__)
  return !_mm256_testz_si256((__m256i)mask, (__m256i)mask);
#elif defined(__SSE2__)
  return _mm_movemask_epi8((__m128i)mask) != 0;
#else
  int32_t lanes[kLanes];
  std::memcpy(lanes, &mask, sizeof lanes);
  int32_t any = 0;
  for (int i = 0; i < kLanes; ++i) any |= lanes[i];
  return any != 0;
#endif
}

// Whether every lane of a comparison result is set (one test, where ~mask first took two more).
static OTFUSE_MATH_INLINE bool AllTrue(VI mask) {
#if defined(__AVX512F__)
  return _mm512_cmpneq_epi32_mask((__m512i)mask, _mm512_set1_epi32(-1)) == 0;
#elif defined(__AVX__)
  return _mm256_testc_si256((__m256i)mask, _mm256_set1_epi32(-1));
#elif defined(__SSE2__)
  return _mm_movemask_epi8((__m128i)mask) == 0xffff;
#else
  return !AnyTrue(~mask);
#endif
}

// 2^k for integer lanes k in [-126, 127], built from the exponent bits.
static OTFUSE_MATH_INLINE VF Pow2(VI k) { return (VF)((k + 127) << 23); }

// v * 2^n for n in [-300, 0] in three normal factors: v is only rounded if the result is subnormal.
static OTFUSE_MATH_INLINE VF ScaleDown(VF v, VI n) {
  const VI n1 = n > -126 ? n : -126;
  const VI rest = n - n1;  // [-174, 0]
  const VI n2 = rest > -126 ? rest : -126;
  return v * Pow2(n1) * Pow2(n2) * Pow2(rest - n2);
}

// Lane-wise maximum; a NaN in `a` gives `b` (as MAXPS does).
static OTFUSE_MATH_INLINE VF Max(VF a, VF b) {
#if defined(__AVX512F__)
  return _mm512_max_ps(a, b);
#elif defined(__AVX__)
  return _mm256_max_ps(a, b);
#else
  return a > b ? a : b;
#endif
}

// Lane-wise minimum; a NaN in `a` gives `b` (as MINPS does).
static OTFUSE_MATH_INLINE VF Min(VF a, VF b) {
#if defined(__AVX512F__)
  return _mm512_min_ps(a, b);
#elif defined(__AVX__)
  return _mm256_min_ps(a, b);
#else
  return a < b ? a : b;
#endif
}

// The smallest exponent argument of the exact paths: e^-190 times the largest float is below
// 2^-126, so every result that would need a smaller argument is within the contract's absolute
// bound of 0. The fast paths stop at -87, where 2^n is still normal.
constexpr float kMinExpArg = -190.0f;
constexpr float kMinFastExpArg = -87.0f;

// e^(a + b) = m * 2^n, m within [0.7, 1.42]: a <= 88, raised to kMinArg when below it (or NaN;
// kMinArg = 0: the caller ensures a >= kMinExpArg); b a correction with |b| much smaller than 1
// (ignored for lanes that were raised).
template <int kMinArg>
static OTFUSE_MATH_INLINE void ExpParts(VF a, VF b, VF* m, VI* n) {
  if constexpr (kMinArg != 0) a = Max(a, Splat(static_cast<float>(kMinArg)));
  const float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const VF shifted = Fma(a, Splat(1.44269504088896341f), Splat(kRound));
  const VF k = shifted - kRound;
  // ln2 = kLn2Hi + kLn2Lo; kLn2Hi has 9 trailing zero bits, so k * kLn2Hi is exact for |k| < 512,
  // and a - k * kLn2Hi is exact too (the two are within a factor of 2).
  const VF r = Fma(k, Splat(-1.42860682030941723212e-6f), Fma(k, Splat(-0.693145751953125f), a)) + b;
  // Estrin's scheme: the dependency chain is 3 steps instead of Horner's 6.
  const VF r2 = r * r;
  const VF low = Fma(Fma(Splat(0.1666642129421234f), r, Splat(0.49999991059303284f)), r2, r + 1.0f);
  const VF high = Fma(Splat(0.0013836438301950693f), r2,
                      Fma(Splat(0.008374765515327454f), r, Splat(0.041668228805065155f)));
  *m = Fma(high, r2 * r2, low);
  *n = (VI)shifted - (VI)Splat(kRound);  // the integer k, from the low mantissa bits
}

// x * sigmoid(t), t = th + tl, for vectors whose every lane has t >= kMinFastExpArg (or NaN):
// x / (1 + e^-t), with e^-t <= e^87 and -t raised to -87 (where e^-t no longer counts next to 1).
static OTFUSE_MATH_INLINE VF TimesSigmoidFast(VF x, VF th, VF tl) {
  VF m;
  VI n;
  ExpParts<static_cast<int>(kMinFastExpArg)>(-th, -tl, &m, &n);
  return x / Fma(m, Pow2(n), Splat(1.0f));
}

// The same for any t: lanes with t < 0 compute x * e^t / (1 + e^t) with 2^n applied last, so
// tiny results stay accurate; an infinite x whose sigmoid goes to 0 gives the limit, a zero.
static OTFUSE_MATH_INLINE VF TimesSigmoidTail(VF x, VF th, VF tl) {
  const VI negative = th < 0.0f;
  VF m;
  VI n;
  ExpParts<static_cast<int>(kMinExpArg)>(-Abs(th), negative ? tl : -tl, &m, &n);  // e^-|t|
  const VF e = ScaleDown(m, n);
  const VF bounded = x < -__FLT_MAX__ ? Splat(-__FLT_MAX__) : x;  // -inf * e^t -> the limit 0
  const VF y = negative ? ScaleDown(bounded * m / (e + 1.0f), n) : x / (e + 1.0f);
  return (Abs(x) == __builtin_inff()) & negative ? CopySign(Splat(0.0f), x) : y;
}

static OTFUSE_MATH_INLINE VF TimesSigmoid(VF x, VF th, VF tl) {
  return AnyTrue(th < kMinFastExpArg) ? TimesSigmoidTail(x, th, tl) : TimesSigmoidFast(x, th, tl);
}

// SiLU: x * sigmoid(x).
static OTFUSE_MATH_INLINE VF Silu(VF x) { return TimesSigmoid(x, x, Splat(0.0f)); }

// QuickGELU: x * sigmoid(alpha * x), alpha * x = th + tl exactly.
static OTFUSE_MATH_INLINE VF QuickGelu(VF x, float alpha) {
  VF th, tl;
  TwoProduct(x, Splat(alpha), &th, &tl);
  // Past |t| = 190 (and for an alpha * x that overflows) the sigmoid is 0 or 1, which th alone
  // says; there tl may be large or NaN, and is dropped.
  return TimesSigmoid(x, th, Abs(th) < -kMinExpArg ? tl : Splat(0.0f));
}

// GELU, tanh form: 0.5 x (1 + tanh(u)) = x * sigmoid(t), t = 2u = 2 sqrt(2/pi) (x + 0.044715 x^3),
// t in float32 (relative error ~2^-22, which docs/ops.md's absolute term covers). Past |x| = 13.5
// the sigmoid is 0 or 1 to well below the contract's bound, so x is clamped there.
static OTFUSE_MATH_INLINE VF GeluTanh(VF x) {
  const VF c = Abs(x) < 13.5f ? x : CopySign(Splat(13.5f), x);
  const float kC1 = 1.5957691216057307f;    // 2 sqrt(2/pi)
  const float kC2 = 0.071354816272869261f;  // 2 sqrt(2/pi) * 0.044715
  return TimesSigmoid(x, c * Fma(c * c, Splat(kC2), Splat(kC1)), Splat(0.0f));
}

// erfc(z) e^(z^2) / 2 for z >= 0.
static OTFUSE_MATH_INLINE VF HalfErfcx(VF z) {
  const VF t = 1.0f / Fma(z, Splat(0.5f), Splat(1.0f));
  // Estrin's scheme (a 4-step dependency chain instead of 8).
  const VF t2 = t * t;
  const VF t4 = t2 * t2;
  const VF p01 = Fma(Splat(0.14120717346668243f), t, Splat(0.14104211330413818f));
  const VF p23 = Fma(Splat(0.10192139446735382f), t, Splat(0.12140779197216034f));
  const VF p45 = Fma(Splat(0.1410674899816513f), t, Splat(-0.014696660451591015f));
  const VF p67 = Fma(Splat(0.14316657185554504f), t, Splat(-0.24539920687675476f));
  const VF low = Fma(p23, t2, p01);
  const VF high = Fma(Fma(Splat(-0.029716698452830315f), t2, p67), t2, p45);
  const VF p = Fma(high, t4, low);
  return t * p;
}

// GELU, erf form: x * Phi(x). With h = erfc(|x|/sqrt2) / 2 = HalfErfcx(z) e^(-x^2/2) = h' 2^n:
// Phi = 1 - h for x >= 0 and Phi = h for x < 0 (nothing cancels for negative x); -x^2/2 is
// passed exactly. Past |x| = 19, Phi is 0 or 1 to well below the contract's bound.
static OTFUSE_MATH_INLINE VF GeluErfAnyRange(VF x) {
  const VF ax = Min(Abs(x), Splat(19.0f));  // NaN -> 19 (x carries the NaN)
  VF a, b;
  TwoProduct(ax, ax * -0.5f, &a, &b);  // -x^2/2 = a + b
  VF m;
  VI n;
  ExpParts<0>(a, b, &m, &n);
  const VF h = HalfErfcx(ax * 0.70710678118654752f) * m;  // times 2^n
  const VI negative = x < 0.0f;
  if (!AnyTrue(n < -126)) {  // |x| < 13.2 in every lane
    const VF scale = Pow2(n);
    return negative ? (x * h) * scale : Fma(-x, h * scale, x);  // x * h first: h * 2^n may be subnormal
  }
  // For x >= 0, h matters next to 1 only while 2^n >= 2^-126.
  const VF positive = x * (1.0f - h * Pow2(n > -126 ? n : -126));  // x * 1 for x = +inf
  const VF y = negative ? ScaleDown(x * h, n) : positive;
  return x == -__builtin_inff() ? Splat(-0.0f) : y;  // the limit
}

#if defined(__AVX512F__) || defined(__FMA__)
// The erf form for |x| < 12.5 in fewer instructions: the AVX2 loop takes 46 a vector where it
// took 59 with GeluErfAnyRange alone (objdump, loop included), and was bound by them, not by
// memory. The same factors in fewer steps: e^(-x^2/2) = 2^(-x^2 C), C = log2(e)/2, reduced in
// base 2 (k = round(-x^2 C), f = -x^2 C - k by FMAs that round once, C in two parts, x^2 = p + e
// exactly), 2^f by a degree-6 polynomial fitted for relative error on |f| <= 1/2 (1.6e-8 with
// float32 coefficients), the exponent bias folded into the rounding constant so that 2^k is the
// shifted integer's low bits; HalfErfcx's polynomial, and both by Horner's rule (fewer
// instructions than Estrin's; the loop has vectors enough in flight to hide the longer chains).
// h = erfc(|x|/sqrt2)/2 stays normal (>= 2^-119), and Y = max(0, x) - |x| h: x (1 - h) for
// x >= 0, x h for x < 0, in one FMA with no select.
static OTFUSE_MATH_INLINE VF GeluErfNarrow(VF x) {
  const VF ax = Abs(x);
  const VF p = x * x;
  const VF e = Fma(x, x, -p);
  const float kC = 0.72134752044448170f, kCLo = 9.6298148e-09f;  // log2(e)/2 = kC + kCLo
  const float kRoundBias = 12582912.0f + 127.0f;                       // 1.5 * 2^23 + the bias
  const VF shifted = Fma(p, Splat(-kC), Splat(kRoundBias));
  const VF k = shifted - kRoundBias;
  const VF f = Fma(e, Splat(-kC), Fma(p, Splat(-kCLo), Fma(p, Splat(-kC), -k)));
  VF m = Fma(Splat(0.0001534580806037411f), f, Splat(0.0013399930903688073f));
  m = Fma(m, f, Splat(0.009618489071726799f));
  m = Fma(m, f, Splat(0.05550328642129898f));
  m = Fma(m, f, Splat(0.24022646248340607f));
  m = Fma(m, f, Splat(0.6931471824645996f));
  m = Fma(m, f, Splat(1.0f));
  const VF scale = (VF)((VI)shifted << 23);  // 2^k, k + 127 in [14, 127]
  // HalfErfcx(|x| / sqrt2) with 1 + z/2 = 1 + |x| / (2 sqrt2).
  const VF t = 1.0f / Fma(ax, Splat(0.35355339059327376f), Splat(1.0f));
  VF q = Fma(Splat(-0.029716698452830315f), t, Splat(0.14316657185554504f));
  q = Fma(q, t, Splat(-0.24539920687675476f));
  q = Fma(q, t, Splat(0.1410674899816513f));
  q = Fma(q, t, Splat(-0.014696660451591015f));
  q = Fma(q, t, Splat(0.10192139446735382f));
  q = Fma(q, t, Splat(0.12140779197216034f));
  q = Fma(q, t, Splat(0.14120717346668243f));
  q = Fma(q, t, Splat(0.14104211330413818f));
  const VF h = ((t * q) * m) * scale;
  return Fma(-ax, h, Max(Splat(0.0f), x));  // Max(0, -0) is -0: GELU(-0) = -0
}

// Every lane with |x| < 12.5 (the usual case) takes the narrow math; a vector with a wider lane
// or a NaN takes GeluErfAnyRange for those lanes only, so a result never depends on its neighbours.
static OTFUSE_MATH_INLINE VF GeluErf(VF x) {
  const VI narrow = Abs(x) < 12.5f;
  if (AllTrue(narrow)) return GeluErfNarrow(x);
  return narrow ? GeluErfNarrow(narrow ? x : Splat(0.0f)) : GeluErfAnyRange(x);
}
#else
static OTFUSE_MATH_INLINE VF GeluErf(VF x) { return GeluErfAnyRange(x); }
#endif


// ReluSquared: max(x, 0)^2, one rounding of the product (and none before it: the float16 and
// bfloat16 rows' squares are exact in float32, so their one rounding is to T). Max(0, x) keeps a
// NaN x (MAXPS returns its second operand when either is NaN); -0 and every x < 0 give +0.
static OTFUSE_MATH_INLINE VF ReluSquared(VF x) {
  const VF r = Max(Splat(0.0f), x);
  return r * r;
}

// ---- float16 results (activation_rows.inc takes these for float16 rows) ----
// A float16 result is rounded to 11 bits, and float16 inputs are at most 65504 with 11-bit
// mantissas: the math below is accurate to ~2^-17 (docs/ops.md states the bounds; the tests check
// every float16 value), with lower-degree polynomials, a reciprocal in place of the division
// (AVX-512's divider is ~10 cycles a vector, most of SiLU's time) and no exact tail: every result
// the tails keep accurate in float32 is below float16's smallest subnormal.

// 2^(a * scale) for a * scale in [-125, 125] (callers clamp): a * scale = k + f, |f| <= 1/2, 2^f by
// a degree-4 polynomial fitted for relative error (2.6e-6). The product is never rounded on its
// own: one FMA adds it to 1.5 * 2^23 + 127 (rounding it to the integer k, whose exponent bits k +
// 127 are then the low mantissa bits) and another gives f = a * scale - k: 4 instructions besides
// the polynomial where a multiply, a rounding, a subtraction and the rebuilt exponent took 5-7.
static OTFUSE_MATH_INLINE VF Exp2Half(VF a, float scale) {
  const float kRoundBias = 12582912.0f + 127.0f;  // shifted = 1.5 * 2^23 + 127 + k, exactly
  const VF shifted = Fma(a, Splat(scale), Splat(kRoundBias));
  const VF k = shifted - kRoundBias;
  const VF f = Fma(a, Splat(scale), -k);
  const VF f2 = f * f;
  const VF low = Fma(Splat(0.6931217908859253f), f, Splat(0.9999992847442627f));
  const VF high = Fma(Fma(Splat(0.009570079855620861f), f, Splat(0.05591783672571182f)), f, Splat(0.240247443318367f));
  const VF p = Fma(high, f2, low);
#if defined(__AVX512F__)
  return _mm512_scalef_ps(p, k);
#else
  return p * (VF)((VI)shifted << 23);  // the low 9 mantissa bits k + 127 (in [2, 252]) into the exponent
#endif
}

// x / d for normal d. With AVX-512, the reciprocal estimate (relative error 2^-14) and one Newton
// step (~2^-22): the divider takes ~10 cycles a 16-lane vector, most of SiLU's time. Narrower
// dividers are fast enough (AVX2: ~5 cycles for 8 lanes, hidden behind the other work).
static OTFUSE_MATH_INLINE VF Divide(VF x, VF d) {
#if defined(__AVX512F__)
  const VF r = _mm512_rcp14_ps(d);
  return x * Fma(Fma(-d, r, Splat(1.0f)), r, r);
#else
  return x / d;
#endif
}

// x * sigmoid(t) = x / (1 + 2^(-t log2 e)). Below t = -80 the sigmoid is under 2e-35 and every
// float16 x times it rounds to a zero of x's sign; 2^-100 stands for it (a tiny value, not 0, so
// that a gated product with an infinite up gives the limit, not NaN).
static OTFUSE_MATH_INLINE VF TimesSigmoidHalf(VF x, VF t) {
  const VF c = Min(Max(t, Splat(-86.0f)), Splat(86.0f));  // |t log2 e| < 125; a NaN t gives -86 (x carries it)
  const VF y = Divide(x, Exp2Half(c, -1.44269504088896341f) + 1.0f);
  return t < -80.0f ? CopySign(Splat(0x1p-100f), x) : y;
}

static OTFUSE_MATH_INLINE VF SiluHalf(VF x) { return TimesSigmoidHalf(x, x); }

static OTFUSE_MATH_INLINE VF QuickGeluHalf(VF x, float alpha) { return TimesSigmoidHalf(x, x * alpha); }

// t = 2 sqrt(2/pi) (x + 0.044715 x^3) has no overflow for |x| <= 65504 (x^3 < 2^48).
static OTFUSE_MATH_INLINE VF GeluTanhHalf(VF x) {
  const float kC1 = 1.5957691216057307f;    // 2 sqrt(2/pi)
  const float kC2 = 0.071354816272869261f;  // 2 sqrt(2/pi) * 0.044715
  return TimesSigmoidHalf(x, x * Fma(x * x, Splat(kC2), Splat(kC1)));
}

// x * Phi(x) with h = erfc(|x|/sqrt2) / 2 = t Q(t) e^(-x^2/2), t = 1 / (1 + 0.3 |x|), Q of degree
// 5 fitted for relative error on |x| in [0, 7.5] (1.6e-6). x^2 is exact for float16 x. Past
// |x| = 7.5, h < 4e-14: x * h rounds to a float16 zero and x * (1 - h) to x, so |x| is clamped
// in h, and x below -7.5.
static OTFUSE_MATH_INLINE VF GeluErfHalf(VF x) {
  const VF ax = Min(Abs(x), Splat(7.5f));  // NaN -> 7.5 (x carries the NaN)
  const VF e = Exp2Half(ax * ax, -0.72134752044448170f);  // e^(-x^2/2), exponent in [-41, 0]
  const VF t = Divide(Splat(1.0f), Fma(ax, Splat(0.3f), Splat(1.0f)));
  const VF t2 = t * t;
  const VF q01 = Fma(Splat(0.11072283983230591f), t, Splat(0.12037979066371918f));
  const VF q23 = Fma(Splat(-0.03706541657447815f), t, Splat(0.15550397336483002f));
  const VF q45 = Fma(Splat(-0.08264702558517456f), t, Splat(0.23310504853725433f));
  const VF q = Fma(Fma(q45, t2, q23), t2, q01);
  const VF h = (t * q) * e;
  const VF cx = Max(Splat(-7.5f), x);  // -inf -> -7.5, so its result is the limit -0; NaN stays
  return cx * (x < 0.0f ? h : 1.0f - h);
}

}  // namespace activation_math
}  // namespace otfuse::cpu
