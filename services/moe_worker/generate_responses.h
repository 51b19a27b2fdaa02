// serving::Output -> moe.v1.GenerateResponse: the one place a generated
// token becomes the wire message (gRPC streams it; the OpenAI translation
// reads it).
#ifndef MOECACHE_SERVICES_MOE_WORKER_GENERATE_RESPONSES_H_
#define MOECACHE_SERVICES_MOE_WORKER_GENERATE_RESPONSES_H_

#include <utility>

#include "moe/v1/inference.pb.h"
#include "services/serving/output_stream.h"

namespace moe::worker {

inline v1::GenerateResponse ToResponse(serving::Output o) {
  v1::GenerateResponse r;
  r.set_token_id(o.token_id);
  r.set_logprob(o.logprob);
  for (const auto& [id, lp] : o.top_logprobs) {
    v1::TokenLogprob* alt = r.add_top_logprobs();
    alt->set_token_id(id);
    alt->set_logprob(lp);
  }
  if (!o.text.empty()) r.set_text(std::move(o.text));
  if (!o.finish_reason.empty()) r.set_finish_reason(o.finish_reason);
  if (o.usage.has_value()) {
    const serving::Usage& u = *o.usage;
    v1::Usage* m = r.mutable_usage();
    m->set_prompt_tokens(u.prompt_tokens);
    m->set_generated_tokens(u.generated_tokens);
    m->set_time_to_first_token_seconds(u.ttft_seconds);
    m->set_time_per_output_token_seconds(u.tpot_seconds);
    m->set_expert_hits(u.experts.hits);
    m->set_expert_misses(u.experts.misses);
    m->set_expert_stall_seconds(u.experts.stall_seconds);
    m->set_cached_prompt_tokens(u.cached_prompt_tokens);
  }
  return r;
}

}  // namespace moe::worker

#endif  // MOECACHE_SERVICES_MOE_WORKER_GENERATE_RESPONSES_H_
