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
#include <algorithm>
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

enum DType : int32_t { kF32 = 0, kF16 = 1, kI32 = 3, kI64 = 9, kBool = 12, kBF16 = 27 };

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
    case kI32: return "int32";
    case kBool: return "bool";
    default: return "unsupported";
  }
}

bool Contiguous(const aclTensor* t) {
  int64_t stride = 1;
  for (size_t d = t->dims.size(); d-- > 0;) {
    if (t->dims[d] != 1 && t->strides[d] != stride) return false;
    stride *= t->dims[d];
  }
  return true;
}

// {"shape", "dtype"}, plus "strides" and "offset" for a non-contiguous view.
std::string Json(const aclTensor* t) {
  if (t == nullptr) return "null";
  std::string view;
  if (!Contiguous(t) || t->offset != 0) {
    view = ",\"strides\":" + Json(t->strides) + ",\"offset\":" + std::to_string(t->offset);
  }
  return "{\"shape\":" + Json(t->dims) + ",\"dtype\":\"" + DTypeName(t->dtype) + "\"" + view + "}";
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
    case kI32: return static_cast<float>(static_cast<const int32_t*>(t->data)[at]);
    case kI64: return static_cast<float>(static_cast<const int64_t*>(t->data)[at]);
    case kBool: return static_cast<const uint8_t*>(t->data)[at] != 0 ? 1.0f : 0.0f;
    default: return BF16ToFloat(static_cast<const uint16_t*>(t->data)[at]);
  }
}

