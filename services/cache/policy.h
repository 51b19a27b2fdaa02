// CachePolicy: the pluggable eviction (and prediction) rule of the expert
// cache. ExpertCache tells the policy what happens (requests, iterations,
// routed layers, hits, inserts, evictions, hints) and asks it for victims.
//
// Event order within one iteration (one prefill pass or one decode token):
//   OnBeginIteration(phase)
//   for each MoE layer l in order:
//     OnRoute(l, phase, demands)       // the experts layer l needs now
//     OnAccess(key, phase, hit) xN     // each demanded expert
//     ChooseVictim(...) / OnEvict / OnInsert as misses are served
//     ProposePrefetch(l, ...)          // only when prefetch is on
//
// ChooseVictim receives only evictable candidates: ready, unleased and not
// needed by the layer being served; the cache guarantees that. Candidates are
// sorted by (layer, expert), so a policy that breaks ties by index is
// deterministic.
//
// Thread-safety: none. ExpertCache calls a policy with its mutex held.
#ifndef MOECACHE_SERVICES_CACHE_POLICY_H_
#define MOECACHE_SERVICES_CACHE_POLICY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "services/cache/slot_table.h"
#include "services/cache/trace.h"

namespace moe::cache {

using Phase = trace::Phase;

struct LearnedState;  // eamc_store.h

using ExpertDemand = trace::ExpertDemand;

// Where a prefetch candidate came from (the prefetcher calibrates each).
enum class HintSource : uint8_t { kPolicy = 0, kHint = 1, kAffinity = 2 };
inline constexpr int kNumHintSources = 3;

// A prediction: `expert` at `layer` will be needed with `probability`.
struct Hint {
  int32_t layer = 0;
  int32_t expert = 0;
  float probability = 0;
  HintSource source = HintSource::kPolicy;
};

struct VictimContext {
  int32_t layer = 0;  // the layer being served (or the prefetch's layer)
  Phase phase = Phase::kDecode;
  bool for_prefetch = false;
};

struct PolicyConfig {
  int num_layers = 0;
  int num_experts = 0;
  int top_k = 1;
  int capacity = 0;  // slots
  // Link model, for policies that reason about time (expertflow's stride).
  double expert_bytes = 0;
  double link_bytes_per_sec = 0;
  double layer_seconds = 0;
};

class CachePolicy {
 public:
  virtual ~CachePolicy() = default;

  virtual std::string name() const = 0;

  // Called once before any event. REQUIRES: positive sizes.
  virtual void Configure(const PolicyConfig& config) { config_ = config; }
  const PolicyConfig& config() const { return config_; }

  virtual void OnBeginRequest() {}
  virtual void OnEndRequest() {}
  virtual void OnBeginIteration(Phase phase) {}
  virtual void OnRoute(int layer, Phase phase, absl::Span<const ExpertDemand> demands) {}
  virtual void OnAccess(const ExpertKey& key, Phase phase, bool hit) {}
  virtual void OnInsert(const ExpertKey& key, bool prefetch) {}
  virtual void OnEvict(const ExpertKey& key) {}
  virtual void OnHint(const Hint& hint) {}

  // Returns an index into `candidates`. REQUIRES: !candidates.empty().
  virtual size_t ChooseVictim(absl::Span<const ExpertKey> candidates,
                              const VictimContext& context) = 0;

  // The policy's estimate in [0, 1] that `key` is needed again soon; the
  // prefetch gate weighs a victim by it.
  virtual double RetentionValue(const ExpertKey& key) const { return 0.5; }

  // Prefetch proposals after `routed_layer` was routed, appended to `out`.
  virtual void ProposePrefetch(int routed_layer, std::vector<Hint>* out) {}

  // How many layers ahead prefetches should target (>= 1).
  virtual int PrefetchDistance() const { return 1; }
  // Entries of the policy's expert activation matrix collection (0 when it
  // keeps none), for monitoring.
  virtual int EamcEntries() const { return 0; }

  // Feedback from the cache: a prefetched expert was used (true) or left
  // unused (evicted or cancelled); time the model waited at a layer.
  virtual void OnPrefetchOutcome(bool used) {}
  virtual void OnStall(int64_t stall_ns) {}

  // What the policy learned that should survive a restart (the EAMC, ...),
  // added to `state` (whose shape is set). Default: nothing.
  virtual void ExportLearned(LearnedState* state) const {}
  // Replaces the learned part of the policy with `state` (already validated
  // against this shape by eamc_store). Default: ignores it.
  virtual void ImportLearned(const LearnedState& state) {}

 protected:
  int Index(const ExpertKey& key) const { return key.layer * config_.num_experts + key.expert; }
  int cells() const { return config_.num_layers * config_.num_experts; }

  PolicyConfig config_;
};

// Online policies by name: lru, lfu, lru-layer, minvisit, moe-infinity,
// moe-infinity-paper, expertflow. moe-infinity options follow a colon, e.g.
// "moe-infinity:fair_share=0,lrfu=1" (see moe_infinity_policy.h).
// INVALID_ARGUMENT for an unknown name or option.
absl::StatusOr<std::unique_ptr<CachePolicy>> MakePolicy(const std::string& spec,
                                                        const PolicyConfig& config);

// The names MakePolicy accepts (without options), in report order.
std::vector<std::string> OnlinePolicyNames();

// Belady's offline optimum for demand fetching: evicts the candidate whose
// next use is farthest in the future. `groups` is every OnRoute call's expert
// set in order (one per layer per iteration); the policy counts OnRoute calls
// to know where it is. Simulator only.
std::unique_ptr<CachePolicy> MakeBeladyPolicy(
    const std::vector<std::vector<ExpertKey>>& groups, const PolicyConfig& config);

}  // namespace moe::cache

#endif  // MOECACHE_SERVICES_CACHE_POLICY_H_
