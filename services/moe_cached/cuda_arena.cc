#include "services/moe_cached/cuda_arena.h"

#include <sys/resource.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "kernels/cuda_module.h"
#include "services/cache/cuda_copy_engine.h"

namespace moe::cached {
namespace {

std::string LimitText(rlim_t v) {
  return v == RLIM_INFINITY ? "unlimited" : absl::StrCat(v, " bytes");
}

absl::StatusOr<DeviceChoice> CudaChoice() {
  absl::StatusOr<const MoeCudaModuleApi*> api = LoadCudaModule();
  if (!api.ok()) return api.status();
  DeviceChoice c;
  c.cuda = *api;
  c.device = 0;
  absl::Status s = cache::CudaCallStatus(c.cuda, c.cuda->set_device(c.device),
                                         "cudaSetDevice");
  if (s.ok()) {
    size_t free_bytes = 0, total_bytes = 0;
    s = cache::CudaCallStatus(c.cuda, c.cuda->mem_info(&free_bytes, &total_bytes),
                              "cudaMemGetInfo");
    c.free_bytes = free_bytes;
    c.total_bytes = total_bytes;
  }
  if (!s.ok()) return absl::UnavailableError(s.message());
  char name[256] = {0};
  c.cuda->device_name(c.device, name, sizeof(name));
  c.description = absl::StrCat("cuda:", c.device, " (", name, ")");
  return c;
}

}  // namespace

absl::StatusOr<DeviceChoice> ResolveDevice(const std::string& flag) {
  if (flag != "auto" && flag != "cpu" && flag != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("--device: '", flag, "' is not auto, cpu or cuda"));
  }
  DeviceChoice cpu;
  cpu.description = "cpu";
  if (flag == "cpu") return cpu;
  absl::StatusOr<DeviceChoice> cuda = CudaChoice();
  if (cuda.ok()) return cuda;
  if (flag == "cuda") {
    return absl::FailedPreconditionError(absl::StrCat(
        "--device cuda: no usable CUDA device: ", cuda.status().message()));
  }
  MOE_LOG(INFO) << "--device auto: using the CPU arena: "
                << cuda.status().message();
  return cpu;
}

absl::Status PinFailedStatus(uint64_t bytes, const std::string& cuda_error) {
  struct rlimit lim;
  std::string limit;
  if (::getrlimit(RLIMIT_MEMLOCK, &lim) == 0) {
    limit = absl::StrCat("RLIMIT_MEMLOCK is ", LimitText(lim.rlim_cur),
                         " (hard ", LimitText(lim.rlim_max), ")");
  } else {
    limit = absl::StrCat("RLIMIT_MEMLOCK unknown (", std::strerror(errno), ")");
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "cannot pin ", bytes, " bytes of expert memory (cudaHostRegister: ",
      cuda_error, "); ", limit,
      ". Fix: set LimitMEMLOCK=infinity in the moe-cached systemd unit, or "
      "run `ulimit -l unlimited` before starting it (or use --device cpu)"));
}

absl::Status PinHostMemory(const MoeCudaModuleApi& api, void* data,
                           uint64_t bytes) {
  const int code = api.host_register(data, bytes);
  if (code == 0) return absl::OkStatus();
  return PinFailedStatus(bytes, absl::StrCat(api.error_string(code), ", code ", code));
}

ExpertStoreOptions PinnedStoreOptions(const MoeCudaModuleApi* api) {
  ExpertStoreOptions o;
  o.pin = [api](void* data, uint64_t bytes) {
    return PinHostMemory(*api, data, bytes);
  };
  o.unpin = [api](void* data, uint64_t) {
    const int code = api->host_unregister(data);
    if (code != 0) {
      MOE_LOG(WARNING) << "cudaHostUnregister: " << api->error_string(code);
    }
  };
  return o;
}

absl::StatusOr<std::unique_ptr<CudaArena>> CudaArena::Create(
    const MoeCudaModuleApi* api, int device, uint64_t bytes) {
  if (api == nullptr || bytes == 0) {
    return absl::InvalidArgumentError("CUDA arena needs a module and bytes > 0");
  }
  void* ptr = nullptr;
  const int code = api->device_malloc(&ptr, bytes);
  if (code != 0) {
    size_t free_bytes = 0, total_bytes = 0;
    api->mem_info(&free_bytes, &total_bytes);
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot allocate a CUDA arena of ", bytes, " bytes on device ", device,
        " (", free_bytes, " of ", total_bytes, " bytes free): ",
        api->error_string(code)));
  }
  std::unique_ptr<CudaArena> arena(new CudaArena(api, device, ptr, bytes));
  // Slots never copied into must not leak a previous owner's bytes.
  absl::Status s = cache::CudaCallStatus(api, api->memset_zero(ptr, bytes, nullptr),
                                         "cudaMemset");
  if (s.ok()) s = cache::CudaCallStatus(api, api->stream_synchronize(nullptr),
                                        "cudaStreamSynchronize");
  if (!s.ok()) return s;
  arena->ipc_handle_.assign(MOE_CUDA_IPC_HANDLE_BYTES, '\0');
  s = cache::CudaCallStatus(api, api->ipc_get_mem_handle(ptr, arena->ipc_handle_.data()),
                            "cudaIpcGetMemHandle");
  if (!s.ok()) return s;
  return arena;
}

CudaArena::~CudaArena() {
  const int code = api_->device_free(ptr_);
  if (code != 0) MOE_LOG(WARNING) << "cudaFree: " << api_->error_string(code);
}

}  // namespace moe::cached
