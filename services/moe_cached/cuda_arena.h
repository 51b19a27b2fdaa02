// The daemon's CUDA side: choosing the device (--device auto|cpu|cuda),
// pinning the ExpertStore's host copy (cudaHostRegister), and the device
// arena that the CudaCopyEngine fills and workers map through CUDA IPC.
//
// Everything goes through the dlopen'ed module's C table (kernels/
// cuda_module.h), so moe-cached links no CUDA library. Functions taking a
// table accept a fake one (tests run them without a GPU).
#ifndef MOECACHE_SERVICES_MOE_CACHED_CUDA_ARENA_H_
#define MOECACHE_SERVICES_MOE_CACHED_CUDA_ARENA_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/module_abi.h"
#include "services/moe_cached/cuda_ipc_mapping.h"
#include "services/moe_cached/expert_store.h"

namespace moe::cached {

// What --device resolved to.
struct DeviceChoice {
  const MoeCudaModuleApi* cuda = nullptr;  // null: the CPU (host shm arena)
  int device = 0;                  // CUDA device ordinal
  std::string description;         // e.g. "cuda:0 (NVIDIA H200)" or "cpu"
  uint64_t free_bytes = 0;         // free device memory when resolved
  uint64_t total_bytes = 0;
  bool is_cuda() const { return cuda != nullptr; }
};

// "auto": CUDA when the module loads and reports a device, else the CPU with
// an INFO log line saying why; "cpu": the CPU; "cuda": CUDA or
// FAILED_PRECONDITION saying why not. INVALID_ARGUMENT for anything else.
// Each call re-reads the free device memory.
absl::StatusOr<DeviceChoice> ResolveDevice(const std::string& flag);

// The RESOURCE_EXHAUSTED status for a failed pin of `bytes`: names the
// bytes, the CUDA error, the current RLIMIT_MEMLOCK (getrlimit) and the fix.
absl::Status PinFailedStatus(uint64_t bytes, const std::string& cuda_error);

// Pins [data, data + bytes) with api->host_register (cudaHostRegister,
// portable). RESOURCE_EXHAUSTED from PinFailedStatus on failure.
absl::Status PinHostMemory(const MoeCudaModuleApi& api, void* data,
                           uint64_t bytes);

// ExpertStoreOptions whose pin/unpin seams use PinHostMemory and
// api->host_unregister. REQUIRES: `api` outlives the store.
ExpertStoreOptions PinnedStoreOptions(const MoeCudaModuleApi* api);

// Device memory of capacity x slot_bytes, exported for other processes with
// cudaIpcGetMemHandle. Freed on destruction. Not copyable or movable.
class CudaArena {
 public:
  // RESOURCE_EXHAUSTED naming the sizes when cudaMalloc fails; INTERNAL when
  // the IPC handle cannot be made. REQUIRES: bytes > 0.
  static absl::StatusOr<std::unique_ptr<CudaArena>> Create(
      const MoeCudaModuleApi* api, int device, uint64_t bytes);
  ~CudaArena();
  CudaArena(const CudaArena&) = delete;
  CudaArena& operator=(const CudaArena&) = delete;

  void* device_ptr() const { return ptr_; }
  uint64_t size() const { return bytes_; }
  int device() const { return device_; }
  // MOE_CUDA_IPC_HANDLE_BYTES bytes, for AttachResponse.cuda_ipc_handle.
  const std::string& ipc_handle() const { return ipc_handle_; }

 private:
  CudaArena(const MoeCudaModuleApi* api, int device, void* ptr, uint64_t bytes)
      : api_(api), device_(device), ptr_(ptr), bytes_(bytes) {}

  const MoeCudaModuleApi* const api_;
  const int device_;
  void* const ptr_;
  const uint64_t bytes_;
  std::string ipc_handle_;
};

}  // namespace moe::cached

#endif  // MOECACHE_SERVICES_MOE_CACHED_CUDA_ARENA_H_
