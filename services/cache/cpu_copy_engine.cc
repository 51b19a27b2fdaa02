#include "services/cache/cpu_copy_engine.h"

#include <algorithm>
#include <cstring>

namespace moe::cache {
MemcpyChunkMover::MemcpyChunkMover(const CpuCopyEngineOptions& options)
    : arena_(static_cast<uint8_t*>(options.arena)),
      rate_(options.link_bytes_per_sec),
      clock_(options.clock != nullptr ? options.clock : RealClock::Get()) {}

absl::StatusOr<int64_t> MemcpyChunkMover::Move(const internal::Chunk& chunk,
                                               bool after_idle) {
  // Back-to-back chunks start when the link frees up even if this thread
  // woke late, so oversleeping does not lower the emulated bandwidth; after
  // an idle spell the link starts at the current time.
  const int64_t now = clock_->NowNanos();
  const int64_t start =
      rate_ > 0 && !after_idle ? link_free_ns_ : std::max(now, link_free_ns_);
  std::memcpy(arena_ + chunk.dst_offset, chunk.src, chunk.bytes);
  if (rate_ == 0) return clock_->NowNanos() - now;
  const int64_t due = start + LinkNanos(chunk.bytes, rate_);
  clock_->SleepUntil(due);
  link_free_ns_ = due;
  return due - start;
}

// The scheduler (base) keeps a pointer to mover_, constructed right after
// it; the pointer is used only once Start runs the copy thread.
CpuCopyEngine::CpuCopyEngine(const CpuCopyEngineOptions& options)
    : ChunkScheduler({options.arena_bytes, options.chunk_bytes, &mover_},
                     CheckEngineArena(options.arena, options.arena_bytes)),
      mover_(options) {}

CpuCopyEngine::~CpuCopyEngine() { Stop(); }

}  // namespace moe::cache
