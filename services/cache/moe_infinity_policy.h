// moe-infinity: the EAMC-based policy of MoE-Infinity (arXiv 2401.14361),
// faithful by default in "paper" mode, plus switchable improvements learned
// from replaying real traces (docs/architecture.md, "Policies").
//
// Paper mode (moe-infinity-paper): per request, iteration EAMs accumulate into
// prefill and decode request EAMs; at every iteration the current phase's EAM
// is matched (cosine) against the EAMC, the best matches are summed and each
// layer row normalised (pEAM); a victim is the candidate with the lowest
//   (pEAM[l][e] + eps) / sum(pEAM[l]) * (1 - l/L)
// (the request's own EAM stands in while nothing matched), ties LRU; prefetch
// proposes the next layers' likely experts, weighted by 1 - (i - l)/L.
//
// Improvements (moe-infinity), each an option:
//   fair_share    rank candidates within equal per-layer shares C/L; evict
//                 from the layer furthest over its share; the routed layer
//                 may borrow.
//   lrfu          request-scoped decayed frequency (+1 per decode use, a
//                 prefill pass adds the expert's token share; halves every
//                 `half_life` tokens) instead of pure recency.
//   next_visit    an expert used at this layer's last token keeps at least
//                 the learned per-layer probability of reuse at the next.
//   unused_first  in decode, experts no decode token of this request used
//                 (and not predicted) go first.
//   confidence    the prediction weighs in by the best match's cosine;
//                 recency/frequency takes the rest (all of it when nothing
//                 matched).
//   layer_factor  the paper's (1 - l/L) factor (on in paper mode only).
//
// lazy_prediction (on in both modes): each iteration's prediction is
// matched against the EAMC only when a victim or a prefetch reads it
// (Predictor::Prepare / Resolve), with the same result; every pending one is
// resolved before the EAMC changes. A cache whose demands all hit (a batch
// of 16 served from resident experts: 16 matchings a step before) matches
// nothing.
#ifndef MOECACHE_SERVICES_CACHE_MOE_INFINITY_POLICY_H_
#define MOECACHE_SERVICES_CACHE_MOE_INFINITY_POLICY_H_

#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "services/cache/policies.h"
#include "services/cache/predictor.h"

namespace moe::cache {

struct MoeInfinityOptions {
  bool fair_share = false;
  bool lrfu = false;
  bool next_visit = false;
  bool unused_first = false;
  bool confidence = false;
  bool layer_factor = true;
  bool lazy_prediction = true;
  double half_life = 16;  // tokens
  int match_top_k = 4;
  int eamc_capacity = 1000;
  int max_experts_per_layer = 0;  // 0 = automatic (all for E <= 16, else 2*top_k)
  // Matching speed: a query keeps the cells holding this fraction of its
  // squared norm (EamcOptions::query_mass).
  double query_mass = 0.99;
  int prefetch_layers = 1;        // how many next layers prefetch proposals cover
  float eps = 1e-3f;

  static MoeInfinityOptions Paper() { return MoeInfinityOptions(); }
  static MoeInfinityOptions Improved();
};

// Parses "key=value,..." (keys as the fields; booleans 0/1/on/off/true/false).
absl::Status ParseMoeInfinityOptions(const std::string& text, MoeInfinityOptions* options);

// Per-request state (activation matrices, LRFU scores, decode use, the
// previous decode token's experts) is kept per owner; victims and retention
// values take the best value over live owners, prefetch proposals come from
// the proposing owner's prediction. The EAMC and next-visit statistics are
// shared (learned across requests, persisted).
class MoeInfinityPolicy : public TrackingPolicy {
 public:
  MoeInfinityPolicy(const MoeInfinityOptions& options, std::string name);

  std::string name() const override { return name_; }
  void Configure(const PolicyConfig& config) override;
  void OnBeginRequest(const RequestOwner& owner) override;
  void OnEndRequest(const RequestOwner& owner) override;
  void OnBeginIteration(const RequestOwner& owner, Phase phase) override;
  void OnRoute(const RequestOwner& owner, int layer, Phase phase,
               absl::Span<const ExpertDemand> demands) override;
  size_t ChooseVictim(absl::Span<const ExpertKey> candidates,
                      const VictimContext& context) override;
  double RetentionValue(const ExpertKey& key) const override;
  void ProposePrefetch(const RequestOwner& owner, int routed_layer,
                       std::vector<ExpertHint>* out) override;
  // The EAMC records and the next-visit statistics.
  void ExportLearned(LearnedState* state) const override;
  void ImportLearned(const LearnedState& state) override;

  int EamcEntries() const override { return predictor_->eamc().size(); }
  const MoeInfinityOptions& options() const { return options_; }
  // The live request's activity (prediction), or null if `owner` has none.
  const Predictor::Activity* ActivityForTest(const RequestOwner& owner) const;
  int live_requests() const { return static_cast<int>(requests_.size()); }

 private:
  struct RequestState {
    // Mutable: resolving a pending prediction (Prediction()) is a read.
    mutable Predictor::Activity activity;
    int64_t token = 0;  // iterations of this request so far
    // Per cell.
    std::vector<double> lrfu;
    std::vector<int64_t> lrfu_token;
    std::vector<uint8_t> decode_used;          // a decode token used it
    std::vector<int64_t> last_decode_token;    // token of its last decode use
    // Per layer: experts at the last decode token.
    std::vector<std::vector<int32_t>> prev_decode;
  };
  RequestState& State(const RequestOwner& owner);
  // r's activity with its prediction resolved.
  const Predictor::Activity& Prediction(const RequestState& r) const;
  // Resolves every live request's pending prediction (before the EAMC
  // changes).
  void ResolveAll();
  double Lrfu(const RequestState& r, int cell) const;
  // Probability-like value of keeping `key` for one request (improved mode).
  double Value(const RequestState& r, const ExpertKey& key) const;
  // The best Value over live requests (0 when none is live).
  double BestValue(const ExpertKey& key) const;
  double PaperPriority(const ExpertKey& key) const;

  MoeInfinityOptions options_;
  std::string name_;
  std::unique_ptr<Predictor> predictor_;
  double decay_per_token_ = 0;
  absl::flat_hash_map<RequestOwner, std::unique_ptr<RequestState>> requests_;
  // Per layer: next-visit statistics (learned across requests).
  std::vector<double> reuse_hits_;
  std::vector<double> reuse_total_;
};

}  // namespace moe::cache

#endif  // MOECACHE_SERVICES_CACHE_MOE_INFINITY_POLICY_H_
