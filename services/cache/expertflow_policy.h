// expertflow: ExpertFlow's two-level LRU with an adaptive prefetch stride.
//
// Level "high" holds experts used in the last `kHighWindow` iterations or
// predicted (hinted/proposed) for this iteration; "low" holds the rest and is
// evicted first; LRU within a level.
//
// Stride: S = ceil(Ne * Es / (Cs * Tl)) layers ahead (experts per layer x
// expert bytes over link bandwidth x layer compute time), clamped to
// [1, L - 1]; every kStallsPerStep stalls move it up by one, every
// kWastePerStep wasted prefetches move it down by one.
#ifndef MOECACHE_SERVICES_CACHE_EXPERTFLOW_POLICY_H_
#define MOECACHE_SERVICES_CACHE_EXPERTFLOW_POLICY_H_

#include <vector>

#include "services/cache/policies.h"

namespace moe::cache {

class ExpertFlowPolicy : public TrackingPolicy {
 public:
  static constexpr int kHighWindow = 2;
  static constexpr int kStallsPerStep = 8;
  static constexpr int kWastePerStep = 8;

  std::string name() const override { return "expertflow"; }
  void Configure(const PolicyConfig& config) override;
  void OnBeginIteration(Phase phase) override { ++iteration_; }
  void OnRoute(int layer, Phase phase, absl::Span<const ExpertDemand> demands) override;
  void OnHint(const Hint& hint) override;
  size_t ChooseVictim(absl::Span<const ExpertKey> candidates,
                      const VictimContext& context) override;
  double RetentionValue(const ExpertKey& key) const override;
  int PrefetchDistance() const override { return stride_; }
  void OnPrefetchOutcome(bool used) override;
  void OnStall(int64_t stall_ns) override;

  int initial_stride() const { return initial_stride_; }

 private:
  bool High(const ExpertKey& key) const;

  int64_t iteration_ = 0;
  int stride_ = 1;
  int initial_stride_ = 1;
  int stalls_ = 0;
  int waste_ = 0;
  std::vector<int64_t> used_iteration_;
  std::vector<int64_t> hinted_iteration_;
};

}  // namespace moe::cache

#endif  // MOECACHE_SERVICES_CACHE_EXPERTFLOW_POLICY_H_
