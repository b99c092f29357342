// PROBE, not part of the library (bench/README.md, "norm_linear through a plugin EP"): can a
// library, loaded with onnxruntime.register_execution_provider_library, claim only the otfuse
// *NormLinear nodes of a session on CPU, get OrtKernelImpl::PrePackWeight on their weights, and
// have ORT free the initializers afterwards? The kernel here is a naive float32 RMSNormLinear
// (transposed = 0, no bias) over its own copy of each weight: enough to check outputs and memory,
// not a fast path. Build (ORT >= 1.24 headers):
//   g++ -O2 -std=c++17 -shared -fPIC -I<ort headers> bench/norm_linear_ep_probe.cc -o /tmp/ep_probe.so
// Driver: bench/norm_linear_ep_probe.py.
#include <onnxruntime_c_api.h>

#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

const OrtApi* g_api = nullptr;
const OrtEpApi* g_ep_api = nullptr;
constexpr const char* kEpName = "OtfuseProbeEp";

OrtStatus* Fail(const std::string& message) { return g_api->CreateStatus(ORT_EP_FAIL, message.c_str()); }

#define PROBE_RETURN_IF(status_expr)            \
  do {                                          \
    OrtStatus* probe_status_ = (status_expr);   \
    if (probe_status_ != nullptr) return probe_status_; \
  } while (0)

// Leading (norm) inputs per op: the weights follow them.
int NormInputs(const std::string& op) {
  if (op == "RMSNormLinear") return 2;
  if (op == "AddRMSNormLinear" || op == "LayerNormLinear") return 3;
  if (op == "AddLayerNormLinear") return 4;
  return -1;
}

struct ProbeKernel : OrtKernelImpl {
  int first_weight = 0;
  std::vector<int64_t> widths;
  std::vector<void*> packed;  // one per weight, from `allocator`; null until PrePackWeight
  OrtAllocator* allocator = nullptr;
};

OrtStatus* ORT_API_CALL PrePack(OrtKernelImpl* self, const OrtValue* tensor, int input_index,
                                OrtAllocator* allocator, OrtSharedPrePackedWeightCache* cache,
                                bool* is_packed) noexcept {
  auto* kernel = static_cast<ProbeKernel*>(self);
  *is_packed = false;
  const int w = input_index - kernel->first_weight;
  if (w < 0 || w >= static_cast<int>(kernel->widths.size())) return nullptr;
  OrtTensorTypeAndShapeInfo* info = nullptr;
  PROBE_RETURN_IF(g_api->GetTensorTypeAndShape(tensor, &info));
  size_t count = 0;
  OrtStatus* status = g_api->GetTensorShapeElementCount(info, &count);
  g_api->ReleaseTensorTypeAndShapeInfo(info);
  PROBE_RETURN_IF(status);
  const void* data = nullptr;
  PROBE_RETURN_IF(g_api->GetTensorData(tensor, &data));
  void* copy = allocator->Alloc(allocator, count * sizeof(float));
  if (copy == nullptr) return Fail("probe: out of memory");
  std::memcpy(copy, data, count * sizeof(float));
  kernel->packed[w] = copy;
  kernel->allocator = allocator;
  *is_packed = true;
  std::fprintf(stderr, "probe: PrePackWeight input %d, %zu floats, cache %s\n", input_index, count,
               cache ? "offered" : "null");
  return nullptr;
}

