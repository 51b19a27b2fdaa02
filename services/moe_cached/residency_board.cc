#include "services/moe_cached/residency_board.h"

#include "common/logging.h"

namespace moe::cached {

ResidencyBoard::ResidencyBoard(int num_layers, int num_experts, int num_slots)
    : shape_{static_cast<uint32_t>(num_layers), static_cast<uint32_t>(num_experts),
             static_cast<uint32_t>(num_slots)},
      held_(static_cast<size_t>(num_slots), 0) {}

uint32_t ResidencyBoard::KeyIndex(const ExpertKey& key) const {
  MOE_CHECK(key.layer >= 0 && static_cast<uint32_t>(key.layer) < shape_.layers &&
            key.expert >= 0 && static_cast<uint32_t>(key.expert) < shape_.experts)
      << "expert " << key.ToString() << " outside the board";
  return shape_.Key(static_cast<uint32_t>(key.layer), static_cast<uint32_t>(key.expert));
}

void ResidencyBoard::AddView(uint64_t id, void* region) {
  channel::ResidencyView view(region, shape_);
  view.Init();
  absl::MutexLock lock(&mu_);
  for (uint32_t s = 0; s < shape_.slots; ++s) {
    if (held_[s] != 0) view.Publish(s, held_[s] - 1);
  }
  views_.emplace_back(id, view);
}

void ResidencyBoard::RemoveView(uint64_t id) {
  absl::MutexLock lock(&mu_);
  for (auto it = views_.begin(); it != views_.end(); ++it) {
    if (it->first == id) {
      views_.erase(it);
      return;
    }
  }
}

void ResidencyBoard::Publish(SlotId slot, const ExpertKey& key) {
  MOE_CHECK(slot >= 0 && static_cast<uint32_t>(slot) < shape_.slots) << "slot " << slot;
  const uint32_t k = KeyIndex(key);
  absl::MutexLock lock(&mu_);
  held_[slot] = k + 1;
  for (auto& [id, view] : views_) view.Publish(slot, k);
}

bool ResidencyBoard::Pinned(SlotId slot) const {
  absl::MutexLock lock(&mu_);
  for (const auto& [id, view] : views_) {
    if (view.Pinned(slot)) return true;
  }
  return false;
}

bool ResidencyBoard::TryRetract(SlotId slot) {
  absl::MutexLock lock(&mu_);
  const uint32_t held = held_[slot];
  if (held == 0) return true;  // never published (set before any load completed)
  bool pinned = false;
  for (auto& [id, view] : views_) pinned |= view.HideAndCheckPinned(slot);
  if (pinned) {
    for (auto& [id, view] : views_) view.Show(slot, held - 1);
    return false;
  }
  for (auto& [id, view] : views_) view.Forget(slot, held - 1);
  held_[slot] = 0;
  return true;
}

}  // namespace moe::cached
