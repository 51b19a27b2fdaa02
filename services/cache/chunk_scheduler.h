// ChunkScheduler: the threaded half of every real copy engine. It implements
// the CopyEngine contract (copy_engine.h) on one copy thread, with the
// queueing and preemption rules of TransferScheduler, and delegates the one
// thing that differs between links, moving one chunk, to a ChunkMover:
//
//   CpuCopyEngine:  memcpy into a host arena, optionally paced to a link rate.
//   CudaCopyEngine: cudaMemcpyAsync on a dedicated copy stream + an event,
//                   waited for on the copy thread.
//
// The copy thread picks a chunk under the lock, releases the lock, calls
// ChunkMover::Move, re-takes the lock and accounts for the chunk; so demand
// preempts prefetch, Promote and Cancel take effect at chunk boundaries.
//
// A chunk the mover fails to move ends its transfer: on_done reports the
// mover's error (the only non-OK, non-CANCELLED status an engine reports),
// counted in transfers_cancelled.
//
// Lifecycle: Submit may be called before Start (work queues up and starts
// with Start). Start() spawns the copy thread. Stop() cancels everything
// pending (an in-flight chunk finishes first), delivers the CANCELLED
// callbacks on the copy thread, and joins it; afterwards Submit returns
// FAILED_PRECONDITION. Stop is idempotent; the destructor calls it. If never
// started, Stop runs the CANCELLED callbacks itself, on the calling thread.
// Stop may be called from several threads at once, and from a callback (it
// then returns without joining; the destructor joins).
//
// Callbacks run on the copy thread with no engine lock held. REQUIRES: the
// caller does not hold a lock in Stop() (or the destructor) that a callback
// takes, or Stop deadlocks waiting for the callback.
//
// Thread-safety: all public methods are thread-safe.
#ifndef MOECACHE_SERVICES_CACHE_CHUNK_SCHEDULER_H_
#define MOECACHE_SERVICES_CACHE_CHUNK_SCHEDULER_H_

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
#include "services/cache/copy_engine.h"
#include "services/cache/transfer_scheduler.h"

namespace moe::cache {

// Moves chunks over one link. Called only on the copy thread, one chunk at a
// time, with no engine lock held.
class ChunkMover {
 public:
  virtual ~ChunkMover() = default;
  // Copies chunk.bytes from chunk.src to arena offset chunk.dst_offset and
  // returns once the bytes are in place, with the link time (ns) to account
  // in CopyStats::busy_ns. `after_idle`: the link had no work since the
  // previous chunk (pacing restarts from now). An error fails the transfer.
  virtual absl::StatusOr<int64_t> Move(const internal::Chunk& chunk,
                                       bool after_idle) = 0;
};

// Called on the copy thread after each chunk is moved, before the next one
// is picked, with no engine lock held. Test seam.
using ChunkObserverFn = std::function<void(const internal::Chunk&)>;

struct ChunkSchedulerOptions {
  uint64_t arena_bytes = 0;  // transfers must lie inside [0, arena_bytes)
  uint64_t chunk_bytes = 4ull << 20;  // REQUIRES > 0
  ChunkMover* mover = nullptr;  // not owned; must outlive the scheduler
};

// The engines' own option check: their arena pointer (which the scheduler
// never touches: movers own the memory) is non-null whenever arena_bytes > 0.
absl::Status CheckEngineArena(const void* arena, uint64_t arena_bytes);

// Engines are ChunkSchedulers with their own mover: they derive from it and
// call Stop() in their destructor, before the mover member dies.
class ChunkScheduler : public CopyEngine {
 public:
  // `options_status` non-OK (the owning engine's own option check) makes
  // Start and Submit return it.
  explicit ChunkScheduler(const ChunkSchedulerOptions& options,
                          absl::Status options_status = absl::OkStatus());
  ~ChunkScheduler() override;

  ChunkScheduler(const ChunkScheduler&) = delete;
  ChunkScheduler& operator=(const ChunkScheduler&) = delete;

  // The engine's and the scheduler's option checks; Start returns it.
  const absl::Status& options_status() const { return options_status_; }

  // INVALID_ARGUMENT on bad options (chunk_bytes == 0, no mover);
  // FAILED_PRECONDITION if already started or stopped.
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
  // Runs callbacks with `lock` (on mu_) released.
  static void Deliver(std::unique_lock<std::mutex>& lock,
                      std::vector<internal::Finished> finished);
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || !scheduler_.idle();
  }

  const ChunkSchedulerOptions options_;
  const absl::Status options_status_;
  ChunkObserverFn observer_;  // set before Start; read by the copy thread
  // Copy thread only (written under mu_): the link ran out of work since the
  // last chunk.
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

#endif  // MOECACHE_SERVICES_CACHE_CHUNK_SCHEDULER_H_
