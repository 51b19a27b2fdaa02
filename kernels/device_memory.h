// DeviceMemory: the memory side of a compute device, beside Backend (which
// runs the ops): device allocations, pinned host memory, IPC export/import of
// allocations between processes, and prioritised asynchronous host-to-device
// copies on copy streams with events. The daemon's arena, its copy engine
// and the worker's view of the arena use it; no service calls the CUDA
// module's function table directly.
//
// Two implementations, chosen at start-up (CreateDeviceMemory):
//  * CPU (kernels/cpu_device_memory.h): "device" memory is host memory,
//    copies are memcpy and complete before they return, streams and events
//    are tokens, pinning is a no-op, IPC is UNIMPLEMENTED (host memory is
//    shared between processes as shared-memory regions instead).
//  * CUDA (kernels/cuda_device_memory.h): the dlopen'ed module's table;
//    tests drive it through a fake table.
//
// Conventions: the public methods validate their arguments once and return
// INVALID_ARGUMENT before anything reaches the implementation; device errors
// come back as statuses (RESOURCE_EXHAUSTED when memory runs out or cannot be
// pinned, INTERNAL naming the device call otherwise); nothing aborts.
//
// Lifecycle: an object serves until destroyed; allocations, streams, events,
// pins and IPC mappings it handed out must be released through it before.
//
// Thread-safety: all methods are thread-safe. A stream must be used by one
// thread at a time (the copy engine's copy thread owns its stream).
#ifndef MOECACHE_KERNELS_DEVICE_MEMORY_H_
#define MOECACHE_KERNELS_DEVICE_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace moe {

// Directions of a copy. The values cross the CUDA module's C ABI
// (MOE_CUDA_COPY_*; checked by static_asserts in kernels/cuda_device_memory.cc).
enum class CopyDirection : int {
  kHostToDevice = 0,
  kDeviceToHost = 1,
  kDeviceToDevice = 2,
};

// Opaque handles made by one DeviceMemory and valid only with it.
struct DeviceMemoryStream;
struct DeviceMemoryEvent;
using CopyStream = DeviceMemoryStream*;
using CopyEvent = DeviceMemoryEvent*;

struct DeviceMemoryInfo {
  std::string name;          // "cpu" or "cuda"
  std::string device_name;   // e.g. "NVIDIA H200"; "host" on the CPU
  int device = 0;            // device ordinal (0 on the CPU)
  bool is_device = false;    // allocations are not host-addressable
  bool supports_ipc = false;       // ExportIpc/OpenIpc work
  bool supports_pinning = false;   // PinHostMemory does something
};

struct DeviceMemoryUsage {
  uint64_t free_bytes = 0;
  uint64_t total_bytes = 0;
};

class DeviceMemory {
 public:
  // Bytes of an IPC handle (the size of a cudaIpcMemHandle_t).
  static constexpr size_t kIpcHandleBytes = 64;

  virtual ~DeviceMemory() = default;
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  DeviceMemoryInfo Info() const { return DoInfo(); }
  // Free and total memory now. INTERNAL when the device cannot say.
  absl::StatusOr<DeviceMemoryUsage> QueryUsage() const;
  // "cuda:0 (NVIDIA H200)" or "cpu".
  std::string Describe() const;

  // ---- Allocations ----------------------------------------------------------
  // At least 64-byte aligned, contents unspecified. INVALID_ARGUMENT for 0
  // bytes; RESOURCE_EXHAUSTED naming the bytes and the free/total memory
  // when the allocation fails.
  absl::StatusOr<void*> Allocate(uint64_t bytes);
  // nullptr is a no-op; a device error is logged (there is no caller that
  // could do better).
  void Free(void* ptr);
  // Zeroes [dst, dst + bytes) and waits until done.
  absl::Status MemsetZero(void* dst, uint64_t bytes);
  // A copy that has completed when it returns (the legacy stream: ordered
  // after earlier synchronous work on the device).
  absl::Status Copy(void* dst, const void* src, uint64_t bytes, CopyDirection direction);

  // ---- Pinned host memory ---------------------------------------------------
  // Page-locks an existing host range so that copies from it run by DMA.
  // RESOURCE_EXHAUSTED naming the bytes, the device error, RLIMIT_MEMLOCK and
  // the fix when it fails. OK and nothing done where pinning is unsupported.
  absl::Status PinHostMemory(void* data, uint64_t bytes);
  // REQUIRES: `data` was pinned by PinHostMemory. INTERNAL on a device error.
  absl::Status UnpinHostMemory(void* data);

