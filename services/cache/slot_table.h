// Residency bookkeeping for a fixed arena of expert slots.
//
// Each slot is in one of three states:
//
//   kEmpty --BeginLoad--> kLoading --CompleteLoad--> kReady
//     ^                      |                          |
//     '------AbortLoad-------'                          |
//     '------------------------Evict--------------------'
//   kReady (unleased) --BeginLoad--> kLoading   (replaces the old expert)
//
// and carries the ExpertKey it holds (kLoading/kReady), a lease count, and a
// generation number that is bumped whenever the slot's content changes
// (BeginLoad, AbortLoad, Evict). A lease pins a ready slot: invariant 1 of the
// design ("a leased slot is never overwritten until the lease is released") is
// enforced here — BeginLoad or Evict on a leased or loading slot is an
// internal bug and fails a MOE_CHECK.
//
// Leases are tracked per owner (a worker session id) so that all leases of a
// dead owner can be dropped at once (ReleaseAllForOwner, invariant 3).
//
// Error taxonomy: arguments that can come from outside the daemon (a slot id
// or generation sent by a worker in Lease/Release) get an absl::Status;
// violations of the state machine by the cache itself (BeginLoad, Evict,
// CompleteLoad/AbortLoad on a slot that is not loading) are MOE_CHECK
// failures, except where noted.
//
// Thread-safety: NOT internally synchronized. The owner (ExpertCache) must
// serialize all calls, e.g. by holding its own mutex around them. Const
// methods may run concurrently with each other only.
#ifndef MOECACHE_SERVICES_CACHE_SLOT_TABLE_H_
#define MOECACHE_SERVICES_CACHE_SLOT_TABLE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "services/exchange/expert_exchange.h"

namespace moe::cache {

// Keys, slot ids and leases are the exchange types (expert_exchange.h).
// For std:: containers; absl containers use AbslHashValue directly.
struct ExpertKeyHash {
  size_t operator()(const ExpertKey& k) const {
    return absl::Hash<ExpertKey>()(k);
  }
};


// Identifies a lease holder: a session (RequestOwner::session). Any value
// is valid.
using OwnerId = uint64_t;

enum class SlotState : uint8_t { kEmpty = 0, kLoading = 1, kReady = 2 };

const char* SlotStateName(SlotState state);

// A snapshot of one slot.
struct SlotInfo {
  SlotState state = SlotState::kEmpty;
  ExpertKey key;          // meaningful unless state == kEmpty
  int32_t leases = 0;     // total over all owners
  uint64_t generation = 0;
};

class SlotTable {
 public:
  // REQUIRES: num_slots >= 0. All slots start empty with generation 0.
  explicit SlotTable(int32_t num_slots);

  SlotTable(const SlotTable&) = delete;
  SlotTable& operator=(const SlotTable&) = delete;
  SlotTable(SlotTable&&) = default;
  SlotTable& operator=(SlotTable&&) = default;

  int32_t num_slots() const { return static_cast<int32_t>(slots_.size()); }

  bool IsValidSlot(SlotId slot) const {
    return slot >= 0 && slot < num_slots();
  }

  // The slot mapped to `key` (loading or ready), if any.
  std::optional<SlotId> Lookup(const ExpertKey& key) const;

  // REQUIRES: IsValidSlot(slot).
  const SlotInfo& Get(SlotId slot) const;

  // True iff the slot may be (re)loaded now: empty, or ready and unleased.
  // REQUIRES: IsValidSlot(slot).
  bool Evictable(SlotId slot) const;

  // Some empty slot (the lowest-numbered one), if any.
  std::optional<SlotId> FindEmpty() const;

  // Number of slots in `state`.
  int32_t CountInState(SlotState state) const;

  // Starts loading `key` into `slot`: unmaps the slot's old key (if ready),
  // maps `key` to it, sets state kLoading, bumps and returns the generation.
  // REQUIRES (MOE_CHECK): IsValidSlot(slot); Evictable(slot) — never on a
  // leased or loading slot (invariant 1); `key` not mapped to any slot.
  uint64_t BeginLoad(SlotId slot, const ExpertKey& key);

  // The copy for the load that BeginLoad returned `generation` for finished:
  // kLoading -> kReady, generation unchanged.
  // FAILED_PRECONDITION if the slot is not loading that generation (a stale
  // completion, e.g. after AbortLoad); INVALID_ARGUMENT for a bad slot id.
  absl::Status CompleteLoad(SlotId slot, uint64_t generation);

  // The load failed or was cancelled: kLoading -> kEmpty, key unmapped,
  // generation bumped. Same errors as CompleteLoad.
  absl::Status AbortLoad(SlotId slot, uint64_t generation);

  // Drops a ready, unleased slot's content: kReady -> kEmpty, key unmapped,
  // generation bumped. Evicting an empty slot is a no-op.
  // REQUIRES (MOE_CHECK): IsValidSlot(slot); Evictable(slot).
  void Evict(SlotId slot);

  // Pins a ready slot for `owner`; returns the slot's generation, which the
  // owner must pass back to Release.
  // INVALID_ARGUMENT for a bad slot id; FAILED_PRECONDITION if not ready.
  absl::StatusOr<uint64_t> Lease(SlotId slot, OwnerId owner);

  // Drops one lease of `owner` on `slot`.
  // INVALID_ARGUMENT for a bad slot id; FAILED_PRECONDITION if `generation`
  // is not the slot's current one (stale) or `owner` holds no lease on it
  // (underflow). On error nothing changes.
  absl::Status Release(SlotId slot, uint64_t generation, OwnerId owner);

  // Drops every lease `owner` holds; returns how many were dropped.
  int64_t ReleaseAllForOwner(OwnerId owner);

  // Leases `owner` holds on `slot` (0 for a bad slot id).
  int32_t LeasesHeldBy(OwnerId owner, SlotId slot) const;

  // Total leases held by `owner`.
  int64_t LeasesHeldBy(OwnerId owner) const;

  // Verifies internal consistency (map <-> slots, lease sums); MOE_CHECK
  // fails on any mismatch. O(slots + leases).
  void CheckInvariantsForTest() const;

 private:
  absl::Status CheckSlotArg(SlotId slot) const;
  absl::Status CheckLoading(SlotId slot, uint64_t generation) const;

  std::vector<SlotInfo> slots_;
  absl::flat_hash_map<ExpertKey, SlotId> key_to_slot_;
  // owner -> (slot -> lease count > 0).
  absl::flat_hash_map<OwnerId, absl::flat_hash_map<SlotId, int32_t>> owners_;
};

}  // namespace moe::cache

#endif  // MOECACHE_SERVICES_CACHE_SLOT_TABLE_H_
