// moe-infinity: the EAMC-based policy of MoE-Infinity (arXiv 2401.14361),
// faithful by default in "paper" mode, plus switchable improvements learned
// from replaying real traces (../shared/notes/cache-findings.md).
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
#ifndef MOECACHE_SERVICES_CACHE_MOE_INFINITY_POLICY_H_
#define MOECACHE_SERVICES_CACHE_MOE_INFINITY_POLICY_H_

#include <string>
#include <vector>

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

class MoeInfinityPolicy : public TrackingPolicy {
 public:
  MoeInfinityPolicy(const MoeInfinityOptions& options, std::string name);

  std::string name() const override { return name_; }
  void Configure(const PolicyConfig& config) override;
  void OnBeginRequest() override;
  void OnEndRequest() override;
  void OnBeginIteration(Phase phase) override;
  void OnRoute(int layer, Phase phase, absl::Span<const ExpertDemand> demands) override;
  size_t ChooseVictim(absl::Span<const ExpertKey> candidates,
                      const VictimContext& context) override;
  double RetentionValue(const ExpertKey& key) const override;
  void ProposePrefetch(int routed_layer, std::vector<Hint>* out) override;
  // The EAMC records and the next-visit statistics.
  void ExportLearned(LearnedState* state) const override;
  void ImportLearned(const LearnedState& state) override;

  Predictor& predictor() { return *predictor_; }
  int EamcEntries() const override { return predictor_->eamc().size(); }
  const MoeInfinityOptions& options() const { return options_; }

 private:
  double Lrfu(int cell) const;
  // Probability-like value of keeping `key` (improved mode).
  double Value(const ExpertKey& key) const;
  double PaperPriority(const ExpertKey& key) const;

  MoeInfinityOptions options_;
  std::string name_;
  std::unique_ptr<Predictor> predictor_;
  Phase phase_ = Phase::kDecode;
  int64_t token_ = 0;       // iterations so far
  int64_t request_ = 0;     // requests so far
  int decode_tokens_ = 0;   // in the current request
  double decay_per_token_ = 0;
  // Per cell.
  std::vector<double> lrfu_;
  std::vector<int64_t> lrfu_token_;
  std::vector<int64_t> lrfu_request_;
  std::vector<int64_t> decode_used_request_;  // request id when a decode token used it
  std::vector<int64_t> last_decode_token_;    // token id of its last decode use
  // Per layer: next-visit statistics.
  std::vector<double> reuse_hits_;
  std::vector<double> reuse_total_;
  std::vector<std::vector<int32_t>> prev_decode_;  // experts at the last decode token
};

}  // namespace moe::cache

#endif  // MOECACHE_SERVICES_CACHE_MOE_INFINITY_POLICY_H_