// y = rmsnorm(x) * scale, then Y_i = y . W_i; float32, [K, N_i] weights, no bias.
OrtStatus* ORT_API_CALL Compute(OrtKernelImpl* self, OrtKernelContext* context) noexcept {
  auto* kernel = static_cast<ProbeKernel*>(self);
  if (kernel->first_weight != 2) return Fail("probe: only RMSNormLinear");
  const OrtValue* x = nullptr;
  const OrtValue* scale = nullptr;
  PROBE_RETURN_IF(g_api->KernelContext_GetInput(context, 0, &x));
  PROBE_RETURN_IF(g_api->KernelContext_GetInput(context, 1, &scale));
  OrtTensorTypeAndShapeInfo* info = nullptr;
  PROBE_RETURN_IF(g_api->GetTensorTypeAndShape(x, &info));
  size_t rank = 0;
  g_api->GetDimensionsCount(info, &rank);
  std::vector<int64_t> shape(rank);
  g_api->GetDimensions(info, shape.data(), rank);
  g_api->ReleaseTensorTypeAndShapeInfo(info);
  if (rank == 0) return Fail("probe: X must have rank >= 1");
  const int64_t k = shape.back();
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < rank; ++i) rows *= shape[i];
  const void* xv = nullptr;
  const void* sv = nullptr;
  PROBE_RETURN_IF(g_api->GetTensorData(x, &xv));
  PROBE_RETURN_IF(g_api->GetTensorData(scale, &sv));
  const float* xf = static_cast<const float*>(xv);
  const float* sf = static_cast<const float*>(sv);
  std::vector<float> y(static_cast<size_t>(rows * k));
  for (int64_t r = 0; r < rows; ++r) {
    double sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += double(xf[r * k + j]) * xf[r * k + j];
    const float inv = 1.0f / std::sqrt(float(sum / k) + 1e-6f);
    for (int64_t j = 0; j < k; ++j) y[r * k + j] = xf[r * k + j] * inv * sf[j];
  }
  for (size_t i = 0; i < kernel->widths.size(); ++i) {
    const int64_t n = kernel->widths[i];
    const float* w = static_cast<const float*>(kernel->packed[i]);
    if (w == nullptr) {  // not prepacked (e.g. a weight that is no initializer): read the input
      const OrtValue* wv = nullptr;
      const void* data = nullptr;
      PROBE_RETURN_IF(g_api->KernelContext_GetInput(context, kernel->first_weight + i, &wv));
      PROBE_RETURN_IF(g_api->GetTensorData(wv, &data));
      w = static_cast<const float*>(data);
    }
    std::vector<int64_t> out_shape(shape);
    out_shape.back() = n;
    OrtValue* out = nullptr;
    PROBE_RETURN_IF(g_api->KernelContext_GetOutput(context, i, out_shape.data(), rank, &out));
    float* yo = nullptr;
    PROBE_RETURN_IF(g_api->GetTensorMutableData(out, reinterpret_cast<void**>(&yo)));
    for (int64_t r = 0; r < rows; ++r) {
      float* row = yo + r * n;
      std::fill(row, row + n, 0.0f);
      for (int64_t j = 0; j < k; ++j) {
        const float a = y[r * k + j];
        const float* wr = w + j * n;
        for (int64_t c = 0; c < n; ++c) row[c] += a * wr[c];
      }
    }
  }
  return nullptr;
}

void ORT_API_CALL ReleaseKernel(OrtKernelImpl* self) noexcept {
  auto* kernel = static_cast<ProbeKernel*>(self);
  for (void* p : kernel->packed) {
    if (p != nullptr) kernel->allocator->Free(kernel->allocator, p);
  }
  delete kernel;
}

OrtStatus* ORT_API_CALL CreateKernel(void* state, const OrtKernelInfo* info, OrtKernelImpl** out) noexcept {
  *out = nullptr;
  auto* kernel = new ProbeKernel{};
  kernel->ort_version_supported = ORT_API_VERSION;
  kernel->Compute = Compute;
  kernel->Release = ReleaseKernel;
  kernel->PrePackWeight = PrePack;
  kernel->first_weight = *static_cast<const int*>(state);
  size_t size = 0;
  g_api->KernelInfoGetAttributeArray_int64(info, "out_features", nullptr, &size);
  kernel->widths.resize(size);
  OrtStatus* status = g_api->KernelInfoGetAttributeArray_int64(info, "out_features", kernel->widths.data(), &size);
  if (status != nullptr) {
    delete kernel;
    return status;
  }
  kernel->packed.assign(size, nullptr);
  *out = kernel;
  return nullptr;
}

const char* kOps[] = {"RMSNormLinear", "AddRMSNormLinear", "LayerNormLinear", "AddLayerNormLinear"};
const int kFirstWeight[] = {2, 3, 3, 4};