void Store(const aclTensor* t, int64_t i, float value) {
  const int64_t at = Offset(t, i);
  switch (t->dtype) {
    case kF32: static_cast<float*>(t->data)[at] = value; break;
    case kF16: static_cast<uint16_t*>(t->data)[at] = FloatToHalf(value); break;
    case kI32: static_cast<int32_t*>(t->data)[at] = static_cast<int32_t>(value); break;
    case kI64: static_cast<int64_t*>(t->data)[at] = static_cast<int64_t>(value); break;
    case kBool: static_cast<uint8_t*>(t->data)[at] = value != 0.0f ? 1 : 0; break;
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

// The view must stay inside its storage (the buffer aclCreateTensor was told about).
Status CheckStorage(const aclTensor* t, const char* name) {
  if (Count(t->dims) == 0) return kOk;
  int64_t last = t->offset;
  for (size_t d = 0; d < t->dims.size(); ++d) last += (t->dims[d] - 1) * t->strides[d];
  if (last >= Count(t->storage)) {
    return Fail(kInvalid, std::string(name) + " view " + Json(t->dims) + " strides " + Json(t->strides) + " offset " +
                              std::to_string(t->offset) + " reads past its storage " + Json(t->storage));
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
  return CheckStorage(t, name);
}

// As CheckTensor, for operators that also take bool / int32 / int64 tensors.
Status CheckAnyTensor(const aclTensor* t, const char* name) {
  if (t == nullptr) return Fail(kNullptr, std::string("Expected a proper Tensor but got null for argument ") + name);
  if (Status s = CheckLive(t, name)) return s;
  if (t->format != 2) return Fail(kInvalid, std::string(name) + " must be ND (format 2)");
  if (!Floating(t->dtype) && t->dtype != kBool && t->dtype != kI32 && t->dtype != kI64) {
    return Fail(kInvalid, std::string(name) + " has unsupported dtype " + DTypeName(t->dtype));
  }
  if (t->dims.empty() || t->dims.size() > 8) {
    return Fail(kInvalid, std::string(name) + " must have 1 to 8 dimensions, got " + Shape(t->dims));
  }
  if (t->data == nullptr && Count(t->dims) > 0) return Fail(kNullptr, std::string(name) + " has no data");
  return CheckStorage(t, name);
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

// ================================================================== rotary / attention support

struct aclTensorList {
  std::vector<const aclTensor*> tensors;
};

namespace {

std::set<const aclTensorList*> g_lists;

std::string Json(const aclTensorList* list) {
  if (list == nullptr) return "null";
  std::string out = "[";
  for (size_t i = 0; i < list->tensors.size(); ++i) out += (i ? "," : "") + Json(list->tensors[i]);
  return out + "]";
}

// The product line the SoC name belongs to, as the aclnn documents name them.
bool UnsupportedTransformerProduct() {
  const char* soc = aclrtGetSocName();
  const std::string name(soc);
  const bool a2a3 = name.rfind("Ascend910B", 0) == 0 || name.rfind("Ascend910_93", 0) == 0;
  const bool other = name.rfind("Ascend310P", 0) == 0 || name.rfind("Ascend310B", 0) == 0 ||
                     (name.rfind("Ascend910", 0) == 0 && !a2a3);
  return other;
}

// Flat index into `src` (numpy-broadcast to `dims`) of the element at flat index i of `dims`.
int64_t BroadcastIndex(const std::vector<int64_t>& dims, const std::vector<int64_t>& src_dims, int64_t i) {
  int64_t index = 0, stride = 1;
  for (size_t k = 0; k < src_dims.size(); ++k) {
    const size_t sd = src_dims.size() - 1 - k;
    const size_t dd = dims.size() - 1 - k;
    int64_t rest = i;
    for (size_t q = dims.size() - 1; q > dd; --q) rest /= dims[q];
    const int64_t coord = rest % dims[dd];
    if (src_dims[sd] != 1) index += coord * stride;
    stride *= src_dims[sd];
  }
  return index;
}

bool Broadcasts(const std::vector<int64_t>& src, const std::vector<int64_t>& dst) {
  if (src.size() > dst.size()) return false;
  for (size_t k = 0; k < src.size(); ++k) {
    const int64_t a = src[src.size() - 1 - k], b = dst[dst.size() - 1 - k];
    if (a != b && a != 1) return false;
  }
  return true;
}

// Whether any element of `a` and `b` share memory (both views of one buffer).
bool Overlap(const aclTensor* a, const aclTensor* b) {
  auto range = [](const aclTensor* t) {
    const size_t es = t->dtype == kF32 || t->dtype == kI32 ? 4 : t->dtype == kI64 ? 8 : t->dtype == kBool ? 1 : 2;
    int64_t last = t->offset;
    for (size_t d = 0; d < t->dims.size(); ++d) last += (t->dims[d] - 1) * t->strides[d];
    const char* base = static_cast<const char*>(t->data);
    return std::pair{base + t->offset * es, base + (last + 1) * es};
  };
  if (Count(a->dims) == 0 || Count(b->dims) == 0) return false;
  const auto [a0, a1] = range(a);
  const auto [b0, b1] = range(b);
  return a0 < b1 && b0 < a1;
}

}  // namespace

// aclCreateTensorList / aclDestroyTensorList: CANN operator API reference, "aclCreateTensorList".
EXPORT aclTensorList* aclCreateTensorList(const aclTensor* const* value, uint64_t size) {
  Log("aclCreateTensorList", "\"size\":" + std::to_string(size));
  if (Injected("aclCreateTensorList") != kOk || value == nullptr || size == 0) {
    if (t_error.empty()) t_error = "[fake CANN] aclCreateTensorList: null value or size 0";
    return nullptr;
  }
  auto* list = new aclTensorList{std::vector<const aclTensor*>(value, value + size)};
  std::lock_guard<std::mutex> lock(g_mutex);
  g_lists.insert(list);
  return list;
}

EXPORT Status aclDestroyTensorList(const aclTensorList* list) {
  Log("aclDestroyTensorList", "");
  std::lock_guard<std::mutex> lock(g_mutex);
  if (list == nullptr || g_lists.erase(list) == 0) return kInvalid;
  delete list;
  return kOk;
}

EXPORT int aclrtMemcpy(void* dst, size_t dest_max, const void* src, size_t count, int32_t kind) {
  Log("aclrtMemcpy", "\"count\":" + std::to_string(count) + ",\"kind\":" + std::to_string(kind));
  if (Status s = Injected("aclrtMemcpy")) return s;
  if (dst == nullptr || src == nullptr || count > dest_max) return Fail(100000, "aclrtMemcpy: bad pointer or count");
  std::memcpy(dst, src, count);
  return 0;
}

EXPORT int aclrtGetDevice(int32_t* device_id) {
  if (device_id == nullptr) return 100000;
  *device_id = 0;
  return 0;
}

// ------------------------------------------------------------------ aclnnInplaceCopy
// cann/ops-math conversion/view_copy/docs/aclnnInplaceCopy.md: selfRef = src, src broadcast to
// selfRef, converted to its dtype; both may be non-contiguous.

EXPORT Status aclnnInplaceCopyGetWorkspaceSize(aclTensor* self_ref, const aclTensor* src, uint64_t* workspace_size,
                                               aclOpExecutor** executor) {
  const char* fn = "aclnnInplaceCopyGetWorkspaceSize";
  const std::string fields = "\"selfRef\":" + Json(self_ref) + ",\"src\":" + Json(src);
  return Logged(fn, fields, workspace_size, [&]() -> Status {
    if (Status s = Begin(fn, workspace_size, executor)) return s;
    if (Status s = CheckAnyTensor(self_ref, "selfRef")) return s;
    if (Status s = CheckAnyTensor(src, "src")) return s;
    if (!Broadcasts(src->dims, self_ref->dims)) {
      return Fail(kInvalid, "src shape " + Shape(src->dims) + " does not broadcast to selfRef shape " +
                                Shape(self_ref->dims));
    }
    if (Overlap(self_ref, src)) return Fail(kInvalid, "selfRef and src overlap (fake CANN refuses aliasing copies)");
    *workspace_size = 0;
    *executor = NewExecutor("aclnnInplaceCopy", 0, [=] {
      const int64_t n = Count(self_ref->dims);
      for (int64_t i = 0; i < n; ++i) Store(self_ref, i, Load(src, BroadcastIndex(self_ref->dims, src->dims, i)));
    });
    return kOk;
  });
}

EXPORT Status aclnnInplaceCopy(void* workspace, uint64_t workspace_size, aclOpExecutor* executor, void* stream) {
  return Execute("aclnnInplaceCopy", workspace, workspace_size, executor, stream);
}

// ------------------------------------------------------------------ aclnnLogicalNot, aclnnInplaceLogicalOr
// CANN operator API reference "aclnnLogicalNot&aclnnInplaceLogicalNot",
// "aclnnLogicalOr&aclnnInplaceLogicalOr": 0 is False, nonzero True; other broadcasts to selfRef.

EXPORT Status aclnnLogicalNotGetWorkspaceSize(const aclTensor* self, aclTensor* out, uint64_t* workspace_size,
                                              aclOpExecutor** executor) {
  const char* fn = "aclnnLogicalNotGetWorkspaceSize";
  return Logged(fn, "\"self\":" + Json(self) + ",\"out\":" + Json(out), workspace_size, [&]() -> Status {
    if (Status s = Begin(fn, workspace_size, executor)) return s;
    if (Status s = CheckAnyTensor(self, "self")) return s;
    if (Status s = CheckAnyTensor(out, "out")) return s;
    if (Status s = SameShape(self, "self", out, "out")) return s;
    *workspace_size = 0;
    *executor = NewExecutor("aclnnLogicalNot", 0, [=] {
      for (int64_t i = 0; i < Count(out->dims); ++i) Store(out, i, Load(self, i) == 0.0f ? 1.0f : 0.0f);
    });
    return kOk;
  });
}

EXPORT Status aclnnLogicalNot(void* workspace, uint64_t workspace_size, aclOpExecutor* executor, void* stream) {
  return Execute("aclnnLogicalNot", workspace, workspace_size, executor, stream);
}

EXPORT Status aclnnInplaceLogicalOrGetWorkspaceSize(aclTensor* self_ref, const aclTensor* other,
                                                    uint64_t* workspace_size, aclOpExecutor** executor) {
  const char* fn = "aclnnInplaceLogicalOrGetWorkspaceSize";
  return Logged(fn, "\"selfRef\":" + Json(self_ref) + ",\"other\":" + Json(other), workspace_size, [&]() -> Status {
    if (Status s = Begin(fn, workspace_size, executor)) return s;
    if (Status s = CheckAnyTensor(self_ref, "selfRef")) return s;
    if (Status s = CheckAnyTensor(other, "other")) return s;
    if (!Broadcasts(other->dims, self_ref->dims)) return Fail(kInvalid, "other does not broadcast to selfRef");
    *workspace_size = 0;
    *executor = NewExecutor("aclnnInplaceLogicalOr", 0, [=] {
      for (int64_t i = 0; i < Count(self_ref->dims); ++i) {
        const bool v = Load(self_ref, i) != 0.0f || Load(other, BroadcastIndex(self_ref->dims, other->dims, i)) != 0.0f;
        Store(self_ref, i, v ? 1.0f : 0.0f);
      }
    });
    return kOk;
  });
}

EXPORT Status aclnnInplaceLogicalOr(void* workspace, uint64_t workspace_size, aclOpExecutor* executor, void* stream) {
  return Execute("aclnnInplaceLogicalOr", workspace, workspace_size, executor, stream);
}

// ------------------------------------------------------------------ aclnnRotaryPositionEmbedding
// hicann/ops-transformer posembedding/rotary_position_embedding/docs/aclnnRotaryPositionEmbedding_en.md

namespace {

// y = x * cos + rotate(x) * sin over rows of d lanes, cos/sin broadcast (numpy) to x.
void Rotate(const aclTensor* x, const aclTensor* cos, const aclTensor* sin, bool interleaved, const aclTensor* y) {
  const int64_t d = x->dims.back();
  const int64_t rows = Count(x->dims) / std::max<int64_t>(d, 1);
  std::vector<float> row(static_cast<size_t>(d));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < d; ++i) row[i] = Load(x, r * d + i);
    for (int64_t i = 0; i < d; ++i) {
      float rotated;
      if (interleaved) {
        rotated = i % 2 == 0 ? -row[i + 1] : row[i - 1];
      } else {
        rotated = i < d / 2 ? -row[i + d / 2] : row[i - d / 2];
      }
      const int64_t c = BroadcastIndex(x->dims, cos->dims, r * d + i);
      Store(y, r * d + i, row[i] * Load(cos, c) + rotated * Load(sin, c));
    }
  }
}

}  // namespace

EXPORT Status aclnnRotaryPositionEmbeddingGetWorkspaceSize(const aclTensor* x, const aclTensor* cos,
                                                           const aclTensor* sin, int64_t mode, aclTensor* out,
                                                           uint64_t* workspace_size, aclOpExecutor** executor) {
  const char* fn = "aclnnRotaryPositionEmbeddingGetWorkspaceSize";
  const std::string fields = "\"x\":" + Json(x) + ",\"cos\":" + Json(cos) + ",\"sin\":" + Json(sin) +
                             ",\"mode\":" + std::to_string(mode) + ",\"out\":" + Json(out);
  return Logged(fn, fields, workspace_size, [&]() -> Status {
    if (Status s = Begin(fn, workspace_size, executor)) return s;
    for (auto [t, name] : {std::pair{x, "x"}, {cos, "cos"}, {sin, "sin"}, {out, "out"}}) {
      if (Status s = CheckTensor(t, name, true)) return s;
    }
    if (UnsupportedTransformerProduct()) {
      return Fail(561003, std::string("aclnnRotaryPositionEmbedding is not supported on ") + aclrtGetSocName());
    }
    for (auto [t, name] : {std::pair{cos, "cos"}, {sin, "sin"}, {(const aclTensor*)out, "out"}}) {
      if (Status s = SameType(x, "x", t, name)) return s;  // "Consistent with the data type of x"
    }
    if (!Contiguous(out)) return Fail(kInvalid, "out must be contiguous (non-contiguous out is not supported)");
    if (x->dims.size() != 4 || out->dims.size() != 4) {
      return Fail(kInvalid, "x and out must be 4-D here (BNSD/BSND), got " + Shape(x->dims));
    }
    if (mode != 0 && mode != 1) return Fail(561002, "mode " + std::to_string(mode) + " is not 0 (half) or 1 (interleave) on Atlas A2/A3");
    if (Status s = SameShape(x, "x", out, "out")) return s;
    if (cos->dims != sin->dims) return Fail(561002, "cos and sin shapes differ");
    const int64_t d = x->dims[3];
    if (cos->dims.size() != 4 || cos->dims[3] != d) return Fail(561002, "cos must be 4-D with x's D");
    if (d % 2 != 0 || d >= 896) return Fail(561002, "D must be even and < 896, got " + std::to_string(d));
    // The layout is read from the cos/sin broadcast form.
    const auto& xd = x->dims;
    const auto& cd = cos->dims;
    auto form = [&](bool a, bool b, bool c) {  // true: cos has x's dim there, false: 1
      return (a ? cd[0] == xd[0] : cd[0] == 1) && (b ? cd[1] == xd[1] : cd[1] == 1) && (c ? cd[2] == xd[2] : cd[2] == 1);
    };
    bool ok = false;
    if (mode == 0) {
      const bool bnsd = form(false, false, true) || form(true, false, true) || form(true, true, true);
      const bool bsnd = form(false, true, false) || form(true, true, false) || form(true, true, true);
      ok = (bnsd && xd[0] < 1000 && xd[1] < 1000) || (bsnd && xd[0] < 1000 && xd[2] < 1000);
    } else {
      ok = (form(false, false, true) && xd[0] * xd[1] < 1000) || (form(false, true, false) && xd[0] * xd[2] < 1000);
    }
    if (!ok) {
      return Fail(561002, "cos " + Shape(cd) + " with x " + Shape(xd) + " is none of the documented layouts for mode " +
                              std::to_string(mode) + " (or B/N exceed their limits)");
    }
    *workspace_size = 256;
    *executor = NewExecutor("aclnnRotaryPositionEmbedding", *workspace_size,
                            [=] { Rotate(x, cos, sin, mode == 1, out); });
    return kOk;
  });
}

EXPORT Status aclnnRotaryPositionEmbedding(void* workspace, uint64_t workspace_size, aclOpExecutor* executor,
                                           void* stream) {
  return Execute("aclnnRotaryPositionEmbedding", workspace, workspace_size, executor, stream);
}

// ------------------------------------------------------------------ aclnnApplyRotaryPosEmbV2
// hicann/ops-transformer posembedding/apply_rotary_pos_emb/docs/aclnnApplyRotaryPosEmbV2.md: in place;
// layout 1 BSND q (b, s, qn, d), k (b, s, kn, d), cos (b, s, 1, d); 3 BNSD (b, n, s, d) with cos
// (b, 1, s, d); D = 128; one dtype; no empty tensors; the UB formula within 192 KiB.

EXPORT Status aclnnApplyRotaryPosEmbV2GetWorkspaceSize(aclTensor* query, aclTensor* key, const aclTensor* cos,
                                                       const aclTensor* sin, int64_t layout, char* rotary_mode,
                                                       uint64_t* workspace_size, aclOpExecutor** executor) {
  const char* fn = "aclnnApplyRotaryPosEmbV2GetWorkspaceSize";
  const std::string mode_text = rotary_mode ? rotary_mode : "";
  const std::string fields = "\"queryRef\":" + Json(query) + ",\"keyRef\":" + Json(key) + ",\"cos\":" + Json(cos) +
                             ",\"sin\":" + Json(sin) + ",\"layout\":" + std::to_string(layout) +
                             ",\"rotaryMode\":" + Json(mode_text);
  return Logged(fn, fields, workspace_size, [&]() -> Status {
    if (Status s = Begin(fn, workspace_size, executor)) return s;
    for (auto [t, name] : {std::pair{(const aclTensor*)query, "queryRef"}, {(const aclTensor*)key, "keyRef"},
                           {cos, "cos"}, {sin, "sin"}}) {
      if (Status s = CheckTensor(t, name, true)) return s;
      if (Status s = SameType(query, "queryRef", t, name)) return s;
      if (t->dims.size() != 4) return Fail(kInvalid, std::string(name) + " must be 4-D");
      if (Count(t->dims) == 0) return Fail(kInvalid, std::string(name) + " is empty (not supported)");
      if (t->dims[3] != 128) return Fail(kInvalid, std::string(name) + " last dim must be 128");
    }
    if (mode_text != "half" && mode_text != "interleave") return Fail(kInvalid, "rotaryMode '" + mode_text + "' not supported");
    if (cos->dims != sin->dims) return Fail(kInvalid, "cos and sin shapes differ");
    const auto& q = query->dims;
    const auto& k = key->dims;
    const auto& c = cos->dims;
    int64_t qn, kn;
    if (layout == 1) {
      if (k[0] != q[0] || k[1] != q[1] || c != std::vector<int64_t>{q[0], q[1], 1, q[3]}) {
        return Fail(kInvalid, "layout 1 (BSND) needs q (b, s, qn, d), k (b, s, kn, d), cos (b, s, 1, d)");
      }
      qn = q[2], kn = k[2];
    } else if (layout == 3) {
      if (k[0] != q[0] || k[2] != q[2] || c != std::vector<int64_t>{q[0], 1, q[2], q[3]}) {
        return Fail(kInvalid, "layout 3 (BNSD) needs q (b, qn, s, d), k (b, kn, s, d), cos (b, 1, s, d)");
      }
      qn = q[1], kn = k[1];
    } else {
      return Fail(kInvalid, "layout " + std::to_string(layout) + " is not supported by the fake (1 BSND, 3 BNSD)");
    }
    const int64_t cast = query->dtype == kBF16 ? 1 : 0;
    const int64_t dtype_size = query->dtype == kF32 ? 4 : 2;
    const int64_t cast_size = cast ? 4 : dtype_size;
    const int64_t ub = (qn + kn) * 128 * cast_size * 5 + 128 * dtype_size * 4 + cast * 128 * 8;
    if (ub > 192 * 1024) return Fail(561002, "ub_required " + std::to_string(ub) + " exceeds the 192 KiB UB");
    *workspace_size = 128;
    *executor = NewExecutor("aclnnApplyRotaryPosEmbV2", *workspace_size, [=] {
      const bool inter = mode_text == "interleave";
      // In place: rotate a copy of each row, then store.
      for (aclTensor* t : {query, key}) {
        std::vector<float> copy(static_cast<size_t>(Count(t->dims)));
        for (int64_t i = 0; i < Count(t->dims); ++i) copy[i] = Load(t, i);
        std::vector<int64_t> cdims = cos->dims;
        // cos (b, s, 1, d) / (b, 1, s, d): broadcast over N.
        const int64_t d = 128, rows = Count(t->dims) / d;
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t i = 0; i < d; ++i) {
            const float x = copy[r * d + i];
            const float rot = inter ? (i % 2 == 0 ? -copy[r * d + i + 1] : copy[r * d + i - 1])
                                    : (i < d / 2 ? -copy[r * d + i + d / 2] : copy[r * d + i - d / 2]);
            const int64_t ci = BroadcastIndex(t->dims, cdims, r * d + i);
            Store(t, r * d + i, x * Load(cos, ci) + rot * Load(sin, ci));
          }
        }
      }
    });
    return kOk;
  });
}

