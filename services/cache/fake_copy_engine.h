// FakeCopyEngine: the CopyEngine contract on a virtual clock with a modelled
// link. Copies no bytes. Used by the simulator and by tests.
//
// Link model (exact integer nanoseconds):
//  - One chunk of c bytes occupies the link for LinkNanos(c, bandwidth).
//  - A transfer's first chunk additionally costs `latency_ns` (paid once per
//    transfer, not again when a preempted prefetch resumes).
//  - Scheduling decisions are made when time moves past the decision point:
//    everything submitted, promoted or cancelled at virtual time t (before the
//    clock moves past t) is taken into account for the chunk that starts at t.
//    Once a chunk has started it runs to its end.
//  - A transfer completes at the end of its last chunk; a cancelled in-flight
//    transfer is reported at the end of its current chunk; a cancelled queued
//    transfer is reported at the time of the Cancel call.
//
// Example (1 byte/ns, chunk 100 B, no latency): prefetch P of 300 B at t=0,
// demand D of 100 B at t=150. P's chunk [100,200) is on the link at 150, so D
// runs [200,300) and completes at 300; P resumes at 300 and completes at 400.
//
// Callbacks run on the caller's thread, from inside AdvanceTo, RunUntilDone
// and RunUntilIdle, in time order (ties: in the order the engine decided
// them), with now_ns() (and the attached clock, if any) equal to the event
// time. A callback may Submit, Promote or Cancel; new work starts at now_ns().
//
// Thread-safety: none; single-threaded use only.
#ifndef MOECACHE_SERVICES_CACHE_FAKE_COPY_ENGINE_H_
#define MOECACHE_SERVICES_CACHE_FAKE_COPY_ENGINE_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "services/cache/clock.h"
#include "services/cache/copy_engine.h"
#include "services/cache/transfer_scheduler.h"

namespace moe::cache {

struct FakeCopyEngineOptions {
  uint64_t bandwidth_bytes_per_sec = 0;  // REQUIRES > 0
  uint64_t chunk_bytes = 0;              // REQUIRES > 0
  int64_t latency_ns = 0;                // REQUIRES >= 0
  int64_t start_ns = 0;                  // initial virtual time
  // Optional, not owned; must outlive the engine. When set, the engine moves
  // it forward (ManualClock::AdvanceTo) to each event time before firing the
  // callback and to the target time of AdvanceTo, so code that reads the
  // clock inside a callback sees the event time. The engine never reads it.
  ManualClock* clock = nullptr;
};

class FakeCopyEngine final : public CopyEngine {
 public:
  // INVALID_ARGUMENT on bad options.
  static absl::StatusOr<std::unique_ptr<FakeCopyEngine>> Create(
      const FakeCopyEngineOptions& options);

  FakeCopyEngine(const FakeCopyEngine&) = delete;
  FakeCopyEngine& operator=(const FakeCopyEngine&) = delete;

  // CopyEngine. `request.src` and `request.dst_offset` are ignored.
  absl::StatusOr<TransferId> Submit(const TransferRequest& request,
                                    TransferDoneFn on_done) override;
  absl::Status Promote(TransferId id) override;
  absl::Status Cancel(TransferId id) override;
  std::optional<TransferInfo> Query(TransferId id) const override;
  CopyStats GetStats() const override;
  uint64_t chunk_bytes() const override { return options_.chunk_bytes; }

  int64_t now_ns() const { return now_ns_; }

  // Runs the link model up to t_ns and fires every completion due at or
  // before t_ns, in time order; afterwards now_ns() == t_ns.
  // REQUIRES (MOE_CHECK): t_ns >= now_ns().
  void AdvanceTo(int64_t t_ns);

  // Time of the next on_done if nothing new is submitted, promoted or
  // cancelled; nullopt when nothing is pending.
  std::optional<int64_t> NextCompletionTime() const;

  // Advances until transfer `id` finishes (its on_done has run, after every
  // completion due before it); returns that time. NOT_FOUND if `id` is not
  // pending. Does not advance further than needed: completions due at the
  // same time but decided after it fire on the next call.
  absl::StatusOr<int64_t> RunUntilDone(TransferId id);

  // Advances until nothing is pending; returns the time then.
  int64_t RunUntilIdle();

  // Link time of one whole transfer of `bytes` on an idle link (latency plus
  // its chunks).
  int64_t TransferNanos(uint64_t bytes) const;

  // True while on_done has not run for `id`.
  bool IsPending(TransferId id) const;

 private:
  explicit FakeCopyEngine(const FakeCopyEngineOptions& options);

  // Time the link needs for `bytes` split into chunks starting at a chunk
  // boundary, plus latency if `first`.
  int64_t ChunksNanos(uint64_t bytes, bool first) const;
  // Starts the next chunk at now_ns_, if any work is pending.
  void MaybeStartChunk();
  // Ends the chunk on the link (now_ns_ must be its end); fires its callback.
  void FinishChunk();
  void FireCancelled();
  void MoveClock(int64_t t_ns);

  FakeCopyEngineOptions options_;
  int64_t now_ns_;
  internal::TransferScheduler scheduler_;
  // Valid while scheduler_.on_link(): when the chunk ends, and its length.
  int64_t chunk_end_ns_ = 0;
  int64_t chunk_ns_ = 0;
};

}  // namespace moe::cache

#endif  // MOECACHE_SERVICES_CACHE_FAKE_COPY_ENGINE_H_
