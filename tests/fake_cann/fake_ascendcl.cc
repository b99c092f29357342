// TEST DOUBLE — NOT CANN. A CPU stand-in for the few CANN runtime / aclnn entry points otfuse's
// Ascend kernels call (kernels/ascend/), built by the test suite as libfake_ascendcl.so and
// reached through symlinks named like the real libraries (libascendcl.so, libnnopbase.so,
// libopapi.so). "Device" memory is host memory, the stream is ignored, everything runs at once.
//
// It implements what CANN's documentation says each call does and refuses what it says each
// call refuses (argument checks return the documented status codes; aclGetRecentErrMsg returns
// the reason), so a backend that passes the wrong shape, dtype or null pointer fails here as it
// would on hardware. Numerics follow the documented formulas in float32; where a document is
// silent on rounding (the residual sums of AddRmsNorm / AddLayerNorm) it rounds the sum to the
// input type before normalising, as otfuse's contract (docs/ops.md) does.
//
// For the tests:
//   OTFUSE_FAKE_CANN_LOG=<file>  appends one JSON object per call (function, shapes, dtypes,
//                                attributes, workspace sizes, stream);
//   OTFUSE_FAKE_CANN_FAIL=<function>=<status>[:<message>]  makes that function fail with that
//                                status (and message, for aclGetRecentErrMsg);
//   OTFUSE_FAKE_CANN_SOC=<name>  what aclrtGetSocName returns (default Ascend910B3, an Atlas A2).
// It exports otfuse_fake_cann_runtime(), by which otfuse recognises it: the Ascend kernels refuse
// to run on it under the real CANN EP, and the CPU "fake mode" refuses anything else.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#define EXPORT extern "C" __attribute__((visibility("default")))

namespace {

using Status = int32_t;
constexpr Status kOk = 0;
constexpr Status kNullptr = 161001;  // ACLNN_ERR_PARAM_NULLPTR
constexpr Status kInvalid = 161002;  // ACLNN_ERR_PARAM_INVALID
constexpr Status kInner = 561000;    // ACLNN_ERR_INNER

enum DType : int32_t { kF32 = 0, kF16 = 1, kI64 = 9, kBF16 = 27 };

}  // namespace

struct aclTensor {
  std::vector<int64_t> dims, strides, storage;
  int64_t offset = 0;
  int32_t dtype = -1, format = -1;
  void* data = nullptr;
};
struct aclIntArray {
  std::vector<int64_t> values;
};
struct aclOpExecutor {
  std::string name;  // the phase-two function that must run it
  uint64_t workspace_size = 0;
  std::function<void()> run;
};

