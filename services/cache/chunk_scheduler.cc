#include "services/cache/chunk_scheduler.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/threads.h"

namespace moe::cache {
namespace {

absl::Status ValidateOptions(const ChunkSchedulerOptions& o,
                             absl::Status engine_status) {
  if (!engine_status.ok()) return engine_status;
  if (o.chunk_bytes == 0) {
    return absl::InvalidArgumentError("chunk_bytes must be > 0");
  }
  if (o.mover == nullptr) {
    return absl::InvalidArgumentError("copy engine without a chunk mover");
  }
  return absl::OkStatus();
}

// Turns the outcome of a chunk the mover failed to move into that failure:
// the chunk's bytes did not arrive, and the transfer ends with `error`.
void FailFinished(const internal::Chunk& chunk, absl::Status error,
                  internal::Finished& done, CopyStats& stats) {
  stats.bytes_moved -= chunk.bytes;
  (chunk.priority == TransferPriority::kDemand ? stats.demand_bytes
                                               : stats.prefetch_bytes) -=
      chunk.bytes;
  if (done.status.ok()) {  // it was the last chunk: not completed after all
    --stats.transfers_completed;
    ++stats.transfers_cancelled;
  }
  done.status = std::move(error);
}

}  // namespace

absl::Status CheckEngineArena(const void* arena, uint64_t arena_bytes) {
  if (arena == nullptr && arena_bytes > 0) {
    return absl::InvalidArgumentError("null arena with arena_bytes > 0");
  }
  return absl::OkStatus();
}

ChunkScheduler::ChunkScheduler(const ChunkSchedulerOptions& options,
                               absl::Status options_status)
    : options_(options),
      options_status_(ValidateOptions(options, std::move(options_status))),
      scheduler_(std::max<uint64_t>(options.chunk_bytes, 1)) {}

ChunkScheduler::~ChunkScheduler() { Stop(); }

absl::Status ChunkScheduler::Start() {
  if (!options_status_.ok()) return options_status_;
  std::lock_guard<std::mutex> join_lock(join_mu_);
  std::lock_guard<std::mutex> lock(mu_);
  if (started_ || stopping_) {
    return absl::FailedPreconditionError(
        started_ ? "copy engine already started" : "copy engine stopped");
  }
  started_ = true;
  thread_ = std::thread([this] { Run(); });
  copy_thread_id_ = thread_.get_id();
  return absl::OkStatus();
}

void ChunkScheduler::Stop() {
  std::vector<internal::Finished> orphans;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_) {  // else already stopping: just join below
      stopping_ = true;
      scheduler_.CancelAll();
      if (!started_) orphans = scheduler_.TakeCancelled();
    }
  }
  work_cv_.notify_all();
  // Never started: no copy thread to deliver the cancellations.
  for (internal::Finished& f : orphans) {
    if (f.on_done) f.on_done(f.id, f.status);
  }
  // Called on the copy thread (from a callback or observer): the thread
  // exits once it has reported everything; a later Stop or the destructor
  // joins it.
  if (std::this_thread::get_id() == copy_thread_id_.load()) return;
  std::lock_guard<std::mutex> join_lock(join_mu_);
  if (thread_.joinable()) thread_.join();
}

absl::StatusOr<TransferId> ChunkScheduler::Submit(
    const TransferRequest& request, TransferDoneFn on_done) {
  if (!options_status_.ok()) return options_status_;
  if (request.bytes == 0) {
    return absl::InvalidArgumentError("transfer of 0 bytes");
  }
  if (request.src == nullptr) {
    return absl::InvalidArgumentError("transfer from a null source");
  }
  if (request.dst_offset > options_.arena_bytes ||
      request.bytes > options_.arena_bytes - request.dst_offset) {
    return absl::InvalidArgumentError(absl::StrCat(
        "destination [", request.dst_offset, ", +", request.bytes,
        ") outside the arena of ", options_.arena_bytes, " bytes"));
  }
  TransferId id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      return absl::FailedPreconditionError("copy engine stopped");
    }
    id = scheduler_.Add(request, std::move(on_done));
  }
  work_cv_.notify_one();
  return id;
}

absl::Status ChunkScheduler::Promote(TransferId id) {
  std::lock_guard<std::mutex> lock(mu_);
  return scheduler_.Promote(id);
}

absl::Status ChunkScheduler::Cancel(TransferId id) {
  absl::Status s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    s = scheduler_.Cancel(id);
  }
  work_cv_.notify_one();  // the copy thread reports the cancellation
  return s;
}

std::optional<TransferInfo> ChunkScheduler::Query(TransferId id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return scheduler_.Query(id);
}

CopyStats ChunkScheduler::GetStats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return scheduler_.stats();
}

void ChunkScheduler::SetChunkObserverForTest(ChunkObserverFn observer) {
  std::lock_guard<std::mutex> lock(mu_);
  MOE_CHECK(!started_) << "SetChunkObserverForTest after Start";
  observer_ = std::move(observer);
}

void ChunkScheduler::Deliver(std::unique_lock<std::mutex>& lock,
                             std::vector<internal::Finished> finished) {
  lock.unlock();
  for (internal::Finished& f : finished) {
    if (f.on_done) f.on_done(f.id, f.status);
  }
  lock.lock();
}

void ChunkScheduler::Run() {
  NameThisThread("moe-copies");
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    if (!HasWork()) link_idle_ = true;
    work_cv_.wait(lock, [this] { return HasWork(); });
    if (scheduler_.has_cancelled()) {
      Deliver(lock, scheduler_.TakeCancelled());
      continue;
    }
    if (scheduler_.idle()) {
      if (stopping_) break;
      continue;
    }
    std::optional<internal::Chunk> chunk = scheduler_.StartChunk();
    MOE_CHECK(chunk.has_value()) << "pending transfers but no chunk";
    const bool after_idle = link_idle_;
    link_idle_ = false;
    lock.unlock();
    absl::StatusOr<int64_t> moved = options_.mover->Move(*chunk, after_idle);
    if (observer_) observer_(*chunk);
    lock.lock();
    if (!moved.ok()) {
      // Ends the transfer at this chunk (OK if already being cancelled).
      absl::Status s = scheduler_.Cancel(chunk->id);
      MOE_CHECK(s.ok()) << s;
    } else {
      scheduler_.stats().busy_ns += *moved;
    }
    std::optional<internal::Finished> done = scheduler_.FinishChunk();
    if (!moved.ok()) {
      MOE_CHECK(done.has_value()) << "failed chunk did not end its transfer";
      MOE_LOG(ERROR) << "copy engine: transfer " << chunk->id
                     << " failed: " << moved.status();
      FailFinished(*chunk, moved.status(), *done, scheduler_.stats());
    }
    // Decided here, not after the callbacks: work submitted once this
    // transfer is reported done arrives on an idle link.
    if (scheduler_.idle()) link_idle_ = true;
    if (done.has_value()) {
      std::vector<internal::Finished> one;
      one.push_back(std::move(*done));
      Deliver(lock, std::move(one));
    }
  }
}

}  // namespace moe::cache