OrtStatus* BuildRegistry(OrtKernelRegistry** out) {
  PROBE_RETURN_IF(g_ep_api->CreateKernelRegistry(out));
  for (int i = 0; i < 4; ++i) {
    OrtKernelDefBuilder* builder = nullptr;
    PROBE_RETURN_IF(g_ep_api->CreateKernelDefBuilder(&builder));
    OrtKernelDef* def = nullptr;
    OrtStatus* status = g_ep_api->KernelDefBuilder_SetOperatorType(builder, kOps[i]);
    if (!status) status = g_ep_api->KernelDefBuilder_SetDomain(builder, "otfuse");
    if (!status) status = g_ep_api->KernelDefBuilder_SetSinceVersion(builder, 1, INT_MAX);
    if (!status) status = g_ep_api->KernelDefBuilder_SetExecutionProvider(builder, kEpName);
    if (!status) status = g_ep_api->KernelDefBuilder_Build(builder, &def);
    g_ep_api->ReleaseKernelDefBuilder(builder);
    if (!status) status = g_ep_api->KernelRegistry_AddKernel(*out, def, CreateKernel, const_cast<int*>(&kFirstWeight[i]));
    if (def) g_ep_api->ReleaseKernelDef(def);
    PROBE_RETURN_IF(status);
  }
  return nullptr;
}

struct ProbeEp : OrtEp {
  OrtKernelRegistry* registry = nullptr;
};

const char* ORT_API_CALL EpName(const OrtEp*) noexcept { return kEpName; }

OrtStatus* ORT_API_CALL GetCapability(OrtEp*, const OrtGraph* graph, OrtEpGraphSupportInfo* support) noexcept {
  size_t count = 0;
  PROBE_RETURN_IF(g_api->Graph_GetNumNodes(graph, &count));
  std::vector<const OrtNode*> nodes(count);
  PROBE_RETURN_IF(g_api->Graph_GetNodes(graph, nodes.data(), count));
  int claimed = 0;
  for (const OrtNode* node : nodes) {
    const char* domain = nullptr;
    const char* op = nullptr;
    PROBE_RETURN_IF(g_api->Node_GetDomain(node, &domain));
    PROBE_RETURN_IF(g_api->Node_GetOperatorType(node, &op));
    if (std::strcmp(domain, "otfuse") != 0 || NormInputs(op) < 0) continue;
    const OrtKernelDef* def = nullptr;
    PROBE_RETURN_IF(g_ep_api->EpGraphSupportInfo_LookUpKernel(support, node, &def));
    if (def == nullptr) continue;
    PROBE_RETURN_IF(g_ep_api->EpGraphSupportInfo_AddSingleNode(support, node));
    ++claimed;
  }
  std::fprintf(stderr, "probe: GetCapability claimed %d of %zu nodes\n", claimed, count);
  return nullptr;
}

OrtStatus* ORT_API_CALL GetKernelRegistry(OrtEp* self, const OrtKernelRegistry** out) noexcept {
  auto* ep = static_cast<ProbeEp*>(self);
  if (ep->registry == nullptr) PROBE_RETURN_IF(BuildRegistry(&ep->registry));
  *out = ep->registry;
  return nullptr;
}

struct ProbeFactory : OrtEpFactory {};

const char* ORT_API_CALL FactoryName(const OrtEpFactory*) noexcept { return kEpName; }
const char* ORT_API_CALL FactoryVendor(const OrtEpFactory*) noexcept { return "otfuse"; }
uint32_t ORT_API_CALL FactoryVendorId(const OrtEpFactory*) noexcept { return 0; }
const char* ORT_API_CALL FactoryVersion(const OrtEpFactory*) noexcept { return "0.1.0"; }

