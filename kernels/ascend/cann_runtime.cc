#include "ascend/cann_runtime.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>

namespace otfuse::ascend {
namespace {

constexpr const char* kRuntimeLibrary = "libascendcl.so";
constexpr const char* kTensorLibrary = "libnnopbase.so";
// The aclnn operators: one libopapi.so up to CANN 8.x, split per operator repository
// (libopapi_nn.so for the norms, libopapi_math.so, ...) in later releases. Every one found is
// loaded; symbols are looked up in all of them.
constexpr const char* kOperatorLibraries[] = {"libopapi_nn.so", "libopapi.so", "libopapi_transformer.so",
                                              "libopapi_math.so"};
// Exported only by otfuse's CPU test double (tests/fake_cann).
constexpr const char* kTestDoubleMarker = "otfuse_fake_cann_runtime";

bool IsFile(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode);
}

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? std::string(value) : std::string();
}

// Candidate directories, in search order, each with where it came from.
std::vector<std::pair<std::string, std::string>> Candidates() {
  std::vector<std::pair<std::string, std::string>> dirs;
  const std::string pinned = Env("OTFUSE_CANN_LIB_DIR");
  if (!pinned.empty()) {
    dirs.emplace_back(pinned, "$OTFUSE_CANN_LIB_DIR");
    return dirs;
  }
  for (const char* var : {"ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME"}) {
    const std::string home = Env(var);
    if (!home.empty()) dirs.emplace_back(home + "/lib64", std::string("$") + var + "/lib64");
  }
  const std::string path = Env("LD_LIBRARY_PATH");
  size_t begin = 0;
  while (begin <= path.size()) {
    size_t end = path.find(':', begin);
    if (end == std::string::npos) end = path.size();
    if (end > begin) dirs.emplace_back(path.substr(begin, end - begin), "$LD_LIBRARY_PATH");
    begin = end + 1;
  }
  dirs.emplace_back("/usr/local/Ascend/cann/lib64", "default location");
  dirs.emplace_back("/usr/local/Ascend/ascend-toolkit/latest/lib64", "default location");
  return dirs;
}

std::string DlError() {
  const char* message = dlerror();
  return message != nullptr ? message : "unknown dlopen error";
}

}  // namespace

struct RuntimeLoader {
  static std::unique_ptr<CannRuntime> Open(const std::string& dir) {
    std::unique_ptr<CannRuntime> rt(new CannRuntime());
    rt->directory_ = dir;
    auto open = [&](const char* name, bool required) -> bool {
      const std::string path = dir + "/" + name;
      if (!IsFile(path)) {
        if (required) {
          throw Error(std::string("CANN runtime in ") + dir + " is incomplete: it has " + kRuntimeLibrary +
                      " but no " + name);
        }
        return false;
      }
      dlerror();
      void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle == nullptr) {
        throw Error("cannot load " + path + ": " + DlError() +
                    " (source the CANN set_env.sh before starting the process so its dependencies resolve)");
      }
      rt->handles_.push_back(handle);
      rt->libraries_ += (rt->libraries_.empty() ? "" : " ") + std::string(name);
      return true;
    };
    open(kRuntimeLibrary, true);
    open(kTensorLibrary, true);
    bool any_operator_library = false;
    for (const char* name : kOperatorLibraries) any_operator_library |= open(name, false);
    if (!any_operator_library) {
      throw Error("CANN runtime in " + dir + " has no aclnn operator library (looked for libopapi_nn.so, "
                  "libopapi.so): install the CANN operator package (ops/kernels)");
    }

    rt->create_tensor = reinterpret_cast<fn::CreateTensor>(rt->Require("aclCreateTensor"));
    rt->destroy_tensor = reinterpret_cast<fn::DestroyTensor>(rt->Require("aclDestroyTensor"));
    rt->create_int_array = reinterpret_cast<fn::CreateIntArray>(rt->Require("aclCreateIntArray"));
    rt->destroy_int_array = reinterpret_cast<fn::DestroyIntArray>(rt->Require("aclDestroyIntArray"));
    rt->get_recent_err_msg = reinterpret_cast<fn::GetRecentErrMsg>(rt->Find("aclGetRecentErrMsg"));
    rt->rt_malloc = reinterpret_cast<fn::RtMalloc>(rt->Find("aclrtMalloc"));
    rt->rt_free = reinterpret_cast<fn::RtFree>(rt->Find("aclrtFree"));
    rt->rt_synchronize_stream = reinterpret_cast<fn::RtSynchronizeStream>(rt->Find("aclrtSynchronizeStream"));
    rt->rt_memset_async = reinterpret_cast<fn::RtMemsetAsync>(rt->Find("aclrtMemsetAsync"));
    rt->rt_get_soc_name = reinterpret_cast<fn::RtGetSocName>(rt->Find("aclrtGetSocName"));
    rt->create_tensor_list = reinterpret_cast<fn::CreateTensorList>(rt->Find("aclCreateTensorList"));
    rt->destroy_tensor_list = reinterpret_cast<fn::DestroyTensorList>(rt->Find("aclDestroyTensorList"));
    rt->rt_memcpy = reinterpret_cast<fn::RtMemcpy>(rt->Find("aclrtMemcpy"));
    rt->rt_get_device = reinterpret_cast<fn::RtGetDevice>(rt->Find("aclrtGetDevice"));
    rt->create_scalar = reinterpret_cast<fn::CreateScalar>(rt->Find("aclCreateScalar"));
    rt->destroy_scalar = reinterpret_cast<fn::DestroyScalar>(rt->Find("aclDestroyScalar"));
    rt->is_test_double_ = rt->Find(kTestDoubleMarker) != nullptr;
    return rt;
  }
};

