// What `moectl plan` measures when a figure is not given: the machine's
// memory (GPU through the device layer, host from /proc/meminfo) and the
// host's memory read bandwidth.
#ifndef MOECACHE_SERVICES_PLAN_MACHINE_H_
#define MOECACHE_SERVICES_PLAN_MACHINE_H_

#include <cstdint>
#include <string>

namespace moe::plan {

struct GpuInfo {
  int64_t total_bytes = 0;  // 0: no usable GPU
  std::string description;  // "cuda:0 (NVIDIA H200)", or why there is none
};

// Device 0 through CreateDeviceMemory("cuda"); never fails (no GPU: 0 bytes
// and the reason).
GpuInfo ProbeGpu();

// MemTotal of /proc/meminfo in bytes; 0 when it cannot be read.
int64_t HostMemoryBytes();

// GB/s (1e9 bytes/s) reading `bytes` of host memory, best of three passes.
double MeasureHostReadGbps(int64_t bytes = int64_t{256} << 20);

}  // namespace moe::plan

#endif  // MOECACHE_SERVICES_PLAN_MACHINE_H_
