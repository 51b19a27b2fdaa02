// CopyEngine: moves one expert's contiguous host block into a slot of the
// arena over one (real or modelled) link, in chunks, with two priorities.
//
// Scheduling contract, shared by every implementation:
//  - The link moves one chunk (at most chunk_bytes()) at a time; a transfer of
//    B bytes is ceil(B / chunk_bytes) chunks at offsets 0, c, 2c, ...
//  - kDemand transfers run in submission (FIFO) order, before any prefetch.
//    A demand transfer is never preempted.
//  - kPrefetch transfers run in FIFO order when no demand is waiting. A demand
//    arriving while a prefetch is in flight preempts it at its next chunk
//    boundary; the preempted prefetch goes to the front of the prefetch queue
//    and later resumes where it stopped (no bytes are copied twice).
//  - Promote(id) turns a queued or in-flight prefetch into a demand transfer:
//    in flight, it simply continues (and can no longer be preempted); queued
//    or preempted, it joins the tail of the demand queue.
//  - Cancel(id) drops a queued transfer at once; a transfer whose chunk is on
//    the link stops at that chunk's end. Either way its destination holds a
//    partial copy, and on_done reports CANCELLED. (If the chunk on the link
//    was the transfer's last, the copy is complete and on_done reports OK.)
//  - on_done(id, status) is called exactly once for every transfer Submit
//    accepted: OK once all bytes are in place, CANCELLED after Cancel (or
//    engine shutdown), or another error (e.g. INTERNAL for a failed CUDA
//    copy) when the link failed to move a chunk; the destination then holds
//    a partial copy, and the error may repeat for any later transfer
//    (ExpertCache retries a bounded number of times). It is NEVER called
//    from inside Submit, Promote or Cancel, and never with an engine lock
//    held, so a callback may call back into the engine and a caller may
//    hold its own lock around Submit/Promote/Cancel. Which thread runs it is
//    up to the implementation (see FakeCopyEngine, CpuCopyEngine).
//
// Thread-safety: implementation-defined (FakeCopyEngine: single-threaded;
// CpuCopyEngine: all methods thread-safe).
#ifndef MOECACHE_SERVICES_CACHE_COPY_ENGINE_H_
#define MOECACHE_SERVICES_CACHE_COPY_ENGINE_H_

#include <cstdint>
#include <functional>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace moe::cache {

enum class TransferPriority : uint8_t { kDemand = 0, kPrefetch = 1 };

// Ids start at 1 and are never reused by one engine; 0 is never a valid id.
using TransferId = uint64_t;
inline constexpr TransferId kNoTransfer = 0;

using TransferDoneFn = std::function<void(TransferId, absl::Status)>;

struct TransferRequest {
  // Host block to copy; must stay valid and unchanged until on_done runs.
  // Engines that only model time (FakeCopyEngine) ignore it (may be null).
  const void* src = nullptr;
  // Byte offset of the destination inside the engine's arena.
  uint64_t dst_offset = 0;
  // REQUIRES: bytes > 0 (else Submit returns INVALID_ARGUMENT).
  uint64_t bytes = 0;
  TransferPriority priority = TransferPriority::kDemand;
};

// Progress of a transfer that has not finished yet.
struct TransferInfo {
  TransferPriority priority = TransferPriority::kDemand;
  uint64_t bytes = 0;
  uint64_t bytes_done = 0;      // chunks fully copied so far
  bool on_link = false;         // a chunk of it is being copied right now
  bool cancel_requested = false;
};

struct CopyStats {
  uint64_t bytes_moved = 0;  // every finished chunk, cancelled transfers too
  uint64_t demand_bytes = 0;    // ... of chunks copied at demand priority
  uint64_t prefetch_bytes = 0;  // ... of chunks copied at prefetch priority
  uint64_t transfers_submitted = 0;
  uint64_t transfers_completed = 0;  // on_done(OK)
  uint64_t transfers_cancelled = 0;  // on_done(CANCELLED)
  uint64_t preemptions = 0;  // times an in-flight prefetch yielded to demand
  uint64_t promotions = 0;   // successful Promote calls that changed priority
  int64_t busy_ns = 0;       // link time spent on chunks (incl. latency)
};

// Time the link needs for `bytes` at `bytes_per_sec`, rounded up to whole
// nanoseconds: ceil(bytes * 1e9 / bytes_per_sec), computed exactly (128-bit).
// Engines apply it per chunk. REQUIRES: bytes_per_sec > 0.
int64_t LinkNanos(uint64_t bytes, uint64_t bytes_per_sec);

class CopyEngine {
 public:
  virtual ~CopyEngine() = default;

  // Queues a transfer. INVALID_ARGUMENT for bytes == 0 or a destination
  // outside the arena (engines that know one); FAILED_PRECONDITION if the
  // engine is stopped.
  virtual absl::StatusOr<TransferId> Submit(const TransferRequest& request,
                                            TransferDoneFn on_done) = 0;

  // Raises a pending transfer to kDemand (no-op if it already is).
  // NOT_FOUND if `id` is unknown or already finished; FAILED_PRECONDITION if
  // it is being cancelled.
  virtual absl::Status Promote(TransferId id) = 0;

  // Cancels a pending transfer (see the contract above). NOT_FOUND if `id` is
  // unknown or already finished; OK if already being cancelled.
  virtual absl::Status Cancel(TransferId id) = 0;

  // Progress of a pending transfer; nullopt once on_done has been scheduled.
  virtual std::optional<TransferInfo> Query(TransferId id) const = 0;

  virtual CopyStats GetStats() const = 0;

  virtual uint64_t chunk_bytes() const = 0;
};

}  // namespace moe::cache

#endif  // MOECACHE_SERVICES_CACHE_COPY_ENGINE_H_
