// ResidencyBoard: one model's ready slots, published to every attached
// worker's residency view (services/channel/residency_view.h), so that a
// worker serves an acquire whose experts are all resident itself, pinning
// their slots through shared memory, without a round trip to the daemon.
// It is the cache's ResidencyListener: the cache publishes each slot whose
// copy completed and asks before a ready slot changes; a slot some worker
// has pinned stays (the cache takes another victim).
//
// Lifecycle: one per CachedModel, set as its cache's listener before any
// worker attaches; AddView when a session's channel is made, RemoveView
// before it is unmapped (the worker's pins go with it, as its leases do).
//
// Thread-safety: thread-safe (one mutex). The cache calls in with its own
// mutex held; the board never calls the cache (lock order: cache, board).
#ifndef MOECACHE_SERVICES_MOE_CACHED_RESIDENCY_BOARD_H_
#define MOECACHE_SERVICES_MOE_CACHED_RESIDENCY_BOARD_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "services/cache/residency_listener.h"
#include "services/channel/residency_view.h"

namespace moe::cached {

class ResidencyBoard : public cache::ResidencyListener {
 public:
  ResidencyBoard(int num_layers, int num_experts, int num_slots);

  channel::ResidencyShape shape() const { return shape_; }

  // Initialises the view in `region` (a channel region of
  // channel::ChannelRegionBytes(shape()) bytes) with every slot published
  // now, and keeps it current until RemoveView(id).
  void AddView(uint64_t id, void* region);
  void RemoveView(uint64_t id);

  void Publish(SlotId slot, const ExpertKey& key) override;
  bool Pinned(SlotId slot) const override;
  bool TryRetract(SlotId slot) override;

 private:
  uint32_t KeyIndex(const ExpertKey& key) const;

  const channel::ResidencyShape shape_;
  mutable absl::Mutex mu_;
  std::vector<uint32_t> held_ ABSL_GUARDED_BY(mu_);  // per slot: key index + 1, 0: none
  std::vector<std::pair<uint64_t, channel::ResidencyView>> views_ ABSL_GUARDED_BY(mu_);
};

}  // namespace moe::cached

#endif  // MOECACHE_SERVICES_MOE_CACHED_RESIDENCY_BOARD_H_
