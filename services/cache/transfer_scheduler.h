// Internal to the copy engines: the queueing and preemption rules of the
// CopyEngine contract (copy_engine.h), with no notion of time or threads, so
// that FakeCopyEngine and CpuCopyEngine make exactly the same decisions.
//
// Use: StartChunk() picks the next chunk and puts it "on the link";
// FinishChunk() accounts for it and returns the transfer if it ended.
// Transfers cancelled while not on the link are collected for TakeCancelled().
//
// Thread-safety: none; the engine serializes all calls.
#ifndef MOECACHE_SERVICES_CACHE_TRANSFER_SCHEDULER_H_
#define MOECACHE_SERVICES_CACHE_TRANSFER_SCHEDULER_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "services/cache/copy_engine.h"

namespace moe::cache::internal {

struct Chunk {
  TransferId id = kNoTransfer;
  const void* src = nullptr;  // request.src + offset (null if src is null)
  uint64_t dst_offset = 0;    // request.dst_offset + offset
  uint64_t offset = 0;        // within the transfer
  uint64_t bytes = 0;
  bool first = false;         // the transfer's first chunk
  TransferPriority priority = TransferPriority::kDemand;
};

struct Finished {
  TransferId id = kNoTransfer;
  absl::Status status;
  TransferDoneFn on_done;
};

// What finishes next if nothing new arrives.
struct Outlook {
  TransferId id = kNoTransfer;
  // The chunk on the link belongs to `id`, which is being cancelled: it
  // finishes when that chunk ends.
  bool cancelled_at_chunk_end = false;
  // Bytes `id` still needs after the chunk on the link (if that chunk is
  // its own) or in total; they start at a chunk boundary.
  uint64_t remaining_bytes = 0;
  bool needs_first_chunk = false;  // `id` has not started yet
};

class TransferScheduler {
 public:
  // REQUIRES: chunk_bytes > 0.
  explicit TransferScheduler(uint64_t chunk_bytes);

  uint64_t chunk_bytes() const { return chunk_bytes_; }

  // REQUIRES: request.bytes > 0 (checked by the engine).
  TransferId Add(const TransferRequest& request, TransferDoneFn on_done);
  absl::Status Promote(TransferId id);
  absl::Status Cancel(TransferId id);
  // Cancels everything pending (engine shutdown).
  void CancelAll();

  std::optional<TransferInfo> Query(TransferId id) const;

  // Picks the next chunk by the contract's rules and puts it on the link;
  // nullopt if nothing is queued. REQUIRES: no chunk on the link.
  std::optional<Chunk> StartChunk();
  const std::optional<Chunk>& on_link() const { return on_link_; }
  // Accounts for the chunk on the link; returns its transfer if that
  // finished (OK) or was cancelled. REQUIRES: a chunk on the link.
  std::optional<Finished> FinishChunk();

  // Transfers cancelled while off the link, in cancel order (drained).
  std::vector<Finished> TakeCancelled();
  bool has_cancelled() const { return !cancelled_.empty(); }
  // `id` was cancelled off the link and is waiting in TakeCancelled().
  bool IsCancelReported(TransferId id) const;

  std::optional<Outlook> NextToFinish() const;

  // No transfer pending and no cancellation left to report.
  bool idle() const { return transfers_.empty() && cancelled_.empty(); }
  bool IsPending(TransferId id) const { return transfers_.contains(id); }

  CopyStats& stats() { return stats_; }
  const CopyStats& stats() const { return stats_; }

 private:
  struct Transfer {
    TransferRequest request;
    TransferDoneFn on_done;
    uint64_t done = 0;
    bool started = false;
    bool cancel_requested = false;
  };

  static void Erase(std::deque<TransferId>& q, TransferId id);

  uint64_t chunk_bytes_;
  TransferId next_id_ = 1;
  absl::flat_hash_map<TransferId, Transfer> transfers_;
  std::deque<TransferId> demand_q_;
  std::deque<TransferId> prefetch_q_;
  // The transfer whose chunk ran last and is not finished (in flight), if
  // any; it is in neither queue.
  TransferId active_ = kNoTransfer;
  std::optional<Chunk> on_link_;
  std::vector<Finished> cancelled_;
  CopyStats stats_;
};

}  // namespace moe::cache::internal

#endif  // MOECACHE_SERVICES_CACHE_TRANSFER_SCHEDULER_H_
