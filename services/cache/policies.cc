#include "services/cache/policies.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "services/cache/eamc_store.h"
#include "services/cache/expertflow_policy.h"
#include "services/cache/moe_infinity_policy.h"

namespace moe::cache {

void TrackingPolicy::Configure(const PolicyConfig& config) {
  CachePolicy::Configure(config);
  last_use_.assign(cells(), 0);
  insert_time_.assign(cells(), 0);
  residents_.assign(config.num_layers, 0);
}

void TrackingPolicy::OnAccess(const ExpertKey& key, Phase phase, bool hit) {
  last_use_[Index(key)] = ++clock_;
}

void TrackingPolicy::OnInsert(const ExpertKey& key, bool prefetch) {
  const int i = Index(key);
  insert_time_[i] = ++clock_;
  last_use_[i] = clock_;
  ++residents_[key.layer];
}

void TrackingPolicy::OnEvict(const ExpertKey& key) { --residents_[key.layer]; }

int TrackingPolicy::FairShareLayer(absl::Span<const ExpertKey> candidates,
                                   int routed_layer) const {
  int best = -1;
  double best_over = -std::numeric_limits<double>::infinity();
  const double share = layer_share();
  for (const ExpertKey& k : candidates) {
    if (k.layer == routed_layer || k.layer == best) continue;
    const double over = residents_[k.layer] - share;
    if (over > best_over) {
      best_over = over;
      best = k.layer;
    }
  }
  return best >= 0 ? best : routed_layer;
}

size_t LruPolicy::ChooseVictim(absl::Span<const ExpertKey> candidates,
                               const VictimContext& context) {
  return ArgMin(candidates, -1, [&](const ExpertKey& k) { return last_use(k); });
}

void LfuPolicy::Configure(const PolicyConfig& config) {
  TrackingPolicy::Configure(config);
  counts_.assign(cells(), 0);
}

void LfuPolicy::OnAccess(const ExpertKey& key, Phase phase, bool hit) {
  TrackingPolicy::OnAccess(key, phase, hit);
  ++counts_[Index(key)];
}

size_t LfuPolicy::ChooseVictim(absl::Span<const ExpertKey> candidates,
                               const VictimContext& context) {
  return ArgMin(candidates, -1, [&](const ExpertKey& k) { return counts_[Index(k)]; });
}

size_t LruLayerPolicy::ChooseVictim(absl::Span<const ExpertKey> candidates,
                                    const VictimContext& context) {
  auto lru = [&](const ExpertKey& k) { return last_use(k); };
  if (residents(context.layer) >= layer_share()) {
    size_t own = ArgMin(candidates, context.layer, lru);
    if (own < candidates.size()) return own;
  }
  const int layer = FairShareLayer(candidates, context.layer);
  size_t pick = ArgMin(candidates, layer, lru);
  return pick < candidates.size() ? pick : ArgMin(candidates, -1, lru);
}

void MinVisitPolicy::Configure(const PolicyConfig& config) {
  TrackingPolicy::Configure(config);
  visits_.assign(cells(), 0);
}

void MinVisitPolicy::OnAccess(const ExpertKey& key, Phase phase, bool hit) {
  TrackingPolicy::OnAccess(key, phase, hit);
  ++visits_[Index(key)];
}

void MinVisitPolicy::OnInsert(const ExpertKey& key, bool prefetch) {
  TrackingPolicy::OnInsert(key, prefetch);
  visits_[Index(key)] = 0;
}

size_t MinVisitPolicy::ChooseVictim(absl::Span<const ExpertKey> candidates,
                                    const VictimContext& context) {
  return ArgMin(candidates, -1, [&](const ExpertKey& k) { return visits_[Index(k)]; });
}

void StaticPopularPolicy::Configure(const PolicyConfig& config) {
  TrackingPolicy::Configure(config);
  tokens_ = oracle_;
  tokens_.resize(cells(), 0);
}

void StaticPopularPolicy::OnRoute(const RequestOwner& owner, int layer, Phase phase,
                                  absl::Span<const ExpertDemand> demands) {
  if (!oracle_.empty()) return;
  for (const ExpertDemand& d : demands) tokens_[layer * config_.num_experts + d.expert] += d.tokens;
}

size_t StaticPopularPolicy::ChooseVictim(absl::Span<const ExpertKey> candidates,
                                         const VictimContext& context) {
  return ArgMin(candidates, -1, [&](const ExpertKey& k) { return tokens_[Index(k)]; });
}

bool StaticPopularPolicy::AdmitBehind(const ExpertKey& key, const ExpertKey* victim) const {
  return victim == nullptr || tokens_[Index(key)] > tokens_[Index(*victim)];
}

void StaticPopularPolicy::ExportLearned(LearnedState* state) const {
  if (oracle_.empty()) state->popularity = tokens_;
}

void StaticPopularPolicy::ImportLearned(const LearnedState& state) {
  if (oracle_.empty() && state.popularity.size() == tokens_.size()) {
    tokens_ = state.popularity;
  }
}

std::vector<ExpertKey> StaticPopularPolicy::WarmSet(int slots) const {
  std::vector<int> cells;
  for (int c = 0; c < static_cast<int>(tokens_.size()); ++c) {
    if (tokens_[c] > 0) cells.push_back(c);
  }
  std::stable_sort(cells.begin(), cells.end(),
                   [&](int a, int b) { return tokens_[a] > tokens_[b]; });
  if (static_cast<int>(cells.size()) > slots) cells.resize(std::max(0, slots));
  std::vector<ExpertKey> keys;
  for (int c : cells) keys.push_back({c / config_.num_experts, c % config_.num_experts});
  return keys;
}

std::vector<ExpertKey> StaticLayersPolicy::WarmSet(int slots) const {
  std::vector<ExpertKey> keys;
  const int layers = std::min(config_.num_layers, std::max(0, slots) / config_.num_experts);
  for (int l = 0; l < layers; ++l) {
    for (int e = 0; e < config_.num_experts; ++e) keys.push_back({l, e});
  }
  return keys;
}

size_t StaticLayersPolicy::ChooseVictim(absl::Span<const ExpertKey> candidates,
                                        const VictimContext& context) {
  // The highest layer first (it should not be resident), LRU within it.
  return ArgMin(candidates, -1, [&](const ExpertKey& k) {
    return static_cast<double>(config_.num_layers - k.layer) * 1e18 +
           static_cast<double>(last_use(k));
  });
}

bool StaticLayersPolicy::AdmitBehind(const ExpertKey& key, const ExpertKey* victim) const {
  return key.layer < resident_layers() &&
         (victim == nullptr || victim->layer >= resident_layers());
}

namespace {

class BeladyPolicy : public CachePolicy {
 public:
  // `foresight`: also admits copies behind by next use and proposes the
  // experts the next layers of this iteration use (the "oracle" policy).
  BeladyPolicy(const std::vector<std::vector<ExpertKey>>& groups, bool foresight)
      : groups_(groups), foresight_(foresight) {}

