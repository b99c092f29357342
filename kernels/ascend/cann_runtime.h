// The CANN runtime and operator libraries, loaded with dlopen when an Ascend kernel is first
// created, so libotfuse_ops.so builds and loads on machines without CANN (nothing links them).
//
// Only the few entry points the Ascend kernels call are declared, each from CANN's public
// documentation (cited beside it); no CANN header is used or copied. Where the docs give a type
// as an opaque struct (aclTensor, aclIntArray, aclOpExecutor) we only ever hold pointers to it.
//
// Where the libraries are found (the same order as otfuse.ascend_ep.find_cann_runtime()):
//   1. $OTFUSE_CANN_LIB_DIR, when set: the only place looked at (pin a toolkit; tests use it);
//   2. $ASCEND_HOME_PATH/lib64, 3. $ASCEND_TOOLKIT_HOME/lib64 (both set by CANN's set_env.sh);
//   4. every directory of $LD_LIBRARY_PATH, read when the kernel is created;
//   5. /usr/local/Ascend/cann/lib64, /usr/local/Ascend/ascend-toolkit/latest/lib64.
// The first directory holding libascendcl.so is used; it must also hold libnnopbase.so (tensor
// descriptors) and libopapi_nn.so or libopapi.so (the aclnn operators). Source
// `set_env.sh` before starting the process, so the CANN libraries' own dependencies resolve.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ort_glue.h"

