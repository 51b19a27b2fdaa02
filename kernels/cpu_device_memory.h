// The CPU DeviceMemory (see kernels/device_memory.h): "device" memory is
// host memory (64-byte aligned), every copy is a memcpy that has completed
// when it returns, copy streams and events are tokens (an event is complete
// as soon as it is recorded), pinning is a no-op, and IPC is UNIMPLEMENTED:
// processes share host memory as shared-memory regions instead.
//
// Thread-safe, like every DeviceMemory.
#ifndef MOECACHE_KERNELS_CPU_DEVICE_MEMORY_H_
#define MOECACHE_KERNELS_CPU_DEVICE_MEMORY_H_

#include <memory>

#include "kernels/device_memory.h"

namespace moe {

std::unique_ptr<DeviceMemory> NewCpuDeviceMemory();

}  // namespace moe

#endif  // MOECACHE_KERNELS_CPU_DEVICE_MEMORY_H_
