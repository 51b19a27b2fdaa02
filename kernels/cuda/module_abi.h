// The C ABI between the executables and the dlopen'ed CUDA module. Plain C
// types only, so the module can be built by nvcc and loaded from any binary.
// Bump kMoeCudaModuleAbiVersion whenever this table changes.
#ifndef MOECACHE_KERNELS_CUDA_MODULE_ABI_H_
#define MOECACHE_KERNELS_CUDA_MODULE_ABI_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MOE_CUDA_MODULE_ABI_VERSION 1

typedef struct MoeCudaModuleApi {
  int abi_version;
  // Number of usable devices; a negative value is -cudaError_t.
  int (*device_count)(void);
  // Writes device `dev`'s name into buf (NUL-terminated). 0 on success.
  int (*device_name)(int dev, char* buf, size_t len);
  // Human-readable text for an error code returned by the functions above.
  const char* (*error_string)(int code);
} MoeCudaModuleApi;

// The module's single exported symbol.
const MoeCudaModuleApi* moe_cuda_module_api(void);

#ifdef __cplusplus
}
#endif

#endif  // MOECACHE_KERNELS_CUDA_MODULE_ABI_H_
