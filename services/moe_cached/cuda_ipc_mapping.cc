#include "services/moe_cached/cuda_ipc_mapping.h"

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace moe::cached {

absl::StatusOr<std::unique_ptr<CudaArenaMapping>> CudaArenaMapping::Open(
    const MoeCudaModuleApi* api, const std::string& handle, uint64_t bytes) {
  if (handle.size() != MOE_CUDA_IPC_HANDLE_BYTES) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CUDA IPC handle of ", handle.size(), " bytes, expected ",
        MOE_CUDA_IPC_HANDLE_BYTES));
  }
  void* ptr = nullptr;
  const int code = api->ipc_open_mem_handle(handle.data(), &ptr);
  if (code != 0) {
    return absl::InternalError(absl::StrCat("cudaIpcOpenMemHandle: ",
                                            api->error_string(code)));
  }
  return std::unique_ptr<CudaArenaMapping>(new CudaArenaMapping(api, ptr, bytes));
}

CudaArenaMapping::~CudaArenaMapping() {
  const int code = api_->ipc_close_mem_handle(ptr_);
  if (code != 0) {
    MOE_LOG(WARNING) << "cudaIpcCloseMemHandle: " << api_->error_string(code);
  }
}

}  // namespace moe::cached
