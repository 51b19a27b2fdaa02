// expertflow: ExpertFlow's two-level LRU with an adaptive prefetch stride.
//
// Level "high" holds experts used in an owner's last `kHighWindow`
// iterations or predicted (hinted/proposed) for its current iteration, for
// any live owner; "low" holds the rest and is evicted first; LRU within a
// level.
//
// Stride, per owner: S = ceil(Ne * Es / (Cs * Tl)) layers ahead (experts per
// layer x expert bytes over link bandwidth x layer compute time), clamped to
// [1, L - 1]; every kStallsPerStep of the owner's stalls move it up by one,
// every kWastePerStep of its wasted prefetches move it down by one.
#ifndef MOECACHE_SERVICES_CACHE_EXPERTFLOW_POLICY_H_
#define MOECACHE_SERVICES_CACHE_EXPERTFLOW_POLICY_H_

#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "services/cache/policies.h"

namespace moe::cache {

class ExpertFlowPolicy : public TrackingPolicy {
 public:
  static constexpr int kHighWindow = 2;
  static constexpr int kStallsPerStep = 8;
  static constexpr int kWastePerStep = 8;

  std::string name() const override { return "expertflow"; }
  void Configure(const PolicyConfig& config) override;
  void OnEndRequest(const RequestOwner& owner) override { owners_.erase(owner); }
  void OnBeginIteration(const RequestOwner& owner, Phase phase) override;
  void OnRoute(const RequestOwner& owner, int layer, Phase phase,
               absl::Span<const ExpertDemand> demands) override;
  void OnHint(const RequestOwner& owner, const ExpertHint& hint) override;
  size_t ChooseVictim(absl::Span<const ExpertKey> candidates,
                      const VictimContext& context) override;
  double RetentionValue(const ExpertKey& key) const override;
  int PrefetchDistance(const RequestOwner& owner) const override;
  int MaxPrefetchDistance() const override;
  void OnPrefetchOutcome(const RequestOwner& owner, bool used) override;
  void OnStall(const RequestOwner& owner, int64_t stall_ns) override;


 private:
  struct OwnerState {
    int64_t iteration = 0;
    int stride = 1;
    int stalls = 0;
    int waste = 0;
    std::vector<int64_t> used_iteration;    // per cell
    std::vector<int64_t> hinted_iteration;  // per cell
  };
  OwnerState& State(const RequestOwner& owner);
  bool High(const ExpertKey& key) const;

  int initial_stride_ = 1;
  absl::flat_hash_map<RequestOwner, std::unique_ptr<OwnerState>> owners_;
};

}  // namespace moe::cache

#endif  // MOECACHE_SERVICES_CACHE_EXPERTFLOW_POLICY_H_
