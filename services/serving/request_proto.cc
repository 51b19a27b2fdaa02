#include "services/serving/request_proto.h"

namespace moe::serving {

Request FromProto(const v1::GenerateRequest& m, Transport transport) {
  Request r;
  r.prompt_text = m.prompt();
  r.prompt_ids.assign(m.prompt_token_ids().begin(), m.prompt_token_ids().end());
  r.max_new_tokens = m.max_new_tokens();
  r.temperature = m.temperature();
  r.top_p = m.top_p();
  r.seed = m.seed();
  r.top_logprobs = m.top_logprobs();
  r.stop_token_ids.assign(m.stop_token_ids().begin(), m.stop_token_ids().end());
  r.ignore_eos = m.ignore_eos();
  r.stop.assign(m.stop().begin(), m.stop().end());
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
  m->set_seed(r.seed);
  m->set_top_logprobs(static_cast<int32_t>(r.top_logprobs));
  m->clear_stop_token_ids();
  for (int32_t id : r.stop_token_ids) m->add_stop_token_ids(id);
  m->set_ignore_eos(r.ignore_eos);
  m->clear_stop();
  for (const std::string& s : r.stop) m->add_stop(s);
}

}  // namespace moe::serving
