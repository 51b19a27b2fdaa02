// The sampler flags of `moectl run`, `moectl generate` and `moectl chat`,
// declared once with serving::Request's defaults (the worker's over gRPC
// and HTTP too), and the request fields they fill:
//   --temperature, --top-k, --top-p, --min-p, --repetition-penalty,
//   --presence-penalty, --frequency-penalty, --logit-bias ID:BIAS
//   (repeatable), --seed (-1: random), --ignore-eos.
// Ranges are serving::Validate's (one bounds table): the flags only parse.
#ifndef MOECACHE_SERVICES_MOECTL_SAMPLING_FLAGS_H_
#define MOECACHE_SERVICES_MOECTL_SAMPLING_FLAGS_H_

#include "absl/status/status.h"
#include "nlohmann/json.hpp"
#include "services/moectl/flags.h"
#include "services/serving/request.h"

namespace moe::moectl {

void DeclareSamplingFlags(FlagSet& f);

// Fills the sampler fields of *request from the parsed flags.
// INVALID_ARGUMENT for a malformed --logit-bias or a --seed below -1.
absl::Status SamplingFromFlags(const FlagSet& f, serving::Request* request);

// The sampler fields of `request` as OpenAI API parameters (seed only when
// set), for `moectl chat`.
nlohmann::ordered_json SamplingJson(const serving::Request& request);

}  // namespace moe::moectl

#endif  // MOECACHE_SERVICES_MOECTL_SAMPLING_FLAGS_H_
