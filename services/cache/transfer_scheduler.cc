#include "services/cache/transfer_scheduler.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace moe::cache::internal {

TransferScheduler::TransferScheduler(uint64_t chunk_bytes)
    : chunk_bytes_(chunk_bytes) {
  MOE_CHECK(chunk_bytes > 0) << "chunk_bytes must be > 0";
}

TransferId TransferScheduler::Add(const TransferRequest& request,
                                  TransferDoneFn on_done) {
  MOE_CHECK(request.bytes > 0) << "empty transfer";
  const TransferId id = next_id_++;
  Transfer& t = transfers_[id];
  t.request = request;
  t.on_done = std::move(on_done);
  (request.priority == TransferPriority::kDemand ? demand_q_ : prefetch_q_)
      .push_back(id);
  ++stats_.transfers_submitted;
  return id;
}

void TransferScheduler::Erase(std::deque<TransferId>& q, TransferId id) {
  auto it = std::find(q.begin(), q.end(), id);
  if (it != q.end()) q.erase(it);
}

absl::Status TransferScheduler::Promote(TransferId id) {
  auto it = transfers_.find(id);
  if (it == transfers_.end()) {
    return absl::NotFoundError(absl::StrCat("transfer ", id, " not pending"));
  }
  Transfer& t = it->second;
  if (t.cancel_requested) {
    return absl::FailedPreconditionError(
        absl::StrCat("transfer ", id, " is being cancelled"));
  }
  if (t.request.priority == TransferPriority::kDemand) return absl::OkStatus();
  t.request.priority = TransferPriority::kDemand;
  ++stats_.promotions;
  if (id != active_) {
    Erase(prefetch_q_, id);
    demand_q_.push_back(id);
  }
  return absl::OkStatus();
}

absl::Status TransferScheduler::Cancel(TransferId id) {
  auto it = transfers_.find(id);
  if (it == transfers_.end()) {
    return absl::NotFoundError(absl::StrCat("transfer ", id, " not pending"));
  }
  Transfer& t = it->second;
  if (t.cancel_requested) return absl::OkStatus();
  if (on_link_.has_value() && on_link_->id == id) {
    t.cancel_requested = true;  // reported by FinishChunk
    return absl::OkStatus();
  }
  if (id == active_) {
    active_ = kNoTransfer;
  } else {
    Erase(t.request.priority == TransferPriority::kDemand ? demand_q_
                                                          : prefetch_q_,
          id);
  }
  cancelled_.push_back(Finished{
      id, absl::CancelledError(absl::StrCat("transfer ", id, " cancelled")),
      std::move(t.on_done)});
  ++stats_.transfers_cancelled;
  transfers_.erase(it);
  return absl::OkStatus();
}

void TransferScheduler::CancelAll() {
  std::vector<TransferId> ids;
  if (active_ != kNoTransfer) ids.push_back(active_);
  ids.insert(ids.end(), demand_q_.begin(), demand_q_.end());
  ids.insert(ids.end(), prefetch_q_.begin(), prefetch_q_.end());
  for (TransferId id : ids) {
    absl::Status s = Cancel(id);
    MOE_CHECK(s.ok()) << s;
  }
}

bool TransferScheduler::IsCancelReported(TransferId id) const {
  for (const Finished& f : cancelled_) {
    if (f.id == id) return true;
  }
  return false;
}

std::optional<TransferInfo> TransferScheduler::Query(TransferId id) const {
  auto it = transfers_.find(id);
  if (it == transfers_.end()) return std::nullopt;
  const Transfer& t = it->second;
  TransferInfo info;
  info.priority = t.request.priority;
  info.bytes = t.request.bytes;
  info.bytes_done = t.done;
  info.on_link = on_link_.has_value() && on_link_->id == id;
  info.cancel_requested = t.cancel_requested;
  return info;
}

std::optional<Chunk> TransferScheduler::StartChunk() {
  MOE_CHECK(!on_link_.has_value()) << "StartChunk with a chunk on the link";
  TransferId pick = kNoTransfer;
  if (active_ != kNoTransfer) {
    const Transfer& a = transfers_.at(active_);
    if (a.request.priority == TransferPriority::kPrefetch &&
        !demand_q_.empty()) {
      prefetch_q_.push_front(active_);
      ++stats_.preemptions;
      pick = demand_q_.front();
      demand_q_.pop_front();
    } else {
      pick = active_;
    }
  } else if (!demand_q_.empty()) {
    pick = demand_q_.front();
    demand_q_.pop_front();
  } else if (!prefetch_q_.empty()) {
    pick = prefetch_q_.front();
    prefetch_q_.pop_front();
  } else {
    return std::nullopt;
  }
  active_ = pick;
  Transfer& t = transfers_.at(pick);
  Chunk c;
  c.id = pick;
  c.offset = t.done;
  c.bytes = std::min(chunk_bytes_, t.request.bytes - t.done);
  c.src = t.request.src == nullptr
              ? nullptr
              : static_cast<const uint8_t*>(t.request.src) + c.offset;
  c.dst_offset = t.request.dst_offset + c.offset;
  c.first = !t.started;
  c.priority = t.request.priority;
  t.started = true;
  on_link_ = c;
  return c;
}

std::optional<Finished> TransferScheduler::FinishChunk() {
  MOE_CHECK(on_link_.has_value()) << "FinishChunk with no chunk on the link";
  const Chunk c = *on_link_;
  on_link_.reset();
  auto it = transfers_.find(c.id);
  MOE_CHECK(it != transfers_.end()) << "chunk of unknown transfer " << c.id;
  Transfer& t = it->second;
  t.done += c.bytes;
  stats_.bytes_moved += c.bytes;
  (c.priority == TransferPriority::kDemand ? stats_.demand_bytes
                                           : stats_.prefetch_bytes) += c.bytes;
  std::optional<Finished> finished;
  if (t.done == t.request.bytes) {
    finished = Finished{c.id, absl::OkStatus(), std::move(t.on_done)};
    ++stats_.transfers_completed;
  } else if (t.cancel_requested) {
    finished = Finished{
        c.id,
        absl::CancelledError(absl::StrCat("transfer ", c.id, " cancelled")),
        std::move(t.on_done)};
    ++stats_.transfers_cancelled;
  } else {
    return std::nullopt;
  }
  transfers_.erase(it);
  active_ = kNoTransfer;
  return finished;
}

std::vector<Finished> TransferScheduler::TakeCancelled() {
  std::vector<Finished> out;
  out.swap(cancelled_);
  return out;
}

std::optional<Outlook> TransferScheduler::NextToFinish() const {
  if (on_link_.has_value() && transfers_.at(on_link_->id).cancel_requested) {
    Outlook o;
    o.id = on_link_->id;
    o.cancelled_at_chunk_end = true;
    return o;
  }
  TransferId next = kNoTransfer;
  if (active_ != kNoTransfer && transfers_.at(active_).request.priority ==
                                    TransferPriority::kDemand) {
    next = active_;
  } else if (!demand_q_.empty()) {
    next = demand_q_.front();
  } else if (active_ != kNoTransfer) {
    next = active_;
  } else if (!prefetch_q_.empty()) {
    next = prefetch_q_.front();
  } else {
    return std::nullopt;
  }
  const Transfer& t = transfers_.at(next);
  Outlook o;
  o.id = next;
  o.remaining_bytes = t.request.bytes - t.done;
  if (on_link_.has_value() && on_link_->id == next) {
    o.remaining_bytes -= on_link_->bytes;
  }
  o.needs_first_chunk = !t.started;
  return o;
}

}  // namespace moe::cache::internal
