// The CUDA backend as seen from the executables: plain C++ that forwards
// every call through the C ABI table of the dlopen'ed module
// (kernels/cuda/module_abi.h). No CUDA header or library is needed here.
//
// MatMul and the expert FFNs take f32, f16, bf16, kQ8, kQ4, kMxfp4 and
// ggml's kQ4_0 .. kQ6K weights (module ABI v7), ExpertFfn with a dtype per
// projection. The ggml kernels
// (kernels/cuda/gguf_gemm.cu) have never run on a GPU yet.
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
