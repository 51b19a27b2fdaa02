#include "kernels/cpu_device_memory.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace moe {
namespace {

constexpr uint64_t kAlignment = 64;

absl::Status NoIpc() {
  return absl::UnimplementedError(
      "the CPU device memory has no IPC handles: share host memory between processes as a "
      "shared-memory region");
}

class CpuDeviceMemory final : public DeviceMemory {
 private:
  DeviceMemoryInfo DoInfo() const override {
    DeviceMemoryInfo info;
    info.name = "cpu";
    info.device_name = "host";
    return info;
  }
  absl::StatusOr<DeviceMemoryUsage> DoQueryUsage() const override {
    const long page = ::sysconf(_SC_PAGESIZE);
    const long avail = ::sysconf(_SC_AVPHYS_PAGES);
    const long total = ::sysconf(_SC_PHYS_PAGES);
    if (page <= 0 || avail < 0 || total <= 0) {
      return absl::InternalError("sysconf: host memory size unknown");
    }
    return DeviceMemoryUsage{static_cast<uint64_t>(avail) * static_cast<uint64_t>(page),
                             static_cast<uint64_t>(total) * static_cast<uint64_t>(page)};
  }
  absl::StatusOr<void*> DoAllocate(uint64_t bytes) override {
    const uint64_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
    void* p = std::aligned_alloc(kAlignment, rounded);
    if (p == nullptr) return absl::ResourceExhaustedError("aligned_alloc failed");
    return p;
  }
  absl::Status DoFree(void* ptr) override {
    std::free(ptr);
    return absl::OkStatus();
  }
  absl::Status DoMemsetZero(void* dst, uint64_t bytes) override {
    std::memset(dst, 0, bytes);
    return absl::OkStatus();
  }
  absl::Status DoCopy(void* dst, const void* src, uint64_t bytes, CopyDirection) override {
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  absl::Status DoPinHostMemory(void*, uint64_t) override { return absl::OkStatus(); }
  absl::Status DoUnpinHostMemory(void*) override { return absl::OkStatus(); }
  absl::Status DoExportIpc(void*, char*) override { return NoIpc(); }
  absl::StatusOr<void*> DoOpenIpc(const char*) override { return NoIpc(); }
  absl::Status DoCloseIpc(void*) override { return NoIpc(); }
  // Streams and events carry no state: any non-null token will do.
  absl::StatusOr<CopyStream> DoCreateCopyStream(int) override {
    return reinterpret_cast<CopyStream>(&token_);
  }
  absl::Status DoDestroyStream(CopyStream) override { return absl::OkStatus(); }
  absl::StatusOr<CopyEvent> DoCreateEvent() override {
    return reinterpret_cast<CopyEvent>(&token_);
  }
  absl::Status DoDestroyEvent(CopyEvent) override { return absl::OkStatus(); }
  absl::Status DoCopyHostToDeviceAsync(void* dst, const void* src, uint64_t bytes,
                                       CopyStream) override {
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  absl::Status DoRecordEvent(CopyEvent, CopyStream) override { return absl::OkStatus(); }
  absl::StatusOr<bool> DoQueryEvent(CopyEvent) override { return true; }
  absl::Status DoSynchronizeEvent(CopyEvent) override { return absl::OkStatus(); }

  char token_ = 0;
};

}  // namespace

std::unique_ptr<DeviceMemory> NewCpuDeviceMemory() {
  return std::unique_ptr<DeviceMemory>(new CpuDeviceMemory());
}

}  // namespace moe
