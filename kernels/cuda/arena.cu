// ABI v3 entry points: pinned host memory, CUDA IPC, asynchronous host ->
// device copies, prioritized streams and event polling. They serve the
// daemon's device arena and copy engine (services/cache/cuda_copy_engine.h).
// Every failure is returned as a code (module_abi.h); nothing here aborts.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/module_abi.h"

static_assert(sizeof(cudaIpcMemHandle_t) == MOE_CUDA_IPC_HANDLE_BYTES,
              "MOE_CUDA_IPC_HANDLE_BYTES must match cudaIpcMemHandle_t");

namespace moe::cuda {
namespace {

// Failed registrations/mappings are not sticky errors: clear them so that the
// next call on this thread does not report them again.
int Cleared(cudaError_t e) {
  if (e != cudaSuccess) cudaGetLastError();
  return Code(e);
}

}  // namespace

int HostRegister(void* ptr, size_t bytes) {
  if (ptr == nullptr || bytes == 0) {
    return ModuleCode(MOE_CUDA_ERR_BAD_ARGUMENT);
  }
  MOE_CUDA_TRY(UseDevice());
  return Cleared(cudaHostRegister(ptr, bytes, cudaHostRegisterPortable));
}

int HostUnregister(void* ptr) {
  MOE_CUDA_TRY(UseDevice());
  return Cleared(cudaHostUnregister(ptr));
}

int IpcGetMemHandle(const void* dev_ptr, void* handle) {
  if (dev_ptr == nullptr || handle == nullptr) {
    return ModuleCode(MOE_CUDA_ERR_BAD_ARGUMENT);
  }
  MOE_CUDA_TRY(UseDevice());
  cudaIpcMemHandle_t h;
  int code = Cleared(cudaIpcGetMemHandle(&h, const_cast<void*>(dev_ptr)));
  if (code != 0) return code;
  std::memcpy(handle, &h, sizeof(h));
  return 0;
}

int IpcOpenMemHandle(const void* handle, void** dev_ptr) {
  if (handle == nullptr || dev_ptr == nullptr) {
    return ModuleCode(MOE_CUDA_ERR_BAD_ARGUMENT);
  }
  *dev_ptr = nullptr;
  MOE_CUDA_TRY(UseDevice());
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle, sizeof(h));
  return Cleared(
      cudaIpcOpenMemHandle(dev_ptr, h, cudaIpcMemLazyEnablePeerAccess));
}

int IpcCloseMemHandle(void* dev_ptr) {
  MOE_CUDA_TRY(UseDevice());
  return Cleared(cudaIpcCloseMemHandle(dev_ptr));
}

int MemcpyAsyncH2D(void* dst, const void* src, size_t bytes, void* stream) {
  MOE_CUDA_TRY(UseDevice());
  return Cleared(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice,
                                 AsStream(stream)));
}

int StreamPriorityRange(int* least, int* greatest) {
  MOE_CUDA_TRY(UseDevice());
  return Code(cudaDeviceGetStreamPriorityRange(least, greatest));
}

int StreamCreateWithPriority(void** stream, int priority) {
  MOE_CUDA_TRY(UseDevice());
  int least = 0, greatest = 0;
  MOE_CUDA_TRY(Code(cudaDeviceGetStreamPriorityRange(&least, &greatest)));
  // CUDA: lower numbers are higher priority; greatest <= least.
  priority = std::clamp(priority, greatest, least);
  cudaStream_t s = nullptr;
  MOE_CUDA_TRY(Code(
      cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, priority)));
  *stream = s;
  return 0;
}

int EventQuery(void* event) {
  cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(event));
  if (e == cudaErrorNotReady) {
    cudaGetLastError();  // cudaEventQuery may leave it as the last error
    return ModuleCode(MOE_CUDA_ERR_NOT_READY);
  }
  return Code(e);
}

}  // namespace moe::cuda
