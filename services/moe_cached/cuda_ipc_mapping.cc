#include "services/moe_cached/cuda_ipc_mapping.h"

#include "common/logging.h"
#include "common/status_macros.h"

namespace moe::cached {

absl::StatusOr<std::unique_ptr<CudaArenaMapping>> CudaArenaMapping::Open(
    std::shared_ptr<DeviceMemory> memory, const std::string& handle, uint64_t bytes) {
  if (memory == nullptr) return absl::InvalidArgumentError("CUDA arena mapping without memory");
  ASSIGN_OR_RETURN(void* ptr, memory->OpenIpc(handle));
  return std::unique_ptr<CudaArenaMapping>(new CudaArenaMapping(std::move(memory), ptr, bytes));
}

CudaArenaMapping::~CudaArenaMapping() {
  const absl::Status s = memory_->CloseIpc(ptr_);
  if (!s.ok()) MOE_LOG(WARNING) << s;
}

}  // namespace moe::cached