namespace {

std::mutex g_mutex;
std::set<const aclTensor*> g_tensors;
std::set<const aclIntArray*> g_arrays;
thread_local std::string t_error;     // pending error description
thread_local std::string t_returned;  // what the last aclGetRecentErrMsg handed out

// ------------------------------------------------------------------ logging & failure injection

std::string Json(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string Json(const std::vector<int64_t>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + std::to_string(v[i]);
  return out + "]";
}

const char* DTypeName(int32_t dtype) {
  switch (dtype) {
    case kF32: return "float32";
    case kF16: return "float16";
    case kBF16: return "bfloat16";
    case kI64: return "int64";
    default: return "unsupported";
  }
}

std::string Json(const aclTensor* t) {
  if (t == nullptr) return "null";
  return "{\"shape\":" + Json(t->dims) + ",\"dtype\":\"" + DTypeName(t->dtype) + "\"}";
}

std::string Json(double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.17g", value);
  return buffer;
}

std::string StreamText(const void* stream) {
  char text[32];
  std::snprintf(text, sizeof text, "0x%llx", static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(stream)));
  return Json(std::string(text));
}

void Log(const std::string& fn, const std::string& fields) {
  const char* path = std::getenv("OTFUSE_FAKE_CANN_LOG");
  if (path == nullptr || *path == '\0') return;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (FILE* f = std::fopen(path, "a")) {
    std::fprintf(f, "{\"fn\":%s%s%s}\n", Json(fn).c_str(), fields.empty() ? "" : ",", fields.c_str());
    std::fclose(f);
  }
}

// OTFUSE_FAKE_CANN_FAIL=<fn>=<status>[:<message>]: the status to fail `fn` with, or 0.
Status Injected(const char* fn) {
  const char* spec = std::getenv("OTFUSE_FAKE_CANN_FAIL");
  if (spec == nullptr) return kOk;
  const std::string text(spec);
  const size_t eq = text.find('=');
  if (eq == std::string::npos || text.compare(0, eq, fn) != 0) return kOk;
  const size_t colon = text.find(':', eq);
  const Status status = std::atoi(text.substr(eq + 1, colon - eq - 1).c_str());
  t_error = colon == std::string::npos ? std::string("injected failure") : text.substr(colon + 1);
  return status;
}

Status Fail(Status status, const std::string& message) {
  t_error = "[fake CANN] " + message;
  return status;
}

// ------------------------------------------------------------------ element access

float HalfToFloat(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  int exponent = (h >> 10) & 0x1f;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {  // subnormal: value = mantissa * 2^-24
      float value = std::ldexp(static_cast<float>(mantissa), -24);
      std::memcpy(&bits, &value, 4);
      bits |= sign;
    }
  } else {
    bits = sign | static_cast<uint32_t>(exponent - 15 + 127) << 23 | (mantissa << 13);
  }
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

uint16_t FloatToHalf(float f) {  // round to nearest even, via double arithmetic on the magnitude
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  if (std::isnan(f)) return sign | 0x7e00u;
  const double a = std::fabs(static_cast<double>(f));
  if (a >= 65520.0) return sign | 0x7c00u;  // rounds to infinity
  if (a < std::ldexp(1.0, -14)) {           // subnormal range: multiples of 2^-24
    const double q = std::nearbyint(a * std::ldexp(1.0, 24));  // default rounding: to even
    return sign | static_cast<uint16_t>(q);
  }
  int e;
  const double m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  double q = std::nearbyint(m * 2048.0);  // 11 significant bits
  if (q == 2048.0) {
    q = 1024.0;
    ++e;
  }
  if (e - 1 > 15) return sign | 0x7c00u;
  return sign | static_cast<uint16_t>((e - 1 + 15) << 10) | static_cast<uint16_t>(static_cast<uint32_t>(q) - 1024);
}

float BF16ToFloat(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

uint16_t FloatToBF16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if (std::isnan(f)) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

// The element at flat logical index `i` (row-major over dims), honouring strides and offset.
int64_t Offset(const aclTensor* t, int64_t i) {
  int64_t offset = t->offset;
  for (size_t d = t->dims.size(); d-- > 0;) {
    offset += (i % t->dims[d]) * t->strides[d];
    i /= t->dims[d];
  }
  return offset;
}

float Load(const aclTensor* t, int64_t i) {
  const int64_t at = Offset(t, i);
  switch (t->dtype) {
    case kF32: return static_cast<const float*>(t->data)[at];
    case kF16: return HalfToFloat(static_cast<const uint16_t*>(t->data)[at]);
    default: return BF16ToFloat(static_cast<const uint16_t*>(t->data)[at]);
  }
}

void Store(const aclTensor* t, int64_t i, float value) {
  const int64_t at = Offset(t, i);
  switch (t->dtype) {
    case kF32: static_cast<float*>(t->data)[at] = value; break;
    case kF16: static_cast<uint16_t*>(t->data)[at] = FloatToHalf(value); break;
    default: static_cast<uint16_t*>(t->data)[at] = FloatToBF16(value); break;
  }
}

float RoundTo(int32_t dtype, float value) {
  if (dtype == kF16) return HalfToFloat(FloatToHalf(value));
  if (dtype == kBF16) return BF16ToFloat(FloatToBF16(value));
  return value;
}

int64_t Count(const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

// ------------------------------------------------------------------ argument checks

bool Floating(int32_t dtype) { return dtype == kF32 || dtype == kF16 || dtype == kBF16; }

std::string Shape(const std::vector<int64_t>& dims) { return Json(dims); }

Status CheckLive(const aclTensor* t, const char* name) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (t != nullptr && g_tensors.count(t) == 0) {
    t_error = std::string("[fake CANN] ") + name + " is not a live aclTensor (destroyed or never created)";
    return kInvalid;
  }
  return kOk;
}

// Every tensor argument: live, ND, floating (unless int), rank 1-8, data present.
Status CheckTensor(const aclTensor* t, const char* name, bool required) {
  if (t == nullptr) {
    return required ? Fail(kNullptr, std::string("Expected a proper Tensor but got null for argument ") + name)
                    : kOk;
  }
  if (Status s = CheckLive(t, name)) return s;
  if (t->format != 2) return Fail(kInvalid, std::string(name) + " must be ND (format 2)");
  if (!Floating(t->dtype)) return Fail(kInvalid, std::string(name) + " has unsupported dtype " + DTypeName(t->dtype));
  if (t->dims.empty() || t->dims.size() > 8) {
    return Fail(kInvalid, std::string(name) + " must have 1 to 8 dimensions, got " + Shape(t->dims));
  }
  if (t->data == nullptr && Count(t->dims) > 0) return Fail(kNullptr, std::string(name) + " has no data");
  return kOk;
}

Status SameShape(const aclTensor* a, const char* an, const aclTensor* b, const char* bn) {
  if (a->dims != b->dims) {
    return Fail(kInvalid, std::string(bn) + " shape " + Shape(b->dims) + " must equal " + an + " shape " +
                              Shape(a->dims));
  }
  return kOk;
}

Status SameType(const aclTensor* a, const char* an, const aclTensor* b, const char* bn) {
  if (a->dtype != b->dtype) {
    return Fail(kInvalid, std::string(bn) + " dtype " + DTypeName(b->dtype) + " must equal " + an + " dtype " +
                              DTypeName(a->dtype));
  }
  return kOk;
}

// gamma_shape = x_shape[n:], n < x.rank; returns n through `lead`.
Status TrailingShape(const aclTensor* x, const char* xn, const std::vector<int64_t>& trailing, const char* what,
                     size_t* lead) {
  if (trailing.empty() || trailing.size() > x->dims.size() ||
      !std::equal(trailing.begin(), trailing.end(), x->dims.end() - trailing.size())) {
    return Fail(kInvalid, std::string(what) + " " + Shape(trailing) + " must equal the trailing dims of " + xn +
                              " " + Shape(x->dims));
  }
  *lead = x->dims.size() - trailing.size();
  return kOk;
}

// rstd / mean: x.shape[:lead] followed by ones, float32 unless `dtype` says otherwise.
Status StatShape(const aclTensor* x, size_t lead, const aclTensor* stat, const char* name, int32_t dtype) {
  std::vector<int64_t> expected = x->dims;
  for (size_t i = lead; i < expected.size(); ++i) expected[i] = 1;
  if (stat->dims != expected) {
    return Fail(kInvalid, std::string(name) + " shape " + Shape(stat->dims) + " must be " + Shape(expected));
  }
  if (stat->dtype != dtype) {
    return Fail(kInvalid, std::string(name) + " dtype " + DTypeName(stat->dtype) + " must be " + DTypeName(dtype));
  }
  return kOk;
}

// Weight dtype rules of the A2/A3 tables: the input's type, or float32 for float16/bfloat16 input.
Status WeightType(const aclTensor* x, const aclTensor* w, const char* name) {
  if (w->dtype == x->dtype || (w->dtype == kF32 && (x->dtype == kF16 || x->dtype == kBF16))) return kOk;
  return Fail(kInvalid, std::string(name) + " dtype " + DTypeName(w->dtype) + " is not supported with input dtype " +
                            DTypeName(x->dtype));
}

uint64_t WorkspaceFor(int64_t rows) { return 512 + 8 * static_cast<uint64_t>(rows); }

aclOpExecutor* NewExecutor(const char* name, uint64_t workspace, std::function<void()> run) {
  return new aclOpExecutor{name, workspace, std::move(run)};
}

Status Execute(const char* name, void* workspace, uint64_t workspace_size, aclOpExecutor* executor, void* stream) {
  Log(name, "\"workspace_size\":" + std::to_string(workspace_size) + ",\"workspace\":" +
                (workspace ? "true" : "false") + ",\"stream\":" + StreamText(stream));
  if (Status s = Injected(name)) {
    delete executor;
    return s;
  }
  if (executor == nullptr) return Fail(kNullptr, std::string(name) + ": executor is null");
  if (executor->name != name) {
    const std::string expected = executor->name;
    delete executor;
    return Fail(kInner, std::string(name) + " was given the executor of " + expected);
  }
  if (workspace_size != executor->workspace_size || (workspace_size > 0 && workspace == nullptr)) {
    const std::string message = std::string(name) + ": workspace of " + std::to_string(workspace_size) +
                                " bytes at " + (workspace ? "non-null" : "null") + ", phase one asked for " +
                                std::to_string(executor->workspace_size);
    delete executor;
    return Fail(kInner, message);
  }
  if (workspace_size > 0) std::memset(workspace, 0xA5, workspace_size);  // touch every byte we asked for
  executor->run();
  delete executor;
  return kOk;
}

// Runs phase one's checks and logs the call once, with its arguments, status and workspace size.
Status Logged(const char* fn, const std::string& fields, const uint64_t* workspace_size,
              const std::function<Status()>& body) {
  const Status status = body();
  Log(fn, fields + ",\"status\":" + std::to_string(status) +
      (status == kOk ? ",\"workspace_size\":" + std::to_string(*workspace_size) : std::string()));
  return status;
}

Status Begin(const char* fn, uint64_t* workspace_size, aclOpExecutor** executor) {
  if (workspace_size == nullptr || executor == nullptr) return Fail(kNullptr, std::string(fn) + ": null out-pointer");
  return Injected(fn);
}

// ------------------------------------------------------------------ the norm math

// y = (x - mean?) * rstd * gamma (+ beta) over rows of length d; writes rstd/mean when given.
void NormRows(const aclTensor* x, const aclTensor* gamma, const aclTensor* beta, double eps, bool center,
              const aclTensor* y, const aclTensor* mean_out, const aclTensor* rstd_out, int64_t rows, int64_t d,
              const std::vector<float>* x_values = nullptr) {
  std::vector<float> row(static_cast<size_t>(d));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < d; ++i) row[i] = x_values ? (*x_values)[r * d + i] : Load(x, r * d + i);
    double mean = 0.0;
    if (center) {
      for (float v : row) mean += v;
      mean /= static_cast<double>(d);
    }
    double sq = 0.0;
    for (float v : row) sq += (v - mean) * (v - mean);
    const double rstd = 1.0 / std::sqrt(sq / static_cast<double>(d) + eps);
    for (int64_t i = 0; i < d; ++i) {
      double v = (row[i] - mean) * rstd;
      v *= gamma ? Load(gamma, i) : 1.0f;
      if (beta) v += Load(beta, i);
      Store(y, r * d + i, static_cast<float>(v));
    }
    if (mean_out) Store(mean_out, r, static_cast<float>(mean));
    if (rstd_out) Store(rstd_out, r, static_cast<float>(rstd));
  }
}

