// The Norm + Linear kernels as a plugin execution provider (ORT >= 1.24's kernel-registry EP API,
// onnxruntime_ep_c_api.h), so that their weights are packed once: an OrtCustomOp has no
// pre-pack hook, an OrtKernelImpl has PrePackWeight, after which ORT frees the initializer (as it
// does for its own MatMul), so the packed panels replace W instead of doubling it.
//
// The library is registered twice by otfuse.InferenceSession (otfuse/run/session.py): as the
// custom-op library (the otfuse schemas, and every kernel, for the CPU EP) and, when ORT has the
// API, as this EP library, whose EP claims only the otfuse *NormLinear nodes. Its device is the
// host CPU with ORT's own CPU memory (no allocator nor data transfer of its own), so ORT inserts
// no copies between it and the CPU EP. The EP's kernels are those of cpu/norm_linear.cc.
// With an older ORT (API < 24) CreateEpFactories reports no factory and the custom ops run alone.
// bench/README.md ("norm_linear through a plugin EP") has the measurements.
#include <climits>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "cpu/norm_linear.h"
#include "op_registry.h"
#include "ort_glue.h"

#if ORT_API_VERSION >= 24

namespace otfuse::cpu {
namespace {

constexpr const char* kEpName = "OtfuseCPUExecutionProvider";

// The API 24 table, for the EP functions; kernels keep using Api() (API 17).
const OrtApi* g_ort = nullptr;
const OrtEpApi* g_ep = nullptr;

OrtStatus* StatusOf(const std::string& where, const std::exception& e) {
  return g_ort->CreateStatus(dynamic_cast<const Error*>(&e) ? ORT_INVALID_ARGUMENT : ORT_FAIL,
                             (where + ": " + e.what()).c_str());
}

// ---- Kernels: one OrtKernelImpl per node, around cpu/norm_linear.cc's kernel.

struct Kernel : OrtKernelImpl {
  std::string where;
  std::unique_ptr<NormLinearOp> op;
  std::shared_ptr<PackedWeightCache> packed;  // the session's (its Ep's): weights shared by kernels packed once
};

// CreateKernel's state: one per op name and Ep (one Ep per session).
struct KernelState {
  const char* op_name;
  std::shared_ptr<PackedWeightCache> packed;
};

// A constant input as the kernels read inputs.
InputTensor TensorView(const OrtValue* value) {
  OrtTensorTypeAndShapeInfo* info = nullptr;
  ThrowOnError(g_ort->GetTensorTypeAndShape(value, &info));
  InputTensor tensor;
  size_t rank = 0;
  OrtStatus* status = g_ort->GetTensorElementType(info, &tensor.type);
  if (status == nullptr) status = g_ort->GetDimensionsCount(info, &rank);
  tensor.shape.resize(rank);
  if (status == nullptr) status = g_ort->GetDimensions(info, tensor.shape.data(), rank);
  g_ort->ReleaseTensorTypeAndShapeInfo(info);
  ThrowOnError(status);
  ThrowOnError(g_ort->GetTensorData(value, &tensor.data));
  return tensor;
}

OrtStatus* ORT_API_CALL KernelCompute(OrtKernelImpl* self, OrtKernelContext* context) noexcept {
  auto* kernel = static_cast<Kernel*>(self);
  try {
    kernel->op->Compute(KernelContext(context));
    return nullptr;
  } catch (const std::exception& e) {
    return StatusOf(kernel->where, e);
  }
}

// Non-sharing mode: the panels are owned by the kernels that read them (freed with the last);
// ORT's cache (only given with a cross-session prepacked-weights container) is not used. Kernels of
// one session that pack the same initializer share its panels through the Ep's PackedWeightCache.
OrtStatus* ORT_API_CALL KernelPrePack(OrtKernelImpl* self, const OrtValue* tensor, int input, OrtAllocator*,
                                      OrtSharedPrePackedWeightCache*, bool* is_packed) noexcept {
  auto* kernel = static_cast<Kernel*>(self);
  *is_packed = false;
  try {
    if (input >= 0) *is_packed = kernel->op->PrePack(static_cast<size_t>(input), TensorView(tensor), *kernel->packed);
    return nullptr;
  } catch (const std::exception& e) {
    return StatusOf(kernel->where, e);
  }
}

void ORT_API_CALL KernelRelease(OrtKernelImpl* self) noexcept { delete static_cast<Kernel*>(self); }

// `state`: a KernelState (the op's name, kNormLinearOpNames, and the session's packed weights).
OrtStatus* ORT_API_CALL CreateKernel(void* state, const OrtKernelInfo* info, OrtKernelImpl** out) noexcept {
  *out = nullptr;
  const auto* kernel_state = static_cast<const KernelState*>(state);
  const char* op_name = kernel_state->op_name;
  std::string where = op_name;
  try {
    const KernelInfo kernel_info(info, op_name);
    where = kernel_info.Where();
    auto kernel = std::make_unique<Kernel>();
    kernel->ort_version_supported = ORT_API_VERSION;
    kernel->Compute = KernelCompute;
    kernel->Release = KernelRelease;
    kernel->PrePackWeight = KernelPrePack;
    kernel->where = where;
    kernel->packed = kernel_state->packed;
    kernel->op = MakeNormLinearOp(kernel_info);
    *out = kernel.release();
    return nullptr;
  } catch (const std::exception& e) {
    return StatusOf(where, e);
  }
}

// ---- The EP: claims the otfuse *NormLinear nodes it has a kernel for.

OrtStatus* AddKernel(OrtKernelRegistry* registry, KernelState& state) {
  const char* op_name = state.op_name;
  OrtKernelDefBuilder* builder = nullptr;
  if (OrtStatus* status = g_ep->CreateKernelDefBuilder(&builder)) return status;
  OrtKernelDef* def = nullptr;
  OrtStatus* status = g_ep->KernelDefBuilder_SetOperatorType(builder, op_name);
  if (status == nullptr) status = g_ep->KernelDefBuilder_SetDomain(builder, kOpDomain);
  if (status == nullptr) status = g_ep->KernelDefBuilder_SetSinceVersion(builder, 1, INT_MAX);
  if (status == nullptr) status = g_ep->KernelDefBuilder_SetExecutionProvider(builder, kEpName);
  if (status == nullptr) status = g_ep->KernelDefBuilder_Build(builder, &def);
  g_ep->ReleaseKernelDefBuilder(builder);
  if (status == nullptr) status = g_ep->KernelRegistry_AddKernel(registry, def, CreateKernel, &state);
  if (def != nullptr) g_ep->ReleaseKernelDef(def);
  return status;
}

struct Ep : OrtEp {
  OrtKernelRegistry* registry = nullptr;
  std::vector<KernelState> kernel_states;  // one per kNormLinearOpNames entry, the registry's kernels' state
};

const char* ORT_API_CALL EpName(const OrtEp*) noexcept { return kEpName; }

bool IsNormLinear(const char* domain, const char* op) {
  if (std::strcmp(domain, kOpDomain) != 0) return false;
  for (const char* name : kNormLinearOpNames) {
    if (std::strcmp(op, name) == 0) return true;
  }
  return false;
}

OrtStatus* ORT_API_CALL EpGetCapability(OrtEp*, const OrtGraph* graph, OrtEpGraphSupportInfo* support) noexcept {
  size_t count = 0;
  if (OrtStatus* status = g_ort->Graph_GetNumNodes(graph, &count)) return status;
  std::vector<const OrtNode*> nodes(count);
  if (OrtStatus* status = g_ort->Graph_GetNodes(graph, nodes.data(), count)) return status;
  for (const OrtNode* node : nodes) {
    const char* domain = nullptr;
    const char* op = nullptr;
    if (OrtStatus* status = g_ort->Node_GetDomain(node, &domain)) return status;
    if (OrtStatus* status = g_ort->Node_GetOperatorType(node, &op)) return status;
    if (!IsNormLinear(domain, op)) continue;
    const OrtKernelDef* def = nullptr;
    if (OrtStatus* status = g_ep->EpGraphSupportInfo_LookUpKernel(support, node, &def)) return status;
    if (def == nullptr) continue;
    if (OrtStatus* status = g_ep->EpGraphSupportInfo_AddSingleNode(support, node)) return status;
  }
  return nullptr;
}

OrtStatus* ORT_API_CALL EpGetKernelRegistry(OrtEp* self, const OrtKernelRegistry** out) noexcept {
  auto* ep = static_cast<Ep*>(self);
  *out = nullptr;
  if (ep->registry == nullptr) {
    OrtKernelRegistry* registry = nullptr;
    if (OrtStatus* status = g_ep->CreateKernelRegistry(&registry)) return status;
    for (KernelState& state : ep->kernel_states) {
      if (OrtStatus* status = AddKernel(registry, state)) {
        g_ep->ReleaseKernelRegistry(registry);
        return status;
      }
    }
    ep->registry = registry;
  }
  *out = ep->registry;
  return nullptr;
}

// ---- The factory: the host CPU, ORT's CPU memory.

const char* ORT_API_CALL FactoryName(const OrtEpFactory*) noexcept { return kEpName; }
const char* ORT_API_CALL FactoryVendor(const OrtEpFactory*) noexcept { return "otfuse"; }
uint32_t ORT_API_CALL FactoryVendorId(const OrtEpFactory*) noexcept { return 0; }
const char* ORT_API_CALL FactoryVersion(const OrtEpFactory*) noexcept { return "0.1.0"; }

OrtStatus* ORT_API_CALL FactoryDevices(OrtEpFactory* self, const OrtHardwareDevice* const* devices, size_t count,
                                       OrtEpDevice** ep_devices, size_t max, size_t* found) noexcept {
  *found = 0;
  for (size_t i = 0; i < count && *found < max; ++i) {
    if (g_ort->HardwareDevice_Type(devices[i]) != OrtHardwareDeviceType_CPU) continue;
    OrtEpDevice* ep_device = nullptr;
    if (OrtStatus* status = g_ep->CreateEpDevice(self, devices[i], nullptr, nullptr, &ep_device)) return status;
    ep_devices[(*found)++] = ep_device;
  }
  return nullptr;
}

OrtStatus* ORT_API_CALL FactoryCreateEp(OrtEpFactory*, const OrtHardwareDevice* const*,
                                        const OrtKeyValuePairs* const*, size_t, const OrtSessionOptions*,
                                        const OrtLogger*, OrtEp** out) noexcept {
  *out = nullptr;
  std::unique_ptr<Ep> ep;
  try {
    ep = std::make_unique<Ep>();
    auto packed = std::make_shared<PackedWeightCache>();
    for (const char* op_name : kNormLinearOpNames) ep->kernel_states.push_back({op_name, packed});
  } catch (const std::bad_alloc&) {
    return g_ort->CreateStatus(ORT_FAIL, "otfuse EP: out of memory");
  }
  ep->ort_version_supported = ORT_API_VERSION;
  ep->GetName = EpName;
  ep->GetCapability = EpGetCapability;
  ep->GetKernelRegistry = EpGetKernelRegistry;
  *out = ep.release();
  return nullptr;
}

void ORT_API_CALL FactoryReleaseEp(OrtEpFactory*, OrtEp* ep) noexcept {
  auto* self = static_cast<Ep*>(ep);
  if (self->registry != nullptr) g_ep->ReleaseKernelRegistry(self->registry);
  delete self;
}

// ORT calls these without checking for null: nothing of our own (ORT's CPU memory, no streams).
OrtStatus* ORT_API_CALL FactoryNoAllocator(OrtEpFactory*, const OrtMemoryInfo*, const OrtKeyValuePairs*,
                                           OrtAllocator** out) noexcept {
  *out = nullptr;
  return nullptr;
}
void ORT_API_CALL FactoryReleaseNoAllocator(OrtEpFactory*, OrtAllocator*) noexcept {}
OrtStatus* ORT_API_CALL FactoryNoDataTransfer(OrtEpFactory*, OrtDataTransferImpl** out) noexcept {
  *out = nullptr;
  return nullptr;
}
bool ORT_API_CALL FactoryNotStreamAware(const OrtEpFactory*) noexcept { return false; }
OrtStatus* ORT_API_CALL FactoryNoStream(OrtEpFactory*, const OrtMemoryDevice*, const OrtKeyValuePairs*,
                                        OrtSyncStreamImpl** out) noexcept {
  *out = nullptr;
  return nullptr;
}
OrtStatus* ORT_API_CALL FactoryNoCustomOpDomains(OrtEpFactory*, size_t* count) noexcept {
  *count = 0;
  return nullptr;
}

// ORT 1.24 on (API 24: OrtKernelImpl), asked before GetApi(24), which prints an error on older
// releases.
bool HasKernelEpApi(const char* version) {
  int major = 0, minor = 0;
  if (version == nullptr || std::sscanf(version, "%d.%d", &major, &minor) != 2) return false;
  return major > 1 || (major == 1 && minor >= 24);
}

OrtEpFactory* NewFactory() {
  auto* factory = new (std::nothrow) OrtEpFactory{};
  if (factory == nullptr) return nullptr;
  factory->ort_version_supported = ORT_API_VERSION;
  factory->GetName = FactoryName;
  factory->GetVendor = FactoryVendor;
  factory->GetVendorId = FactoryVendorId;
  factory->GetVersion = FactoryVersion;
  factory->GetSupportedDevices = FactoryDevices;
  factory->CreateEp = FactoryCreateEp;
  factory->ReleaseEp = FactoryReleaseEp;
  factory->CreateAllocator = FactoryNoAllocator;
  factory->ReleaseAllocator = FactoryReleaseNoAllocator;
  factory->CreateDataTransfer = FactoryNoDataTransfer;
  factory->IsStreamAware = FactoryNotStreamAware;
  factory->CreateSyncStreamForDevice = FactoryNoStream;
  factory->GetNumCustomOpDomains = FactoryNoCustomOpDomains;
  return factory;
}

}  // namespace
}  // namespace otfuse::cpu

