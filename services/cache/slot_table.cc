#include "services/cache/slot_table.h"

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace moe::cache {

const char* SlotStateName(SlotState state) {
  switch (state) {
    case SlotState::kEmpty:
      return "empty";
    case SlotState::kLoading:
      return "loading";
    case SlotState::kReady:
      return "ready";
  }
  return "unknown";
}

SlotTable::SlotTable(int32_t num_slots) {
  MOE_CHECK(num_slots >= 0) << "num_slots=" << num_slots;
  slots_.resize(num_slots);
  key_to_slot_.reserve(num_slots);
}

std::optional<SlotId> SlotTable::Lookup(const ExpertKey& key) const {
  auto it = key_to_slot_.find(key);
  if (it == key_to_slot_.end()) return std::nullopt;
  return it->second;
}

const SlotInfo& SlotTable::Get(SlotId slot) const {
  MOE_CHECK(IsValidSlot(slot)) << "slot " << slot;
  return slots_[slot];
}

bool SlotTable::Evictable(SlotId slot) const {
  const SlotInfo& info = Get(slot);
  return info.state == SlotState::kEmpty ||
         (info.state == SlotState::kReady && info.leases == 0);
}

std::optional<SlotId> SlotTable::FindEmpty() const {
  for (SlotId s = 0; s < num_slots(); ++s) {
    if (slots_[s].state == SlotState::kEmpty) return s;
  }
  return std::nullopt;
}

int32_t SlotTable::CountInState(SlotState state) const {
  int32_t n = 0;
  for (const SlotInfo& info : slots_) n += info.state == state;
  return n;
}

uint64_t SlotTable::BeginLoad(SlotId slot, const ExpertKey& key) {
  MOE_CHECK(IsValidSlot(slot)) << "BeginLoad: slot " << slot;
  SlotInfo& info = slots_[slot];
  MOE_CHECK(info.state != SlotState::kLoading)
      << "BeginLoad on loading slot " << slot << " (" << info.key.ToString()
      << ")";
  MOE_CHECK(info.leases == 0)
      << "BeginLoad on leased slot " << slot << " (" << info.key.ToString()
      << ", " << info.leases << " leases): invariant 1";
  auto existing = key_to_slot_.find(key);
  MOE_CHECK(existing == key_to_slot_.end())
      << "BeginLoad: " << key.ToString() << " already in slot "
      << (existing == key_to_slot_.end() ? -1 : existing->second);
  if (info.state == SlotState::kReady) key_to_slot_.erase(info.key);
  info.state = SlotState::kLoading;
  info.key = key;
  ++info.generation;
  key_to_slot_[key] = slot;
  return info.generation;
}

absl::Status SlotTable::CheckSlotArg(SlotId slot) const {
  if (!IsValidSlot(slot)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "slot ", slot, " out of range [0, ", num_slots(), ")"));
  }
  return absl::OkStatus();
}

absl::Status SlotTable::CheckLoading(SlotId slot, uint64_t generation) const {
  absl::Status s = CheckSlotArg(slot);
  if (!s.ok()) return s;
  const SlotInfo& info = slots_[slot];
  if (info.state != SlotState::kLoading || info.generation != generation) {
    return absl::FailedPreconditionError(absl::StrCat(
        "slot ", slot, " is ", SlotStateName(info.state), " at generation ",
        info.generation, ", not loading generation ", generation));
  }
  return absl::OkStatus();
}

absl::Status SlotTable::CompleteLoad(SlotId slot, uint64_t generation) {
  absl::Status s = CheckLoading(slot, generation);
  if (!s.ok()) return s;
  slots_[slot].state = SlotState::kReady;
  return absl::OkStatus();
}

absl::Status SlotTable::AbortLoad(SlotId slot, uint64_t generation) {
  absl::Status s = CheckLoading(slot, generation);
  if (!s.ok()) return s;
  SlotInfo& info = slots_[slot];
  key_to_slot_.erase(info.key);
  info.state = SlotState::kEmpty;
  info.key = ExpertKey{};
  ++info.generation;
  return absl::OkStatus();
}