// x1 + x2 (+ bias broadcast over rows) rounded to the input type; also stored to x_out.
std::vector<float> ResidualSum(const aclTensor* x1, const aclTensor* x2, const aclTensor* bias, const aclTensor* x_out,
                               int64_t rows, int64_t d) {
  std::vector<float> sum(static_cast<size_t>(rows * d));
  const bool bias_full = bias && Count(bias->dims) == rows * d;
  for (int64_t i = 0; i < rows * d; ++i) {
    float v = Load(x1, i) + Load(x2, i);
    if (bias) v += Load(bias, bias_full ? i : i % d);
    sum[i] = RoundTo(x1->dtype, v);
    if (x_out) Store(x_out, i, sum[i]);
  }
  return sum;
}

}  // namespace

// ================================================================== exported entry points

#ifndef OTFUSE_FAKE_CANN_UNMARKED  // the unmarked build poses as a real CANN runtime (refusal tests)
EXPORT const char* otfuse_fake_cann_runtime() { return "otfuse CPU test double of the CANN runtime (not CANN)"; }
#endif

EXPORT const char* aclGetRecentErrMsg() {
  if (t_error.empty()) return nullptr;
  t_returned = t_error;  // "gets and clears": the pointer stays valid until the next call
  t_error.clear();
  return t_returned.c_str();
}