const CannRuntime& CannRuntime::Load() {
  // Keyed by directory and never evicted: a failed search is retried next time (the environment
  // may have changed), a loaded runtime is reused.
  static std::mutex mutex;
  static std::map<std::string, std::unique_ptr<CannRuntime>> loaded;

  std::string searched;
  for (const auto& [dir, origin] : Candidates()) {
    if (!IsFile(dir + "/" + kRuntimeLibrary)) {
      searched += (searched.empty() ? "" : ", ") + dir + " (" + origin + ")";
      continue;
    }
    std::lock_guard<std::mutex> lock(mutex);
    auto it = loaded.find(dir);
    if (it == loaded.end()) it = loaded.emplace(dir, RuntimeLoader::Open(dir)).first;
    return *it->second;
  }
  throw Error(std::string("CANN runtime not found: no ") + kRuntimeLibrary + " in " + searched +
              ". Install the CANN toolkit and source its set_env.sh (or set OTFUSE_CANN_LIB_DIR)");
}

void* CannRuntime::Find(const char* name) const {
  for (void* handle : handles_) {
    if (void* symbol = dlsym(handle, name)) return symbol;
  }
  return nullptr;
}

void* CannRuntime::Require(const char* name) const {
  if (void* symbol = Find(name)) return symbol;
  throw Error(std::string("the CANN libraries in ") + directory_ + " (" + libraries_ + ") do not export " + name +
              " (CANN too old for this operator?)");
}

std::string CannRuntime::RecentErrorMessage() const {
  if (get_recent_err_msg == nullptr) return "";
  const char* message = get_recent_err_msg();
  return message != nullptr ? std::string(message) : std::string();
}

std::string CannRuntime::SocName() const {
  if (rt_get_soc_name == nullptr) return "";
  const char* name = rt_get_soc_name();
  return name != nullptr ? std::string(name) : std::string();
}

Product ClassifySoc(const std::string& soc) {
  auto starts = [&](const char* prefix) { return soc.rfind(prefix, 0) == 0; };
  if (starts("Ascend910B") || starts("Ascend910_93")) return Product::kAtlasA2A3;
  if (starts("Ascend950")) return Product::kAscend950;
  if (starts("Ascend310P")) return Product::kAtlasInference;
  if (starts("Ascend310B")) return Product::kAtlas200I500A2;
  if (starts("Ascend910")) return Product::kAtlasTraining;
  return Product::kUnknown;
}

const char* ProductName(Product product) {
  switch (product) {
    case Product::kAtlasA2A3: return "Atlas A2/A3";
    case Product::kAscend950: return "Ascend 950";
    case Product::kAtlasInference: return "Atlas inference products";
    case Product::kAtlasTraining: return "Atlas training products";
    case Product::kAtlas200I500A2: return "Atlas 200I/500 A2";
    default: return "an unknown Ascend product";
  }
}

const char* AclnnStatusName(aclnnStatus status) {
  // "aclnn Return Codes", hicann/ops-nn docs/en/context/aclnn_return_codes_nn.md
  switch (status) {
    case 0: return "ACLNN_SUCCESS";
    case 161001: return "ACLNN_ERR_PARAM_NULLPTR";
    case 161002: return "ACLNN_ERR_PARAM_INVALID";
    case 361001: return "ACLNN_ERR_RUNTIME_ERROR";
    case 561000: return "ACLNN_ERR_INNER";
    case 561001: return "ACLNN_ERR_INNER_INFERSHAPE_ERROR";
    case 561002: return "ACLNN_ERR_INNER_TILING_ERROR";
    case 561003: return "ACLNN_ERR_INNER_FIND_KERNEL_ERROR";
    case 561101: return "ACLNN_ERR_INNER_CREATE_EXECUTOR";
    case 561103: return "ACLNN_ERR_INNER_NULLPTR";
    default: return "";
  }
}

}  // namespace otfuse::ascend
