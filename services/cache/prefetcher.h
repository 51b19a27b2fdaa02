// Prefetcher: where prefetch candidates come from and whether one pays.
//
// Candidate sources for a target layer, merged by the highest probability:
//  - hints (e.g. the worker applying the next layer's router early), with the
//    probability set to the hints' measured precision;
//  - inter-layer affinity learned online from decode tokens: P(b at layer
//    l+d | a at layer l), for the experts routed at l this iteration;
//  - the policy's own proposals (moe-infinity's predicted EAM).
//
// Gate (docs/architecture.md, "Prefetch"), "when in doubt, do not": issue
// only if
//   p * min(X, T) > (1 - p) * value(victim) * X + C
// with X the transfer time of one expert, T the layer compute time (fixed,
// or estimated online: ObserveLayerSeconds), value the victim's retention
// value in [0, 1], C the link time of the rest of one in-flight prefetch
// chunk, which a demand fetch may wait behind (ChunkWaitSeconds), and
// p the candidate's probability calibrated per source: hints carry their
// measured precision; affinity and policy proposals are multiplied by that
// source's (used + 1) / (sum of predicted p + 1), free to fall towards 0
// when its prefetches go unused (no floor: a floor let useless prefetches
// through whenever the victim looked worthless).
//
// Thread-safety: none (used under the cache's mutex).
#ifndef MOECACHE_SERVICES_CACHE_PREFETCHER_H_
#define MOECACHE_SERVICES_CACHE_PREFETCHER_H_

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "services/cache/eamc_store.h"
#include "services/cache/policy.h"

namespace moe::cache {

// C: a demand waits behind at most the rest of ONE in-flight chunk of a
// prefetch, and a chunk never exceeds the transfer (one expert), so
// min(chunk_bytes, expert_bytes) / link. 0 without a link rate or a chunk.
double ChunkWaitSeconds(uint64_t chunk_bytes, uint64_t expert_bytes,
                        double link_bytes_per_sec);

struct PrefetcherOptions {
  int num_layers = 0;
  int num_experts = 0;
  double transfer_seconds = 0;  // X: one expert over the link
  // T: > 0 fixed; 0 estimated online (ObserveLayerSeconds), and until the
  // first observation T = 0, which refuses every prefetch.
  double layer_seconds = 0;
  double chunk_seconds = 0;     // C (ChunkWaitSeconds)
  bool gate = true;
  int max_lag = 3;  // affinity lags learned (1 only when E > 64)
};

class Prefetcher {
 public:
  explicit Prefetcher(const PrefetcherOptions& options);

  // What is routed and hinted is per owner (a request's iteration); what is
  // learned from it (affinity, calibration, hint precision) is shared.
  void BeginIteration(const RequestOwner& owner, Phase phase);
  // Layer routed: learns affinity (decode) and hint precision.
  void OnRoute(const RequestOwner& owner, int layer, Phase phase,
               absl::Span<const ExpertDemand> demands);
  // A hint for a later layer of `owner`; kept until that layer routes.
  // REQUIRES: hint.layer in range (validated by the caller).
  void AddHint(const RequestOwner& owner, const ExpertHint& hint);
  // Forgets `owner`'s iteration (its request ended).
  void EndRequest(const RequestOwner& owner) { owners_.erase(owner); }

  // Candidates for `owner`'s `target_layer`, best first; `proposals` may
  // hold any layers (others are ignored).
  std::vector<ExpertHint> Candidates(const RequestOwner& owner, int target_layer,
                                     const std::vector<ExpertHint>& proposals) const;

  bool Gate(const ExpertHint& candidate, double victim_value) const;
  // One observed compute time of a layer (seconds >= 0), folded into an EWMA
  // (weight kLayerEwmaWeight; the first sets it). Ignored when T is fixed.
  void ObserveLayerSeconds(double seconds);
  // T as the gate uses it: the fixed value, else the estimate (0 before any
  // observation).
  double layer_seconds() const {
    return options_.layer_seconds > 0 ? options_.layer_seconds : layer_ewma_;
  }
  static constexpr double kLayerEwmaWeight = 0.125;
  double Calibrated(const ExpertHint& candidate) const;

  void OnIssued(const ExpertHint& candidate);
  void OnOutcome(HintSource source, bool used);

  // Inter-layer affinity counts, for persistence (eamc_store.h). Import takes
  // the lags both sides have.
  void ExportLearned(LearnedState* state) const;
  void ImportLearned(const LearnedState& state);

  double accuracy_scale(HintSource source) const;
  double hint_precision() const {
    return (hint_hits_ + 1.0) / (hint_total_ + 2.0);
  }
  int max_lag() const { return max_lag_; }

 private:
  size_t AffIndex(int lag, int layer, int a, int b) const;
  float Affinity(int lag, int layer, int a, int b) const {
    return aff_[AffIndex(lag, layer, a, b)];
  }

  struct OwnerState {
    std::vector<std::vector<int32_t>> routed;  // this iteration, per layer
    std::vector<std::vector<int32_t>> hints;   // per layer, until it routes
  };
  OwnerState& State(const RequestOwner& owner);

  PrefetcherOptions options_;
  int max_lag_;
  std::vector<float> aff_;                    // [lag-1][layer][a][b] counts
  std::vector<float> aff_from_;               // [lag-1][layer][a] counts
  absl::flat_hash_map<RequestOwner, OwnerState> owners_;
  double layer_ewma_ = 0;
  int64_t layer_samples_ = 0;
  double hint_hits_ = 0;
  double hint_total_ = 0;
  double predicted_sum_[kNumHintSources] = {0, 0, 0};
  double used_[kNumHintSources] = {0, 0, 0};
};

}  // namespace moe::cache

#endif  // MOECACHE_SERVICES_CACHE_PREFETCHER_H_
