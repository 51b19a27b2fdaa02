#include "kernels/device_memory.h"

#include <sys/resource.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "kernels/cpu_device_memory.h"
#include "kernels/cuda_device_memory.h"

namespace moe {
namespace {

std::string LimitText(rlim_t v) {
  return v == RLIM_INFINITY ? "unlimited" : absl::StrCat(v, " bytes");
}

std::string MemlockLimitText() {
  struct rlimit lim;
  if (::getrlimit(RLIMIT_MEMLOCK, &lim) != 0) {
    return absl::StrCat("RLIMIT_MEMLOCK unknown (", std::strerror(errno), ")");
  }
  return absl::StrCat("RLIMIT_MEMLOCK is ", LimitText(lim.rlim_cur), " (hard ",
                      LimitText(lim.rlim_max), ")");
}

absl::Status NullArgument(const char* what) {
  return absl::InvalidArgumentError(absl::StrCat(what, ": null pointer or handle"));
}

void LogIfError(const absl::Status& s) {
  if (!s.ok()) MOE_LOG(WARNING) << s;
}

}  // namespace

absl::StatusOr<DeviceMemoryUsage> DeviceMemory::QueryUsage() const { return DoQueryUsage(); }

std::string DeviceMemory::Describe() const {
  const DeviceMemoryInfo info = DoInfo();
  if (!info.is_device) return info.name;
  return absl::StrCat(info.name, ":", info.device, " (", info.device_name, ")");
}

absl::StatusOr<void*> DeviceMemory::Allocate(uint64_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("Allocate: 0 bytes");
  absl::StatusOr<void*> p = DoAllocate(bytes);
  if (p.ok()) return p;
  const absl::StatusOr<DeviceMemoryUsage> usage = DoQueryUsage();
  return absl::ResourceExhaustedError(absl::StrCat(
      "cannot allocate ", bytes, " bytes on ", Describe(), " (",
      usage.ok() ? absl::StrCat(usage->free_bytes, " of ", usage->total_bytes, " bytes free")
                 : std::string("free memory unknown"),
      "): ", p.status().message()));
}

void DeviceMemory::Free(void* ptr) {
  if (ptr != nullptr) LogIfError(DoFree(ptr));
}

absl::Status DeviceMemory::MemsetZero(void* dst, uint64_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  if (dst == nullptr) return NullArgument("MemsetZero");
  return DoMemsetZero(dst, bytes);
}

absl::Status DeviceMemory::Copy(void* dst, const void* src, uint64_t bytes,
                                CopyDirection direction) {
  if (bytes == 0) return absl::OkStatus();
  if (dst == nullptr || src == nullptr) return NullArgument("Copy");
  return DoCopy(dst, src, bytes, direction);
}

absl::Status DeviceMemory::PinHostMemory(void* data, uint64_t bytes) {
  if (data == nullptr || bytes == 0) {
    return absl::InvalidArgumentError("PinHostMemory: null range or 0 bytes");
  }
  const absl::Status s = DoPinHostMemory(data, bytes);
  if (s.ok()) return s;
  return absl::ResourceExhaustedError(absl::StrCat(
      "cannot pin ", bytes, " bytes of host memory (", s.message(), "); ", MemlockLimitText(),
      ". Fix: set LimitMEMLOCK=infinity in the service's systemd unit, or run "
      "`ulimit -l unlimited` before starting it"));
}

absl::Status DeviceMemory::UnpinHostMemory(void* data) {
  if (data == nullptr) return NullArgument("UnpinHostMemory");
  return DoUnpinHostMemory(data);
}

absl::StatusOr<std::string> DeviceMemory::ExportIpc(void* device_ptr) {
  if (device_ptr == nullptr) return NullArgument("ExportIpc");
  std::string handle(kIpcHandleBytes, '\0');
  absl::Status s = DoExportIpc(device_ptr, handle.data());
  if (!s.ok()) return s;
  return handle;
}

absl::StatusOr<void*> DeviceMemory::OpenIpc(const std::string& handle) {
  if (handle.size() != kIpcHandleBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "IPC handle of ", handle.size(), " bytes, expected ", kIpcHandleBytes));
  }
  return DoOpenIpc(handle.data());
}

absl::Status DeviceMemory::CloseIpc(void* device_ptr) {
  if (device_ptr == nullptr) return NullArgument("CloseIpc");
  return DoCloseIpc(device_ptr);
}

absl::StatusOr<CopyStream> DeviceMemory::CreateCopyStream(int priority) {
  return DoCreateCopyStream(priority);
}

void DeviceMemory::DestroyStream(CopyStream stream) {
  if (stream != nullptr) LogIfError(DoDestroyStream(stream));
}

absl::StatusOr<CopyEvent> DeviceMemory::CreateEvent() { return DoCreateEvent(); }

void DeviceMemory::DestroyEvent(CopyEvent event) {
  if (event != nullptr) LogIfError(DoDestroyEvent(event));
}

absl::Status DeviceMemory::CopyHostToDeviceAsync(void* dst, const void* host_src, uint64_t bytes,
                                                 CopyStream stream) {
  if (stream == nullptr) return NullArgument("CopyHostToDeviceAsync: stream");
  if (bytes == 0) return absl::OkStatus();
  if (dst == nullptr || host_src == nullptr) return NullArgument("CopyHostToDeviceAsync");
  return DoCopyHostToDeviceAsync(dst, host_src, bytes, stream);
}

absl::Status DeviceMemory::RecordEvent(CopyEvent event, CopyStream stream) {
  if (event == nullptr || stream == nullptr) return NullArgument("RecordEvent");
  return DoRecordEvent(event, stream);
}

absl::StatusOr<bool> DeviceMemory::QueryEvent(CopyEvent event) {
  if (event == nullptr) return NullArgument("QueryEvent");
  return DoQueryEvent(event);
}

absl::Status DeviceMemory::SynchronizeEvent(CopyEvent event) {
  if (event == nullptr) return NullArgument("SynchronizeEvent");
  return DoSynchronizeEvent(event);
}

absl::StatusOr<std::unique_ptr<DeviceMemory>> CreateDeviceMemory(absl::string_view name,
                                                                 int device) {
  if (name == "cpu") return NewCpuDeviceMemory();
  if (name != "cuda" && name != "auto") {
    return absl::InvalidArgumentError(
        absl::StrCat("device memory '", name, "' is not cpu, cuda or auto"));
  }
  absl::StatusOr<std::unique_ptr<DeviceMemory>> cuda = CreateCudaDeviceMemory(device);
  if (cuda.ok() || name == "cuda") return cuda;
  return NewCpuDeviceMemory();
}

}  // namespace moe
