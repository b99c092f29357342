// Library entry point: ORT calls RegisterCustomOps when a session options object loads us.
#include "op_registry.h"

#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>

namespace otfuse {
namespace {

// Ascend (CANN) kernels, one line per family.
void AppendAscendOps(CustomOpList& list, ascend::Placement placement, ascend::AttentionFp32 fp32) {
  ascend::AppendAscendNormOps(list, placement);
  ascend::AppendAscendRotaryOps(list, placement);
  ascend::AppendAscendAttentionOps(list, placement, fp32);
  ascend::AppendAscendNormLinearOps(list, placement);
  ascend::AppendAscendActivationOps(list, placement);
}

// The CPU kernels of every family.
const CustomOpList& CpuOps() {
  static const CustomOpList ops = [] {
    CustomOpList list;
    cpu::AppendNormOps(list);
    cpu::AppendNormLinearOps(list);
    cpu::AppendRotaryOps(list);
    cpu::AppendAttentionOps(list);
    cpu::AppendActivationOps(list);
    return list;
  }();
  return ops;
}

// The one registration list: the CPU kernels and the Ascend backend's CANN kernels.
const CustomOpList& AllOps(ascend::AttentionFp32 fp32) {
  static std::mutex mutex;
  static std::map<ascend::AttentionFp32, CustomOpList> lists;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = lists.find(fp32);
  if (it == lists.end()) {
    CustomOpList list = CpuOps();
    AppendAscendOps(list, ascend::Placement::kCannEp, fp32);
    it = lists.emplace(fp32, std::move(list)).first;
  }
  return it->second;
}

// TEST ONLY (otfuse.ascend_ep.fake_mode=1): the Ascend kernels under the CPU EP, in place of the
// CPU kernels of the same op and element type; every other op (and type: float32 attention
// without the opt-in) keeps its CPU kernel. The Ascend kernels then refuse to start unless the
// CANN runtime found is otfuse's CPU test double (tests/fake_cann).
const CustomOpList& CpuTestDoubleOps(ascend::AttentionFp32 fp32) {
  static std::mutex mutex;
  static std::map<ascend::AttentionFp32, CustomOpList> lists;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = lists.find(fp32);
  if (it == lists.end()) {
    CustomOpList list;
    AppendAscendOps(list, ascend::Placement::kCpuTestDouble, fp32);
    // An op is told apart by its name and the type of its first input (T).
    auto key = [](const CustomOpPtr& op) {
      return std::make_pair(std::string(op->GetName(op.get())), static_cast<int>(op->GetInputType(op.get(), 0)));
    };
    std::set<std::pair<std::string, int>> replaced;
    for (const CustomOpPtr& op : list) replaced.insert(key(op));
    for (const CustomOpPtr& op : CpuOps()) {
      if (replaced.count(key(op)) == 0) list.push_back(op);
    }
    it = lists.emplace(fp32, std::move(list)).first;
  }
  return it->second;
}

constexpr const char* kFakeModeKey = "otfuse.ascend_ep.fake_mode";
constexpr const char* kFp32AttentionKey = "otfuse.ascend_ep.fp32_attention";

// The session config entry `key`, or nullopt when absent.
std::optional<std::string> ConfigEntry(const OrtSessionOptions* options, const char* key) {
  int has = 0;
  if (OrtStatus* status = Api().HasSessionConfigEntry(options, key, &has)) {
    Api().ReleaseStatus(status);
    return std::nullopt;
  }
  if (!has) return std::nullopt;
  size_t size = 0;
  ThrowOnError(Api().GetSessionConfigEntry(options, key, nullptr, &size), key);
  std::string value(size, '\0');
  ThrowOnError(Api().GetSessionConfigEntry(options, key, value.data(), &size), key);
  value.resize(size > 0 ? size - 1 : 0);  // size counts the terminating NUL
  return value;
}

ascend::AttentionFp32 Fp32AttentionRequested(const OrtSessionOptions* options) {
  const std::optional<std::string> value = ConfigEntry(options, kFp32AttentionKey);
  if (!value || *value == "cpu" || value->empty()) return ascend::AttentionFp32::kCpu;
  if (*value == "float16") return ascend::AttentionFp32::kFloat16;
  if (*value == "bfloat16") return ascend::AttentionFp32::kBFloat16;
  throw Error(std::string("session config ") + kFp32AttentionKey + " must be cpu, float16 or bfloat16, got '" +
              *value + "'");
}

bool FakeModeRequested(const OrtSessionOptions* options) {
  const std::optional<std::string> entry = ConfigEntry(options, kFakeModeKey);
  if (!entry) return false;
  const std::string& value = *entry;
  if (value == "1") return true;
  if (value == "0" || value.empty()) return false;
  throw Error(std::string("session config ") + kFakeModeKey + " must be 0 or 1, got '" + value + "'");
}

// A domain must outlive every session created from the options it was added to; ORT does not
// take ownership, so domains live until the library is unloaded.
class DomainKeeper {
 public:
  void Keep(OrtCustomOpDomain* domain) {
    std::lock_guard<std::mutex> lock(mutex_);
    domains_.push_back(domain);
  }
  ~DomainKeeper() {
    for (OrtCustomOpDomain* domain : domains_) Api().ReleaseCustomOpDomain(domain);
  }

 private:
  std::mutex mutex_;
  std::vector<OrtCustomOpDomain*> domains_;
};

DomainKeeper& Domains() {
  static DomainKeeper keeper;
  return keeper;
}

OrtStatus* Register(OrtSessionOptions* options) {
  OrtCustomOpDomain* domain = nullptr;
  if (OrtStatus* status = Api().CreateCustomOpDomain(kOpDomain, &domain)) return status;
  const ascend::AttentionFp32 fp32 = Fp32AttentionRequested(options);
  const CustomOpList& ops = FakeModeRequested(options) ? CpuTestDoubleOps(fp32) : AllOps(fp32);
  for (const CustomOpPtr& op : ops) {
    if (OrtStatus* status = Api().CustomOpDomain_Add(domain, op.get())) {
      Api().ReleaseCustomOpDomain(domain);
      return status;
    }
  }
  if (OrtStatus* status = Api().AddCustomOpDomain(options, domain)) {
    Api().ReleaseCustomOpDomain(domain);
    return status;
  }
  Domains().Keep(domain);
  return nullptr;
}

}  // namespace
}  // namespace otfuse

extern "C" __attribute__((visibility("default"))) OrtStatus* ORT_API_CALL
RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  const OrtApi* api = api_base->GetApi(otfuse::kOrtApiVersion);
  if (api == nullptr) {
    // Too old an ORT: report through the oldest API table, which every release has.
    const OrtApi* oldest = api_base->GetApi(1);
    std::string message = std::string("otfuse custom ops need ONNX Runtime >= 1.17 (C API version ") +
                          std::to_string(otfuse::kOrtApiVersion) + "), this is ONNX Runtime " +
                          api_base->GetVersionString();
    return oldest != nullptr ? oldest->CreateStatus(ORT_FAIL, message.c_str()) : nullptr;
  }
  otfuse::SetApi(api);
  try {
    return otfuse::Register(options);
  } catch (const std::exception& e) {
    return api->CreateStatus(ORT_FAIL, (std::string("otfuse: ") + e.what()).c_str());
  }
}