  // ---- IPC --------------------------------------------------------------------
  // A kIpcHandleBytes handle for an allocation of Allocate() that another
  // process can open. UNIMPLEMENTED where IPC is unsupported.
  absl::StatusOr<std::string> ExportIpc(void* device_ptr);
  // Maps another process's allocation; close it with CloseIpc. INVALID_ARGUMENT
  // when `handle` is not kIpcHandleBytes long; INTERNAL naming the device
  // error (CUDA refuses a handle in the process that made it); UNIMPLEMENTED
  // where IPC is unsupported.
  absl::StatusOr<void*> OpenIpc(const std::string& handle);
  absl::Status CloseIpc(void* device_ptr);

  // ---- Copy streams and events ------------------------------------------------
  // A stream for asynchronous copies. `priority` as in CUDA: lower numbers are
  // higher priority, 0 is the default, values are clamped to the device's
  // range.
  absl::StatusOr<CopyStream> CreateCopyStream(int priority);
  void DestroyStream(CopyStream stream);  // nullptr is a no-op
  absl::StatusOr<CopyEvent> CreateEvent();
  void DestroyEvent(CopyEvent event);  // nullptr is a no-op
  // Queues a host -> device copy on `stream` and returns; the source must
  // stay unchanged until an event recorded after it has completed.
  absl::Status CopyHostToDeviceAsync(void* dst, const void* host_src, uint64_t bytes,
                                     CopyStream stream);
  // The event completes when the work queued on `stream` before it has.
  absl::Status RecordEvent(CopyEvent event, CopyStream stream);
  // True when the event has completed, false while it has not.
  absl::StatusOr<bool> QueryEvent(CopyEvent event);
  absl::Status SynchronizeEvent(CopyEvent event);

 protected:
  DeviceMemory() = default;

 private:
  // Implementations; arguments are already validated (non-null pointers and
  // handles, bytes > 0 where it matters).
  virtual DeviceMemoryInfo DoInfo() const = 0;
  virtual absl::StatusOr<DeviceMemoryUsage> DoQueryUsage() const = 0;
  virtual absl::StatusOr<void*> DoAllocate(uint64_t bytes) = 0;
  virtual absl::Status DoFree(void* ptr) = 0;
  virtual absl::Status DoMemsetZero(void* dst, uint64_t bytes) = 0;
  virtual absl::Status DoCopy(void* dst, const void* src, uint64_t bytes,
                              CopyDirection direction) = 0;
  // Returns the device error's text on failure (PinHostMemory adds the rest).
  virtual absl::Status DoPinHostMemory(void* data, uint64_t bytes) = 0;
  virtual absl::Status DoUnpinHostMemory(void* data) = 0;
  // Writes exactly kIpcHandleBytes bytes to `handle`.
  virtual absl::Status DoExportIpc(void* device_ptr, char* handle) = 0;
  virtual absl::StatusOr<void*> DoOpenIpc(const char* handle) = 0;
  virtual absl::Status DoCloseIpc(void* device_ptr) = 0;
  virtual absl::StatusOr<CopyStream> DoCreateCopyStream(int priority) = 0;
  virtual absl::Status DoDestroyStream(CopyStream stream) = 0;
  virtual absl::StatusOr<CopyEvent> DoCreateEvent() = 0;
  virtual absl::Status DoDestroyEvent(CopyEvent event) = 0;
  virtual absl::Status DoCopyHostToDeviceAsync(void* dst, const void* host_src, uint64_t bytes,
                                               CopyStream stream) = 0;
  virtual absl::Status DoRecordEvent(CopyEvent event, CopyStream stream) = 0;
  virtual absl::StatusOr<bool> DoQueryEvent(CopyEvent event) = 0;
  virtual absl::Status DoSynchronizeEvent(CopyEvent event) = 0;
};

// "cpu", "cuda" or "auto" (CUDA when a device is usable, else CPU), on
// device ordinal `device` for CUDA. "cuda" returns the reason when no module
// or device is usable: NOT_FOUND (no module), UNAVAILABLE (no usable device,
// or the device cannot be selected), FAILED_PRECONDITION (ABI mismatch).
// INVALID_ARGUMENT for another name.
absl::StatusOr<std::unique_ptr<DeviceMemory>> CreateDeviceMemory(absl::string_view name,
                                                                 int device = 0);

}  // namespace moe

#endif  // MOECACHE_KERNELS_DEVICE_MEMORY_H_
