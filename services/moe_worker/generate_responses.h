// The messages a Generate stream carries, built once for both runner loops
// (one at a time: generation_runner.cc; batched: generation_batch.cc).
#ifndef MOECACHE_SERVICES_MOE_WORKER_GENERATE_RESPONSES_H_
#define MOECACHE_SERVICES_MOE_WORKER_GENERATE_RESPONSES_H_

#include "moe/v1/inference.pb.h"
#include "services/engine/sampler.h"
#include "services/moe_worker/metered_provider.h"

namespace moe::worker {

inline v1::GenerateResponse TokenResponse(const SampledToken& t) {
  v1::GenerateResponse r;
  r.set_token_id(t.token);
  r.set_logprob(t.logprob);
  for (const auto& [id, lp] : t.top_logprobs) {
    v1::TokenLogprob* alt = r.add_top_logprobs();
    alt->set_token_id(id);
    alt->set_logprob(lp);
  }
  return r;
}

inline void FillUsage(int prompt, int generated, double ttft, double tpot,
                      const ExpertCounters& experts, v1::Usage* u) {
  u->set_prompt_tokens(prompt);
  u->set_generated_tokens(generated);
  u->set_time_to_first_token_seconds(ttft);
  u->set_time_per_output_token_seconds(tpot);
  u->set_expert_hits(experts.hits);
  u->set_expert_misses(experts.misses);
  u->set_expert_stall_seconds(experts.stall_seconds);
}

}  // namespace moe::worker

#endif  // MOECACHE_SERVICES_MOE_WORKER_GENERATE_RESPONSES_H_