// ORT's EP library entry points (onnxruntime.register_execution_provider_library).
extern "C" __attribute__((visibility("default"))) OrtStatus* CreateEpFactories(
    const char*, const OrtApiBase* base, const OrtLogger*, OrtEpFactory** factories, size_t max, size_t* count) {
  *count = 0;
  if (!otfuse::cpu::HasKernelEpApi(base->GetVersionString())) return nullptr;  // the custom ops alone
  const OrtApi* api = base->GetApi(ORT_API_VERSION);
  const OrtApi* kernels_api = base->GetApi(otfuse::kOrtApiVersion);
  if (api == nullptr || kernels_api == nullptr) return nullptr;  // ORT < 1.24: the custom ops alone
  otfuse::cpu::g_ort = api;
  otfuse::cpu::g_ep = api->GetEpApi();
  otfuse::SetApi(kernels_api);
  if (max < 1) return api->CreateStatus(ORT_INVALID_ARGUMENT, "otfuse EP: no room for its factory");
  OrtEpFactory* factory = otfuse::cpu::NewFactory();
  if (factory == nullptr) return api->CreateStatus(ORT_FAIL, "otfuse EP: out of memory");
  factories[0] = factory;
  *count = 1;
  return nullptr;
}

extern "C" __attribute__((visibility("default"))) OrtStatus* ReleaseEpFactory(OrtEpFactory* factory) {
  delete factory;
  return nullptr;
}

#else  // headers older than ORT 1.24: the entry points exist (exports.map names them), no factory

extern "C" __attribute__((visibility("default"))) OrtStatus* CreateEpFactories(const char*, const OrtApiBase*,
                                                                              const void*, void**, size_t,
                                                                              size_t* count) {
  *count = 0;
  return nullptr;
}

extern "C" __attribute__((visibility("default"))) OrtStatus* ReleaseEpFactory(void*) { return nullptr; }

#endif  // ORT_API_VERSION >= 24
