// ExpertCache's speculative loads: prefetches (issued, cancelled, scored),
// the placement policy's warm set, and copies behind host answers. The
// demand path and the bookkeeping are in expert_cache.cc.
#include "services/cache/expert_cache.h"

#include <algorithm>

namespace moe::cache {

void ExpertCache::NotePrefetchOutcome(SlotMeta& meta, bool used) {
  if (!meta.prefetched) return;
  meta.prefetched = false;
  if (used) {
    ++stats_[PhaseIndex(meta.phase)].prefetches_used;
  } else {
    ++stats_[PhaseIndex(meta.phase)].prefetches_wasted;
  }
  prefetcher_.OnOutcome(meta.source, used);
  policy_->OnPrefetchOutcome(meta.prefetch_owner, used);
}

void ExpertCache::CancelUnneededPrefetches(const RequestOwner& owner, int layer,
                                           absl::Span<const ExpertDemand> demands) {
  // A slot this could cancel carries a counted prefetch (only a promotion
  // uncounts one, and it makes the load a demand).
  if (inflight_prefetches_ == 0) return;
  for (SlotId s = 0; s < slots_.num_slots(); ++s) {
    SlotMeta& m = meta_[s];
    if (m.transfer == kNoTransfer || m.demand || m.cancelling) continue;
    if (m.prefetch_owner != owner) continue;  // another request's prediction
    const SlotInfo& info = slots_.Get(s);
    if (info.state != SlotState::kLoading || info.key.layer != layer) continue;
    bool needed = false;
    for (const auto& d : demands) needed |= d.expert == info.key.expert;
    if (needed) continue;
    if (auto q = engine_->Query(m.transfer); q.has_value()) {
      uint64_t moved = q->bytes_done;
      if (q->on_link) moved = std::min(q->bytes, moved + engine_->chunk_bytes());
      stats_[PhaseIndex(m.phase)].bytes_moved += moved;
    }
    if (engine_->Cancel(m.transfer).ok()) m.cancelling = true;
  }
}

bool ExpertCache::RoomForSpeculativeLoad() const {
  int busy = inflight_prefetches_;
  for (SlotId s = 0; s < slots_.num_slots(); ++s) {
    busy += slots_.Get(s).leases > 0 || meta_[s].pins > 0 || meta_[s].demand ||
            meta_[s].cancelling;
  }
  // A layer's experts stay free for demands, unless the cache is smaller
  // than a layer: then every session runs its misses on the host
  // (CheckCapacity, the daemon's attach), and a free slot is worth filling.
  const int reserve = options_.capacity >= options_.num_experts ? options_.num_experts : 0;
  return busy + reserve < options_.capacity;
}

bool ExpertCache::StartSpeculativeLoad(SlotId slot, const ExpertKey& key, Phase phase,
                                       const RequestOwner& owner, HintSource source) {
  if (!EvictSlot(slot)) return false;  // a worker pinned it
  if (!StartLoad(slot, key, TransferPriority::kPrefetch, phase).ok()) return false;
  meta_[slot].source = source;
  meta_[slot].prefetch_owner = owner;
  policy_->OnInsert(key, /*prefetch=*/true);
  ++stats_[PhaseIndex(phase)].prefetches_issued;
  return true;
}

int ExpertCache::WarmUp() {
  absl::MutexLock lock(&mu_);
  warm_queue_ = policy_->WarmSet(options_.capacity);
  std::reverse(warm_queue_.begin(), warm_queue_.end());
  const int queued = static_cast<int>(warm_queue_.size());
  ContinueWarmUp(RequestOwner{}, Phase::kDecode);
  return queued;
}

void ExpertCache::ContinueWarmUp(const RequestOwner& owner, Phase phase) {
  while (!warm_queue_.empty() && RoomForSpeculativeLoad()) {
    const ExpertKey key = warm_queue_.back();
    if (slots_.Lookup(key).has_value()) {
      warm_queue_.pop_back();
      continue;
    }
    std::optional<SlotId> slot = slots_.FindEmpty();
    if (!slot.has_value()) {
      // Over a resident expert: one at a time, while the link is idle, and
      // only if the policy ranks the key above its victim (the queue is best
      // first: when this one does not pay, none after it does).
      for (SlotId s = 0; s < slots_.num_slots(); ++s) {
        if (meta_[s].transfer != kNoTransfer) return;
      }
      const SlotId victim = ChooseSlot(VictimContext{owner, key.layer, phase},
                                       [](const ExpertKey&) { return true; });
      if (victim < 0 || !policy_->AdmitBehind(key, &slots_.Get(victim).key)) {
        warm_queue_.clear();
        return;
      }
      if (!EvictSlot(victim)) return;  // a worker pinned it: try at a later acquire
      slot = victim;
    }
    if (!StartLoad(*slot, key, TransferPriority::kPrefetch, phase).ok()) {
      warm_queue_.clear();
      return;
    }
    meta_[*slot].prefetched = false;  // a placement, not a prediction to score
    policy_->OnInsert(key, /*prefetch=*/true);
    warm_queue_.pop_back();
  }
}

void ExpertCache::CopyBehind(const RequestOwner& owner, const ExpertKey& key, Phase phase,
                             const std::function<bool(const ExpertKey&)>& keep) {
  // Into a free slot at any time (it evicts nothing; it yields to demands at
  // the next chunk); over a resident expert only while the link is idle
  // (copying over residents behind a busy link measured slower on the
  // benchmark traces: tests/bench/miss_mode_sim.py).
  const bool any_free = slots_.FindEmpty().has_value();
  for (SlotId s = 0; s < slots_.num_slots() && !any_free; ++s) {
    if (meta_[s].transfer != kNoTransfer) return;  // the link is not idle
  }
  if (!RoomForSpeculativeLoad()) return;
  const SlotId slot = ChooseSlot(VictimContext{owner, key.layer, phase},
                                 [&](const ExpertKey& k) { return !keep(k); });
  if (slot < 0) return;
  const SlotInfo& victim = slots_.Get(slot);
  const bool free = victim.state == SlotState::kEmpty;
  if (!policy_->AdmitBehind(key, free ? nullptr : &victim.key)) return;
  StartSpeculativeLoad(slot, key, phase, owner, HintSource::kPolicy);
}

void ExpertCache::IssuePrefetches(absl::Span<const RequestOwner> owners, int layer,
                                  Phase phase) {
  if (phase != Phase::kDecode || owners.empty()) return;
  const RequestOwner& owner = owners[0];
  // Targets: the owners' next `distance` layers (expertflow's stride), each at
  // most max_prefetch_per_layer times per iteration of the first owner.
  int distance = 1;
  std::vector<std::vector<ExpertHint>> proposals(owners.size());
  for (size_t i = 0; i < owners.size(); ++i) {
    distance = std::max(distance, policy_->PrefetchDistance(owners[i]));
    policy_->ProposePrefetch(owners[i], layer, &proposals[i]);
  }
  const int last = std::min(options_.num_layers - 1, layer + distance);
  std::vector<int>& issued_for_layer = Owner(owner).issued_for_layer;
  struct Candidate {
    ExpertHint hint;      // probability: that any owner needs it
    RequestOwner owner;   // the owner most likely to
    float best = 0;
  };
  for (int target = layer + 1; target <= last; ++target) {
    int& issued = issued_for_layer[target];
    if (issued >= options_.max_prefetch_per_layer) continue;
    std::vector<Candidate> cands;
    if (owners.size() == 1) {  // one owner's list as it is, best first
      for (const ExpertHint& h : prefetcher_.Candidates(owner, target, proposals[0])) {
        cands.push_back({h, owner, h.probability});
      }
    }
    for (size_t i = 0; owners.size() > 1 && i < owners.size(); ++i) {
      for (const ExpertHint& h : prefetcher_.Candidates(owners[i], target, proposals[i])) {
        auto same = std::find_if(cands.begin(), cands.end(),
                                 [&](const Candidate& c) { return c.hint.expert == h.expert; });
        if (same == cands.end()) {
          cands.push_back({h, owners[i], h.probability});
          continue;
        }
        same->hint.probability = 1 - (1 - same->hint.probability) * (1 - h.probability);
        if (h.probability > same->best) {
          same->best = h.probability;
          same->owner = owners[i];
          same->hint.source = h.source;
        }
      }
    }
    if (owners.size() > 1) {
      std::stable_sort(cands.begin(), cands.end(), [](const Candidate& a, const Candidate& b) {
        return a.hint.probability > b.hint.probability;
      });
    }
    for (const Candidate& cand : cands) {
      const ExpertHint& c = cand.hint;
      if (issued >= options_.max_prefetch_per_layer) break;
      const ExpertKey key{target, c.expert};
      if (slots_.Lookup(key).has_value()) continue;
      if (!RoomForSpeculativeLoad()) return;
      const SlotId slot = ChooseSlot(VictimContext{owner, target, phase},
                                     [&](const ExpertKey& k) { return k.layer <= layer; });
      if (slot < 0) return;
      const SlotInfo& info = slots_.Get(slot);
      const double value =
          info.state == SlotState::kReady ? policy_->RetentionValue(info.key) : 0.0;
      if (!prefetcher_.Gate(c, value)) break;  // the best did not pay
      if (!StartSpeculativeLoad(slot, key, phase, cand.owner, c.source)) return;
      prefetcher_.OnIssued(c);
      ++issued;
    }
  }
}

}  // namespace moe::cache
