// Predictor: MoE-Infinity's activation tracking and EAM prediction.
//
// Tracks the running request's EAMs (prefill and decode separately), and on
// Refresh() matches the current phase's EAM against the EAMC (cosine), sums
// the `match_top_k` best records' decode parts and normalises each layer row:
// the predicted EAM (pEAM). `confidence()` is the best match's cosine (0 when
// nothing matched). EndRequest() stores the finished request in the EAMC.
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
  explicit Predictor(const PredictorOptions& options);

  void BeginRequest();
  // Stores the request in the EAMC (if it routed anything) and clears it.
  void EndRequest();
  void Record(int layer, int expert, float tokens, trace::Phase phase);

  // Recomputes the pEAM from the EAM of `phase` so far (decode falls back to
  // prefill while no decode token has been recorded).
  void Refresh(trace::Phase phase);

  bool has_prediction() const { return has_prediction_; }
  double confidence() const { return confidence_; }
  // Row-normalised prediction in [0, 1]; each row sums to 1 (or 0).
  float Predicted(int layer, int expert) const {
    return predicted_[static_cast<size_t>(layer) * options_.num_experts + expert];
  }

  const Eam& prefill_eam() const { return prefill_; }
  const Eam& decode_eam() const { return decode_; }
  Eamc& eamc() { return eamc_; }
  const Eamc& eamc() const { return eamc_; }

 private:
  PredictorOptions options_;
  Eamc eamc_;
  Eam prefill_;
  Eam decode_;
  std::vector<float> predicted_;
  std::vector<EamcMatch> matches_;  // scratch
  bool has_prediction_ = false;
  double confidence_ = 0;
};

}  // namespace moe::cache

#endif  // MOECACHE_SERVICES_CACHE_PREDICTOR_H_