EXPORT Status aclnnApplyRotaryPosEmbV2(void* workspace, uint64_t workspace_size, aclOpExecutor* executor, void* stream) {
  return Execute("aclnnApplyRotaryPosEmbV2", workspace, workspace_size, executor, stream);
}

// ------------------------------------------------------------------ aclnnFusedInferAttentionScoreV3
// hicann/ops-transformer attention/fused_infer_attention_score/docs/aclnnFusedInferAttentionScoreV3_en.md.
// The fake takes the subset otfuse uses (FLOAT16/BFLOAT16, one-tensor key/value lists, layouts BSND,
// BNSD, BNSD_BSND, BSH, sparse modes 0-4, no quantisation / paging / prefix / rope inputs) and
// refuses everything else with ACLNN_ERR_PARAM_INVALID.

EXPORT Status aclnnFusedInferAttentionScoreV3GetWorkspaceSize(
    const aclTensor* query, const aclTensorList* key, const aclTensorList* value, const aclTensor* pse_shift,
    const aclTensor* atten_mask, const aclIntArray* actual_seq_lengths, const aclIntArray* actual_seq_lengths_kv,
    const aclTensor* deq_scale1, const aclTensor* quant_scale1, const aclTensor* deq_scale2,
    const aclTensor* quant_scale2, const aclTensor* quant_offset2, const aclTensor* antiquant_scale,
    const aclTensor* antiquant_offset, const aclTensor* block_table, const aclTensor* query_padding_size,
    const aclTensor* kv_padding_size, const aclTensor* key_antiquant_scale, const aclTensor* key_antiquant_offset,
    const aclTensor* value_antiquant_scale, const aclTensor* value_antiquant_offset,
    const aclTensor* key_shared_prefix, const aclTensor* value_shared_prefix,
    const aclIntArray* actual_shared_prefix_len, const aclTensor* query_rope, const aclTensor* key_rope,
    const aclTensor* key_rope_antiquant_scale, int64_t num_heads, double scale_value, int64_t pre_tokens,
    int64_t next_tokens, char* input_layout, int64_t num_key_value_heads, int64_t sparse_mode,
    int64_t inner_precise, int64_t block_size, int64_t antiquant_mode, bool softmax_lse_flag,
    int64_t key_antiquant_mode, int64_t value_antiquant_mode, const aclTensor* attention_out,
    const aclTensor* softmax_lse, uint64_t* workspace_size, aclOpExecutor** executor) {
  const char* fn = "aclnnFusedInferAttentionScoreV3GetWorkspaceSize";
  const std::string layout = input_layout ? input_layout : "";
  const std::string fields = "\"query\":" + Json(query) + ",\"key\":" + Json(key) + ",\"value\":" + Json(value) +
      ",\"pseShift\":" + Json(pse_shift) + ",\"attenMask\":" + Json(atten_mask) + ",\"numHeads\":" +
      std::to_string(num_heads) + ",\"scaleValue\":" + Json(scale_value) + ",\"preTokens\":" +
      std::to_string(pre_tokens) + ",\"nextTokens\":" + std::to_string(next_tokens) + ",\"inputLayout\":" +
      Json(layout) + ",\"numKeyValueHeads\":" + std::to_string(num_key_value_heads) + ",\"sparseMode\":" +
      std::to_string(sparse_mode) + ",\"innerPrecise\":" + std::to_string(inner_precise) + ",\"attentionOut\":" +
      Json(attention_out);
  return Logged(fn, fields, workspace_size, [&]() -> Status {
    if (Status s = Begin(fn, workspace_size, executor)) return s;
    if (query == nullptr || key == nullptr || value == nullptr || attention_out == nullptr) {
      return Fail(kNullptr, "query, key, value and attentionOut are required");
    }
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      if (g_lists.count(key) == 0 || g_lists.count(value) == 0) return Fail(kInvalid, "key/value are not live aclTensorLists");
    }
    if (key->tensors.size() != 1 || value->tensors.size() != 1) {
      return Fail(kInvalid, "the fake takes one-tensor key/value lists (batch in the tensor)");
    }
    const aclTensor* k = key->tensors[0];
    const aclTensor* v = value->tensors[0];
    for (auto [t, name] : {std::pair{query, "query"}, {k, "key"}, {v, "value"}, {attention_out, "attentionOut"}}) {
      if (Status s = CheckTensor(t, name, true)) return s;
      if (t->dtype != kF16 && t->dtype != kBF16) {
        return Fail(kInvalid, std::string(name) + " dtype " + DTypeName(t->dtype) + " is not FLOAT16/BFLOAT16");
      }
      if (Status s = SameType(query, "query", t, name)) return s;
      if (!Contiguous(t) || t->offset != 0) return Fail(kInvalid, std::string(name) + " must be contiguous");
    }
    if (UnsupportedTransformerProduct()) {
      return Fail(561003, std::string("aclnnFusedInferAttentionScoreV3 is not supported on ") + aclrtGetSocName());
    }
    for (const void* p : {(const void*)actual_seq_lengths, (const void*)actual_seq_lengths_kv, (const void*)deq_scale1,
                          (const void*)quant_scale1, (const void*)deq_scale2, (const void*)quant_scale2,
                          (const void*)quant_offset2, (const void*)antiquant_scale, (const void*)antiquant_offset,
                          (const void*)block_table, (const void*)query_padding_size, (const void*)kv_padding_size,
                          (const void*)key_antiquant_scale, (const void*)key_antiquant_offset,
                          (const void*)value_antiquant_scale, (const void*)value_antiquant_offset,
                          (const void*)key_shared_prefix, (const void*)value_shared_prefix,
                          (const void*)actual_shared_prefix_len, (const void*)query_rope, (const void*)key_rope,
                          (const void*)key_rope_antiquant_scale, (const void*)softmax_lse}) {
      if (p != nullptr) return Fail(kInvalid, "the fake supports no quantisation, paging, prefix, rope or lse inputs");
    }
    if (block_size != 0 || antiquant_mode != 0 || softmax_lse_flag || key_antiquant_mode != 0 || value_antiquant_mode != 0) {
      return Fail(kInvalid, "blockSize / antiquant modes / softmaxLseFlag must be 0 / false here");
    }
    if (k->dims != v->dims) return Fail(kInvalid, "key and value shapes must be identical");
    // Layouts: B, N, S, D of each tensor.
    bool out_bsnd = false;
    auto heads = [&](const aclTensor* t, bool bsnd, int64_t n_hint, int64_t* b, int64_t* n, int64_t* s, int64_t* d) {
      if (layout == "BSH") {
        if (t->dims.size() != 3 || n_hint <= 0 || t->dims[2] % n_hint != 0) return false;
        *b = t->dims[0], *s = t->dims[1], *n = n_hint, *d = t->dims[2] / n_hint;
        return true;
      }
      if (t->dims.size() != 4) return false;
      *b = t->dims[0], *d = t->dims[3];
      *n = bsnd ? t->dims[2] : t->dims[1];
      *s = bsnd ? t->dims[1] : t->dims[2];
      return true;
    };
    bool in_bsnd;
    if (layout == "BNSD") {
      in_bsnd = false;
    } else if (layout == "BSND" || layout == "BSH") {
      in_bsnd = out_bsnd = true;
    } else if (layout == "BNSD_BSND") {
      in_bsnd = false, out_bsnd = true;
    } else {
      return Fail(kInvalid, "inputLayout '" + layout + "' is not supported by the fake");
    }
    const int64_t nkv_attr = num_key_value_heads == 0 ? num_heads : num_key_value_heads;
    int64_t b, n, sq, d, kb, kn, skv, kd;
    if (!heads(query, in_bsnd, num_heads, &b, &n, &sq, &d) || !heads(k, in_bsnd, nkv_attr, &kb, &kn, &skv, &kd)) {
      return Fail(kInvalid, "query/key ranks do not fit inputLayout " + layout);
    }
    if (layout == "BNSD_BSND" && sq <= 1) return Fail(kInvalid, "BNSD_BSND needs Q_S > 1");
    if (num_heads != n) return Fail(kInvalid, "numHeads " + std::to_string(num_heads) + " != query's N " + std::to_string(n));
    if (num_key_value_heads != 0 && num_key_value_heads != kn) return Fail(kInvalid, "numKeyValueHeads != key's N");
    if (kn == 0 || n % kn != 0) return Fail(kInvalid, "numHeads must be a multiple of numKeyValueHeads");
    if (kb != b || kd != d) return Fail(kInvalid, "key's B/D differ from query's");
    const std::vector<int64_t> want_out = layout == "BSH" ? std::vector<int64_t>{b, sq, n * d}
                                          : out_bsnd      ? std::vector<int64_t>{b, sq, n, d}
                                                          : std::vector<int64_t>{b, n, sq, d};
    if (attention_out->dims != want_out) {
      return Fail(kInvalid, "attentionOut shape " + Shape(attention_out->dims) + " must be " + Shape(want_out));
    }
    if (sq > 1) {
      if (n > 256 || d > 512) return Fail(kInvalid, "Q_S > 1 needs N <= 256 and D <= 512");
      if ((d * 2) % 16 != 0) return Fail(kInvalid, "D must be 16-byte aligned for FLOAT16/BFLOAT16");
      if (b > 65536) return Fail(kInvalid, "B must be <= 65536");
    }
    if (pse_shift) {
      if (Status s = CheckTensor(pse_shift, "pseShift", true)) return s;
      if (Status s = SameType(query, "query", pse_shift, "pseShift")) return s;
      if (!Contiguous(pse_shift) || pse_shift->offset != 0) return Fail(kInvalid, "pseShift must be contiguous");
      if (pse_shift->dims != std::vector<int64_t>{b, n, sq, skv} && pse_shift->dims != std::vector<int64_t>{1, n, sq, skv}) {
        return Fail(kInvalid, "pseShift shape " + Shape(pse_shift->dims) + " must be (B, N, Q_S, KV_S) or (1, N, Q_S, KV_S)");
      }
    }
    if (sparse_mode < 0 || sparse_mode > 4) return Fail(kInvalid, "sparseMode must be 0-4");
    if (inner_precise < 0 || inner_precise > 3) return Fail(kInvalid, "innerPrecise must be 0-3");
    const bool compressed = sq > 1 && sparse_mode >= 2;
    if (atten_mask) {
      if (Status s = CheckAnyTensor(atten_mask, "attenMask")) return s;
      if (atten_mask->dtype != kBool) return Fail(kInvalid, "the fake takes BOOL attenMask");
      if (!Contiguous(atten_mask) || atten_mask->offset != 0) return Fail(kInvalid, "attenMask must be contiguous");
      const auto& md = atten_mask->dims;
      if (compressed) {
        const std::vector<int64_t> sq2{2048, 2048};
        if (std::vector<int64_t>(md.end() - std::min<size_t>(md.size(), 2), md.end()) != sq2 || Count(md) != 2048 * 2048) {
          return Fail(kInvalid, "sparseMode 2/3/4 need the (2048, 2048) compressed mask, got " + Shape(md));
        }
        for (int64_t i = 0; i < 2048; ++i) {
          for (int64_t j = 0; j < 2048; ++j) {
            if ((Load(atten_mask, i * 2048 + j) != 0.0f) != (j > i)) {
              return Fail(kInvalid, "the compressed mask must be True exactly above the diagonal");
            }
          }
        }
      } else {
        const bool ok = sq > 1 ? (md == std::vector<int64_t>{sq, skv} || md == std::vector<int64_t>{b, sq, skv} ||
                                  md == std::vector<int64_t>{1, sq, skv} || md == std::vector<int64_t>{b, 1, sq, skv} ||
                                  md == std::vector<int64_t>{1, 1, sq, skv})
                               : (md == std::vector<int64_t>{b, skv} || md == std::vector<int64_t>{b, 1, skv} ||
                                  md == std::vector<int64_t>{b, 1, 1, skv});
        if (!ok) return Fail(kInvalid, "attenMask shape " + Shape(md) + " is not a documented full-mask shape");
      }
    } else if (compressed) {
      return Fail(kInvalid, "sparseMode 2/3/4 need the compressed attenMask");
    }
    *workspace_size = 1024;
    *executor = NewExecutor("aclnnFusedInferAttentionScoreV3", *workspace_size, [=] {
      const int64_t group = n / kn, c = skv - sq;
      const bool use_sparse = sq > 1;  // "When Q_S is 1 ... sparseMode is invalid"
      auto q_at = [&](int64_t bi, int64_t h, int64_t i, int64_t e) {
        return in_bsnd ? ((bi * sq + i) * n + h) * d + e : ((bi * n + h) * sq + i) * d + e;
      };
      auto kv_at = [&](int64_t bi, int64_t g, int64_t j, int64_t e) {
        return in_bsnd ? ((bi * skv + j) * kn + g) * d + e : ((bi * kn + g) * skv + j) * d + e;
      };
      auto o_at = [&](int64_t bi, int64_t h, int64_t i, int64_t e) {
        return out_bsnd ? ((bi * sq + i) * n + h) * d + e : ((bi * n + h) * sq + i) * d + e;
      };
      std::vector<float> s(static_cast<size_t>(skv));
      for (int64_t bi = 0; bi < b; ++bi) {
        for (int64_t h = 0; h < n; ++h) {
          const int64_t g = h / group;
          for (int64_t i = 0; i < sq; ++i) {
            float m = -INFINITY;
            for (int64_t j = 0; j < skv; ++j) {
              float dot = 0.0f;
              for (int64_t e = 0; e < d; ++e) dot += Load(query, q_at(bi, h, i, e)) * Load(k, kv_at(bi, g, j, e));
              float score = static_cast<float>(scale_value) * dot;
              if (pse_shift) {
                const int64_t pb = pse_shift->dims[0] == 1 ? 0 : bi;
                score += Load(pse_shift, ((pb * n + h) * sq + i) * skv + j);
              }
              bool masked = false;
              if (atten_mask && !compressed) {
                const auto& md = atten_mask->dims;
                const int64_t mb = (md.size() >= 3 && md[0] == b && b != 1) ? bi : 0;
                const int64_t mi = sq > 1 ? i : 0;
                masked = Load(atten_mask, (mb * (sq > 1 ? sq : 1) + mi) * skv + j) != 0.0f;
                if (use_sparse && (j - i > next_tokens || i - j > pre_tokens)) masked = true;
              }
              if (use_sparse && sparse_mode == 2) masked = masked || j > i;
              if (use_sparse && sparse_mode == 3) masked = masked || j > i + c;
              if (use_sparse && sparse_mode == 4) masked = masked || j > i + c + next_tokens || j < i + c - pre_tokens;
              s[j] = masked ? -INFINITY : score;
              m = std::max(m, s[j]);
            }
            const bool correct = (inner_precise & 2) != 0 || (use_sparse && sparse_mode == 3 && sq > skv);
            for (int64_t e = 0; e < d; ++e) {
              float out;
              if (m == -INFINITY) {
                out = correct ? 0.0f : NAN;  // invalid row: corrected to 0, else undefined
              } else {
                float sum = 0.0f, acc = 0.0f;
                for (int64_t j = 0; j < skv; ++j) {
                  const float p = std::exp(s[j] - m);
                  sum += p;
                  acc += p * Load(v, kv_at(bi, g, j, e));
                }
                out = acc / sum;
              }
              Store(attention_out, o_at(bi, h, i, e), out);
            }
          }
        }
      }
    });
    return kOk;
  });
}