  std::string name() const override { return foresight_ ? "oracle" : "belady"; }

  void Configure(const PolicyConfig& config) override {
    CachePolicy::Configure(config);
    uses_.assign(cells(), {});
    cursor_.assign(cells(), 0);
    for (size_t g = 0; g < groups_.size(); ++g) {
      for (const ExpertKey& k : groups_[g]) uses_[Index(k)].push_back(static_cast<int64_t>(g));
    }
  }

  void OnRoute(const RequestOwner& owner, int layer, Phase phase,
               absl::Span<const ExpertDemand> demands) override {
    ++group_;
  }

  size_t ChooseVictim(absl::Span<const ExpertKey> candidates,
                      const VictimContext& context) override {
    size_t best = 0;
    int64_t best_next = -1;
    for (size_t i = 0; i < candidates.size(); ++i) {
      const int64_t next = NextUse(Index(candidates[i]));
      if (next > best_next) {
        best_next = next;
        best = i;
      }
    }
    return best;
  }

  // A copy behind pays when the key is used again before the victim.
  bool AdmitBehind(const ExpertKey& key, const ExpertKey* victim) const override {
    if (!foresight_) return true;
    const int64_t next = NextUse(Index(key));
    if (next == std::numeric_limits<int64_t>::max()) return false;
    return victim == nullptr || next < NextUse(Index(*victim));
  }

