// Baseline policies (lru, lfu, lru-layer, minvisit) and Belady's optimum.
// Use MakePolicy / MakeBeladyPolicy (policy.h); the classes are exposed for
// tests and for policies that build on them.
#ifndef MOECACHE_SERVICES_CACHE_POLICIES_H_
#define MOECACHE_SERVICES_CACHE_POLICIES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "services/cache/policy.h"

namespace moe::cache {

// Shared bookkeeping: a logical access clock, last use and insert time per
// expert, residents per layer.
class TrackingPolicy : public CachePolicy {
 public:
  void Configure(const PolicyConfig& config) override;
  void OnAccess(const ExpertKey& key, Phase phase, bool hit) override;
  void OnInsert(const ExpertKey& key, bool prefetch) override;
  void OnEvict(const ExpertKey& key) override;

 protected:
  uint64_t last_use(const ExpertKey& key) const { return last_use_[Index(key)]; }
  int residents(int layer) const { return residents_[layer]; }
  double layer_share() const {
    return static_cast<double>(config_.capacity) / config_.num_layers;
  }
  // Among candidates in `layer` (any layer if -1), the index with the
  // smallest `score`, ties by older last use, then by position.
  template <typename ScoreFn>
  size_t ArgMin(absl::Span<const ExpertKey> candidates, int layer, ScoreFn score) const {
    size_t best = candidates.size();
    for (size_t i = 0; i < candidates.size(); ++i) {
      if (layer >= 0 && candidates[i].layer != layer) continue;
      if (best == candidates.size()) {
        best = i;
        continue;
      }
      const auto si = score(candidates[i]);
      const auto sb = score(candidates[best]);
      if (si < sb || (si == sb && last_use(candidates[i]) < last_use(candidates[best]))) {
        best = i;
      }
    }
    return best;
  }
  // The layer to evict from under equal per-layer shares: the candidates'
  // layer furthest over its share, other than `routed_layer` unless only it
  // has candidates (the routed layer may borrow).
  int FairShareLayer(absl::Span<const ExpertKey> candidates, int routed_layer) const;

  uint64_t clock_ = 0;
  std::vector<uint64_t> last_use_;
  std::vector<uint64_t> insert_time_;
  std::vector<int> residents_;
};

class LruPolicy : public TrackingPolicy {
 public:
  std::string name() const override { return "lru"; }
  size_t ChooseVictim(absl::Span<const ExpertKey> candidates,
                      const VictimContext& context) override;
};

// All-time access counts; ties by recency.
class LfuPolicy : public TrackingPolicy {
 public:
  std::string name() const override { return "lfu"; }
  void Configure(const PolicyConfig& config) override;
  void OnAccess(const ExpertKey& key, Phase phase, bool hit) override;
  size_t ChooseVictim(absl::Span<const ExpertKey> candidates,
                      const VictimContext& context) override;

 private:
  std::vector<uint64_t> counts_;
};

// Per-layer LRU with the capacity split evenly (Mixtral-offloading's rule):
// a layer at or over its share evicts its own LRU expert; otherwise the
// layer furthest over its share gives one up.
class LruLayerPolicy : public TrackingPolicy {
 public:
  std::string name() const override { return "lru-layer"; }
  size_t ChooseVictim(absl::Span<const ExpertKey> candidates,
                      const VictimContext& context) override;
};

// Fewest visits since entering the cache (MoE-Infinity's released code).
class MinVisitPolicy : public TrackingPolicy {
 public:
  std::string name() const override { return "minvisit"; }
  void Configure(const PolicyConfig& config) override;
  void OnAccess(const ExpertKey& key, Phase phase, bool hit) override;
  void OnInsert(const ExpertKey& key, bool prefetch) override;
  size_t ChooseVictim(absl::Span<const ExpertKey> candidates,
                      const VictimContext& context) override;

 private:
  std::vector<uint64_t> visits_;
};

// Static placements for host execution (--miss-mode host|auto), where a miss
// is cheap to run on the host and residency should go to the experts whose
// misses cost most over the coming tokens.
//
// static-popular (Fiddler's placement): keep the most popular experts,
// popularity being the tokens routed to each since the start (learned
// online; the oracle form knows the whole trace's counts); a host-answered
// miss is copied in only if it is more popular than the victim.
class StaticPopularPolicy : public TrackingPolicy {
 public:
  // `oracle`: the counts are fixed (one per cell) and never updated.
  explicit StaticPopularPolicy(std::vector<double> oracle = {}) : oracle_(std::move(oracle)) {}
  std::string name() const override {
    return oracle_.empty() ? "static-popular" : "static-popular-oracle";
  }
  void Configure(const PolicyConfig& config) override;
  void OnRoute(const RequestOwner& owner, int layer, Phase phase,
               absl::Span<const ExpertDemand> demands) override;
  size_t ChooseVictim(absl::Span<const ExpertKey> candidates,
                      const VictimContext& context) override;
  bool AdmitBehind(const ExpertKey& key, const ExpertKey* victim) const override;
  // The counts persist (learned state section "popularity"), so a restarted
  // daemon places the most popular experts before the first token.
  void ExportLearned(LearnedState* state) const override;
  void ImportLearned(const LearnedState& state) override;
  // The `slots` most popular experts with any tokens, most popular first.
  std::vector<ExpertKey> WarmSet(int slots) const override;

 private:
  std::vector<double> oracle_;
  std::vector<double> tokens_;  // per cell
};

// static-layers (llama.cpp's --n-cpu-moe split): the experts of the first
// capacity / E layers live in the arena, the other layers' run on the host;
// victims come from the highest layer, and only the resident layers'
// experts are copied in behind a host answer.
class StaticLayersPolicy : public TrackingPolicy {
 public:
  std::string name() const override { return "static-layers"; }
  // Every expert of the first capacity / E layers, known before any traffic.
  std::vector<ExpertKey> WarmSet(int slots) const override;
  size_t ChooseVictim(absl::Span<const ExpertKey> candidates,
                      const VictimContext& context) override;
  bool AdmitBehind(const ExpertKey& key, const ExpertKey* victim) const override;

 private:
  int resident_layers() const { return config_.capacity / config_.num_experts; }
};

}  // namespace moe::cache

#endif  // MOECACHE_SERVICES_CACHE_POLICIES_H_
