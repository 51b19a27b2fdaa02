// The speed side of a plan (plan.h says how it is estimated).
#ifndef MOECACHE_SERVICES_PLAN_PREDICT_H_
#define MOECACHE_SERVICES_PLAN_PREDICT_H_

#include "absl/status/statusor.h"
#include "common/model_config.h"
#include "services/plan/plan.h"

namespace moe::plan {

struct Rates {
  double layer_ms = 0;             // decode compute per MoE layer per step
  double decode_tokens_per_s = 0;  // all sequences of a step together
  double prefill_tokens_per_s = 0;
  bool simulated = false;          // the simulator ran (else the closed form)
};

// Weight bytes one decode step of `sequences` reads per MoE layer: the
// non-expert matrices (less the embedding, of which a step reads rows,
// unless it is tied to the output head)
// spread over the MoE layers, and the routed experts the step's tokens
// choose (at most every expert of the layer). REQUIRES: `m` from
// ComputeFigures(config, ...).
double DecodeBytesPerLayer(const ModelConfig& config, const ModelFigures& m, int sequences);

// REQUIRES: `plan`'s memory side is filled in (slots, miss mode, options).
absl::StatusOr<Rates> PredictRates(const ModelConfig& config, const Plan& plan);

}  // namespace moe::plan

#endif  // MOECACHE_SERVICES_PLAN_PREDICT_H_
