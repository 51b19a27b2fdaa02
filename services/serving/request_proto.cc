#include "services/serving/request_proto.h"

#include <algorithm>

namespace moe::serving {

Request FromProto(const v1::GenerateRequest& m, Transport transport) {
  Request r;
  r.prompt_text = m.prompt();
  r.prompt_ids.assign(m.prompt_token_ids().begin(), m.prompt_token_ids().end());
  r.max_new_tokens = m.max_new_tokens();
  r.temperature = m.temperature();
  r.top_p = m.top_p();
  if (m.has_seed()) r.seed = m.seed();
  r.top_k = m.top_k();
  r.min_p = m.min_p();
  if (m.has_repetition_penalty()) r.repetition_penalty = m.repetition_penalty();
  r.presence_penalty = m.presence_penalty();
  r.frequency_penalty = m.frequency_penalty();
  for (const auto& [id, bias] : m.logit_bias()) r.logit_bias.emplace_back(id, bias);
  // The map's order is unspecified; the sampler's result does not depend on
  // it, but a sorted list reads the same in logs and tests.
  std::sort(r.logit_bias.begin(), r.logit_bias.end());
  r.top_logprobs = m.top_logprobs();
  r.stop_token_ids.assign(m.stop_token_ids().begin(), m.stop_token_ids().end());
  r.ignore_eos = m.ignore_eos();
  r.stop.assign(m.stop().begin(), m.stop().end());
  r.json_schema = m.json_schema();
  r.transport = transport;
  return r;
}

void ToProto(const Request& r, v1::GenerateRequest* m) {
  m->set_prompt(r.prompt_text);
  m->clear_prompt_token_ids();
  for (int32_t id : r.prompt_ids) m->add_prompt_token_ids(id);
  m->set_max_new_tokens(static_cast<int32_t>(r.max_new_tokens));
  m->set_temperature(static_cast<float>(r.temperature));
  m->set_top_p(static_cast<float>(r.top_p));
  if (r.seed.has_value()) {
    m->set_seed(*r.seed);
  } else {
    m->clear_seed();
  }
  m->set_top_k(static_cast<int32_t>(r.top_k));
  m->set_min_p(static_cast<float>(r.min_p));
  m->set_repetition_penalty(static_cast<float>(r.repetition_penalty));
  m->set_presence_penalty(static_cast<float>(r.presence_penalty));
  m->set_frequency_penalty(static_cast<float>(r.frequency_penalty));
  m->clear_logit_bias();
  for (const auto& [id, bias] : r.logit_bias) {
    (*m->mutable_logit_bias())[id] += static_cast<float>(bias);
  }
  m->set_top_logprobs(static_cast<int32_t>(r.top_logprobs));
  m->clear_stop_token_ids();
  for (int32_t id : r.stop_token_ids) m->add_stop_token_ids(id);
  m->set_ignore_eos(r.ignore_eos);
  m->clear_stop();
  for (const std::string& s : r.stop) m->add_stop(s);
  m->set_json_schema(r.json_schema);
}

}  // namespace moe::serving
