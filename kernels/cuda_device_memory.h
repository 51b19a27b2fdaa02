// The CUDA DeviceMemory (see kernels/device_memory.h) over the dlopen'ed
// module's C table (kernels/cuda/module_abi.h): cudaMalloc'ed allocations,
// cudaHostRegister'ed (portable) pinning, cudaIpc* handles, non-blocking
// copy streams with priorities, and events made without timing, so polling
// them is cheap. Links no CUDA library.
//
// Module return codes become statuses as CudaModuleStatus says
// (kernels/cuda_module.h), named after the CUDA call.
//
// Thread-safe, like every DeviceMemory.
#ifndef MOECACHE_KERNELS_CUDA_DEVICE_MEMORY_H_
#define MOECACHE_KERNELS_CUDA_DEVICE_MEMORY_H_

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/device_memory.h"

struct MoeCudaModuleApi;  // kernels/cuda/module_abi.h

namespace moe {

// Over `api` (the loaded module, or a fake table in tests) on `device`; makes
// no module call until used. REQUIRES: `api` outlives the result.
std::unique_ptr<DeviceMemory> NewCudaDeviceMemory(const MoeCudaModuleApi* api, int device);

// Loads the module (LoadCudaModule) and selects `device`: the errors of
// LoadCudaModule, INVALID_ARGUMENT for a device that does not exist,
// UNAVAILABLE when it cannot be selected.
absl::StatusOr<std::unique_ptr<DeviceMemory>> CreateCudaDeviceMemory(int device);

}  // namespace moe

#endif  // MOECACHE_KERNELS_CUDA_DEVICE_MEMORY_H_
