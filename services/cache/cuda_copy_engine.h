// CudaCopyEngine: the CopyEngine contract over PCIe/NVLink into a device
// arena (cudaMalloc'ed memory, see services/moe_cached/cuda_arena.h).
//
// The scheduling is ChunkScheduler's (chunking, demand before prefetch,
// preemption at chunk boundaries, Promote, Cancel, callbacks on the copy
// thread with no lock held); this engine adds the mover: each chunk is one
// cudaMemcpyAsync on the engine's own non-blocking copy stream followed by an
// event, and the copy thread waits for that event before it accounts for the
// chunk and picks the next one. So a chunk is "on the link" exactly while the
// DMA engine moves it, and the bytes of a transfer reported OK are in device
// memory (visible to any later work on any stream of the device).
//
// Sources should be pinned (cudaHostRegister'ed, see the ExpertStore pin
// seam) for the copy to be a true asynchronous DMA; pageable sources still
// work, more slowly.
//
// Every device call goes through a DeviceMemory (kernels/device_memory.h):
// the CUDA one in the daemon; in tests the CUDA one over a fake module table,
// or the CPU one (memcpy, events complete at once).
//
// A chunk the device fails to copy ends its transfer with INTERNAL naming
// the CUDA error (see chunk_scheduler.h).
//
// Lifecycle as ChunkScheduler's; Start() also creates the stream and event
// (an error there is returned). Thread-safety: all public methods are
// thread-safe.
#ifndef MOECACHE_SERVICES_CACHE_CUDA_COPY_ENGINE_H_
#define MOECACHE_SERVICES_CACHE_CUDA_COPY_ENGINE_H_

#include <cstdint>
#include <memory>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/device_memory.h"
#include "services/cache/chunk_scheduler.h"
#include "services/cache/copy_engine.h"

namespace moe::cache {

struct CudaCopyEngineOptions {
  std::shared_ptr<DeviceMemory> memory;  // the device of the arena
  // Destination arena: memory's allocation, not owned; must outlive the engine.
  void* arena = nullptr;
  uint64_t arena_bytes = 0;
  uint64_t chunk_bytes = 4ull << 20;  // REQUIRES > 0
  // CUDA stream priority of the copy stream (clamped to the device's range;
  // lower is higher priority). 0: the default priority.
  int stream_priority = 0;
};

// The CUDA link: one async copy + event per chunk, on the copy thread.
class CudaChunkMover final : public ChunkMover {
 public:
  explicit CudaChunkMover(const CudaCopyEngineOptions& options);
  ~CudaChunkMover() override;
  CudaChunkMover(const CudaChunkMover&) = delete;
  CudaChunkMover& operator=(const CudaChunkMover&) = delete;

  // Creates the copy stream and event. Idempotent.
  absl::Status Init();
  absl::StatusOr<int64_t> Move(const internal::Chunk& chunk,
                               bool after_idle) override;

 private:
  const CudaCopyEngineOptions options_;
  CopyStream stream_ = nullptr;
  CopyEvent event_ = nullptr;
};

class CudaCopyEngine final : public ChunkScheduler {
 public:
  explicit CudaCopyEngine(const CudaCopyEngineOptions& options);
  ~CudaCopyEngine() override;  // Stop(): the copy thread ends before mover_

  CudaCopyEngine(const CudaCopyEngine&) = delete;
  CudaCopyEngine& operator=(const CudaCopyEngine&) = delete;

  // INVALID_ARGUMENT on bad options (no device memory, null arena with
  // arena_bytes > 0, chunk_bytes == 0); INTERNAL/RESOURCE_EXHAUSTED when
  // the stream or event cannot be created; FAILED_PRECONDITION if already
  // started or stopped. (Hides ChunkScheduler::Start.)
  absl::Status Start();

 private:
  CudaChunkMover mover_;  // used by the copy thread only after Start
};

}  // namespace moe::cache

#endif  // MOECACHE_SERVICES_CACHE_CUDA_COPY_ENGINE_H_
