// Entry table of the CUDA backend module: device, memory, streams, and the
// ops (implemented in gemm.cu, quant_gemm.cu, gguf_gemm.cu, attention.cu,
// mla_router.cu, ops.cu). Every failure is returned as a code (see
// module_abi.h); nothing here aborts.
#include <cuda_runtime.h>

#include <atomic>
#include <cstring>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/module_abi.h"

namespace moe::cuda {

namespace {
std::atomic<int> g_device{0};
}  // namespace

int UseDevice() {
  int current = -1;
  cudaError_t e = cudaGetDevice(&current);
  if (e != cudaSuccess) return Code(e);
  int want = g_device.load();
  if (current != want) return Code(cudaSetDevice(want));
  return 0;
}

namespace {

int DeviceCount() {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) return -static_cast<int>(err);
  return n;
}

int DeviceName(int dev, char* buf, size_t len) {
  cudaDeviceProp prop;
  cudaError_t err = cudaGetDeviceProperties(&prop, dev);
  if (err != cudaSuccess) return static_cast<int>(err);
  if (len == 0) return 0;
  std::strncpy(buf, prop.name, len - 1);
  buf[len - 1] = '\0';
  return 0;
}

const char* ErrorString(int code) {
  if (code < 0) code = -code;
  if (code >= MOE_CUDA_MODULE_BASE) {
    switch (code - MOE_CUDA_MODULE_BASE) {
      case MOE_CUDA_ERR_BAD_DTYPE:
        return "unsupported weight dtype";
      case MOE_CUDA_ERR_HEAD_DIM:
        return "head_dim exceeds the attention kernel's limit (512)";
      case MOE_CUDA_ERR_NOT_READY:
        return "not ready (work before the event is still running)";
      default:
        return "unsupported argument";
    }
  }
  if (code >= MOE_CUDA_CUBLAS_BASE) {
    return cublasGetStatusString(
        static_cast<cublasStatus_t>(code - MOE_CUDA_CUBLAS_BASE));
  }
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}

int SetDevice(int dev) {
  g_device.store(dev);
  return Code(cudaSetDevice(dev));
}

int MemInfo(size_t* free_bytes, size_t* total_bytes) {
  MOE_CUDA_TRY(UseDevice());
  return Code(cudaMemGetInfo(free_bytes, total_bytes));
}

int DeviceMalloc(void** ptr, size_t bytes) {
  MOE_CUDA_TRY(UseDevice());
  cudaError_t e = cudaMalloc(ptr, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it for the next call
    *ptr = nullptr;
  }
  return Code(e);
}

int DeviceFree(void* ptr) {
  MOE_CUDA_TRY(UseDevice());
  return Code(cudaFree(ptr));
}

int Memcpy(void* dst, const void* src, size_t bytes, int kind, void* stream) {
  MOE_CUDA_TRY(UseDevice());
  cudaMemcpyKind k = kind == MOE_CUDA_COPY_H2D   ? cudaMemcpyHostToDevice
                     : kind == MOE_CUDA_COPY_D2H ? cudaMemcpyDeviceToHost
                                                 : cudaMemcpyDeviceToDevice;
  MOE_CUDA_TRY(Code(cudaMemcpyAsync(dst, src, bytes, k, AsStream(stream))));
  if (kind == MOE_CUDA_COPY_D2D) return 0;
  return Code(cudaStreamSynchronize(AsStream(stream)));
}

int MemsetZero(void* dst, size_t bytes, void* stream) {
  MOE_CUDA_TRY(UseDevice());
  return Code(cudaMemsetAsync(dst, 0, bytes, AsStream(stream)));
}

int StreamCreate(void** stream) {
  MOE_CUDA_TRY(UseDevice());
  cudaStream_t s = nullptr;
  MOE_CUDA_TRY(Code(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)));
  *stream = s;
  return 0;
}
int StreamDestroy(void* stream) {
  return Code(cudaStreamDestroy(AsStream(stream)));
}
int EventCreate(void** event) {
  MOE_CUDA_TRY(UseDevice());
  cudaEvent_t e = nullptr;
  MOE_CUDA_TRY(Code(cudaEventCreateWithFlags(&e, cudaEventDisableTiming)));
  *event = e;
  return 0;
}
int EventDestroy(void* event) {
  return Code(cudaEventDestroy(static_cast<cudaEvent_t>(event)));
}
int EventRecord(void* event, void* stream) {
  return Code(cudaEventRecord(static_cast<cudaEvent_t>(event), AsStream(stream)));
}
int StreamWaitEvent(void* stream, void* event) {
  return Code(cudaStreamWaitEvent(AsStream(stream),
                                  static_cast<cudaEvent_t>(event), 0));
}
int EventSynchronize(void* event) {
  return Code(cudaEventSynchronize(static_cast<cudaEvent_t>(event)));
}
int StreamSynchronize(void* stream) {
  MOE_CUDA_TRY(UseDevice());
  return Code(cudaStreamSynchronize(AsStream(stream)));
}

const MoeCudaModuleApi kApi = {
    MOE_CUDA_MODULE_ABI_VERSION,
    &DeviceCount,
    &DeviceName,
    &ErrorString,
    &SetDevice,
    &MemInfo,
    &DeviceMalloc,
    &DeviceFree,
    &Memcpy,
    &MemsetZero,
    &StreamCreate,
    &StreamDestroy,
    &EventCreate,
    &EventDestroy,
    &EventRecord,
    &StreamWaitEvent,
    &EventSynchronize,
    &StreamSynchronize,
    &MatMul,
    &RmsNorm,
    &Rope,
    &KvCacheAppend,
    &Attention,
    &RouterTopK,
    &ExpertFfn,
    &Embedding,
    &ConvertToF32,
    &Elementwise,
    &Argmax,
    &LogSoftmax,
    &TopK,
    &HostRegister,
    &HostUnregister,
    &IpcGetMemHandle,
    &IpcOpenMemHandle,
    &IpcCloseMemHandle,
    &MemcpyAsyncH2D,
    &StreamCreateWithPriority,
    &StreamPriorityRange,
    &EventQuery,
    &RouterSelect,
    &RopeInterleaved,
    &MlaAttention,
    &SinkAttention,
    &BiasedExpertFfn,
    &ExpertFfnDTypes,
};

}  // namespace
}  // namespace moe::cuda

extern "C" __attribute__((visibility("default"))) const MoeCudaModuleApi*
moe_cuda_module_api(void) {
  return &moe::cuda::kApi;
}