EXPORT Status aclnnFusedInferAttentionScoreV3(void* workspace, uint64_t workspace_size, aclOpExecutor* executor,
                                              void* stream) {
  return Execute("aclnnFusedInferAttentionScoreV3", workspace, workspace_size, executor, stream);
}

// ================================================================== aclScalar, aclnnMatmul, aclnnAddmm
// aclCreateScalar / aclDestroyScalar: CANN operator API reference (operatorlist_00017 / _00025).
// aclnnMatmul: hicann/ops-nn matmul/mat_mul_v3/docs/aclnnMatmul_en.md; aclnnAddmm:
// matmul/mat_mul_v3/docs/aclnnAddmm&aclnnInplaceAddmm_en.md; dtype deduction:
// docs/en/context/deduction_relationship.md. Products are told apart by aclrtGetSocName as in the
// other entry points. The products compute in the Cube unit with float32 accumulation; the fake
// accumulates in float32 and rounds to out's dtype once (the docs say nothing finer).

struct aclScalar {
  double value = 0.0;
  int32_t dtype = -1;
};

namespace {

constexpr int32_t kF64 = 11;  // ACL_DOUBLE
std::set<const aclScalar*> g_scalars;

std::string Json(const aclScalar* s) {
  if (s == nullptr) return "null";
  return "{\"value\":" + Json(s->value) + ",\"dtype\":\"" + (s->dtype == kF64 ? "float64" : DTypeName(s->dtype)) +
         "\"}";
}

Status CheckScalar(const aclScalar* s, const char* name) {
  if (s == nullptr) return Fail(kNullptr, std::string("Expected a proper Scalar but got null for argument ") + name);
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_scalars.count(s) == 0) {
    t_error = std::string("[fake CANN] ") + name + " is not a live aclScalar (destroyed or never created)";
    return kInvalid;
  }
  return kOk;
}

