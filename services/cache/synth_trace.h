// A synthetic `moe-trace/1` generator for development and tests, shaped by
// what MoE papers report about real routing:
//  - requests fall into activation groups (`groups`, 10-30 in the papers);
//    each group has, per layer, a small core of heavily reused experts;
//  - a request's working set per layer is its group's core with some members
//    swapped at random (`set_noise`), and a token picks from that set with
//    probability `in_set` (else from a per-layer skewed global popularity);
//  - consecutive tokens repeat their first-choice expert with probability
//    `repeat` on top of that (Mixtral: ~14-28% against 12.5% chance);
//  - a token's first choice at layer l+1 follows its choice at layer l
//    (same rank in the working set) with probability `layer_affinity`;
//  - the next request's group is the previous one with probability
//    `stickiness`, else uniformly random (switches are unpredictable);
//  - prefill tokens are more spread (`prefill_in_set`);
//  - optional hints: each routed expert appears in the hint of its layer with
//    probability `hint_accuracy`, else a random expert stands in (0 = none).
#ifndef MOECACHE_SERVICES_CACHE_SYNTH_TRACE_H_
#define MOECACHE_SERVICES_CACHE_SYNTH_TRACE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "services/cache/trace.h"

namespace moe::trace {

struct SynthOptions {
  std::string model = "synthetic";
  int num_layers = 32;
  int num_experts = 8;
  int top_k = 2;
  int requests = 40;
  int prefill_tokens = 64;   // mean; each request draws in [mean/2, 3*mean/2]
  int decode_tokens = 128;   // mean; same spread
  int groups = 16;
  int working_set = 0;       // experts per layer per request; 0 = from E (25% for
                             // E <= 16, else 5%, at least 1)
  double in_set = 0.85;      // a decode choice comes from the working set
  double prefill_in_set = 0.6;
  double set_noise = 0.25;   // per member: replaced by a random expert
  double repeat = 0.15;      // repeat the previous token's first choice
  double layer_affinity = 0.4;
  double stickiness = 0.2;   // next request keeps the group
  double popularity_skew = 0.8;  // Zipf exponent of the per-layer popularity
  double hint_accuracy = 0.0;
  uint64_t seed = 1;
};

absl::Status ValidateSynthOptions(const SynthOptions& options);

// Knob settings that reproduce regimes seen in real routing traces (held out
// of the repository), where eviction alone does badly:
//   "mixtral-uniform": 32 layers x 8 experts, top-2, near-uniform popularity
//     in each layer, consecutive decode tokens sharing about half of a
//     layer's experts, 4 requests of ~150 decode tokens, no prompt
//     (per-layer LRU beat moe-infinity by 1-7% there);
//   "wide-256": 40 layers x 256 experts, top-8, one request with a ~30-token
//     prompt and ~130 decode tokens (LRU beat it by 5% at 5120 slots).
// INVALID_ARGUMENT for another name.
absl::StatusOr<SynthOptions> SynthRegime(const std::string& name);

absl::StatusOr<Trace> GenerateSyntheticTrace(const SynthOptions& options);

}  // namespace moe::trace

#endif  // MOECACHE_SERVICES_CACHE_SYNTH_TRACE_H_
