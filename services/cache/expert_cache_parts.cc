// ExpertCache's layer in parts (AcquireCall::part, ::continues): the open
// layer an owner is answered in parts, kept from eviction until answered,
// and the next part copied ahead. See expert_cache.h and
// docs/architecture.md, "A layer in parts".
#include <algorithm>
#include <functional>
#include <optional>

#include "absl/strings/str_cat.h"
#include "services/cache/expert_cache.h"

namespace moe::cache {

bool ExpertCache::ReadyForPartLocked(const OwnerState::OpenLayer& open,
                                     const ExpertKey& key) const {
  const std::optional<SlotId> slot = slots_.Lookup(key);
  return slot.has_value() && slots_.Get(*slot).state == SlotState::kReady &&
         !open.copied_ahead(key.expert);
}

absl::Status ExpertCache::CheckNextPartLocked(const RequestOwner& owner,
                                              const AcquireCall& call, Phase phase) {
  auto it = owners_.find(owner);
  if (it == owners_.end() || it->second.open.layer < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("no layer open in parts to continue (layer ", call.layer, ")"));
  }
  OwnerState::OpenLayer& open = it->second.open;
  const size_t n = call.demands.size();
  bool next = open.layer == call.layer && open.phase == phase &&
              n <= open.rest.size() - open.next;
  for (size_t i = 0; next && i < n; ++i) {
    next = open.rest[open.next + i].expert == call.demands[i].expert &&
           open.rest[open.next + i].tokens == call.demands[i].tokens;
  }
  if (!next) {
    return absl::FailedPreconditionError(
        absl::StrCat("not what is left of the open layer ", open.layer, ": ", n,
                     " experts of layer ", call.layer, " (", open.rest.size() - open.next,
                     " left)"));
  }
  return absl::OkStatus();
}

void ExpertCache::OpenLayerLocked(const RequestOwner& owner, const AcquireCall& call,
                                  Phase phase) {
  OwnerState::OpenLayer& open = Owner(owner).open;
  open = OwnerState::OpenLayer{};
  open.layer = call.layer;
  open.phase = phase;
  open.part = call.part;
  open.copy_ahead = options_.miss_mode == MissMode::kFetch || !call.host_ok;
  open.rest.assign(call.demands.begin(), call.demands.end());
  for (const ExpertDemand& d : open.rest) {
    ++kept_open_[static_cast<size_t>(call.layer) * options_.num_experts + d.expert];
  }
}

void ExpertCache::CloseLayerLocked(OwnerState& o) {
  OwnerState::OpenLayer& open = o.open;
  if (open.layer < 0) return;
  for (size_t i = open.next; i < open.rest.size(); ++i) {
    --kept_open_[static_cast<size_t>(open.layer) * options_.num_experts + open.rest[i].expert];
  }
  open = OwnerState::OpenLayer{};
}

std::function<bool(const ExpertKey&)> ExpertCache::AnsweredIn(
    const OwnerState::OpenLayer& open) {
  return [&open](const ExpertKey& k) {
    return k.layer == open.layer && open.answered(k.expert);
  };
}

void ExpertCache::AnsweredPartLocked(const RequestOwner& owner,
                                     absl::Span<const ExpertDemand> part) {
  OwnerState& o = owners_[owner];
  OwnerState::OpenLayer& open = o.open;
  for (const ExpertDemand& d : part) {
    --kept_open_[static_cast<size_t>(open.layer) * options_.num_experts + d.expert];
    open.done.push_back(d.expert);
  }
  open.next += part.size();
  if (open.next == open.rest.size()) {
    CloseLayerLocked(o);
  } else if (open.copy_ahead) {
    CopyNextPartLocked(owner, open);
  }
}

void ExpertCache::CopyNextPartLocked(const RequestOwner& owner, OwnerState::OpenLayer& open) {
  const std::function<bool(const ExpertKey&)> answered = AnsweredIn(open);
  int copies = 0;
  for (size_t i = open.next; i < open.rest.size() && copies < open.part; ++i) {
    const ExpertKey key{open.layer, open.rest[i].expert};
    if (slots_.Lookup(key).has_value()) continue;  // resident or loading
    ++copies;
    const SlotId slot = TakeSlot(VictimContext{owner, open.layer, open.phase},
                                 [](const ExpertKey&) { return true; }, &answered);
    if (slot < 0) return;  // its own call will find one, or answer it on the host
    if (!StartLoad(slot, key, TransferPriority::kDemand, open.phase).ok()) return;
    policy_->OnInsert(key, /*prefetch=*/false);
    open.ahead.push_back(key.expert);
  }
}

}  // namespace moe::cache