enum class MatmulProduct { kA2A3, k950, kTrainingOrInference, k200I500A2 };

MatmulProduct MatmulProductOf() {
  const std::string name(aclrtGetSocName());
  auto starts = [&](const char* p) { return name.rfind(p, 0) == 0; };
  if (starts("Ascend910B") || starts("Ascend910_93")) return MatmulProduct::kA2A3;
  if (starts("Ascend950")) return MatmulProduct::k950;
  if (starts("Ascend310B")) return MatmulProduct::k200I500A2;
  if (starts("Ascend310P") || starts("Ascend910")) return MatmulProduct::kTrainingOrInference;
  return MatmulProduct::kA2A3;
}

// The deduced type of two floating dtypes (deduction_relationship.md, Table 1, FLOAT types), or -1:
// "If one input is BFLOAT16 and the other is FLOAT16 [FLOAT32], the data type cannot be deduced"
// (aclnnMatmul, Constraints, A2/A3; the other products have no BFLOAT16 at all).
int32_t Deduce(int32_t a, int32_t b) {
  if (a == b) return a;
  if (a == kBF16 || b == kBF16) return -1;
  return kF32;  // float16 with float32
}

// cubeMathType and dtype rules of one product ("Parameters", the per-product lists).
Status CubeMathTypeRules(const char* api, int32_t dtype, int8_t cube, bool addmm) {
  const MatmulProduct product = MatmulProductOf();
  if (product == MatmulProduct::k200I500A2) {
    return Fail(561003, std::string(api) + " is not supported on " + aclrtGetSocName());
  }
  if (cube < 0 || cube > 4) return Fail(kInvalid, "cubeMathType " + std::to_string(cube) + " is not 0-4");
  if (product == MatmulProduct::kTrainingOrInference) {
    if (dtype == kBF16) return Fail(kInvalid, "BFLOAT16 is not supported on " + std::string(aclrtGetSocName()));
    if (dtype == kF32 && cube == 0) return Fail(kInvalid, "cubeMathType 0 is not supported for FLOAT32 on this product");
    if (cube == 3 || (addmm && cube == 4)) {
      return Fail(kInvalid, "cubeMathType " + std::to_string(cube) + " is not supported on this product");
    }
    return kOk;
  }
  if (cube == 2 && dtype == kBF16) return Fail(kInvalid, "cubeMathType 2 (USE_FP16) does not take BFLOAT16");
  if (cube == 3 && dtype != kF32) return Fail(kInvalid, "cubeMathType 3 (USE_HF32) takes FLOAT32 only");
  if (product == MatmulProduct::k950 && addmm && cube == 4) return Fail(kInvalid, "cubeMathType 4 is not supported");
  return kOk;
}

