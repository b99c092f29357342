// Library entry point: ORT calls RegisterCustomOps when a session options object loads us.
#include "op_registry.h"

#include <mutex>
#include <string>

namespace otfuse {
namespace {

// The one registration list. New families (and the Ascend backend's CANN kernels) go here.
const CustomOpList& AllOps() {
  static const CustomOpList ops = [] {
    CustomOpList list;
    cpu::AppendNormOps(list);
    cpu::AppendNormLinearOps(list);
    cpu::AppendRotaryOps(list);
    cpu::AppendAttentionOps(list);
    return list;
  }();
  return ops;
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
  for (const CustomOpPtr& op : AllOps()) {
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
