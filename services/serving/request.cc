#include "services/serving/request.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <random>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace moe::serving {
namespace {

constexpr char kFieldPayload[] = "type.moecache.dev/serving.field";

const char* Name(const FieldBound& b, Transport t) {
  switch (t) {
    case Transport::kHttp:
      return b.http;
    case Transport::kCli:
      return b.cli;
    case Transport::kGrpc:
      break;
  }
  return b.grpc;
}

// INVALID_ARGUMENT with `message`, the field attached as a payload.
absl::Status Invalid(const std::string& field, const std::string& message) {
  absl::Status s = absl::InvalidArgumentError(message);
  s.SetPayload(kFieldPayload, absl::Cord(field));
  return s;
}

// `x` within `b` (NaN never is). The flag names of moectl run also carry
// the field's own name, so one message reads the same everywhere.
absl::Status InRange(const FieldBound& b, Transport t, double x, double hi) {
  if (x >= b.lo && x <= hi) return absl::OkStatus();
  const std::string name =
      t == Transport::kCli ? absl::StrCat(b.cli, " (", b.grpc, ")") : Name(b, t);
  return Invalid(Name(b, t), absl::StrCat(name, " must be in [", b.lo, ", ", hi, "], got ", x));
}

std::string PromptField(Transport t) {
  switch (t) {
    case Transport::kHttp:
      return "prompt";
    case Transport::kCli:
      return "--prompt-ids";
    case Transport::kGrpc:
      break;
  }
  return "prompt_token_ids";
}

absl::Status ValidatePrompt(const Request& r, const Limits& l) {
  const std::string field = PromptField(r.transport);
  if (r.prompt_ids.empty()) {
    return Invalid(field, r.transport == Transport::kGrpc
                              ? "empty prompt: set prompt or prompt_token_ids"
                              : absl::StrCat("empty prompt: set ", field));
  }
  for (int32_t id : r.prompt_ids) {
    if (id < 0 || (l.vocab_size > 0 && id >= l.vocab_size)) {
      return Invalid(field, absl::StrCat("prompt token id ", id, " outside the vocabulary [0, ",
                                         l.vocab_size, ")"));
    }
  }
  const int64_t n = static_cast<int64_t>(r.prompt_ids.size());
  if (l.max_prompt_tokens > 0 && n > l.max_prompt_tokens) {
    return Invalid(field, absl::StrCat("prompt of ", n, " tokens exceeds --max-prompt-tokens ",
                                       l.max_prompt_tokens));
  }
  return absl::OkStatus();
}

absl::Status ValidateStops(const Request& r, const Limits& l) {
  for (int32_t id : r.stop_token_ids) {
    if (id < 0 || (l.vocab_size > 0 && id >= l.vocab_size)) {
      return Invalid("stop_token_ids", absl::StrCat("stop token id ", id,
                                                    " outside the vocabulary [0, ",
                                                    l.vocab_size, ")"));
    }
  }
  if (static_cast<int>(r.stop.size()) > kMaxStopStrings) {
    return Invalid("stop", absl::StrCat("at most ", kMaxStopStrings, " stop strings"));
  }
  for (const std::string& s : r.stop) {
    if (s.empty()) return Invalid("stop", "empty stop string");
    if (!l.has_tokenizer) {
      return Invalid("stop", "stop strings need the model's tokenizer.json");
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateLogitBias(const Request& r, const Limits& l) {
  const std::string field = Name(kLogitBiasBound, r.transport);
  if (static_cast<int64_t>(r.logit_bias.size()) > kMaxLogitBias) {
    return Invalid(field, absl::StrCat("at most ", kMaxLogitBias, " logit_bias entries"));
  }
  for (const auto& [id, bias] : r.logit_bias) {
    if (id < 0 || (l.vocab_size > 0 && id >= l.vocab_size)) {
      return Invalid(field, absl::StrCat("logit_bias token id ", id,
                                         " outside the vocabulary [0, ", l.vocab_size, ")"));
    }
    if (absl::Status s = InRange(kLogitBiasBound, r.transport, bias, kLogitBiasBound.hi);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateJsonSchema(const Request& r, const Limits& l) {
  if (r.json_schema.empty()) return absl::OkStatus();
  if (!l.has_tokenizer) {
    return Invalid(Name(kJsonSchemaBound, r.transport),
                   "structured output needs the model's tokenizer.json");
  }
  return GrammarFor(r).status();
}

uint64_t RandomSeed() {
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) ^ device();
}

}  // namespace

Limits LimitsFor(const MoeModel& model, bool has_tokenizer, int64_t max_prompt_tokens) {
  Limits l;
  l.vocab_size = model.config().vocab_size;
  l.context_window = model.max_context();
  l.max_prompt_tokens = max_prompt_tokens;
  l.has_tokenizer = has_tokenizer;
  return l;
}

absl::Status EncodePrompt(Request* r, const Tokenizer* tokenizer) {
  if (!r->prompt_ids.empty() || r->prompt_text.empty()) return absl::OkStatus();
  if (tokenizer == nullptr) {
    return Invalid("prompt", absl::StrCat("this model has no tokenizer.json: send ",
                                          r->transport == Transport::kHttp
                                              ? "the prompt as token ids"
                                              : PromptField(r->transport)));
  }
  r->prompt_ids = tokenizer->Encode(r->prompt_text, /*add_special=*/true);
  return absl::OkStatus();
}

absl::Status Validate(const Request& r, const Limits& l) {
  if (absl::Status s = ValidatePrompt(r, l); !s.ok()) return s;
  return ValidateParameters(r, l);
}

absl::Status ValidateParameters(const Request& r, const Limits& l) {
  const double ceiling = std::min<double>(kMaxNewTokensBound.hi, l.max_new_tokens);
  if (absl::Status s =
          InRange(kMaxNewTokensBound, r.transport, static_cast<double>(r.max_new_tokens), ceiling);
      !s.ok()) {
    return s;
  }
  const int64_t need = static_cast<int64_t>(r.prompt_ids.size()) + r.max_new_tokens;
  if (l.context_window > 0 && need > l.context_window) {
    return Invalid(Name(kMaxNewTokensBound, r.transport),
                   absl::StrCat("prompt of ", r.prompt_ids.size(), " tokens + ",
                                Name(kMaxNewTokensBound, r.transport), " ",
                                r.max_new_tokens, " exceeds the context window of ",
                                l.context_window));
  }
  for (const auto& [bound, value] :
       {std::pair{kTemperatureBound, r.temperature}, std::pair{kTopPBound, r.top_p},
        std::pair{kTopLogprobsBound, static_cast<double>(r.top_logprobs)},
        std::pair{kTopKBound, static_cast<double>(r.top_k)}, std::pair{kMinPBound, r.min_p},
        std::pair{kRepetitionPenaltyBound, r.repetition_penalty},
        std::pair{kPresencePenaltyBound, r.presence_penalty},
        std::pair{kFrequencyPenaltyBound, r.frequency_penalty}}) {
    if (absl::Status s = InRange(bound, r.transport, value, bound.hi); !s.ok()) return s;
  }
  if (absl::Status s = ValidateLogitBias(r, l); !s.ok()) return s;
  if (absl::Status s = ValidateJsonSchema(r, l); !s.ok()) return s;
  return ValidateStops(r, l);
}

absl::StatusOr<std::shared_ptr<const JsonGrammar>> GrammarFor(const Request& r) {
  if (r.json_schema.empty()) return nullptr;
  const std::string field = Name(kJsonSchemaBound, r.transport);
  if (static_cast<double>(r.json_schema.size()) > kJsonSchemaBound.hi) {
    return Invalid(field, absl::StrCat("a JSON schema of ", r.json_schema.size(),
                                       " bytes; at most ", kJsonSchemaBound.hi));
  }
  const nlohmann::json schema =
      nlohmann::json::parse(r.json_schema, nullptr, /*allow_exceptions=*/false);
  if (schema.is_discarded()) return Invalid(field, "the JSON schema is not valid JSON");
  absl::StatusOr<JsonGrammar> grammar = CompileJsonSchema(schema);
  if (!grammar.ok()) return Invalid(field, std::string(grammar.status().message()));
  return std::make_shared<const JsonGrammar>(*std::move(grammar));
}

std::string FieldOf(const absl::Status& status) {
  const auto field = status.GetPayload(kFieldPayload);
  return field.has_value() ? std::string(*field) : std::string();
}

GenerateOptions ToGenerateOptions(const Request& r) {
  GenerateOptions o;
  o.prompt = r.prompt_ids;
  o.max_new_tokens = static_cast<int>(r.max_new_tokens);
  o.sampling.temperature = static_cast<float>(r.temperature);
  o.sampling.top_k = r.top_k > 0 ? static_cast<int>(r.top_k) : 0;
  o.sampling.top_p = static_cast<float>(r.top_p);
  o.sampling.min_p = static_cast<float>(r.min_p);
  o.sampling.repetition_penalty = static_cast<float>(r.repetition_penalty);
  o.sampling.presence_penalty = static_cast<float>(r.presence_penalty);
  o.sampling.frequency_penalty = static_cast<float>(r.frequency_penalty);
  for (const auto& [id, bias] : r.logit_bias) {
    o.sampling.logit_bias.emplace_back(id, static_cast<float>(bias));
  }
  o.sampling.seed = r.seed.has_value() ? *r.seed : RandomSeed();
  o.sampling.top_logprobs = static_cast<int>(r.top_logprobs);
  o.stop_token_ids = r.stop_token_ids;
  o.stop_at_eos = !r.ignore_eos;
  return o;
}

}  // namespace moe::serving