namespace otfuse::ascend {

// ---------------------------------------------------------------------------------------------
// Types and enums (values from the CANN docs; only the members we use).
// ---------------------------------------------------------------------------------------------

// aclTensor / aclIntArray / aclOpExecutor: opaque, created and destroyed by the runtime.
//   "aclCreateTensor", CANN 8.0.0 operator API reference,
//   https://www.hiascend.com/document/detail/en/canncommercial/800/apiref/aolapi/operatorlist_00019.html
struct aclTensor;
struct aclIntArray;
struct aclTensorList;  // "aclCreateTensorList" (below)
struct aclScalar;      // "aclCreateScalar" (below)
struct aclOpExecutor;
using aclrtStream = void*;   // "aclrtStream": a stream handle, the one ORT's CANN EP computes on
using aclnnStatus = int32_t; // aclnn return codes: "aclnn Return Codes", hicann/ops-nn
                             //   docs/en/context/aclnn_return_codes_nn.md (0 = ACLNN_SUCCESS)
using aclError = int;        // acl runtime return codes (0 = ACL_SUCCESS)

// "aclDataType", CANN 8.5.0 application development API reference,
//   https://www.hiascend.com/document/detail/en/canncommercial/850/API/appdevgapi/aclcppdevg_03_1346.html
enum aclDataType : int32_t {
  ACL_DT_UNDEFINED = -1,
  ACL_FLOAT = 0,
  ACL_FLOAT16 = 1,
  ACL_INT32 = 3,
  ACL_INT64 = 9,
  ACL_BOOL = 12,
  ACL_BF16 = 27,
};

// "aclFormat", CANN 8.5.0 application development API reference (pyACL aclFormat table),
//   https://www.hiascend.com/document/detail/en/canncommercial/850/API/appdevgapi/aclpythondevg_01_0914.html
enum aclFormat : int32_t {
  ACL_FORMAT_ND = 2,
};

// "aclrtMemMallocPolicy" (first member), CANN 8.0.RC2 application development API reference,
//   https://www.hiascend.com/document/detail/zh/canncommercial/80RC2/apiref/appdevgapi/aclcppdevg_03_1335.html
enum aclrtMemMallocPolicy : int32_t {
  ACL_MEM_MALLOC_HUGE_FIRST = 0,
};

// "aclrtMemcpyKind" (second member), CANN 8.0.0 application development API reference, aclrtMemcpy,
//   https://www.hiascend.com/document/detail/en/canncommercial/800/apiref/appdevgapi/aclcppdevg_03_0105.html
enum aclrtMemcpyKind : int32_t {
  ACL_MEMCPY_HOST_TO_DEVICE = 1,
  ACL_MEMCPY_DEVICE_TO_HOST = 2,
};

// ---------------------------------------------------------------------------------------------
// Entry points. Signatures as documented; we call them through these pointer types.
// ---------------------------------------------------------------------------------------------
namespace fn {
// aclCreateTensor(viewDims, viewDimsNum, dataType, stride, offset, format, storageDims,
//                 storageDimsNum, tensorData) -> aclTensor*   (libnnopbase.so)
//   https://www.hiascend.com/document/detail/en/canncommercial/800/apiref/aolapi/operatorlist_00019.html
using CreateTensor = aclTensor* (*)(const int64_t* view_dims, uint64_t view_dims_num, aclDataType data_type,
                                    const int64_t* stride, int64_t offset, aclFormat format,
                                    const int64_t* storage_dims, uint64_t storage_dims_num, void* tensor_data);
// aclDestroyTensor(const aclTensor*) -> aclnnStatus   (libnnopbase.so)
//   https://www.hiascend.com/document/detail/en/canncommercial/850/API/aolapi/operatorlist_00027.html
using DestroyTensor = aclnnStatus (*)(const aclTensor* tensor);
// aclCreateIntArray(const int64_t* value, uint64_t size) -> aclIntArray*   (libnnopbase.so)
//   https://www.hiascend.com/document/detail/en/canncommercial/850/API/aolapi/operatorlist_00016.html
using CreateIntArray = aclIntArray* (*)(const int64_t* value, uint64_t size);
// aclDestroyIntArray(const aclIntArray*) -> aclnnStatus   (libnnopbase.so)
//   https://www.hiascend.com/document/detail/en/canncommercial/850/API/aolapi/operatorlist_00024.html
using DestroyIntArray = aclnnStatus (*)(const aclIntArray* array);
// aclCreateTensorList(const aclTensor* const* value, uint64_t size) -> aclTensorList*, null on
//   failure; paired with aclDestroyTensorList(const aclTensorList*) -> aclnnStatus (libnnopbase.so)
//   https://www.hiascend.com/document/detail/en/canncommercial/850/API/aolapi/operatorlist_00020.html
using CreateTensorList = aclTensorList* (*)(const aclTensor* const* value, uint64_t size);
using DestroyTensorList = aclnnStatus (*)(const aclTensorList* list);
// aclCreateScalar(void* value, aclDataType dataType) -> aclScalar*: a scalar argument of an aclnn
//   operator from the host value `value` points to; null on failure   (libnnopbase.so)
//   https://www.hiascend.com/document/detail/en/canncommercial/800/apiref/aolapi/operatorlist_00017.html
using CreateScalar = aclScalar* (*)(void* value, aclDataType data_type);
// aclDestroyScalar(const aclScalar*) -> aclnnStatus   (libnnopbase.so; paired with aclCreateScalar)
//   https://www.hiascend.com/document/detail/en/canncommercial/800/apiref/aolapi/operatorlist_00025.html
using DestroyScalar = aclnnStatus (*)(const aclScalar* scalar);
// aclGetRecentErrMsg() -> const char*: gets and clears this thread's latest error description
//   (libascendcl.so).
//   https://www.hiascend.com/document/detail/zh/CANNCommunityEdition/80RC3alpha002/apiref/appdevgapi/aclcppdevg_03_0028.html
using GetRecentErrMsg = const char* (*)();
// aclrtMalloc(void** devPtr, size_t size, aclrtMemMallocPolicy) -> aclError   (libascendcl.so)
//   https://www.hiascend.com/document/detail/en/canncommercial/850/API/appdevgapi/aclcppdevg_03_0095.html
using RtMalloc = aclError (*)(void** dev_ptr, size_t size, aclrtMemMallocPolicy policy);
// aclrtFree(void* devPtr) -> aclError   (libascendcl.so; paired with aclrtMalloc, same reference)
using RtFree = aclError (*)(void* dev_ptr);
// aclrtSynchronizeStream(aclrtStream) -> aclError   (libascendcl.so; used in every aclnn sample,
//   e.g. hicann/ops-nn norm/rms_norm/docs/aclnnRmsNorm_en.md "Example")
using RtSynchronizeStream = aclError (*)(aclrtStream stream);
// aclrtMemsetAsync(void* devPtr, size_t maxCount, int32_t value, size_t count, aclrtStream)
//   -> aclError   (libascendcl.so)
//   https://www.hiascend.com/document/detail/zh/canncommercial/850/API/appdevgapi/aclcppdevg_03_0104.html
using RtMemsetAsync = aclError (*)(void* dev_ptr, size_t max_count, int32_t value, size_t count,
                                   aclrtStream stream);
// aclrtMemcpy(void* dst, size_t destMax, const void* src, size_t count, aclrtMemcpyKind kind)
//   -> aclError: synchronous, "no implicit device synchronization or stream synchronization"
//   (libascendcl.so); used once per device to upload the compressed attention mask, and to read
//   key_padding_mask / attn_bias back for empty_rows = "uniform" (after aclrtSynchronizeStream)
//   https://www.hiascend.com/document/detail/en/canncommercial/800/apiref/appdevgapi/aclcppdevg_03_0105.html
using RtMemcpy = aclError (*)(void* dst, size_t dest_max, const void* src, size_t count, aclrtMemcpyKind kind);
// aclrtGetDevice(int32_t* deviceId) -> aclError: the device of the calling thread's context
//   (libascendcl.so)
//   https://www.hiascend.com/document/detail/en/canncommercial/800/apiref/appdevgapi/aclcppdevg_03_0042.html
using RtGetDevice = aclError (*)(int32_t* device_id);
// aclrtGetSocName() -> const char*: the AI processor version ("Ascend910B3", "Ascend310P3", ...),
//   of device 0 when there are several; null on failure   (libascendcl.so)
//   https://www.hiascend.com/document/detail/en/canncommercial/800/apiref/appdevgapi/aclcppdevg_03_0048.html
using RtGetSocName = const char* (*)();
// Phase two of every aclnn operator: aclnnXxx(workspace, workspaceSize, executor, stream).
//   "Two-phase API", hicann/ops-nn docs/en/context/two_phase_api.md
using AclnnExecute = aclnnStatus (*)(void* workspace, uint64_t workspace_size, aclOpExecutor* executor,
                                     aclrtStream stream);
}  // namespace fn

// The loaded runtime. One instance per library directory, alive until the process exits (CANN
// libraries are never unloaded: ORT's CANN EP may share them).
class CannRuntime {
 public:
  // The runtime for the current environment (see the search order above). Throws Error saying
  // where it looked when no directory qualifies or a library fails to load.
  static const CannRuntime& Load();

