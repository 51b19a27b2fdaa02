#include "services/cache/predictor.h"

#include <algorithm>

namespace moe::cache {

Predictor::Predictor(const PredictorOptions& o)
    : options_(o),
      eamc_(EamcOptions{o.num_layers, o.num_experts, o.eamc_capacity,
                        o.max_experts_per_layer, false, o.query_mass}),
      prefill_(o.num_layers, o.num_experts),
      decode_(o.num_layers, o.num_experts),
      predicted_(static_cast<size_t>(o.num_layers) * o.num_experts, 0.0f) {}

void Predictor::BeginRequest() {
  prefill_.Clear();
  decode_.Clear();
  std::fill(predicted_.begin(), predicted_.end(), 0.0f);
  has_prediction_ = false;
  confidence_ = 0;
}

void Predictor::EndRequest() {
  eamc_.Add(prefill_, decode_);
  BeginRequest();
}

void Predictor::Record(int layer, int expert, float tokens, trace::Phase phase) {
  (phase == trace::Phase::kPrefill ? prefill_ : decode_).Add(layer, expert, tokens);
}

void Predictor::Refresh(trace::Phase phase) {
  const bool use_decode = phase == trace::Phase::kDecode && !decode_.empty();
  const Eam& query = use_decode ? decode_ : prefill_;
  std::fill(predicted_.begin(), predicted_.end(), 0.0f);
  has_prediction_ = false;
  confidence_ = 0;
  if (query.empty()) return;
  std::vector<EamcMatch>& matches = matches_;
  eamc_.FindBest(query, use_decode ? EamPhase::kDecode : EamPhase::kPrefill,
                 options_.match_top_k, &matches);
  if (matches.empty()) return;
  for (const auto& m : matches) {
    const EamcRecord& r = eamc_.record(m.index);
    const SparseEam& part = r.decode.empty() ? r.prefill : r.decode;
    for (const auto& e : part.entries()) predicted_[e.index] += e.value;
  }
  const int E = options_.num_experts;
  for (int l = 0; l < options_.num_layers; ++l) {
    float* row = &predicted_[static_cast<size_t>(l) * E];
    float sum = 0;
    for (int e = 0; e < E; ++e) sum += row[e];
    if (sum > 0) {
      for (int e = 0; e < E; ++e) row[e] /= sum;
    }
  }
  has_prediction_ = true;
  confidence_ = matches[0].cosine;
}

}  // namespace moe::cache
