#include "services/cache/cpu_copy_engine.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace moe::cache {
namespace {

absl::Status ValidateOptions(const CpuCopyEngineOptions& o) {
  if (o.chunk_bytes == 0) {
    return absl::InvalidArgumentError("chunk_bytes must be > 0");
  }
  if (o.arena == nullptr && o.arena_bytes > 0) {
    return absl::InvalidArgumentError("null arena with arena_bytes > 0");
  }
  return absl::OkStatus();
}

}  // namespace

CpuCopyEngine::CpuCopyEngine(const CpuCopyEngineOptions& options)
    : options_(options),
      clock_(options.clock != nullptr ? options.clock : RealClock::Get()),
      options_status_(ValidateOptions(options)),
      scheduler_(std::max<uint64_t>(options.chunk_bytes, 1)) {}

CpuCopyEngine::~CpuCopyEngine() { Stop(); }

absl::Status CpuCopyEngine::Start() {
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

void CpuCopyEngine::Stop() {
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

absl::StatusOr<TransferId> CpuCopyEngine::Submit(const TransferRequest& request,
                                                 TransferDoneFn on_done) {
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

absl::Status CpuCopyEngine::Promote(TransferId id) {
  std::lock_guard<std::mutex> lock(mu_);
  return scheduler_.Promote(id);
}

absl::Status CpuCopyEngine::Cancel(TransferId id) {
  absl::Status s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    s = scheduler_.Cancel(id);
  }
  work_cv_.notify_one();  // the copy thread reports the cancellation
  return s;
}

std::optional<TransferInfo> CpuCopyEngine::Query(TransferId id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return scheduler_.Query(id);
}

CopyStats CpuCopyEngine::GetStats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return scheduler_.stats();
}

void CpuCopyEngine::SetChunkObserverForTest(ChunkObserverFn observer) {
  std::lock_guard<std::mutex> lock(mu_);
  MOE_CHECK(!started_) << "SetChunkObserverForTest after Start";
  observer_ = std::move(observer);
}

void CpuCopyEngine::Deliver(std::unique_lock<std::mutex>& lock,
                            std::vector<internal::Finished> finished) {
  lock.unlock();
  for (internal::Finished& f : finished) {
    if (f.on_done) f.on_done(f.id, f.status);
  }
  lock.lock();
}

int64_t CpuCopyEngine::CopyChunk(const internal::Chunk& chunk) {
  const uint64_t rate = options_.link_bytes_per_sec;
  // Back-to-back chunks start when the link frees up even if this thread
  // woke late, so oversleeping does not lower the emulated bandwidth; after
  // an idle spell the link starts at the current time.
  const int64_t now = clock_->NowNanos();
  const int64_t start =
      rate > 0 && !link_idle_ ? link_free_ns_ : std::max(now, link_free_ns_);
  link_idle_ = false;
  std::memcpy(static_cast<uint8_t*>(options_.arena) + chunk.dst_offset,
              chunk.src, chunk.bytes);
  if (rate == 0) return clock_->NowNanos() - now;
  const int64_t due = start + LinkNanos(chunk.bytes, rate);
  clock_->SleepUntil(due);
  link_free_ns_ = due;
  return due - start;
}

void CpuCopyEngine::Run() {
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
    lock.unlock();
    const int64_t ns = CopyChunk(*chunk);
    if (observer_) observer_(*chunk);
    lock.lock();
    scheduler_.stats().busy_ns += ns;
    std::optional<internal::Finished> done = scheduler_.FinishChunk();
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
