// Predictor: MoE-Infinity's activation tracking and EAM prediction.
//
// Tracks a request's EAMs (prefill and decode separately) in an Activity
// (one per live request), and on Refresh() matches the current phase's EAM
// against the EAMC (cosine), sums the `match_top_k` best records' decode
// parts and normalises each layer row: the predicted EAM (pEAM). Prepare()
// and Resolve() are Refresh in two halves: the query taken now, the
// matching (most of the cost) only when the prediction is read, which a
// cache whose every demand hits never does.
// `confidence` is the best match's cosine (0 when nothing matched).
// EndRequest() stores the finished request in the shared EAMC.
//
// Thread-safety: none (used under the cache's mutex).
#ifndef MOECACHE_SERVICES_CACHE_PREDICTOR_H_
#define MOECACHE_SERVICES_CACHE_PREDICTOR_H_

#include <vector>

#include "services/cache/eam.h"
#include "services/cache/eamc.h"
#include "services/cache/trace.h"

namespace moe::cache {

struct PredictorOptions {
  int num_layers = 0;
  int num_experts = 0;
  int eamc_capacity = 1000;
  int match_top_k = 4;
  int max_experts_per_layer = 0;  // EAMC pruning; 0 = all
  double query_mass = 1.0;        // EamcOptions::query_mass
};

class Predictor {
 public:
  // One request's activations and its prediction.
  struct Activity {
    Eam prefill;
    Eam decode;
    std::vector<float> predicted;  // row-normalised, [layer * E + expert]
    bool has_prediction = false;
    double confidence = 0;
    // Prepared, not yet resolved: the fields above are stale until Resolve.
    bool pending = false;
    trace::Phase pending_phase = trace::Phase::kPrefill;
    Eamc::PreparedQuery query;

    // Row-normalised prediction in [0, 1]; each row sums to 1 (or 0).
    float Predicted(int layer, int expert) const {
      return predicted[static_cast<size_t>(layer) * prefill.num_experts() + expert];
    }
  };

  explicit Predictor(const PredictorOptions& options);

  // An empty activity of this predictor's shape (a request's start).
  Activity NewActivity() const;
  // Stores the request in the EAMC (if it routed anything) and clears it.
  void EndRequest(Activity& activity);
  void Record(Activity& activity, int layer, int expert, float tokens, trace::Phase phase) const;

  // Recomputes the pEAM from the EAM of `phase` so far (decode falls back to
  // prefill while no decode token has been recorded).
  void Refresh(Activity& activity, trace::Phase phase);
  // Refresh deferred: takes the query now and marks the activity pending.
  // Resolve then computes the same pEAM Refresh would have computed here,
  // provided the EAMC did not change first: the caller resolves every
  // pending activity before EndRequest or a change to eamc().
  void Prepare(Activity& activity, trace::Phase phase) const;
  // Completes a pending Prepare (nothing when none is pending).
  void Resolve(Activity& activity);

  Eamc& eamc() { return eamc_; }
  const Eamc& eamc() const { return eamc_; }

 private:
  PredictorOptions options_;
  Eamc eamc_;
  std::vector<EamcMatch> matches_;  // scratch
};

}  // namespace moe::cache

#endif  // MOECACHE_SERVICES_CACHE_PREDICTOR_H_
