#include "services/cache/predictor.h"

#include <algorithm>

namespace moe::cache {

Predictor::Predictor(const PredictorOptions& o)
    : options_(o),
      eamc_(EamcOptions{o.num_layers, o.num_experts, o.eamc_capacity,
                        o.max_experts_per_layer, false, o.query_mass}) {}

Predictor::Activity Predictor::NewActivity() const {
  Activity a{Eam(options_.num_layers, options_.num_experts),
             Eam(options_.num_layers, options_.num_experts),
             std::vector<float>(static_cast<size_t>(options_.num_layers) * options_.num_experts,
                                0.0f),
             false, 0};
  return a;
}

void Predictor::EndRequest(Activity& a) {
  eamc_.Add(a.prefill, a.decode);
  a.prefill.Clear();
  a.decode.Clear();
  std::fill(a.predicted.begin(), a.predicted.end(), 0.0f);
  a.has_prediction = false;
  a.confidence = 0;
  a.pending = false;
}

void Predictor::Record(Activity& a, int layer, int expert, float tokens,
                       trace::Phase phase) const {
  (phase == trace::Phase::kPrefill ? a.prefill : a.decode).Add(layer, expert, tokens);
}

void Predictor::Refresh(Activity& a, trace::Phase phase) {
  Prepare(a, phase);
  Resolve(a);
}

void Predictor::Prepare(Activity& a, trace::Phase phase) const {
  const bool use_decode = phase == trace::Phase::kDecode && !a.decode.empty();
  a.pending_phase = use_decode ? trace::Phase::kDecode : trace::Phase::kPrefill;
  a.query.cells.clear();
  a.query.norm = 0;
  const Eam& query = use_decode ? a.decode : a.prefill;
  if (!query.empty()) eamc_.Prepare(query, &a.query);
  a.pending = true;
}

void Predictor::Resolve(Activity& a) {
  if (!a.pending) return;
  a.pending = false;
  std::fill(a.predicted.begin(), a.predicted.end(), 0.0f);
  a.has_prediction = false;
  a.confidence = 0;
  if (a.query.cells.empty()) return;
  std::vector<EamcMatch>& matches = matches_;
  eamc_.FindBest(a.query,
                 a.pending_phase == trace::Phase::kDecode ? EamPhase::kDecode : EamPhase::kPrefill,
                 options_.match_top_k, &matches);
  if (matches.empty()) return;
  for (const auto& m : matches) {
    const EamcRecord& r = eamc_.record(m.index);
    const SparseEam& part = r.decode.empty() ? r.prefill : r.decode;
    for (const auto& e : part.entries()) a.predicted[e.index] += e.value;
  }
  const int E = options_.num_experts;
  for (int l = 0; l < options_.num_layers; ++l) {
    float* row = &a.predicted[static_cast<size_t>(l) * E];
    float sum = 0;
    for (int e = 0; e < E; ++e) sum += row[e];
    if (sum > 0) {
      for (int e = 0; e < E; ++e) row[e] /= sum;
    }
  }
  a.has_prediction = true;
  a.confidence = matches[0].cosine;
}

}  // namespace moe::cache
