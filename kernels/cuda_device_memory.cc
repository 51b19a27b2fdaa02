#include "kernels/cuda_device_memory.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda/module_abi.h"
#include "kernels/cuda_module.h"

namespace moe {

static_assert(static_cast<int>(CopyDirection::kHostToDevice) == MOE_CUDA_COPY_H2D);
static_assert(static_cast<int>(CopyDirection::kDeviceToHost) == MOE_CUDA_COPY_D2H);
static_assert(static_cast<int>(CopyDirection::kDeviceToDevice) == MOE_CUDA_COPY_D2D);
static_assert(DeviceMemory::kIpcHandleBytes == MOE_CUDA_IPC_HANDLE_BYTES);

namespace {

void* Raw(CopyStream s) { return static_cast<void*>(s); }
void* Raw(CopyEvent e) { return static_cast<void*>(e); }

class CudaDeviceMemory final : public DeviceMemory {
 public:
  CudaDeviceMemory(const MoeCudaModuleApi* api, int device) : api_(api), device_(device) {}

 private:
  absl::Status Check(int code, const char* what) const {
    return CudaModuleStatus(api_, code, what);
  }

  DeviceMemoryInfo DoInfo() const override {
    DeviceMemoryInfo info;
    info.name = "cuda";
    char name[256] = {0};
    if (api_->device_name(device_, name, sizeof(name)) == 0) info.device_name = name;
    info.device = device_;
    info.is_device = true;
    info.supports_ipc = true;
    info.supports_pinning = true;
    return info;
  }
  absl::StatusOr<DeviceMemoryUsage> DoQueryUsage() const override {
    size_t free_bytes = 0, total_bytes = 0;
    RETURN_IF_ERROR(Check(api_->mem_info(&free_bytes, &total_bytes), "cudaMemGetInfo"));
    return DeviceMemoryUsage{free_bytes, total_bytes};
  }
  absl::StatusOr<void*> DoAllocate(uint64_t bytes) override {
    void* p = nullptr;
    RETURN_IF_ERROR(Check(api_->device_malloc(&p, bytes), "cudaMalloc"));
    return p;
  }
  absl::Status DoFree(void* ptr) override { return Check(api_->device_free(ptr), "cudaFree"); }
  absl::Status DoMemsetZero(void* dst, uint64_t bytes) override {
    RETURN_IF_ERROR(Check(api_->memset_zero(dst, bytes, nullptr), "cudaMemset"));
    return Check(api_->stream_synchronize(nullptr), "cudaStreamSynchronize");
  }
  absl::Status DoCopy(void* dst, const void* src, uint64_t bytes,
                      CopyDirection direction) override {
    return Check(api_->memcpy(dst, src, bytes, static_cast<int>(direction), nullptr),
                 "cudaMemcpy");
  }
  absl::Status DoPinHostMemory(void* data, uint64_t bytes) override {
    return Check(api_->host_register(data, bytes), "cudaHostRegister");
  }
  absl::Status DoUnpinHostMemory(void* data) override {
    return Check(api_->host_unregister(data), "cudaHostUnregister");
  }
  absl::Status DoExportIpc(void* device_ptr, char* handle) override {
    return Check(api_->ipc_get_mem_handle(device_ptr, handle), "cudaIpcGetMemHandle");
  }
  absl::StatusOr<void*> DoOpenIpc(const char* handle) override {
    void* p = nullptr;
    RETURN_IF_ERROR(Check(api_->ipc_open_mem_handle(handle, &p), "cudaIpcOpenMemHandle"));
    return p;
  }
  absl::Status DoCloseIpc(void* device_ptr) override {
    return Check(api_->ipc_close_mem_handle(device_ptr), "cudaIpcCloseMemHandle");
  }
  absl::StatusOr<CopyStream> DoCreateCopyStream(int priority) override {
    void* s = nullptr;
    RETURN_IF_ERROR(
        Check(api_->stream_create_with_priority(&s, priority), "cudaStreamCreateWithPriority"));
    return static_cast<CopyStream>(s);
  }
  absl::Status DoDestroyStream(CopyStream stream) override {
    return Check(api_->stream_destroy(Raw(stream)), "cudaStreamDestroy");
  }
  absl::StatusOr<CopyEvent> DoCreateEvent() override {
    void* e = nullptr;
    RETURN_IF_ERROR(Check(api_->event_create(&e), "cudaEventCreate"));
    return static_cast<CopyEvent>(e);
  }
  absl::Status DoDestroyEvent(CopyEvent event) override {
    return Check(api_->event_destroy(Raw(event)), "cudaEventDestroy");
  }
  absl::Status DoCopyHostToDeviceAsync(void* dst, const void* src, uint64_t bytes,
                                       CopyStream stream) override {
    return Check(api_->memcpy_async_h2d(dst, src, bytes, Raw(stream)), "cudaMemcpyAsync");
  }
  absl::Status DoRecordEvent(CopyEvent event, CopyStream stream) override {
    return Check(api_->event_record(Raw(event), Raw(stream)), "cudaEventRecord");
  }
  absl::StatusOr<bool> DoQueryEvent(CopyEvent event) override {
    const int code = api_->event_query(Raw(event));
    if (code == MOE_CUDA_NOT_READY) return false;
    RETURN_IF_ERROR(Check(code, "cudaEventQuery"));
    return true;
  }
  absl::Status DoSynchronizeEvent(CopyEvent event) override {
    return Check(api_->event_synchronize(Raw(event)), "cudaEventSynchronize");
  }

  const MoeCudaModuleApi* const api_;
  const int device_;
};

}  // namespace

std::unique_ptr<DeviceMemory> NewCudaDeviceMemory(const MoeCudaModuleApi* api, int device) {
  return std::unique_ptr<DeviceMemory>(new CudaDeviceMemory(api, device));
}

absl::StatusOr<std::unique_ptr<DeviceMemory>> CreateCudaDeviceMemory(int device) {
  ASSIGN_OR_RETURN(const MoeCudaModuleApi* api, LoadCudaModule());
  const int count = api->device_count();
  if (device < 0 || device >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device ", device, " does not exist (", count, " devices)"));
  }
  absl::Status s = CudaModuleStatus(api, api->set_device(device), "cudaSetDevice");
  if (!s.ok()) return absl::UnavailableError(s.message());
  return NewCudaDeviceMemory(api, device);
}

}  // namespace moe
