// Finds and loads the optional CUDA backend module (libmoe_cuda.so) at run
// time. Executables link no CUDA library; on a machine without a GPU, without
// the module or without the CUDA runtime, callers get a status saying why and
// fall back to the CPU backend.
//
// Thread-safe: the module is loaded once per process.
#ifndef MOECACHE_KERNELS_CUDA_MODULE_H_
#define MOECACHE_KERNELS_CUDA_MODULE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

struct MoeCudaModuleApi;  // kernels/cuda/module_abi.h

namespace moe {

struct CudaModuleInfo {
  std::string path;      // file that was loaded
  int device_count = 0;  // devices the CUDA runtime reports
  std::string device_name;  // device 0, when device_count > 0
};

// Loads the module once and returns its entry table. Search order:
// $MOE_CUDA_MODULE, then the directory of the running executable and its
// ../lib, then the dynamic loader's default path.
// Returns NOT_FOUND if no module exists, UNAVAILABLE if it exists but there is
// no usable GPU, FAILED_PRECONDITION on an ABI mismatch.
absl::StatusOr<const MoeCudaModuleApi*> LoadCudaModule();

// Like LoadCudaModule() but only describes what was found.
absl::StatusOr<CudaModuleInfo> ProbeCudaModule();

// A module return code as a Status; `what` names the call. OK for 0;
// RESOURCE_EXHAUSTED for out-of-memory (cudaErrorMemoryAllocation,
// CUBLAS_STATUS_ALLOC_FAILED); INVALID_ARGUMENT for the module's own argument
// errors (MOE_CUDA_MODULE_BASE + ...); INTERNAL otherwise. The message has the
// module's text for the code and the code.
absl::Status CudaModuleStatus(const MoeCudaModuleApi* api, int code, const char* what);

}  // namespace moe

#endif  // MOECACHE_KERNELS_CUDA_MODULE_H_