EXPORT aclTensor* aclCreateTensor(const int64_t* view_dims, uint64_t view_dims_num, int32_t data_type,
                                  const int64_t* stride, int64_t offset, int32_t format, const int64_t* storage_dims,
                                  uint64_t storage_dims_num, void* tensor_data) {
  auto* t = new aclTensor;
  t->dims.assign(view_dims, view_dims + view_dims_num);
  t->strides.assign(stride, stride + view_dims_num);
  t->storage.assign(storage_dims, storage_dims + storage_dims_num);
  t->offset = offset;
  t->dtype = data_type;
  t->format = format;
  t->data = tensor_data;
  Log("aclCreateTensor", "\"shape\":" + Json(t->dims) + ",\"strides\":" + Json(t->strides) + ",\"storage\":" +
                             Json(t->storage) + ",\"offset\":" + std::to_string(offset) + ",\"dtype\":\"" +
                             DTypeName(data_type) + "\",\"format\":" + std::to_string(format) + ",\"data\":" +
                             (tensor_data ? "true" : "false"));
  bool bad = Injected("aclCreateTensor") != kOk || offset < 0;
  for (uint64_t i = 0; i < view_dims_num; ++i) bad |= view_dims[i] < 0 || stride[i] < 0;
  if (bad) {
    if (t_error.empty()) t_error = "[fake CANN] aclCreateTensor: negative dim, stride or offset";
    delete t;
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  g_tensors.insert(t);
  return t;
}

EXPORT Status aclDestroyTensor(const aclTensor* tensor) {
  Log("aclDestroyTensor", "\"shape\":" + (tensor ? Json(tensor->dims) : std::string("null")));
  std::lock_guard<std::mutex> lock(g_mutex);
  if (tensor == nullptr || g_tensors.erase(tensor) == 0) {
    t_error = "[fake CANN] aclDestroyTensor: not a live aclTensor";
    return kInvalid;
  }
  delete tensor;
  return kOk;
}

EXPORT aclIntArray* aclCreateIntArray(const int64_t* value, uint64_t size) {
  auto* array = new aclIntArray{std::vector<int64_t>(value, value + size)};
  Log("aclCreateIntArray", "\"values\":" + Json(array->values));
  std::lock_guard<std::mutex> lock(g_mutex);
  g_arrays.insert(array);
  return array;
}

EXPORT Status aclDestroyIntArray(const aclIntArray* array) {
  Log("aclDestroyIntArray", "");
  std::lock_guard<std::mutex> lock(g_mutex);
  if (array == nullptr || g_arrays.erase(array) == 0) return kInvalid;
  delete array;
  return kOk;
}

// The SoC it claims to be: $OTFUSE_FAKE_CANN_SOC, else an Atlas A2 ("Ascend910B3").
EXPORT const char* aclrtGetSocName() {
  static thread_local std::string name;
  const char* soc = std::getenv("OTFUSE_FAKE_CANN_SOC");
  name = soc != nullptr && *soc ? soc : "Ascend910B3";
  return name.c_str();
}

EXPORT int aclrtMalloc(void** dev_ptr, size_t size, int32_t policy) {
  Log("aclrtMalloc", "\"size\":" + std::to_string(size) + ",\"policy\":" + std::to_string(policy));
  if (Status s = Injected("aclrtMalloc")) return s;
  if (dev_ptr == nullptr || size == 0) return Fail(100000, "aclrtMalloc: null pointer or size 0");
  *dev_ptr = std::malloc(size);
  return *dev_ptr ? 0 : 207001;
}

EXPORT int aclrtFree(void* dev_ptr) {
  Log("aclrtFree", "");
  std::free(dev_ptr);
  return 0;
}

EXPORT int aclrtSynchronizeStream(void* stream) {
  Log("aclrtSynchronizeStream", "\"stream\":" + StreamText(stream));
  return 0;
}

EXPORT int aclrtMemsetAsync(void* dev_ptr, size_t max_count, int32_t value, size_t count, void* stream) {
  Log("aclrtMemsetAsync", "\"max_count\":" + std::to_string(max_count) + ",\"value\":" + std::to_string(value) +
                              ",\"count\":" + std::to_string(count) + ",\"stream\":" + StreamText(stream));
  if (Status s = Injected("aclrtMemsetAsync")) return s;
  if (dev_ptr == nullptr || count > max_count) return Fail(100000, "aclrtMemsetAsync: bad pointer or count");
  std::memset(dev_ptr, value, count);
  return 0;
}

// ------------------------------------------------------------------ aclnnRmsNorm
// hicann/ops-nn norm/rms_norm/docs/aclnnRmsNorm_en.md

EXPORT Status aclnnRmsNormGetWorkspaceSize(const aclTensor* x, const aclTensor* gamma, double epsilon,
                                           const aclTensor* y_out, const aclTensor* rstd_out,
                                           uint64_t* workspace_size, aclOpExecutor** executor) {
  const char* fn = "aclnnRmsNormGetWorkspaceSize";
  const std::string fields = "\"x\":" + Json(x) + ",\"gamma\":" + Json(gamma) + ",\"epsilon\":" + Json(epsilon) +
      ",\"yOut\":" + Json(y_out) + ",\"rstdOut\":" + Json(rstd_out);
  return Logged(fn, fields, workspace_size, [&]() -> Status {
    if (Status s = Begin(fn, workspace_size, executor)) return s;
    for (auto [t, name] : {std::pair{x, "x"}, {gamma, "gamma"}, {y_out, "yOut"}, {rstd_out, "rstdOut"}}) {
      if (Status s = CheckTensor(t, name, true)) return s;
    }
    size_t lead = 0;
    if (Status s = TrailingShape(x, "x", gamma->dims, "gamma shape", &lead)) return s;
    if (Status s = WeightType(x, gamma, "gamma")) return s;
    if (Status s = SameShape(x, "x", y_out, "yOut")) return s;
    if (Status s = SameType(x, "x", y_out, "yOut")) return s;
    if (Status s = StatShape(x, lead, rstd_out, "rstdOut", kF32)) return s;
    const int64_t rows = Count(std::vector<int64_t>(x->dims.begin(), x->dims.begin() + lead));
    const int64_t d = Count(gamma->dims);
    *workspace_size = WorkspaceFor(rows);
    *executor = NewExecutor("aclnnRmsNorm", *workspace_size, [=] {
      NormRows(x, gamma, nullptr, epsilon, false, y_out, nullptr, rstd_out, rows, d);
    });
    return kOk;
  });
}

EXPORT Status aclnnRmsNorm(void* workspace, uint64_t workspace_size, aclOpExecutor* executor, void* stream) {
  return Execute("aclnnRmsNorm", workspace, workspace_size, executor, stream);
}

// ------------------------------------------------------------------ aclnnAddRmsNorm
// hicann/ops-nn norm/add_rms_norm/docs/aclnnAddRmsNorm_en.md

EXPORT Status aclnnAddRmsNormGetWorkspaceSize(const aclTensor* x1, const aclTensor* x2, const aclTensor* gamma,
                                              double epsilon, aclTensor* y_out, aclTensor* rstd_out,
                                              aclTensor* x_out, uint64_t* workspace_size,
                                              aclOpExecutor** executor) {
  const char* fn = "aclnnAddRmsNormGetWorkspaceSize";
  const std::string fields = "\"x1\":" + Json(x1) + ",\"x2\":" + Json(x2) + ",\"gamma\":" + Json(gamma) +
      ",\"epsilon\":" + Json(epsilon) + ",\"yOut\":" + Json(y_out) + ",\"rstdOut\":" + Json(rstd_out) + ",\"xOut\":" +
      Json(x_out);
  return Logged(fn, fields, workspace_size, [&]() -> Status {
    if (Status s = Begin(fn, workspace_size, executor)) return s;
    for (auto [t, name] : {std::pair{x1, "x1"}, {x2, "x2"}, {gamma, "gamma"}, {y_out, "yOut"}}) {
      if (Status s = CheckTensor(t, name, true)) return s;
    }
    if (rstd_out != nullptr && x_out == nullptr) {
      return Fail(kNullptr, "When the preset value of rstdOut is not nullptr, the preset value of xOut is nullptr");
    }
    if (Status s = CheckTensor(rstd_out, "rstdOut", false)) return s;
    if (Status s = CheckTensor(x_out, "xOut", false)) return s;
    size_t lead = 0;
    if (Status s = SameShape(x1, "x1", x2, "x2")) return s;
    if (Status s = SameType(x1, "x1", x2, "x2")) return s;
    if (Status s = SameType(x1, "x1", gamma, "gamma")) return s;  // "must be the same as that of x1"
    if (Status s = TrailingShape(x1, "x1", gamma->dims, "gamma shape", &lead)) return s;
    if (Status s = SameShape(x1, "x1", y_out, "yOut")) return s;
    if (Status s = SameType(x1, "x1", y_out, "yOut")) return s;
    if (x_out) {
      if (Status s = SameShape(x1, "x1", x_out, "xOut")) return s;
      if (Status s = SameType(x1, "x1", x_out, "xOut")) return s;
    }
    if (rstd_out) {
      if (Status s = StatShape(x1, lead, rstd_out, "rstdOut", kF32)) return s;
    }
    const int64_t rows = Count(std::vector<int64_t>(x1->dims.begin(), x1->dims.begin() + lead));
    const int64_t d = Count(gamma->dims);
    *workspace_size = WorkspaceFor(rows);
    *executor = NewExecutor("aclnnAddRmsNorm", *workspace_size, [=] {
      const std::vector<float> sum = ResidualSum(x1, x2, nullptr, x_out, rows, d);
      NormRows(x1, gamma, nullptr, epsilon, false, y_out, nullptr, rstd_out, rows, d, &sum);
    });
    return kOk;
  });
}

EXPORT Status aclnnAddRmsNorm(void* workspace, uint64_t workspace_size, aclOpExecutor* executor, void* stream) {
  return Execute("aclnnAddRmsNorm", workspace, workspace_size, executor, stream);
}

// ------------------------------------------------------------------ aclnnLayerNorm
// hicann/ops-nn norm/layer_norm_v4/docs/aclnnLayerNorm&aclnnLayerNormWithImplMode.md

EXPORT Status aclnnLayerNormGetWorkspaceSize(const aclTensor* input, const aclIntArray* normalized_shape,
                                             const aclTensor* weight, const aclTensor* bias, double eps,
                                             aclTensor* out, aclTensor* mean_out, aclTensor* rstd_out,
                                             uint64_t* workspace_size, aclOpExecutor** executor) {
  const char* fn = "aclnnLayerNormGetWorkspaceSize";
  const std::string fields = "\"input\":" + Json(input) + ",\"normalizedShape\":" +
      (normalized_shape ? Json(normalized_shape->values) : std::string("null")) + ",\"weight\":" +
      Json(weight) + ",\"bias\":" + Json(bias) + ",\"eps\":" + Json(eps) + ",\"out\":" + Json(out) +
      ",\"meanOut\":" + Json(mean_out) + ",\"rstdOut\":" + Json(rstd_out);
  return Logged(fn, fields, workspace_size, [&]() -> Status {
    if (Status s = Begin(fn, workspace_size, executor)) return s;
    if (normalized_shape == nullptr) return Fail(kNullptr, "normalizedShape is null");
    if (Status s = CheckTensor(input, "input", true)) return s;
    if (Status s = CheckTensor(out, "out", true)) return s;
    for (auto [t, name] : {std::pair{weight, "weightOptional"}, {bias, "biasOptional"}, {mean_out, "meanOutOptional"},
                           {rstd_out, "rstdOutOptional"}}) {
      if (Status s = CheckTensor(t, name, false)) return s;
    }
    size_t lead = 0;
    if (normalized_shape->values.empty()) return Fail(kInvalid, "normalizedShape must have at least 1 dimension");
    if (Status s = TrailingShape(input, "input", normalized_shape->values, "normalizedShape", &lead)) return s;
    for (auto [t, name] : {std::pair{weight, "weightOptional"}, {bias, "biasOptional"}}) {
      if (t == nullptr) continue;
      if (t->dims != normalized_shape->values) {
        return Fail(kInvalid, std::string(name) + " shape " + Shape(t->dims) + " must equal normalizedShape");
      }
      if (Status s = WeightType(input, t, name)) return s;
    }
    if (weight && bias) {
      if (Status s = SameType(weight, "weightOptional", bias, "biasOptional")) return s;
    }
    if (Status s = SameShape(input, "input", out, "out")) return s;
    if (Status s = SameType(input, "input", out, "out")) return s;
    for (auto [t, name] : {std::pair{mean_out, "meanOutOptional"}, {rstd_out, "rstdOutOptional"}}) {
      if (t == nullptr) continue;
      if (Status s = StatShape(input, lead, t, name, input->dtype)) return s;  // "same dtype as input"
    }
    const int64_t rows = Count(std::vector<int64_t>(input->dims.begin(), input->dims.begin() + lead));
    const int64_t d = Count(normalized_shape->values);
    *workspace_size = WorkspaceFor(rows);
    *executor = NewExecutor("aclnnLayerNorm", *workspace_size, [=] {
      NormRows(input, weight, bias, eps, true, out, mean_out, rstd_out, rows, d);
    });
    return kOk;
  });
}

EXPORT Status aclnnLayerNorm(void* workspace, uint64_t workspace_size, aclOpExecutor* executor, void* stream) {
  return Execute("aclnnLayerNorm", workspace, workspace_size, executor, stream);
}

// ------------------------------------------------------------------ aclnnAddLayerNorm
// hicann/ops-nn norm/add_layer_norm/docs/aclnnAddLayerNorm_en.md

EXPORT Status aclnnAddLayerNormGetWorkspaceSize(const aclTensor* x1, const aclTensor* x2, const aclTensor* gamma,
                                                const aclTensor* beta, const aclTensor* bias, double epsilon,
                                                bool additional_output, const aclTensor* y_out,
                                                const aclTensor* mean_out, const aclTensor* rstd_out,
                                                const aclTensor* x_out, uint64_t* workspace_size,
                                                aclOpExecutor** executor) {
  const char* fn = "aclnnAddLayerNormGetWorkspaceSize";
  const std::string fields = "\"x1\":" + Json(x1) + ",\"x2\":" + Json(x2) + ",\"gamma\":" + Json(gamma) +
      ",\"beta\":" + Json(beta) + ",\"biasOptional\":" + Json(bias) + ",\"epsilon\":" + Json(epsilon) +
      ",\"additionalOutput\":" + (additional_output ? "true" : "false") + ",\"yOut\":" + Json(y_out) +
      ",\"meanOut\":" + Json(mean_out) + ",\"rstdOut\":" + Json(rstd_out) + ",\"xOut\":" + Json(x_out);
  return Logged(fn, fields, workspace_size, [&]() -> Status {
    if (Status s = Begin(fn, workspace_size, executor)) return s;
    for (auto [t, name] : {std::pair{x1, "x1"}, {x2, "x2"}, {gamma, "gamma"}, {beta, "beta"}, {y_out, "yOut"},
                           {mean_out, "meanOut"}, {rstd_out, "rstdOut"}, {x_out, "xOut"}}) {
      if (Status s = CheckTensor(t, name, true)) return s;
    }
    if (Status s = CheckTensor(bias, "biasOptional", false)) return s;
    for (int64_t dim : x1->dims) {
      if (dim == 0) return Fail(kInvalid, "Any dimension of x1 is equal to 0");
    }
    size_t lead = 0;
    if (Status s = SameShape(x1, "x1", x2, "x2")) return s;
    if (Status s = SameType(x1, "x1", x2, "x2")) return s;
    if (Status s = TrailingShape(x1, "x1", gamma->dims, "gamma shape", &lead)) return s;
    if (Status s = SameShape(gamma, "gamma", beta, "beta")) return s;
    if (Status s = WeightType(x1, gamma, "gamma")) return s;
    if (Status s = SameType(gamma, "gamma", beta, "beta")) return s;
    if (bias && bias->dims != gamma->dims && bias->dims != x1->dims) {
      return Fail(kInvalid, "biasOptional shape must equal gamma's or x1's");
    }
    for (auto [t, name] : {std::pair{y_out, "yOut"}, {x_out, "xOut"}}) {
      if (Status s = SameShape(x1, "x1", t, name)) return s;
      if (Status s = SameType(x1, "x1", t, name)) return s;
    }
    if (Status s = StatShape(x1, lead, mean_out, "meanOut", kF32)) return s;
    if (Status s = StatShape(x1, lead, rstd_out, "rstdOut", kF32)) return s;
    const int64_t rows = Count(std::vector<int64_t>(x1->dims.begin(), x1->dims.begin() + lead));
    const int64_t d = Count(gamma->dims);
    *workspace_size = WorkspaceFor(rows);
    *executor = NewExecutor("aclnnAddLayerNorm", *workspace_size, [=] {
      const std::vector<float> sum = ResidualSum(x1, x2, bias, additional_output ? x_out : nullptr, rows, d);
      NormRows(x1, gamma, beta, epsilon, true, y_out, mean_out, rstd_out, rows, d, &sum);
    });
    return kOk;
  });
}

EXPORT Status aclnnAddLayerNorm(void* workspace, uint64_t workspace_size, aclOpExecutor* executor, void* stream) {
  return Execute("aclnnAddLayerNorm", workspace, workspace_size, executor, stream);
}
