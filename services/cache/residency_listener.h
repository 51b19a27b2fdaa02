// What the cache tells whoever lets workers read ready slots without an
// acquire: moe-cached's hit path through shared memory
// (services/moe_cached/residency_board.h). The cache publishes each slot
// whose copy completed, and takes a ready slot back before its content
// changes (an eviction, or a load over it); a worker that pinned the slot
// meanwhile keeps it, and the cache chooses another victim. Design
// invariant 1 then holds for these pins as for leases: a slot a worker
// reads is never overwritten.
//
// The cache calls these with its own mutex held, in the order the slots
// change; an implementation must not call back into the cache.
#ifndef MOECACHE_SERVICES_CACHE_RESIDENCY_LISTENER_H_
#define MOECACHE_SERVICES_CACHE_RESIDENCY_LISTENER_H_

#include "services/exchange/expert_exchange.h"

namespace moe::cache {

class ResidencyListener {
 public:
  virtual ~ResidencyListener() = default;
  // `slot` holds `key`, ready: workers may pin it from now on.
  virtual void Publish(SlotId slot, const ExpertKey& key) = 0;
  // Whether a worker holds `slot` now: a hint for the choice of victims
  // (it may change at once; TryRetract decides).
  virtual bool Pinned(SlotId slot) const = 0;
  // Takes a published `slot` back: true when no worker holds it (none can
  // pin it any more), false when one does (it stays published and must not
  // change).
  virtual bool TryRetract(SlotId slot) = 0;
};

}  // namespace moe::cache

#endif  // MOECACHE_SERVICES_CACHE_RESIDENCY_LISTENER_H_