void SlotTable::Evict(SlotId slot) {
  MOE_CHECK(IsValidSlot(slot)) << "Evict: slot " << slot;
  SlotInfo& info = slots_[slot];
  MOE_CHECK(Evictable(slot))
      << "Evict on " << SlotStateName(info.state) << " slot " << slot
      << " with " << info.leases << " leases: invariant 1";
  if (info.state == SlotState::kEmpty) return;
  key_to_slot_.erase(info.key);
  info.state = SlotState::kEmpty;
  info.key = ExpertKey{};
  ++info.generation;
}

absl::StatusOr<uint64_t> SlotTable::Lease(SlotId slot, OwnerId owner) {
  absl::Status s = CheckSlotArg(slot);
  if (!s.ok()) return s;
  SlotInfo& info = slots_[slot];
  if (info.state != SlotState::kReady) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot lease slot ", slot, ": it is ", SlotStateName(info.state)));
  }
  ++info.leases;
  ++owners_[owner][slot];
  return info.generation;
}

absl::Status SlotTable::Release(SlotId slot, uint64_t generation,
                                OwnerId owner) {
  absl::Status s = CheckSlotArg(slot);
  if (!s.ok()) return s;
  SlotInfo& info = slots_[slot];
  if (info.generation != generation) {
    return absl::FailedPreconditionError(
        absl::StrCat("stale release of slot ", slot, ": generation ",
                     generation, ", current ", info.generation));
  }
  if (LeasesHeldBy(owner, slot) == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "lease underflow: owner ", owner, " holds no lease on slot ", slot));
  }
  MOE_CHECK(info.leases > 0) << "slot " << slot << " lease count out of sync";
  --info.leases;
  auto owner_it = owners_.find(owner);
  auto slot_it = owner_it->second.find(slot);
  if (--slot_it->second == 0) {
    owner_it->second.erase(slot_it);
    if (owner_it->second.empty()) owners_.erase(owner_it);
  }
  return absl::OkStatus();
}

int64_t SlotTable::ReleaseAllForOwner(OwnerId owner) {
  auto owner_it = owners_.find(owner);
  if (owner_it == owners_.end()) return 0;
  int64_t released = 0;
  for (const auto& [slot, count] : owner_it->second) {
    SlotInfo& info = slots_[slot];
    MOE_CHECK(info.leases >= count)
        << "slot " << slot << " lease count out of sync";
    info.leases -= count;
    released += count;
  }
  owners_.erase(owner_it);
  return released;
}

int32_t SlotTable::LeasesHeldBy(OwnerId owner, SlotId slot) const {
  auto owner_it = owners_.find(owner);
  if (owner_it == owners_.end()) return 0;
  auto slot_it = owner_it->second.find(slot);
  return slot_it == owner_it->second.end() ? 0 : slot_it->second;
}

int64_t SlotTable::LeasesHeldBy(OwnerId owner) const {
  auto owner_it = owners_.find(owner);
  if (owner_it == owners_.end()) return 0;
  int64_t n = 0;
  for (const auto& [slot, count] : owner_it->second) n += count;
  return n;
}

void SlotTable::CheckInvariantsForTest() const {
  size_t mapped = 0;
  std::vector<int32_t> lease_sums(slots_.size(), 0);
  for (const auto& [owner, slots] : owners_) {
    MOE_CHECK(!slots.empty()) << "owner " << owner << " with no leases kept";
    for (const auto& [slot, count] : slots) {
      MOE_CHECK(IsValidSlot(slot) && count > 0) << "bad owner lease entry";
      lease_sums[slot] += count;
    }
  }
  for (SlotId s = 0; s < num_slots(); ++s) {
    const SlotInfo& info = slots_[s];
    MOE_CHECK(info.leases == lease_sums[s])
        << "slot " << s << " leases " << info.leases << " != owners' "
        << lease_sums[s];
    MOE_CHECK(info.leases == 0 || info.state == SlotState::kReady)
        << "leased slot " << s << " is " << SlotStateName(info.state);
    if (info.state == SlotState::kEmpty) continue;
    ++mapped;
    auto it = key_to_slot_.find(info.key);
    MOE_CHECK(it != key_to_slot_.end() && it->second == s)
        << "slot " << s << " key " << info.key.ToString() << " not mapped";
  }
  MOE_CHECK(mapped == key_to_slot_.size()) << "stale keys in map";
}

}  // namespace moe::cache
