#include "services/moe_cached/cuda_arena.h"

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace moe::cached {

absl::StatusOr<DeviceChoice> ResolveDevice(const std::string& flag) {
  if (flag != "auto" && flag != "cpu" && flag != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("--device: '", flag, "' is not auto, cpu or cuda"));
  }
  DeviceChoice cpu;
  cpu.description = "cpu";
  if (flag == "cpu") return cpu;
  absl::StatusOr<DeviceChoice> cuda = [&]() -> absl::StatusOr<DeviceChoice> {
    DeviceChoice c;
    ASSIGN_OR_RETURN(c.memory, CreateDeviceMemory("cuda", c.device));
    absl::StatusOr<DeviceMemoryUsage> usage = c.memory->QueryUsage();
    if (!usage.ok()) return absl::UnavailableError(usage.status().message());
    c.free_bytes = usage->free_bytes;
    c.total_bytes = usage->total_bytes;
    c.description = c.memory->Describe();
    return c;
  }();
  if (cuda.ok()) return cuda;
  if (flag == "cuda") {
    return absl::FailedPreconditionError(absl::StrCat(
        "--device cuda: no usable CUDA device: ", cuda.status().message()));
  }
  MOE_LOG(INFO) << "--device auto: using the CPU arena: "
                << cuda.status().message();
  return cpu;
}

absl::Status PinHostMemory(DeviceMemory& memory, void* data, uint64_t bytes) {
  absl::Status s = memory.PinHostMemory(data, bytes);
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(s.message(), " (or use --device cpu)"));
}

ExpertStoreOptions PinnedStoreOptions(std::shared_ptr<DeviceMemory> memory) {
  ExpertStoreOptions o;
  o.pin = [memory](void* data, uint64_t bytes) { return PinHostMemory(*memory, data, bytes); };
  o.unpin = [memory](void* data, uint64_t) {
    const absl::Status s = memory->UnpinHostMemory(data);
    if (!s.ok()) MOE_LOG(WARNING) << s;
  };
  return o;
}

absl::StatusOr<std::unique_ptr<CudaArena>> CudaArena::Create(
    std::shared_ptr<DeviceMemory> memory, uint64_t bytes) {
  if (memory == nullptr || bytes == 0) {
    return absl::InvalidArgumentError("CUDA arena needs device memory and bytes > 0");
  }
  absl::StatusOr<void*> ptr = memory->Allocate(bytes);
  if (!ptr.ok()) {
    return absl::Status(ptr.status().code(),
                        absl::StrCat("CUDA arena: ", ptr.status().message()));
  }
  std::unique_ptr<CudaArena> arena(new CudaArena(std::move(memory), *ptr, bytes));
  // Slots never copied into must not leak a previous owner's bytes.
  RETURN_IF_ERROR(arena->memory_->MemsetZero(arena->ptr_, bytes));
  ASSIGN_OR_RETURN(arena->ipc_handle_, arena->memory_->ExportIpc(arena->ptr_));
  return arena;
}

CudaArena::~CudaArena() { memory_->Free(ptr_); }

}  // namespace moe::cached
