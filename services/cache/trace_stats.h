// How good a trace's pre-gating hints were (design.md "Trace format",
// "hints"): for every (token, layer) whose hint list is not empty,
//   recall    = |hinted ∩ routed| / |routed|
//   precision = |hinted ∩ routed| / |hinted|
// summed over those pairs before dividing (micro-averaged), hinted experts
// counted once each. Pairs with no hint (MoE layer 0, prefill tokens, requests
// recorded with pre-gating off) are left out, so the figures say how good the
// predictions that were made are, not how many were made.
//
//   ASSIGN_OR_RETURN(trace::Trace t, trace::ReadTraceFile(path));
//   ASSIGN_OR_RETURN(trace::HintStats s, trace::ComputeHintStats(t));
//   if (s.hinted_pairs > 0) printf("recall %.3f\n", s.recall());
//
// Thread-safety: plain functions over values.
#ifndef MOECACHE_SERVICES_CACHE_TRACE_STATS_H_
#define MOECACHE_SERVICES_CACHE_TRACE_STATS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "services/cache/trace.h"

namespace moe::trace {

struct HintCounts {
  int64_t hinted_pairs = 0;  // (token, layer) pairs with a non-empty hint
  int64_t routed = 0;        // experts routed in those pairs
  int64_t hinted = 0;        // distinct experts hinted in those pairs
  int64_t correct = 0;       // hinted and routed

  // 0 when there is nothing to divide by.
  double recall() const;
  double precision() const;
};

struct HintStats : HintCounts {
  int requests_with_hints = 0;
  std::vector<HintCounts> per_layer;  // [num_layers]
};

// INVALID_ARGUMENT when a request does not fit the header (ValidateRequest).
absl::StatusOr<HintStats> ComputeHintStats(const Trace& trace);

// {"recall", "precision", "hinted_pairs", "routed", "hinted", "correct",
//  "requests_with_hints", "per_layer_recall": [...]}.
nlohmann::json HintStatsJson(const HintStats& stats);

}  // namespace moe::trace

#endif  // MOECACHE_SERVICES_CACHE_TRACE_STATS_H_
