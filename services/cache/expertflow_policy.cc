#include "services/cache/expertflow_policy.h"

#include <algorithm>
#include <cmath>

namespace moe::cache {

void ExpertFlowPolicy::Configure(const PolicyConfig& config) {
  TrackingPolicy::Configure(config);
  used_iteration_.assign(cells(), -100);
  hinted_iteration_.assign(cells(), -100);
  double s = 1;
  if (config.link_bytes_per_sec > 0 && config.layer_seconds > 0) {
    s = std::ceil(config.top_k * config.expert_bytes /
                  (config.link_bytes_per_sec * config.layer_seconds));
  }
  const int max_stride = std::max(1, config.num_layers - 1);
  stride_ = initial_stride_ = std::clamp(static_cast<int>(s), 1, max_stride);
}

void ExpertFlowPolicy::OnRoute(int layer, Phase phase, absl::Span<const ExpertDemand> demands) {
  for (const auto& d : demands) used_iteration_[layer * config_.num_experts + d.expert] = iteration_;
}

void ExpertFlowPolicy::OnHint(const Hint& hint) {
  if (hint.probability > 0) hinted_iteration_[Index({hint.layer, hint.expert})] = iteration_;
}

bool ExpertFlowPolicy::High(const ExpertKey& key) const {
  const int i = Index(key);
  return used_iteration_[i] > iteration_ - kHighWindow || hinted_iteration_[i] == iteration_;
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

void ExpertFlowPolicy::OnPrefetchOutcome(bool used) {
  if (used) return;
  if (++waste_ >= kWastePerStep) {
    waste_ = 0;
    stride_ = std::max(1, stride_ - 1);
  }
}

void ExpertFlowPolicy::OnStall(int64_t stall_ns) {
  if (stall_ns <= 0) return;
  if (++stalls_ >= kStallsPerStep) {
    stalls_ = 0;
    stride_ = std::min(std::max(1, config_.num_layers - 1), stride_ + 1);
  }
}

}  // namespace moe::cache
