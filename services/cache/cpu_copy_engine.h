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
// Thread-safety: all public methods are thread-safe.
#ifndef MOECACHE_SERVICES_CACHE_CPU_COPY_ENGINE_H_
#define MOECACHE_SERVICES_CACHE_CPU_COPY_ENGINE_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "services/cache/clock.h"
#include "services/cache/copy_engine.h"
#include "services/cache/transfer_scheduler.h"

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

// Called on the copy thread after each chunk is copied (and paced), before
// the next chunk is picked, with no engine lock held. Test seam.
using ChunkObserverFn = std::function<void(const internal::Chunk&)>;

class CpuCopyEngine final : public CopyEngine {
 public:
  explicit CpuCopyEngine(const CpuCopyEngineOptions& options);
  ~CpuCopyEngine() override;

  CpuCopyEngine(const CpuCopyEngine&) = delete;
  CpuCopyEngine& operator=(const CpuCopyEngine&) = delete;

  // INVALID_ARGUMENT on bad options (null arena with arena_bytes > 0,
  // chunk_bytes == 0); FAILED_PRECONDITION if already started or stopped.
  absl::Status Start();
  void Stop();

  // CopyEngine. Submit: INVALID_ARGUMENT for bytes == 0, a null src, or a
  // destination outside the arena; FAILED_PRECONDITION after Stop.
  absl::StatusOr<TransferId> Submit(const TransferRequest& request,
                                    TransferDoneFn on_done) override;
  absl::Status Promote(TransferId id) override;
  absl::Status Cancel(TransferId id) override;
  std::optional<TransferInfo> Query(TransferId id) const override;
  CopyStats GetStats() const override;
  uint64_t chunk_bytes() const override { return options_.chunk_bytes; }

  // Must be set before Start.
  void SetChunkObserverForTest(ChunkObserverFn observer);

 private:
  void Run();
  // Copies and paces one chunk; returns the link time it accounted for.
  int64_t CopyChunk(const internal::Chunk& chunk);
  // Runs callbacks with `lock` (on mu_) released.
  static void Deliver(std::unique_lock<std::mutex>& lock,
                      std::vector<internal::Finished> finished);
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || !scheduler_.idle();
  }

  const CpuCopyEngineOptions options_;
  Clock* const clock_;
  const absl::Status options_status_;
  ChunkObserverFn observer_;  // set before Start; read by the copy thread
  // Copy thread only: when the emulated link frees up, and whether the
  // thread ran out of work since the last chunk.
  int64_t link_free_ns_ = 0;
  bool link_idle_ = true;

  // std::mutex rather than absl::Mutex so that ThreadSanitizer understands
  // it with the uninstrumented Debian abseil.
  mutable std::mutex mu_;
  std::condition_variable work_cv_;  // signalled when HasWork() may be true
  internal::TransferScheduler scheduler_ ABSL_GUARDED_BY(mu_);
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Lock order: join_mu_ before mu_. join_mu_ serializes starting and
  // joining thread_ (Stop may run on several threads at once).
  std::mutex join_mu_;
  std::thread thread_ ABSL_GUARDED_BY(join_mu_);
  std::atomic<std::thread::id> copy_thread_id_{};
};

}  // namespace moe::cache

#endif  // MOECACHE_SERVICES_CACHE_CPU_COPY_ENGINE_H_