// self / mat2 / out dtypes: floating, deducible, out deducible with the deduced type. Returns the
// deduced type through `deduced`.
Status MatmulTypes(const aclTensor* a, const char* an, const aclTensor* b, const char* bn, const aclTensor* out,
                   int32_t* deduced) {
  *deduced = Deduce(a->dtype, b->dtype);
  if (*deduced < 0) {
    return Fail(kInvalid, std::string(an) + " " + DTypeName(a->dtype) + " and " + bn + " " + DTypeName(b->dtype) +
                              " cannot be deduced to one type");
  }
  if (Deduce(*deduced, out->dtype) < 0) {
    return Fail(kInvalid, std::string("the deduced type ") + DTypeName(*deduced) + " cannot be converted to out's " +
                              DTypeName(out->dtype));
  }
  return kOk;
}

// out = beta * self + alpha * (a @ b) over the batch of `a`/`b` (already promoted to rank >= 2),
// float32 throughout, one rounding to out's dtype. self may be null (Matmul).
void MatmulRun(const aclTensor* a, std::vector<int64_t> ad, const aclTensor* b, std::vector<int64_t> bd,
               const aclTensor* out, const std::vector<int64_t>& batch, const aclTensor* self, float beta,
               float alpha) {
  const int64_t m = ad[ad.size() - 2], k = ad.back(), n = bd.back();
  const int64_t batches = Count(batch);
  const std::vector<int64_t> a_batch(ad.begin(), ad.end() - 2), b_batch(bd.begin(), bd.end() - 2);
  const std::vector<int64_t> mn{m, n};
  for (int64_t bi = 0; bi < batches; ++bi) {
    const int64_t ab = a_batch.empty() ? 0 : BroadcastIndex(batch, a_batch, bi);
    const int64_t bb = b_batch.empty() ? 0 : BroadcastIndex(batch, b_batch, bi);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        float acc = 0.0f;
        for (int64_t e = 0; e < k; ++e) acc += Load(a, (ab * m + i) * k + e) * Load(b, (bb * k + e) * n + j);
        float value = alpha * acc;
        if (self != nullptr) value += beta * Load(self, BroadcastIndex(mn, self->dims, i * n + j));
        Store(out, (bi * m + i) * n + j, value);
      }
    }
  }
}

}  // namespace

