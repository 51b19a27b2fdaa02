// CachePolicy: the pluggable eviction (and prediction) rule of the expert
// cache. ExpertCache tells the policy what happens (requests, iterations,
// routed layers, hits, inserts, evictions, hints) and asks it for victims.
//
// Event order within one iteration of one owner (one prefill pass or one
// decode token of a request); several owners' iterations may interleave:
//   OnBeginIteration(owner, phase)
//   for each MoE layer l in order:
//     OnRoute(owner, l, phase, demands)  // the experts layer l needs now
//     OnAccess(key, phase, hit) xN       // each demanded expert
//     ChooseVictim(...) / OnEvict / OnInsert as misses are served
//     ProposePrefetch(owner, l, ...)     // only when prefetch is on
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

// Demands, hints (ExpertHint, with their HintSource), keys and owners are
// the exchange types (services/exchange/expert_exchange.h).

struct VictimContext {
  RequestOwner owner;  // whose acquire (or prefetch) needs the slot
  int32_t layer = 0;   // the layer being served (or the prefetch's layer)
  Phase phase = Phase::kDecode;
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

  // Request-scoped events name their owner. A policy that keeps per-request
  // state (moe-infinity's activation matrices, expertflow's counters) keeps
  // it per owner: created at the owner's first event, dropped at
  // OnEndRequest (which may learn from it, e.g. into the EAMC). Several
  // owners may be live at once (several workers on one daemon).
  virtual void OnBeginRequest(const RequestOwner& owner) {}
  virtual void OnEndRequest(const RequestOwner& owner) {}
  virtual void OnBeginIteration(const RequestOwner& owner, Phase phase) {}
  virtual void OnRoute(const RequestOwner& owner, int layer, Phase phase,
                       absl::Span<const ExpertDemand> demands) {}
  virtual void OnHint(const RequestOwner& owner, const ExpertHint& hint) {}
  // Residency events are global (the arena is shared).
  virtual void OnAccess(const ExpertKey& key, Phase phase, bool hit) {}
  virtual void OnInsert(const ExpertKey& key, bool prefetch) {}
  virtual void OnEvict(const ExpertKey& key) {}

  // Returns an index into `candidates`. REQUIRES: !candidates.empty().
  // A policy with per-owner state weighs every live owner's view (an expert
  // one owner needs soon is worth keeping whoever evicts).
  virtual size_t ChooseVictim(absl::Span<const ExpertKey> candidates,
                              const VictimContext& context) = 0;

  // The policy's estimate in [0, 1] that `key` is needed again soon by any
  // live owner; the prefetch gate weighs a victim by it.
  virtual double RetentionValue(const ExpertKey& key) const { return 0.5; }

  // A miss answered on the host may be copied in behind the answer while the
  // link is idle: true if `key` is worth keeping resident more than `victim`
  // (null: the slot is free). Default: yes (recency keeps what was just used).
  virtual bool AdmitBehind(const ExpertKey& key, const ExpertKey* victim) const { return true; }

  // Prefetch proposals for `owner` after its `routed_layer` was routed,
  // appended to `out`.
  virtual void ProposePrefetch(const RequestOwner& owner, int routed_layer,
                               std::vector<ExpertHint>* out) {}

  // How many layers ahead `owner`'s prefetches should target (>= 1).
  virtual int PrefetchDistance(const RequestOwner& owner) const { return 1; }
  // The largest distance over live owners (>= 1), for monitoring.
  virtual int MaxPrefetchDistance() const { return 1; }
  // Entries of the policy's expert activation matrix collection (0 when it
  // keeps none), for monitoring.
  virtual int EamcEntries() const { return 0; }

  // Feedback from the cache: a prefetch issued for `owner` was used (true)
  // or left unused (evicted or cancelled); time `owner` waited at a layer.
  virtual void OnPrefetchOutcome(const RequestOwner& owner, bool used) {}
  virtual void OnStall(const RequestOwner& owner, int64_t stall_ns) {}

  // What the policy learned that should survive a restart (the EAMC, ...),
  // added to `state` (whose shape is set). Default: nothing.
  virtual void ExportLearned(LearnedState* state) const {}
  // Replaces the learned part of the policy with `state` (already validated
  // against this shape by eamc_store). Default: ignores it.
  virtual void ImportLearned(const LearnedState& state) {}

  // The experts a placement policy wants resident before any traffic, best
  // first, at most `slots` (a static placement known in advance or learned
  // and persisted). ExpertCache::WarmUp loads them into free slots. Default:
  // none (recency policies learn their set from the traffic).
  virtual std::vector<ExpertKey> WarmSet(int slots) const { return {}; }

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

// Belady's eviction with foresight of everything else a policy decides:
// copies behind admitted when the key is used again before its victim,
// prefetches of exactly the experts the rest of the iteration routes to
// (probability 1; only with prefetch on). What an online policy could reach
// with a perfect predictor under --miss-mode host|auto, within this cache's
// mechanisms (prefetches target the rest of the iteration: a copy slower
// than that lead lands late, so compare prefetch on and off). Simulator
// only ("oracle").
std::unique_ptr<CachePolicy> MakeOraclePolicy(
    const std::vector<std::vector<ExpertKey>>& groups, const PolicyConfig& config);

// static-popular with its popularity known in advance: `tokens[l * E + e]`
// is how many tokens the whole trace routes to (l, e). The bound of what a
// static popularity placement (Fiddler's) can do. Simulator only.
std::unique_ptr<CachePolicy> MakeOraclePopularPolicy(std::vector<double> tokens,
                                                     const PolicyConfig& config);

}  // namespace moe::cache

#endif  // MOECACHE_SERVICES_CACHE_POLICY_H_
