// Library entry point: ORT calls RegisterCustomOps when a session options object loads us.
#include "op_registry.h"

#include <mutex>
#include <set>
#include <string>

namespace otfuse {
namespace {

// Ascend (CANN) kernels, one line per family.
void AppendAscendOps(CustomOpList& list, ascend::Placement placement) {
  ascend::AppendAscendNormOps(list, placement);
}

// The one registration list. New families (and the Ascend backend's CANN kernels) go here.
const CustomOpList& AllOps() {
  static const CustomOpList ops = [] {
    CustomOpList list;
    cpu::AppendNormOps(list);
    cpu::AppendNormLinearOps(list);
    cpu::AppendRotaryOps(list);
    cpu::AppendAttentionOps(list);
    AppendAscendOps(list, ascend::Placement::kCannEp);
    return list;
  }();
  return ops;
}

// TEST ONLY (otfuse.ascend_ep.fake_mode=1): the Ascend kernels under the CPU EP, in place of the
// CPU kernels of the same ops; every other op keeps its CPU kernel. The Ascend kernels then
// refuse to start unless the CANN runtime found is otfuse's CPU test double (tests/fake_cann).
const CustomOpList& CpuTestDoubleOps() {
  static const CustomOpList ops = [] {
    CustomOpList list;
    AppendAscendOps(list, ascend::Placement::kCpuTestDouble);
    std::set<std::string> replaced;
    for (const CustomOpPtr& op : list) replaced.insert(op->GetName(op.get()));
    for (const CustomOpPtr& op : AllOps()) {
      const char* ep = op->GetExecutionProviderType(op.get());
      const bool on_cpu = ep == nullptr || std::string(ep) == "CPUExecutionProvider";
      if (on_cpu && replaced.count(op->GetName(op.get())) == 0) list.push_back(op);
    }
    return list;
  }();
  return ops;
}

constexpr const char* kFakeModeKey = "otfuse.ascend_ep.fake_mode";

bool FakeModeRequested(const OrtSessionOptions* options) {
  int has = 0;
  if (OrtStatus* status = Api().HasSessionConfigEntry(options, kFakeModeKey, &has)) {
    Api().ReleaseStatus(status);
    return false;
  }
  if (!has) return false;
  size_t size = 0;
  ThrowOnError(Api().GetSessionConfigEntry(options, kFakeModeKey, nullptr, &size), kFakeModeKey);
  std::string value(size, '\0');
  ThrowOnError(Api().GetSessionConfigEntry(options, kFakeModeKey, value.data(), &size), kFakeModeKey);
  value.resize(size > 0 ? size - 1 : 0);  // size counts the terminating NUL
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
  const CustomOpList& ops = FakeModeRequested(options) ? CpuTestDoubleOps() : AllOps();
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
