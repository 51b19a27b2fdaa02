// CpuCopyEngine: the CopyEngine contract with real bytes. One copy thread
// (one emulated link) memcpy's chunk by chunk from host buffers into the
// arena (typically a ShmRegion mapping), demand first, preempting prefetches
// at chunk boundaries, exactly as TransferScheduler decides.
//
// Pacing (optional, link_bytes_per_sec > 0): the link is modelled as busy
// until `link_free_ns`. A chunk of c bytes starts at link_free_ns when it
// follows another chunk back to back (so a late wake-up is caught up and the
// average rate stays the link's), or at max(now, link_free_ns) after the
// thread ran out of work; it is due at start + LinkNanos(c, rate), and after
// the memcpy the thread calls clock->SleepUntil(due). Pacing sleeps emulate
// the link; tests inject a ManualClock and check the requested schedule,
// never wall time. Without pacing, chunks run at memcpy speed.
//
// Lifecycle: Submit may be called before Start (work queues up and starts
// with Start). Start() spawns the copy thread. Stop() cancels everything
// pending (an in-flight chunk finishes first), delivers the CANCELLED
// callbacks on the copy thread, and joins it; afterwards Submit returns
// FAILED_PRECONDITION. Stop is idempotent; the destructor calls it. If the
// engine was never started, Stop runs the CANCELLED callbacks itself, on the
// calling thread. Stop may be called from several threads at once, and from
// a callback (it then returns without joining; the destructor joins).
//
// Callbacks run on the copy thread with no engine lock held. REQUIRES: the
// caller does not hold a lock in Stop() (or the destructor) that a callback
// takes, or Stop deadlocks waiting for the callback.
//
// The scheduling (copy thread, queues, preemption, callbacks) is
// ChunkScheduler's, shared with CudaCopyEngine; this engine adds the mover.
//
// Thread-safety: all public methods are thread-safe.
#ifndef MOECACHE_SERVICES_CACHE_CPU_COPY_ENGINE_H_
#define MOECACHE_SERVICES_CACHE_CPU_COPY_ENGINE_H_

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "services/cache/chunk_scheduler.h"
#include "services/cache/clock.h"
#include "services/cache/copy_engine.h"

namespace moe::cache {

struct CpuCopyEngineOptions {
  // Destination arena, not owned; must outlive the engine. Every transfer's
  // [dst_offset, dst_offset + bytes) must lie inside [0, arena_bytes).
  void* arena = nullptr;
  uint64_t arena_bytes = 0;
  uint64_t chunk_bytes = 4ull << 20;  // REQUIRES > 0
  uint64_t link_bytes_per_sec = 0;    // 0: unpaced (memcpy speed)
  Clock* clock = nullptr;             // not owned; null: RealClock::Get()
};

// The CPU link: memcpy plus the optional pacing described above. Runs on the
// copy thread only. Exposed so that it can be tested on its own.
class MemcpyChunkMover final : public ChunkMover {
 public:
  explicit MemcpyChunkMover(const CpuCopyEngineOptions& options);
  absl::StatusOr<int64_t> Move(const internal::Chunk& chunk,
                               bool after_idle) override;

 private:
  uint8_t* const arena_;
  const uint64_t rate_;
  Clock* const clock_;
  int64_t link_free_ns_ = 0;  // when the emulated link frees up
};

// Start(): INVALID_ARGUMENT on bad options (null arena with arena_bytes > 0,
// chunk_bytes == 0); FAILED_PRECONDITION if already started or stopped.
// Submit: INVALID_ARGUMENT for bytes == 0, a null src, or a destination
// outside the arena; FAILED_PRECONDITION after Stop.
class CpuCopyEngine final : public ChunkScheduler {
 public:
  explicit CpuCopyEngine(const CpuCopyEngineOptions& options);
  ~CpuCopyEngine() override;  // Stop(): the copy thread ends before mover_

  CpuCopyEngine(const CpuCopyEngine&) = delete;
  CpuCopyEngine& operator=(const CpuCopyEngine&) = delete;

 private:
  MemcpyChunkMover mover_;  // used by the copy thread only after Start
};

}  // namespace moe::cache

#endif  // MOECACHE_SERVICES_CACHE_CPU_COPY_ENGINE_H_
