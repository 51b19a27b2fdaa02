#include "services/cache/fake_copy_engine.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace moe::cache {

absl::StatusOr<std::unique_ptr<FakeCopyEngine>> FakeCopyEngine::Create(
    const FakeCopyEngineOptions& options) {
  if (options.bandwidth_bytes_per_sec == 0) {
    return absl::InvalidArgumentError("fake link bandwidth must be > 0");
  }
  if (options.chunk_bytes == 0) {
    return absl::InvalidArgumentError("chunk_bytes must be > 0");
  }
  if (options.latency_ns < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("latency_ns must be >= 0, got ", options.latency_ns));
  }
  return std::unique_ptr<FakeCopyEngine>(new FakeCopyEngine(options));
}

FakeCopyEngine::FakeCopyEngine(const FakeCopyEngineOptions& options)
    : options_(options),
      now_ns_(options.start_ns),
      scheduler_(options.chunk_bytes) {
  if (options_.clock != nullptr) options_.clock->AdvanceTo(now_ns_);
}

absl::StatusOr<TransferId> FakeCopyEngine::Submit(
    const TransferRequest& request, TransferDoneFn on_done) {
  if (request.bytes == 0) {
    return absl::InvalidArgumentError("transfer of 0 bytes");
  }
  return scheduler_.Add(request, std::move(on_done));
}

absl::Status FakeCopyEngine::Promote(TransferId id) {
  return scheduler_.Promote(id);
}

absl::Status FakeCopyEngine::Cancel(TransferId id) {
  return scheduler_.Cancel(id);
}

std::optional<TransferInfo> FakeCopyEngine::Query(TransferId id) const {
  return scheduler_.Query(id);
}

CopyStats FakeCopyEngine::GetStats() const { return scheduler_.stats(); }

bool FakeCopyEngine::IsPending(TransferId id) const {
  return scheduler_.IsPending(id) || scheduler_.IsCancelReported(id);
}

int64_t FakeCopyEngine::ChunksNanos(uint64_t bytes, bool first) const {
  if (bytes == 0) return 0;
  const uint64_t cb = options_.chunk_bytes;
  const uint64_t full = bytes / cb;
  const uint64_t rest = bytes % cb;
  int64_t ns = static_cast<int64_t>(full) *
               LinkNanos(cb, options_.bandwidth_bytes_per_sec);
  if (rest > 0) ns += LinkNanos(rest, options_.bandwidth_bytes_per_sec);
  if (first) ns += options_.latency_ns;
  return ns;
}

int64_t FakeCopyEngine::TransferNanos(uint64_t bytes) const {
  return ChunksNanos(bytes, /*first=*/true);
}

void FakeCopyEngine::MoveClock(int64_t t_ns) {
  MOE_CHECK(t_ns >= now_ns_) << "time going backwards: " << t_ns << " < "
                             << now_ns_;
  now_ns_ = t_ns;
  if (options_.clock != nullptr) options_.clock->AdvanceTo(t_ns);
}

void FakeCopyEngine::MaybeStartChunk() {
  std::optional<internal::Chunk> c = scheduler_.StartChunk();
  if (!c.has_value()) return;
  chunk_ns_ = (c->first ? options_.latency_ns : 0) +
              LinkNanos(c->bytes, options_.bandwidth_bytes_per_sec);
  chunk_end_ns_ = now_ns_ + chunk_ns_;
}

void FakeCopyEngine::FinishChunk() {
  scheduler_.stats().busy_ns += chunk_ns_;
  std::optional<internal::Finished> f = scheduler_.FinishChunk();
  if (f.has_value() && f->on_done) f->on_done(f->id, f->status);
}

void FakeCopyEngine::FireCancelled() {
  while (scheduler_.has_cancelled()) {
    for (internal::Finished& f : scheduler_.TakeCancelled()) {
      if (f.on_done) f.on_done(f.id, f.status);
    }
  }
}

void FakeCopyEngine::AdvanceTo(int64_t t_ns) {
  MOE_CHECK(t_ns >= now_ns_) << "AdvanceTo(" << t_ns << ") before now "
                             << now_ns_;
  while (true) {
    FireCancelled();
    if (!scheduler_.on_link().has_value()) {
      // Decide the next chunk only once time moves past now, so that work
      // submitted at now competes for it.
      if (t_ns == now_ns_) break;
      MaybeStartChunk();
      if (!scheduler_.on_link().has_value()) break;
    }
    if (chunk_end_ns_ > t_ns) break;
    MoveClock(chunk_end_ns_);
    FinishChunk();
  }
  MoveClock(t_ns);
}

std::optional<int64_t> FakeCopyEngine::NextCompletionTime() const {
  if (scheduler_.has_cancelled()) return now_ns_;
  std::optional<internal::Outlook> o = scheduler_.NextToFinish();
  if (!o.has_value()) return std::nullopt;
  if (o->cancelled_at_chunk_end) return chunk_end_ns_;
  const int64_t base =
      scheduler_.on_link().has_value() ? chunk_end_ns_ : now_ns_;
  return base + ChunksNanos(o->remaining_bytes, o->needs_first_chunk);
}

absl::StatusOr<int64_t> FakeCopyEngine::RunUntilDone(TransferId id) {
  if (!IsPending(id)) {
    return absl::NotFoundError(absl::StrCat("transfer ", id, " not pending"));
  }
  while (IsPending(id)) {
    if (scheduler_.has_cancelled()) {
      FireCancelled();
      continue;
    }
    if (!scheduler_.on_link().has_value()) MaybeStartChunk();
    MOE_CHECK(scheduler_.on_link().has_value())
        << "transfer " << id << " pending but nothing to run";
    MoveClock(chunk_end_ns_);
    FinishChunk();
  }
  return now_ns_;
}

int64_t FakeCopyEngine::RunUntilIdle() {
  while (true) {
    FireCancelled();
    if (scheduler_.idle()) break;
    if (!scheduler_.on_link().has_value()) MaybeStartChunk();
    MOE_CHECK(scheduler_.on_link().has_value()) << "pending but idle link";
    MoveClock(chunk_end_ns_);
    FinishChunk();
  }
  return now_ns_;
}

}  // namespace moe::cache
