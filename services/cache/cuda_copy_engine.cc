#include "services/cache/cuda_copy_engine.h"

#include <chrono>

#include "common/status_macros.h"

namespace moe::cache {
namespace {

int64_t SteadyNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

CudaChunkMover::CudaChunkMover(const CudaCopyEngineOptions& options)
    : options_(options) {}

CudaChunkMover::~CudaChunkMover() {
  if (options_.memory == nullptr) return;
  options_.memory->DestroyEvent(event_);
  options_.memory->DestroyStream(stream_);
}

absl::Status CudaChunkMover::Init() {
  DeviceMemory& memory = *options_.memory;
  if (stream_ == nullptr) {
    ASSIGN_OR_RETURN(stream_, memory.CreateCopyStream(options_.stream_priority));
  }
  if (event_ == nullptr) {
    ASSIGN_OR_RETURN(event_, memory.CreateEvent());
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> CudaChunkMover::Move(const internal::Chunk& chunk,
                                             bool /*after_idle*/) {
  DeviceMemory& memory = *options_.memory;
  const int64_t start = SteadyNanos();
  void* dst = static_cast<uint8_t*>(options_.arena) + chunk.dst_offset;
  RETURN_IF_ERROR(memory.CopyHostToDeviceAsync(dst, chunk.src, chunk.bytes, stream_));
  RETURN_IF_ERROR(memory.RecordEvent(event_, stream_));
  RETURN_IF_ERROR(memory.SynchronizeEvent(event_));
  return SteadyNanos() - start;
}

CudaCopyEngine::CudaCopyEngine(const CudaCopyEngineOptions& options)
    : ChunkScheduler({options.arena_bytes, options.chunk_bytes, &mover_},
                     options.memory != nullptr
                         ? CheckEngineArena(options.arena, options.arena_bytes)
                         : absl::InvalidArgumentError("CUDA copy engine without device memory")),
      mover_(options) {}

CudaCopyEngine::~CudaCopyEngine() { Stop(); }

absl::Status CudaCopyEngine::Start() {
  if (!options_status().ok()) return options_status();  // before Init uses the memory
  absl::Status s = mover_.Init();
  if (!s.ok()) return s;
  return ChunkScheduler::Start();
}

}  // namespace moe::cache