OrtStatus* ORT_API_CALL SupportedDevices(OrtEpFactory* self, const OrtHardwareDevice* const* devices, size_t count,
                                         OrtEpDevice** ep_devices, size_t max, size_t* found) noexcept {
  *found = 0;
  for (size_t i = 0; i < count && *found < max; ++i) {
    if (g_api->HardwareDevice_Type(devices[i]) != OrtHardwareDeviceType_CPU) continue;
    OrtEpDevice* ep_device = nullptr;
    PROBE_RETURN_IF(g_ep_api->CreateEpDevice(self, devices[i], nullptr, nullptr, &ep_device));
    ep_devices[(*found)++] = ep_device;
  }
  return nullptr;
}

OrtStatus* ORT_API_CALL CreateEp(OrtEpFactory*, const OrtHardwareDevice* const*, const OrtKeyValuePairs* const*,
                                 size_t, const OrtSessionOptions*, const OrtLogger*, OrtEp** out) noexcept {
  auto* ep = new ProbeEp{};
  ep->ort_version_supported = ORT_API_VERSION;
  ep->GetName = EpName;
  ep->GetCapability = GetCapability;
  ep->GetKernelRegistry = GetKernelRegistry;
  *out = ep;
  return nullptr;
}

// ORT 1.32 calls these without a null check: a CPU EP of ORT's own memory has nothing to add.
OrtStatus* ORT_API_CALL NoAllocator(OrtEpFactory*, const OrtMemoryInfo*, const OrtKeyValuePairs*,
                                    OrtAllocator** out) noexcept {
  *out = nullptr;
  return nullptr;
}
void ORT_API_CALL ReleaseNoAllocator(OrtEpFactory*, OrtAllocator*) noexcept {}
OrtStatus* ORT_API_CALL NoDataTransfer(OrtEpFactory*, OrtDataTransferImpl** out) noexcept {
  *out = nullptr;
  return nullptr;
}
bool ORT_API_CALL NotStreamAware(const OrtEpFactory*) noexcept { return false; }
OrtStatus* ORT_API_CALL NoStream(OrtEpFactory*, const OrtMemoryDevice*, const OrtKeyValuePairs*,
                                 OrtSyncStreamImpl** out) noexcept {
  *out = nullptr;
  return nullptr;
}
OrtStatus* ORT_API_CALL NoCustomOpDomains(OrtEpFactory*, size_t* count) noexcept {
  *count = 0;
  return nullptr;
}

void ORT_API_CALL ReleaseEp(OrtEpFactory*, OrtEp* ep) noexcept {
  auto* probe = static_cast<ProbeEp*>(ep);
  if (probe->registry) g_ep_api->ReleaseKernelRegistry(probe->registry);
  delete probe;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) OrtStatus* CreateEpFactories(
    const char*, const OrtApiBase* base, const OrtLogger*, OrtEpFactory** factories, size_t max, size_t* count) {
  *count = 0;
  g_api = base->GetApi(ORT_API_VERSION);
  if (g_api == nullptr) return nullptr;  // ORT older than these headers: no factory
  g_ep_api = g_api->GetEpApi();
  if (max < 1) return g_api->CreateStatus(ORT_INVALID_ARGUMENT, "probe: no room for a factory");
  auto* factory = new ProbeFactory{};
  factory->ort_version_supported = ORT_API_VERSION;
  factory->GetName = FactoryName;
  factory->GetVendor = FactoryVendor;
  factory->GetVendorId = FactoryVendorId;
  factory->GetVersion = FactoryVersion;
  factory->GetSupportedDevices = SupportedDevices;
  factory->CreateEp = CreateEp;
  factory->ReleaseEp = ReleaseEp;
  factory->CreateAllocator = NoAllocator;
  factory->ReleaseAllocator = ReleaseNoAllocator;
  factory->CreateDataTransfer = NoDataTransfer;
  factory->IsStreamAware = NotStreamAware;
  factory->CreateSyncStreamForDevice = NoStream;
  factory->GetNumCustomOpDomains = NoCustomOpDomains;
  factories[0] = factory;
  *count = 1;
  return nullptr;
}

extern "C" __attribute__((visibility("default"))) OrtStatus* ReleaseEpFactory(OrtEpFactory* factory) {
  delete static_cast<ProbeFactory*>(factory);
  return nullptr;
}
