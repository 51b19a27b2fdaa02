// The CUDA backend as seen from the executables: plain C++ that forwards
// every call through the C ABI table of the dlopen'ed module
// (kernels/cuda/module_abi.h). No CUDA header or library is needed here.
//
// MatMul and the expert FFNs take f32, f16, bf16, kQ8, kQ4, kMxfp4 and
// ggml's kQ4_0 .. kQ6K weights (module ABI v7), ExpertFfn with a dtype per
// projection. The ggml kernels (kernels/cuda/gguf_gemm.cu) have never run
// on a GPU yet, so CreateCudaBackend runs them once on small problems
// against the host (kernels/cuda_gguf_self_check.h, a few ms): if any type
// disagrees or fails to run, a WARNING names it, Info() reports
// supports_gguf_blocks = false and MatMul and the expert FFNs return
// UNIMPLEMENTED for ggml weights; every other dtype still runs.
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
// usable, including a device left unusable by the self-check (a kernel
// fault); device >= device count is INVALID_ARGUMENT.
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int device);

// Without the self-check: ggml blocks always run (supports_gguf_blocks), so
// that the parity tests (cuda_gguf_ops_test) show every difference even
// when the self-check would turn them off.
absl::StatusOr<std::unique_ptr<Backend>>
CreateCudaBackendWithoutSelfCheckForTest(int device);

}  // namespace moe

#endif  // MOECACHE_KERNELS_CUDA_BACKEND_H_