EXPORT aclScalar* aclCreateScalar(void* value, int32_t data_type) {
  auto* s = new aclScalar;
  s->dtype = data_type;
  bool ok = value != nullptr && Injected("aclCreateScalar") == kOk;
  if (ok) {
    switch (data_type) {
      case kF32: s->value = *static_cast<const float*>(value); break;
      case kF16: s->value = HalfToFloat(*static_cast<const uint16_t*>(value)); break;
      case kBF16: s->value = BF16ToFloat(*static_cast<const uint16_t*>(value)); break;
      case kF64: s->value = *static_cast<const double*>(value); break;
      case kI32: s->value = *static_cast<const int32_t*>(value); break;
      case kI64: s->value = static_cast<double>(*static_cast<const int64_t*>(value)); break;
      default: ok = false; t_error = "[fake CANN] aclCreateScalar: dtype not supported by the fake";
    }
  }
  Log("aclCreateScalar", "\"dtype\":" + std::to_string(data_type) + (ok ? ",\"value\":" + Json(s->value) : ""));
  if (!ok) {
    if (t_error.empty()) t_error = "[fake CANN] aclCreateScalar: null value";
    delete s;
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  g_scalars.insert(s);
  return s;
}

EXPORT Status aclDestroyScalar(const aclScalar* scalar) {
  Log("aclDestroyScalar", "");
  std::lock_guard<std::mutex> lock(g_mutex);
  if (scalar == nullptr || g_scalars.erase(scalar) == 0) {
    t_error = "[fake CANN] aclDestroyScalar: not a live aclScalar";
    return kInvalid;
  }
  delete scalar;
  return kOk;
}

EXPORT Status aclnnMatmulGetWorkspaceSize(const aclTensor* self, const aclTensor* mat2, aclTensor* out,
                                          int8_t cube_math_type, uint64_t* workspace_size, aclOpExecutor** executor) {
  const char* fn = "aclnnMatmulGetWorkspaceSize";
  const std::string fields = "\"self\":" + Json(self) + ",\"mat2\":" + Json(mat2) + ",\"out\":" + Json(out) +
                             ",\"cubeMathType\":" + std::to_string(cube_math_type);
  return Logged(fn, fields, workspace_size, [&]() -> Status {
    if (Status s = Begin(fn, workspace_size, executor)) return s;
    if (self == nullptr || mat2 == nullptr || out == nullptr) {
      return Fail(kNullptr, "The passed self, mat2, or out is a null pointer");
    }
    for (auto [t, name] : {std::pair{self, "self"}, {mat2, "mat2"}, {(const aclTensor*)out, "out"}}) {
      if (Status s = CheckTensor(t, name, true)) return s;
      if (t->dims.size() > 6) return Fail(kInvalid, std::string(name) + " must have 1 to 6 dimensions, got " + Shape(t->dims));
    }
    if (!Contiguous(out)) return Fail(kInvalid, "out must be contiguous (non-contiguous out is not supported)");
    int32_t deduced = -1;
    if (Status s = MatmulTypes(self, "self", mat2, "mat2", out, &deduced)) return s;
    if (Status s = CubeMathTypeRules("aclnnMatmul", deduced, cube_math_type, false)) return s;
    // 1-D operands: (K) as (1, K) for self, (K, 1) for mat2; the padded dim leaves the output.
    std::vector<int64_t> ad = self->dims, bd = mat2->dims;
    const bool a1 = ad.size() == 1, b1 = bd.size() == 1;
    if (a1) ad.insert(ad.begin(), 1);
    if (b1) bd.push_back(1);
    if (ad.back() != bd[bd.size() - 2]) {
      return Fail(kInvalid, "the Reduce dims differ: self " + Shape(self->dims) + ", mat2 " + Shape(mat2->dims));
    }
    const std::vector<int64_t> a_batch(ad.begin(), ad.end() - 2), b_batch(bd.begin(), bd.end() - 2);
    std::vector<int64_t> batch(std::max(a_batch.size(), b_batch.size()), 1);
    for (size_t i = 0; i < batch.size(); ++i) {
      const int64_t x = i < batch.size() - a_batch.size() ? 1 : a_batch[i - (batch.size() - a_batch.size())];
      const int64_t y = i < batch.size() - b_batch.size() ? 1 : b_batch[i - (batch.size() - b_batch.size())];
      if (x != y && x != 1 && y != 1) {
        return Fail(kInvalid, "self " + Shape(self->dims) + " and mat2 " + Shape(mat2->dims) + " do not broadcast");
      }
      batch[i] = x == 1 ? y : x;
    }
    std::vector<int64_t> want = batch;
    if (!a1) want.push_back(ad[ad.size() - 2]);
    if (!b1) want.push_back(bd.back());
    if (out->dims != want) return Fail(kInvalid, "out shape " + Shape(out->dims) + " must be " + Shape(want));
    *workspace_size = WorkspaceFor(ad[ad.size() - 2]);
    *executor = NewExecutor("aclnnMatmul", *workspace_size, [=] {
      MatmulRun(self, ad, mat2, bd, out, batch, nullptr, 0.0f, 1.0f);
    });
    return kOk;
  });
}

EXPORT Status aclnnMatmul(void* workspace, uint64_t workspace_size, aclOpExecutor* executor, void* stream) {
  return Execute("aclnnMatmul", workspace, workspace_size, executor, stream);
}

EXPORT Status aclnnAddmmGetWorkspaceSize(const aclTensor* self, const aclTensor* mat1, const aclTensor* mat2,
                                         const aclScalar* beta, const aclScalar* alpha, aclTensor* out,
                                         int8_t cube_math_type, uint64_t* workspace_size, aclOpExecutor** executor) {
  const char* fn = "aclnnAddmmGetWorkspaceSize";
  const std::string fields = "\"self\":" + Json(self) + ",\"mat1\":" + Json(mat1) + ",\"mat2\":" + Json(mat2) +
                             ",\"beta\":" + Json(beta) + ",\"alpha\":" + Json(alpha) + ",\"out\":" + Json(out) +
                             ",\"cubeMathType\":" + std::to_string(cube_math_type);
  return Logged(fn, fields, workspace_size, [&]() -> Status {
    if (Status s = Begin(fn, workspace_size, executor)) return s;
    if (self == nullptr || mat1 == nullptr || mat2 == nullptr || out == nullptr) {
      return Fail(kNullptr, "The passed self, mat1, mat2, or out is a null pointer");
    }
    for (auto [t, name] : {std::pair{self, "self"}, {mat1, "mat1"}, {mat2, "mat2"}, {(const aclTensor*)out, "out"}}) {
      if (Status s = CheckTensor(t, name, true)) return s;
    }
    if (Status s = CheckScalar(beta, "beta")) return s;
    if (Status s = CheckScalar(alpha, "alpha")) return s;
    if (self->dims.size() > 2) return Fail(kInvalid, "self must have 1 or 2 dimensions, got " + Shape(self->dims));
    for (auto [t, name] : {std::pair{mat1, "mat1"}, {mat2, "mat2"}, {(const aclTensor*)out, "out"}}) {
      if (t->dims.size() != 2) return Fail(kInvalid, std::string(name) + " must be 2-D, got " + Shape(t->dims));
    }
    if (!Contiguous(out)) return Fail(kInvalid, "out must be contiguous (non-contiguous out is not supported)");
    int32_t deduced = -1;
    if (Status s = MatmulTypes(mat1, "mat1", mat2, "mat2", out, &deduced)) return s;
    if (Deduce(self->dtype, deduced) < 0) {
      return Fail(kInvalid, std::string("self ") + DTypeName(self->dtype) + " cannot be deduced with mat1 @ mat2's " +
                                DTypeName(deduced));
    }
    if (Status s = CubeMathTypeRules("aclnnAddmm", deduced, cube_math_type, true)) return s;
    const int64_t m = mat1->dims[0], k = mat1->dims[1], n = mat2->dims[1];
    if (mat2->dims[0] != k) {
      return Fail(kInvalid, "mat1 " + Shape(mat1->dims) + " and mat2 " + Shape(mat2->dims) +
                                " do not meet the condition of multiplication");
    }
    const std::vector<int64_t> mn{m, n};
    if (out->dims != mn) return Fail(kInvalid, "The shape of out " + Shape(out->dims) + " is inconsistent with mat1@mat2 " + Shape(mn));
    if (!Broadcasts(self->dims, mn)) return Fail(kInvalid, "self " + Shape(self->dims) + " does not broadcast to " + Shape(mn));
    if (cube_math_type == 4 && deduced != kF32 && self->dims != mn) {
      return Fail(kInvalid, "cubeMathType 4 with FLOAT16/BFLOAT16: self cannot be broadcast");
    }
    const float b = static_cast<float>(beta->value), a = static_cast<float>(alpha->value);
    *workspace_size = WorkspaceFor(m);
    *executor = NewExecutor("aclnnAddmm", *workspace_size, [=] {
      MatmulRun(mat1, mat1->dims, mat2, mat2->dims, out, {}, self, b, a);
    });
    return kOk;
  });
}

EXPORT Status aclnnAddmm(void* workspace, uint64_t workspace_size, aclOpExecutor* executor, void* stream) {
  return Execute("aclnnAddmm", workspace, workspace_size, executor, stream);
}

// ================================================================== activation family
// hicann/ops-nn activation/: gelu_v2/docs/aclnnGeluV2_en.md, swish (aclnnSwish, CANN operator API
// reference), silu (aclnnSilu), swi_glu/docs/aclnnSwiGlu.md, ge_glu_v2/docs/aclnnGeGlu_en.md;
// hicann/ops-math math/mul/docs/aclnnMul&aclnnInplaceMul_en.md. The documented formulas are
// evaluated in float64, then stored through float32 into out's dtype (the docs say nothing finer).

namespace {

enum class ActProduct { kA2A3, k950, kInference, kTraining, k200I500A2 };

ActProduct ActProductOf() {
  const std::string name(aclrtGetSocName());
  auto starts = [&](const char* p) { return name.rfind(p, 0) == 0; };
  if (starts("Ascend910B") || starts("Ascend910_93")) return ActProduct::kA2A3;
  if (starts("Ascend950")) return ActProduct::k950;
  if (starts("Ascend310P")) return ActProduct::kInference;
  if (starts("Ascend310B")) return ActProduct::k200I500A2;
  if (starts("Ascend910")) return ActProduct::kTraining;
  return ActProduct::kA2A3;
}

// The product rules the activation docs share: `allowed` lists the products the op's table marks
// supported; Atlas inference and training products take FLOAT16 / FLOAT32 only.
Status ActivationProductRules(const char* api, int32_t dtype, std::initializer_list<ActProduct> allowed) {
  const ActProduct product = ActProductOf();
  if (std::find(allowed.begin(), allowed.end(), product) == allowed.end()) {
    return Fail(kInvalid, std::string(api) + " is not supported on " + aclrtGetSocName());
  }
  if ((product == ActProduct::kInference || product == ActProduct::kTraining) && dtype == kBF16) {
    return Fail(kInvalid, std::string(api) + ": BFLOAT16 is not supported on " + aclrtGetSocName());
  }
  return kOk;
}

constexpr std::initializer_list<ActProduct> kElementwiseProducts = {ActProduct::kA2A3, ActProduct::k950,
                                                                    ActProduct::kInference, ActProduct::kTraining};

double GeluOf(double x, int64_t approximate) {
  if (approximate == 1) return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
  return 0.5 * x * std::erfc(-x / std::sqrt(2.0));
}

double SwishOf(double x, double beta) {
  const double t = beta * x;
  return t >= 0 ? x / (1.0 + std::exp(-t)) : x * std::exp(t) / (1.0 + std::exp(t));
}

// self and out: same dtype, same shape (the unary activations).
Status UnaryArgs(const aclTensor* self, const char* sn, const aclTensor* out, const char* on) {
  if (Status s = CheckTensor(self, sn, true)) return s;
  if (Status s = CheckTensor(out, on, true)) return s;
  if (Status s = SameType(self, sn, out, on)) return s;
  return SameShape(self, sn, out, on);
}

// out (and outGelu) of the GLU ops: self's shape with dim halved, self's dtype; returns dim >= 0.
Status HalvedArgs(const aclTensor* self, int64_t dim, const aclTensor* out, const char* on, size_t* axis) {
  const int64_t rank = static_cast<int64_t>(self->dims.size());
  if (dim < -rank || dim >= rank) return Fail(kInvalid, "dim " + std::to_string(dim) + " is out of range");
  *axis = static_cast<size_t>(dim < 0 ? dim + rank : dim);
  if (self->dims[*axis] % 2 != 0) return Fail(kInvalid, "the dim axis of self must be even, got " + Shape(self->dims));
  std::vector<int64_t> half = self->dims;
  half[*axis] /= 2;
  if (out->dims != half) return Fail(kInvalid, std::string(on) + " shape " + Shape(out->dims) + " must be " + Shape(half));
  return SameType(self, "self", out, on);
}

// The flat indices of halves A (first) and B (second) of self along `axis` for out's element i.
std::pair<int64_t, int64_t> Halves(const aclTensor* self, size_t axis, int64_t i) {
  int64_t inner = 1;
  for (size_t d = axis + 1; d < self->dims.size(); ++d) inner *= self->dims[d];
  const int64_t half = self->dims[axis] / 2;
  const int64_t outer = i / (half * inner), rest = i % (half * inner);
  const int64_t a = outer * self->dims[axis] * inner + rest;
  return {a, a + half * inner};
}

}  // namespace

EXPORT Status aclnnGeluV2GetWorkspaceSize(const aclTensor* x, int64_t approximate, aclTensor* y,
                                          uint64_t* workspace_size, aclOpExecutor** executor) {
  const char* fn = "aclnnGeluV2GetWorkspaceSize";
  const std::string fields = "\"x\":" + Json(x) + ",\"approximate\":" + std::to_string(approximate) + ",\"y\":" + Json(y);
  return Logged(fn, fields, workspace_size, [&]() -> Status {
    if (Status s = Begin(fn, workspace_size, executor)) return s;
    if (Status s = UnaryArgs(x, "x", y, "y")) return s;
    if (approximate != 0 && approximate != 1) return Fail(kInvalid, "approximate must be 0 (none) or 1 (tanh)");
    if (Status s = ActivationProductRules("aclnnGeluV2", x->dtype, kElementwiseProducts)) return s;
    *workspace_size = 0;
    *executor = NewExecutor("aclnnGeluV2", 0, [=] {
      for (int64_t i = 0, n = Count(x->dims); i < n; ++i) Store(y, i, static_cast<float>(GeluOf(Load(x, i), approximate)));
    });
    return kOk;
  });
}

EXPORT Status aclnnGeluV2(void* workspace, uint64_t workspace_size, aclOpExecutor* executor, void* stream) {
  return Execute("aclnnGeluV2", workspace, workspace_size, executor, stream);
}

EXPORT Status aclnnSwishGetWorkspaceSize(const aclTensor* self, const aclScalar* beta, aclTensor* out,
                                         uint64_t* workspace_size, aclOpExecutor** executor) {
  const char* fn = "aclnnSwishGetWorkspaceSize";
  const std::string fields = "\"self\":" + Json(self) + ",\"betaOptional\":" + Json(beta) + ",\"out\":" + Json(out);
  return Logged(fn, fields, workspace_size, [&]() -> Status {
    if (Status s = Begin(fn, workspace_size, executor)) return s;
    if (Status s = UnaryArgs(self, "self", out, "out")) return s;
    if (beta != nullptr) {
      if (Status s = CheckScalar(beta, "betaOptional")) return s;
    }
    if (Status s = ActivationProductRules("aclnnSwish", self->dtype, kElementwiseProducts)) return s;
    const double b = beta != nullptr ? beta->value : 1.0;  // "when betaOptional is null, 1.0 is used"
    *workspace_size = 0;
    *executor = NewExecutor("aclnnSwish", 0, [=] {
      for (int64_t i = 0, n = Count(self->dims); i < n; ++i) Store(out, i, static_cast<float>(SwishOf(Load(self, i), b)));
    });
    return kOk;
  });
}

EXPORT Status aclnnSwish(void* workspace, uint64_t workspace_size, aclOpExecutor* executor, void* stream) {
  return Execute("aclnnSwish", workspace, workspace_size, executor, stream);
}

EXPORT Status aclnnSiluGetWorkspaceSize(const aclTensor* self, aclTensor* out, uint64_t* workspace_size,
                                        aclOpExecutor** executor) {
  const char* fn = "aclnnSiluGetWorkspaceSize";
  return Logged(fn, "\"self\":" + Json(self) + ",\"out\":" + Json(out), workspace_size, [&]() -> Status {
    if (Status s = Begin(fn, workspace_size, executor)) return s;
    if (Status s = UnaryArgs(self, "self", out, "out")) return s;
    if (Status s = ActivationProductRules("aclnnSilu", self->dtype, kElementwiseProducts)) return s;
    *workspace_size = 0;
    *executor = NewExecutor("aclnnSilu", 0, [=] {
      for (int64_t i = 0, n = Count(self->dims); i < n; ++i) Store(out, i, static_cast<float>(SwishOf(Load(self, i), 1.0)));
    });
    return kOk;
  });
}

EXPORT Status aclnnSilu(void* workspace, uint64_t workspace_size, aclOpExecutor* executor, void* stream) {
  return Execute("aclnnSilu", workspace, workspace_size, executor, stream);
}

// out = Swish(A) * B, A and B the first and second halves of x along dim; x contiguous, not empty.
EXPORT Status aclnnSwiGluGetWorkspaceSize(const aclTensor* x, int64_t dim, const aclTensor* out,
                                          uint64_t* workspace_size, aclOpExecutor** executor) {
  const char* fn = "aclnnSwiGluGetWorkspaceSize";
  const std::string fields = "\"x\":" + Json(x) + ",\"dim\":" + std::to_string(dim) + ",\"out\":" + Json(out);
  return Logged(fn, fields, workspace_size, [&]() -> Status {
    if (Status s = Begin(fn, workspace_size, executor)) return s;
    if (Status s = CheckTensor(x, "x", true)) return s;
    if (Status s = CheckTensor(out, "out", true)) return s;
    if (!Contiguous(x) || !Contiguous(out)) return Fail(kInvalid, "non-contiguous tensors are not supported");
    if (Count(x->dims) == 0) return Fail(kInvalid, "empty tensors are not supported");
    size_t axis = 0;
    if (Status s = HalvedArgs(x, dim, out, "out", &axis)) return s;
    if (Status s = ActivationProductRules("aclnnSwiGlu", x->dtype, {ActProduct::kA2A3, ActProduct::kInference})) return s;
    if (ActProductOf() == ActProduct::kInference && (x->dims.back() * (x->dtype == kF32 ? 4 : 2)) % 64 != 0) {
      return Fail(kInvalid, "aclnnSwiGlu on Atlas inference products: shape not 64-byte aligned");
    }
    *workspace_size = 0;
    *executor = NewExecutor("aclnnSwiGlu", 0, [=] {
      for (int64_t i = 0, n = Count(out->dims); i < n; ++i) {
        const auto [a, b] = Halves(x, axis, i);
        Store(out, i, static_cast<float>(SwishOf(Load(x, a), 1.0) * Load(x, b)));
      }
    });
    return kOk;
  });
}

EXPORT Status aclnnSwiGlu(void* workspace, uint64_t workspace_size, aclOpExecutor* executor, void* stream) {
  return Execute("aclnnSwiGlu", workspace, workspace_size, executor, stream);
}

// out = A * Gelu(B), outGelu = Gelu(B), A and B the first and second halves of self along dim.
EXPORT Status aclnnGeGluGetWorkspaceSize(const aclTensor* self, int64_t dim, int64_t approximate, aclTensor* out,
                                         aclTensor* out_gelu, uint64_t* workspace_size, aclOpExecutor** executor) {
  const char* fn = "aclnnGeGluGetWorkspaceSize";
  const std::string fields = "\"self\":" + Json(self) + ",\"dim\":" + std::to_string(dim) + ",\"approximate\":" +
                             std::to_string(approximate) + ",\"out\":" + Json(out) + ",\"outGelu\":" + Json(out_gelu);
  return Logged(fn, fields, workspace_size, [&]() -> Status {
    if (Status s = Begin(fn, workspace_size, executor)) return s;
    for (auto [t, name] : {std::pair{self, "self"}, {(const aclTensor*)out, "out"}, {(const aclTensor*)out_gelu, "outGelu"}}) {
      if (Status s = CheckTensor(t, name, true)) return s;
    }
    size_t axis = 0;
    if (Status s = HalvedArgs(self, dim, out, "out", &axis)) return s;
    if (Status s = HalvedArgs(self, dim, out_gelu, "outGelu", &axis)) return s;
    if (approximate != 0 && approximate != 1) return Fail(kInvalid, "approximate must be 0 (none) or 1 (tanh)");
    if (Status s = ActivationProductRules("aclnnGeGlu", self->dtype,
                                          {ActProduct::kA2A3, ActProduct::k950, ActProduct::kInference})) {
      return s;
    }
    *workspace_size = 0;
    *executor = NewExecutor("aclnnGeGlu", 0, [=] {
      for (int64_t i = 0, n = Count(out->dims); i < n; ++i) {
        const auto [a, b] = Halves(self, axis, i);
        const double gelu = GeluOf(Load(self, b), approximate);
        Store(out_gelu, i, static_cast<float>(gelu));
        Store(out, i, static_cast<float>(Load(self, a) * gelu));
      }
    });
    return kOk;
  });
}

EXPORT Status aclnnGeGlu(void* workspace, uint64_t workspace_size, aclOpExecutor* executor, void* stream) {
  return Execute("aclnnGeGlu", workspace, workspace_size, executor, stream);
}

// selfRef *= other, other broadcast to selfRef (the fake takes one floating dtype for both).
EXPORT Status aclnnInplaceMulGetWorkspaceSize(aclTensor* self_ref, const aclTensor* other, uint64_t* workspace_size,
                                              aclOpExecutor** executor) {
  const char* fn = "aclnnInplaceMulGetWorkspaceSize";
  return Logged(fn, "\"selfRef\":" + Json(self_ref) + ",\"other\":" + Json(other), workspace_size, [&]() -> Status {
    if (Status s = Begin(fn, workspace_size, executor)) return s;
    if (Status s = CheckTensor(self_ref, "selfRef", true)) return s;
    if (Status s = CheckTensor(other, "other", true)) return s;
    if (Status s = SameType(self_ref, "selfRef", other, "other")) return s;
    if (!Broadcasts(other->dims, self_ref->dims)) {
      return Fail(kInvalid, "other shape " + Shape(other->dims) + " does not broadcast to selfRef " + Shape(self_ref->dims));
    }
    if (Status s = ActivationProductRules("aclnnInplaceMul", self_ref->dtype, kElementwiseProducts)) return s;
    *workspace_size = 0;
    *executor = NewExecutor("aclnnInplaceMul", 0, [=] {
      for (int64_t i = 0, n = Count(self_ref->dims); i < n; ++i) {
        const double product = static_cast<double>(Load(self_ref, i)) * Load(other, BroadcastIndex(self_ref->dims, other->dims, i));
        Store(self_ref, i, static_cast<float>(product));
      }
    });
    return kOk;
  });
}

EXPORT Status aclnnInplaceMul(void* workspace, uint64_t workspace_size, aclOpExecutor* executor, void* stream) {
  return Execute("aclnnInplaceMul", workspace, workspace_size, executor, stream);
}