  // Exactly the experts the rest of this iteration routes to: groups
  // group_ + 1.. are the same iteration's later layers while their layer
  // grows.
  void ProposePrefetch(const RequestOwner& owner, int routed_layer,
                       std::vector<ExpertHint>* out) override {
    if (!foresight_) return;
    for (int l = routed_layer + 1; l < config_.num_layers; ++l) {
      const int64_t g = group_ + (l - routed_layer);
      if (g < 0 || g >= static_cast<int64_t>(groups_.size())) break;
      for (const ExpertKey& k : groups_[g]) {
        if (k.layer != l) return;  // the next iteration already
        out->push_back(ExpertHint{l, k.expert, 1.0f, HintSource::kPolicy});
      }
    }
  }
  int PrefetchDistance(const RequestOwner& owner) const override {
    return foresight_ ? std::max(1, config_.num_layers - 1) : 1;
  }
  int MaxPrefetchDistance() const override { return PrefetchDistance(RequestOwner{}); }

 private:
  // First use strictly after the current group; max int64 if none. The
  // cursors only move forward as group_ does (hence mutable).
  int64_t NextUse(int cell) const {
    const auto& u = uses_[cell];
    size_t& c = cursor_[cell];
    while (c < u.size() && u[c] <= group_) ++c;
    return c < u.size() ? u[c] : std::numeric_limits<int64_t>::max();
  }

  std::vector<std::vector<ExpertKey>> groups_;
  const bool foresight_;
  std::vector<std::vector<int64_t>> uses_;
  mutable std::vector<size_t> cursor_;
  int64_t group_ = -1;
};

}  // namespace

std::vector<std::string> OnlinePolicyNames() {
  return {"lru",          "lfu",          "lru-layer",     "minvisit",
          "expertflow",   "moe-infinity-paper", "moe-infinity", "static-popular",
          "static-layers"};
}

absl::StatusOr<std::unique_ptr<CachePolicy>> MakePolicy(const std::string& spec,
                                                        const PolicyConfig& config) {
  const size_t colon = spec.find(':');
  const std::string name = spec.substr(0, colon);
  const std::string opts = colon == std::string::npos ? "" : spec.substr(colon + 1);
  std::unique_ptr<CachePolicy> policy;
  if (name == "moe-infinity" || name == "moe-infinity-paper") {
    MoeInfinityOptions o = name == "moe-infinity" ? MoeInfinityOptions::Improved()
                                                  : MoeInfinityOptions::Paper();
    if (!opts.empty()) {
      auto st = ParseMoeInfinityOptions(opts, &o);
      if (!st.ok()) return st;
    }
    policy = std::make_unique<MoeInfinityPolicy>(o, spec);
  } else if (!opts.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("policy \"", name, "\" takes no options"));
  } else if (name == "lru") {
    policy = std::make_unique<LruPolicy>();
  } else if (name == "lfu") {
    policy = std::make_unique<LfuPolicy>();
  } else if (name == "lru-layer") {
    policy = std::make_unique<LruLayerPolicy>();
  } else if (name == "minvisit") {
    policy = std::make_unique<MinVisitPolicy>();
  } else if (name == "expertflow") {
    policy = std::make_unique<ExpertFlowPolicy>();
  } else if (name == "static-popular") {
    policy = std::make_unique<StaticPopularPolicy>();
  } else if (name == "static-layers") {
    policy = std::make_unique<StaticLayersPolicy>();
  } else if (name == "belady" || name == "static-popular-oracle") {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " needs the future: simulator only"));
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown policy \"", name,
        "\" (lru, lfu, lru-layer, minvisit, expertflow, moe-infinity, moe-infinity-paper, "
        "static-popular, static-layers)"));
  }
  if (config.num_layers <= 0 || config.num_experts <= 0 || config.capacity < 0) {
    return absl::InvalidArgumentError(
        "policy config needs positive layers and experts and a capacity >= 0");
  }
  policy->Configure(config);
  return policy;
}

std::unique_ptr<CachePolicy> MakeOraclePopularPolicy(std::vector<double> tokens,
                                                     const PolicyConfig& config) {
  auto p = std::make_unique<StaticPopularPolicy>(std::move(tokens));
  p->Configure(config);
  return p;
}

std::unique_ptr<CachePolicy> MakeBeladyPolicy(
    const std::vector<std::vector<ExpertKey>>& groups, const PolicyConfig& config) {
  auto p = std::make_unique<BeladyPolicy>(groups, /*foresight=*/false);
  p->Configure(config);
  return p;
}

std::unique_ptr<CachePolicy> MakeOraclePolicy(
    const std::vector<std::vector<ExpertKey>>& groups, const PolicyConfig& config) {
  auto p = std::make_unique<BeladyPolicy>(groups, /*foresight=*/true);
  p->Configure(config);
  return p;
}

}  // namespace moe::cache
