// The CUDA backend as seen from the executables: plain C++ that forwards
// every call through the C ABI table of the dlopen'ed module
// (kernels/cuda/module_abi.h). No CUDA header or library is needed here.
//
// Every CUDA or cuBLAS error comes back as a Status (RESOURCE_EXHAUSTED for
// out-of-memory, INVALID_ARGUMENT for shapes the kernels do not support,
// INTERNAL otherwise); nothing aborts.
#ifndef MOECACHE_KERNELS_CUDA_BACKEND_H_
#define MOECACHE_KERNELS_CUDA_BACKEND_H_

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/cuda/module_abi.h"
#include "kernels/cuda_module.h"  // CudaModuleStatus

namespace moe {

// UNAVAILABLE (with the reason) when the module is missing or no device is
// usable; device >= device count is INVALID_ARGUMENT.
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int device);

}  // namespace moe

#endif  // MOECACHE_KERNELS_CUDA_BACKEND_H_
