// CudaArenaMapping: a worker's (or test's) view of moe-cached's CUDA arena,
// opened from the 64-byte cudaIpcMemHandle that Attach returns. Goes through
// the dlopen'ed module's C table, so its users link no CUDA library.
#ifndef MOECACHE_SERVICES_MOE_CACHED_CUDA_IPC_MAPPING_H_
#define MOECACHE_SERVICES_MOE_CACHED_CUDA_IPC_MAPPING_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/cuda/module_abi.h"

namespace moe::cached {

// A peer process's view of a CudaArena (cudaIpcOpenMemHandle); closed on
// destruction. For workers and tests.
class CudaArenaMapping {
 public:
  // INVALID_ARGUMENT if `handle` is not MOE_CUDA_IPC_HANDLE_BYTES long;
  // INTERNAL naming the CUDA error when it cannot be opened (e.g. in the
  // process that made it: CUDA refuses that).
  static absl::StatusOr<std::unique_ptr<CudaArenaMapping>> Open(
      const MoeCudaModuleApi* api, const std::string& handle, uint64_t bytes);
  ~CudaArenaMapping();
  CudaArenaMapping(const CudaArenaMapping&) = delete;
  CudaArenaMapping& operator=(const CudaArenaMapping&) = delete;

  const void* device_ptr() const { return ptr_; }
  uint64_t size() const { return bytes_; }

 private:
  CudaArenaMapping(const MoeCudaModuleApi* api, void* ptr, uint64_t bytes)
      : api_(api), ptr_(ptr), bytes_(bytes) {}
  const MoeCudaModuleApi* const api_;
  void* const ptr_;
  const uint64_t bytes_;
};


}  // namespace moe::cached

#endif  // MOECACHE_SERVICES_MOE_CACHED_CUDA_IPC_MAPPING_H_
