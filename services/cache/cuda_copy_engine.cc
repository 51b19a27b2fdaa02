#include "services/cache/cuda_copy_engine.h"

#include <chrono>

#include "absl/strings/str_cat.h"

namespace moe::cache {
namespace {

constexpr int kCudaErrorMemoryAllocation = 2;

int64_t SteadyNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

absl::Status CudaCallStatus(const MoeCudaModuleApi* api, int code,
                            const char* what) {
  if (code == 0) return absl::OkStatus();
  std::string msg = absl::StrCat(what, ": ", api->error_string(code),
                                 " (code ", code, ")");
  if (code == kCudaErrorMemoryAllocation) {
    return absl::ResourceExhaustedError(msg);
  }
  if (code > MOE_CUDA_MODULE_BASE) return absl::InvalidArgumentError(msg);
  return absl::InternalError(msg);
}

CudaChunkMover::CudaChunkMover(const CudaCopyEngineOptions& options)
    : options_(options) {}

CudaChunkMover::~CudaChunkMover() {
  if (event_ != nullptr) options_.api->event_destroy(event_);
  if (stream_ != nullptr) options_.api->stream_destroy(stream_);
}

absl::Status CudaChunkMover::Init() {
  const MoeCudaModuleApi* api = options_.api;
  if (stream_ == nullptr) {
    void* s = nullptr;
    absl::Status st = CudaCallStatus(
        api, api->stream_create_with_priority(&s, options_.stream_priority),
        "cudaStreamCreateWithPriority");
    if (!st.ok()) return st;
    stream_ = s;
  }
  if (event_ == nullptr) {
    void* e = nullptr;
    absl::Status st =
        CudaCallStatus(api, api->event_create(&e), "cudaEventCreate");
    if (!st.ok()) return st;
    event_ = e;
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> CudaChunkMover::Move(const internal::Chunk& chunk,
                                             bool /*after_idle*/) {
  const MoeCudaModuleApi* api = options_.api;
  const int64_t start = SteadyNanos();
  void* dst = static_cast<uint8_t*>(options_.arena) + chunk.dst_offset;
  absl::Status s = CudaCallStatus(
      api, api->memcpy_async_h2d(dst, chunk.src, chunk.bytes, stream_),
      "cudaMemcpyAsync");
  if (s.ok()) {
    s = CudaCallStatus(api, api->event_record(event_, stream_),
                       "cudaEventRecord");
  }
  if (s.ok()) {
    s = CudaCallStatus(api, api->event_synchronize(event_),
                       "cudaEventSynchronize");
  }
  if (!s.ok()) return s;
  return SteadyNanos() - start;
}

CudaCopyEngine::CudaCopyEngine(const CudaCopyEngineOptions& options)
    : ChunkScheduler({options.arena_bytes, options.chunk_bytes, &mover_},
                     options.api != nullptr
                         ? CheckEngineArena(options.arena, options.arena_bytes)
                         : absl::InvalidArgumentError("CUDA copy engine without a module")),
      mover_(options) {}

CudaCopyEngine::~CudaCopyEngine() { Stop(); }

absl::Status CudaCopyEngine::Start() {
  if (!options_status().ok()) return options_status();  // before Init uses the module
  absl::Status s = mover_.Init();
  if (!s.ok()) return s;
  return ChunkScheduler::Start();
}

}  // namespace moe::cache
