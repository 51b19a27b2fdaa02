// Entry table of the CUDA backend module.
#include <cuda_runtime.h>

#include <cstring>

#include "kernels/cuda/module_abi.h"

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
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}

const MoeCudaModuleApi kApi = {
    MOE_CUDA_MODULE_ABI_VERSION,
    &DeviceCount,
    &DeviceName,
    &ErrorString,
};

}  // namespace

extern "C" __attribute__((visibility("default"))) const MoeCudaModuleApi*
moe_cuda_module_api(void) {
  return &kApi;
}
