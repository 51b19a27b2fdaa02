#include "services/cache/expertflow_policy.h"

#include <algorithm>
#include <cmath>

namespace moe::cache {

void ExpertFlowPolicy::Configure(const PolicyConfig& config) {
  TrackingPolicy::Configure(config);
  double s = 1;
  if (config.link_bytes_per_sec > 0 && config.layer_seconds > 0) {
    s = std::ceil(config.top_k * config.expert_bytes /
                  (config.link_bytes_per_sec * config.layer_seconds));
  }
  const int max_stride = std::max(1, config.num_layers - 1);
  initial_stride_ = std::clamp(static_cast<int>(s), 1, max_stride);
  owners_.clear();
}

ExpertFlowPolicy::OwnerState& ExpertFlowPolicy::State(const RequestOwner& owner) {
  std::unique_ptr<OwnerState>& s = owners_[owner];
  if (s == nullptr) {
    s = std::make_unique<OwnerState>();
    s->stride = initial_stride_;
    s->used_iteration.assign(cells(), -100);
    s->hinted_iteration.assign(cells(), -100);
  }
  return *s;
}

void ExpertFlowPolicy::OnBeginIteration(const RequestOwner& owner, Phase phase) {
  ++State(owner).iteration;
}

void ExpertFlowPolicy::OnRoute(const RequestOwner& owner, int layer, Phase phase,
                               absl::Span<const ExpertDemand> demands) {
  OwnerState& s = State(owner);
  for (const auto& d : demands) s.used_iteration[layer * config_.num_experts + d.expert] = s.iteration;
}

void ExpertFlowPolicy::OnHint(const RequestOwner& owner, const ExpertHint& hint) {
  if (hint.probability <= 0) return;
  OwnerState& s = State(owner);
  s.hinted_iteration[Index({hint.layer, hint.expert})] = s.iteration;
}

bool ExpertFlowPolicy::High(const ExpertKey& key) const {
  const int i = Index(key);
  for (const auto& [owner, s] : owners_) {
    if (s->used_iteration[i] > s->iteration - kHighWindow ||
        s->hinted_iteration[i] == s->iteration) {
      return true;
    }
  }
  return false;
}

size_t ExpertFlowPolicy::ChooseVictim(absl::Span<const ExpertKey> candidates,
                                      const VictimContext& context) {
  // Encode (level, last use) so that low-level experts sort first.
  return ArgMin(candidates, -1, [&](const ExpertKey& k) {
    return (High(k) ? (uint64_t{1} << 62) : 0) + last_use(k);
  });
}

double ExpertFlowPolicy::RetentionValue(const ExpertKey& key) const {
  return High(key) ? 0.75 : 0.25;
}

int ExpertFlowPolicy::PrefetchDistance(const RequestOwner& owner) const {
  auto it = owners_.find(owner);
  return it == owners_.end() ? initial_stride_ : it->second->stride;
}

int ExpertFlowPolicy::MaxPrefetchDistance() const {
  int stride = owners_.empty() ? initial_stride_ : 1;
  for (const auto& [owner, s] : owners_) stride = std::max(stride, s->stride);
  return stride;
}

void ExpertFlowPolicy::OnPrefetchOutcome(const RequestOwner& owner, bool used) {
  if (used) return;
  auto it = owners_.find(owner);
  if (it == owners_.end()) return;  // the request has ended
  OwnerState& s = *it->second;
  if (++s.waste >= kWastePerStep) {
    s.waste = 0;
    s.stride = std::max(1, s.stride - 1);
  }
}

void ExpertFlowPolicy::OnStall(const RequestOwner& owner, int64_t stall_ns) {
  if (stall_ns <= 0) return;
  OwnerState& s = State(owner);
  if (++s.stalls >= kStallsPerStep) {
    s.stalls = 0;
    s.stride = std::min(std::max(1, config_.num_layers - 1), s.stride + 1);
  }
}

}  // namespace moe::cache