  const std::string& directory() const { return directory_; }
  // The libraries actually opened, "libascendcl.so libnnopbase.so libopapi.so".
  const std::string& libraries() const { return libraries_; }
  // True for otfuse's CPU test double (tests/fake_cann): it exports otfuse_fake_cann_runtime.
  bool is_test_double() const { return is_test_double_; }

  // The address of `name` in any of the loaded libraries, or nullptr.
  void* Find(const char* name) const;
  // As Find, but throws Error naming the symbol, the directory and the CANN version hint.
  void* Require(const char* name) const;

  // Always present (checked by Load).
  fn::CreateTensor create_tensor = nullptr;
  fn::DestroyTensor destroy_tensor = nullptr;
  fn::CreateIntArray create_int_array = nullptr;
  fn::DestroyIntArray destroy_int_array = nullptr;
  // Optional: nullptr when the runtime does not export them.
  fn::GetRecentErrMsg get_recent_err_msg = nullptr;
  fn::RtMalloc rt_malloc = nullptr;
  fn::RtFree rt_free = nullptr;
  fn::RtSynchronizeStream rt_synchronize_stream = nullptr;
  fn::RtMemsetAsync rt_memset_async = nullptr;
  fn::RtGetSocName rt_get_soc_name = nullptr;
  fn::CreateTensorList create_tensor_list = nullptr;
  fn::DestroyTensorList destroy_tensor_list = nullptr;
  fn::RtMemcpy rt_memcpy = nullptr;
  fn::RtGetDevice rt_get_device = nullptr;
  fn::CreateScalar create_scalar = nullptr;
  fn::DestroyScalar destroy_scalar = nullptr;

  // aclGetRecentErrMsg(), or "" when there is none (or no such entry point).
  std::string RecentErrorMessage() const;
  // aclrtGetSocName(), or "" when unknown. Asked on every call (it names the device in use).
  std::string SocName() const;

 private:
  CannRuntime() = default;
  std::string directory_;
  std::string libraries_;
  std::vector<void*> handles_;
  bool is_test_double_ = false;

  friend struct RuntimeLoader;
};

// The product lines the aclnn documents distinguish, from the SoC name.
enum class Product {
  kUnknown,        // no aclrtGetSocName, or a name we do not know: no extra checks, CANN decides
  kAtlasA2A3,      // Ascend910B*, Ascend910_93*: "Atlas A2/A3 training/inference products"
  kAscend950,      // Ascend950*
  kAtlasInference, // Ascend310P*: "Atlas inference products"
  kAtlasTraining,  // other Ascend910*: "Atlas training products"
  kAtlas200I500A2, // Ascend310B*: "Atlas 200I/500 A2 inference products"
};
Product ClassifySoc(const std::string& soc_name);
const char* ProductName(Product product);

// Human-readable name of an aclnn status ("ACLNN_ERR_PARAM_INVALID"), or "" when unknown.
const char* AclnnStatusName(aclnnStatus status);

}  // namespace otfuse::ascend
