// The daemon's CUDA side: choosing the device (--device auto|cpu|cuda),
// pinning the ExpertStore's host copy, and the device arena that the
// CudaCopyEngine fills and workers map through CUDA IPC.
//
// Everything goes through a DeviceMemory (kernels/device_memory.h), so
// moe-cached links no CUDA library; tests pass the CUDA one over a fake
// module table.
#ifndef MOECACHE_SERVICES_MOE_CACHED_CUDA_ARENA_H_
#define MOECACHE_SERVICES_MOE_CACHED_CUDA_ARENA_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/device_memory.h"
#include "services/moe_cached/cuda_ipc_mapping.h"
#include "services/moe_cached/expert_store.h"

namespace moe::cached {

// What --device resolved to.
struct DeviceChoice {
  std::shared_ptr<DeviceMemory> memory;  // CUDA; null: the CPU (host shm arena)
  int device = 0;                  // CUDA device ordinal
  std::string description;         // e.g. "cuda:0 (NVIDIA H200)" or "cpu"
  uint64_t free_bytes = 0;         // free device memory when resolved
  uint64_t total_bytes = 0;
  bool is_cuda() const { return memory != nullptr; }
};

// "auto": CUDA when the module loads and reports a device, else the CPU with
// an INFO log line saying why; "cpu": the CPU; "cuda": CUDA or
// FAILED_PRECONDITION saying why not. INVALID_ARGUMENT for anything else.
// Each call re-reads the free device memory.
absl::StatusOr<DeviceChoice> ResolveDevice(const std::string& flag);

// memory.PinHostMemory(data, bytes) (cudaHostRegister, portable): its
// RESOURCE_EXHAUSTED names the bytes, the CUDA error, RLIMIT_MEMLOCK and the
// fix; this adds the daemon's own way out (--device cpu).
absl::Status PinHostMemory(DeviceMemory& memory, void* data, uint64_t bytes);

// ExpertStoreOptions whose pin/unpin seams use PinHostMemory and
// memory->UnpinHostMemory (a failure there is logged). The store shares
// `memory`.
ExpertStoreOptions PinnedStoreOptions(std::shared_ptr<DeviceMemory> memory);

// Device memory of capacity x slot_bytes, exported for other processes with
// cudaIpcGetMemHandle. Freed on destruction. Not copyable or movable.
class CudaArena {
 public:
  // RESOURCE_EXHAUSTED naming the sizes when the allocation fails; INTERNAL
  // when the IPC handle cannot be made. INVALID_ARGUMENT without `memory` or
  // for 0 bytes.
  static absl::StatusOr<std::unique_ptr<CudaArena>> Create(std::shared_ptr<DeviceMemory> memory,
                                                           uint64_t bytes);
  ~CudaArena();
  CudaArena(const CudaArena&) = delete;
  CudaArena& operator=(const CudaArena&) = delete;

  void* device_ptr() const { return ptr_; }
  uint64_t size() const { return bytes_; }
  int device() const { return device_; }
  // DeviceMemory::kIpcHandleBytes bytes, for AttachResponse.cuda_ipc_handle.
  const std::string& ipc_handle() const { return ipc_handle_; }

 private:
  CudaArena(std::shared_ptr<DeviceMemory> memory, void* ptr, uint64_t bytes)
      : memory_(std::move(memory)), device_(memory_->Info().device), ptr_(ptr), bytes_(bytes) {}

  const std::shared_ptr<DeviceMemory> memory_;
  const int device_;
  void* const ptr_;
  const uint64_t bytes_;
  std::string ipc_handle_;
};

}  // namespace moe::cached

#endif  // MOECACHE_SERVICES_MOE_CACHED_CUDA_ARENA_H_
