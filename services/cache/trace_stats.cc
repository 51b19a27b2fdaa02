#include "services/cache/trace_stats.h"

#include <algorithm>

#include "common/status_macros.h"

namespace moe::trace {
namespace {

double Ratio(int64_t num, int64_t den) {
  return den > 0 ? static_cast<double>(num) / static_cast<double>(den) : 0.0;
}

// Adds one (token, layer) pair; `hints` is not empty.
void AddPair(const std::vector<int32_t>& routed, std::vector<int32_t> hints,
             HintCounts* c) {
  std::sort(hints.begin(), hints.end());
  hints.erase(std::unique(hints.begin(), hints.end()), hints.end());
  ++c->hinted_pairs;
  c->routed += static_cast<int64_t>(routed.size());
  c->hinted += static_cast<int64_t>(hints.size());
  for (int32_t e : routed) {
    if (std::binary_search(hints.begin(), hints.end(), e)) ++c->correct;
  }
}

}  // namespace

double HintCounts::recall() const { return Ratio(correct, routed); }
double HintCounts::precision() const { return Ratio(correct, hinted); }

absl::StatusOr<HintStats> ComputeHintStats(const Trace& trace) {
  const int L = trace.header.num_layers;
  HintStats s;
  s.per_layer.assign(std::max(L, 0), HintCounts{});
  for (const TraceRequest& r : trace.requests) {
    RETURN_IF_ERROR(ValidateRequest(trace.header, r));
    if (r.hints.empty()) continue;
    bool any = false;
    for (int t = 0; t < r.num_tokens(); ++t) {
      for (int l = 0; l < L; ++l) {
        if (r.hints[t][l].empty()) continue;
        any = true;
        AddPair(r.experts[t][l], r.hints[t][l], &s.per_layer[l]);
      }
    }
    s.requests_with_hints += any ? 1 : 0;
  }
  for (const HintCounts& c : s.per_layer) {
    s.hinted_pairs += c.hinted_pairs;
    s.routed += c.routed;
    s.hinted += c.hinted;
    s.correct += c.correct;
  }
  return s;
}

nlohmann::json HintStatsJson(const HintStats& s) {
  nlohmann::json j;
  j["recall"] = s.recall();
  j["precision"] = s.precision();
  j["hinted_pairs"] = s.hinted_pairs;
  j["routed"] = s.routed;
  j["hinted"] = s.hinted;
  j["correct"] = s.correct;
  j["requests_with_hints"] = s.requests_with_hints;
  nlohmann::json per = nlohmann::json::array();
  for (const HintCounts& c : s.per_layer) {
    per.push_back(c.hinted_pairs > 0 ? nlohmann::json(c.recall())
                                     : nlohmann::json(nullptr));
  }
  j["per_layer_recall"] = per;
  return j;
}

}  // namespace moe::trace
