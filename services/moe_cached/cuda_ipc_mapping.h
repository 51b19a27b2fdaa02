// CudaArenaMapping: a worker's (or test's) view of moe-cached's CUDA arena,
// opened from the IPC handle that Attach returns through DeviceMemory::OpenIpc
// (kernels/device_memory.h), so its users link no CUDA library.
#ifndef MOECACHE_SERVICES_MOE_CACHED_CUDA_IPC_MAPPING_H_
#define MOECACHE_SERVICES_MOE_CACHED_CUDA_IPC_MAPPING_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/device_memory.h"

namespace moe::cached {

// A peer process's view of a CudaArena (cudaIpcOpenMemHandle); closed on
// destruction. For workers and tests.
class CudaArenaMapping {
 public:
  // INVALID_ARGUMENT without `memory` or when `handle` is not
  // DeviceMemory::kIpcHandleBytes long; INTERNAL naming the CUDA error when it
  // cannot be opened (e.g. in the process that made it: CUDA refuses that);
  // UNIMPLEMENTED when `memory` has no IPC (the CPU).
  static absl::StatusOr<std::unique_ptr<CudaArenaMapping>> Open(
      std::shared_ptr<DeviceMemory> memory, const std::string& handle, uint64_t bytes);
  ~CudaArenaMapping();
  CudaArenaMapping(const CudaArenaMapping&) = delete;
  CudaArenaMapping& operator=(const CudaArenaMapping&) = delete;

  const void* device_ptr() const { return ptr_; }
  uint64_t size() const { return bytes_; }

 private:
  CudaArenaMapping(std::shared_ptr<DeviceMemory> memory, void* ptr, uint64_t bytes)
      : memory_(std::move(memory)), ptr_(ptr), bytes_(bytes) {}
  const std::shared_ptr<DeviceMemory> memory_;
  void* const ptr_;
  const uint64_t bytes_;
};

}  // namespace moe::cached

#endif  // MOECACHE_SERVICES_MOE_CACHED_CUDA_IPC_MAPPING_H_
