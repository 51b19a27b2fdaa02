// serving::Request: one generation request as every transport hands it to
// the serving core (gRPC Generate, the OpenAI HTTP API, `moectl run`), and
// Validate(): the one place its parameters are checked, against one table
// of bounds (kFieldBounds; docs/architecture.md, "Where a request is
// validated").
//
//   serving::Request r = FromProto(generate);      // or built by the transport
//   r.transport = Transport::kHttp;               // errors name its fields
//   RETURN_IF_ERROR(serving::EncodePrompt(&r, tokenizer));
//   RETURN_IF_ERROR(serving::Validate(r, limits));
//   GenerateOptions o = serving::ToGenerateOptions(r);
//
// An INVALID_ARGUMENT from Validate names the field as the request's
// transport spells it ("max_tokens" over HTTP, "--max-new-tokens" for
// moectl run, "max_new_tokens" over gRPC), in its message and in a payload
// that FieldOf() reads back (the OpenAI error's "param").
//
// Plain data; thread-compatible.
#ifndef MOECACHE_SERVICES_SERVING_REQUEST_H_
#define MOECACHE_SERVICES_SERVING_REQUEST_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "services/engine/generator.h"
#include "services/engine/tokenizer.h"
#include "services/serving/json_schema.h"

namespace moe::serving {

// Where a request came from: only the names in error messages differ.
enum class Transport { kGrpc, kHttp, kCli };

// The defaults are every interface's (HTTP, gRPC, moectl generate, run and
// chat; docs/operations.md, "Sampling"): greedy, no truncation, no
// penalties, a random seed. The sampler chain is SamplingParams'
// (services/engine/sampler.h).
struct Request {
  std::string prompt_text;             // encoded by EncodePrompt
  std::vector<int32_t> prompt_ids;     // used instead of prompt_text when non-empty
  int64_t max_new_tokens = 16;
  double temperature = 0.0;            // 0 = greedy
  int64_t top_k = 0;                   // 0 or -1 = off
  double top_p = 1.0;                  // 0 or 1 = no nucleus truncation
  double min_p = 0.0;                  // 0 = off
  double repetition_penalty = 1.0;     // 1 = off
  double presence_penalty = 0.0;
  double frequency_penalty = 0.0;
  std::vector<std::pair<int32_t, double>> logit_bias;  // (token id, bias)
  std::optional<uint64_t> seed;        // none = random (drawn by ToGenerateOptions)
  int64_t top_logprobs = 0;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;             // do not stop at the model's eos ids
  std::vector<std::string> stop;       // stop strings, matched on the text
  // Structured output: the output is one JSON value this JSON schema (its
  // text; json_schema.h lists the keywords) accepts, by token masks. "" =
  // unconstrained. OpenAI's json_object is {"type":"object"}.
  std::string json_schema;
  Transport transport = Transport::kGrpc;
};

// One numeric parameter's accepted range [lo, hi] and its names.
struct FieldBound {
  const char* grpc;  // moe.v1.GenerateRequest's field
  const char* http;  // the OpenAI API's parameter
  const char* cli;   // moectl run's flag
  double lo;
  double hi;
};

// The bounds table. Also: at most kMaxStopStrings stop strings, none empty;
// prompt and stop token ids in [0, vocab); prompt + max_new_tokens within
// the context window; the prompt within --max-prompt-tokens (Limits).
inline constexpr FieldBound kMaxNewTokensBound = {"max_new_tokens", "max_tokens",
                                                  "--max-new-tokens", 1, kMaxNewTokensLimit};
inline constexpr FieldBound kTemperatureBound = {"temperature", "temperature",
                                                 "--temperature", 0, 2};
inline constexpr FieldBound kTopPBound = {"top_p", "top_p", "--top-p", 0, 1};
inline constexpr FieldBound kTopLogprobsBound = {"top_logprobs", "top_logprobs",
                                                 "--top-logprobs", 0, kMaxTopLogprobs};
inline constexpr FieldBound kTopKBound = {"top_k", "top_k", "--top-k", -1, 1 << 20};
inline constexpr FieldBound kMinPBound = {"min_p", "min_p", "--min-p", 0, 1};
inline constexpr FieldBound kRepetitionPenaltyBound = {"repetition_penalty", "repetition_penalty",
                                                       "--repetition-penalty", 0.01, 10};
inline constexpr FieldBound kPresencePenaltyBound = {"presence_penalty", "presence_penalty",
                                                     "--presence-penalty", -2, 2};
inline constexpr FieldBound kFrequencyPenaltyBound = {"frequency_penalty", "frequency_penalty",
                                                      "--frequency-penalty", -2, 2};
// Each bias of logit_bias (OpenAI's range).
inline constexpr FieldBound kLogitBiasBound = {"logit_bias", "logit_bias", "--logit-bias", -100,
                                               100};
// The length of json_schema's text in bytes (not a value: outside the
// table; json_schema.h bounds what the schema may hold).
inline constexpr FieldBound kJsonSchemaBound = {"json_schema", "response_format", "--json-schema",
                                                0, 1 << 18};
inline constexpr FieldBound kFieldBounds[] = {
    kMaxNewTokensBound,      kTemperatureBound,     kTopPBound,
    kTopLogprobsBound,       kTopKBound,            kMinPBound,
    kRepetitionPenaltyBound, kPresencePenaltyBound, kFrequencyPenaltyBound,
    kLogitBiasBound};
// At most this many logit_bias entries, their ids in [0, vocab).
inline constexpr int kMaxLogitBias = 1024;
inline constexpr int kMaxStopStrings = 4;

// What the serving side knows about the model and its own settings; a
// zero limit is not checked (a transport that has not loaded the model
// checks what it can, the runner checks everything).
struct Limits {
  int64_t vocab_size = 0;
  int64_t context_window = 0;
  int64_t max_prompt_tokens = 0;      // --max-prompt-tokens
  int64_t max_new_tokens = kMaxNewTokensLimit;  // a ceiling below the table's
  bool has_tokenizer = true;          // stop strings need one
};

// Limits for `model` (vocabulary, context window; has_tokenizer as given).
Limits LimitsFor(const MoeModel& model, bool has_tokenizer, int64_t max_prompt_tokens);

// Fills prompt_ids from prompt_text when no ids were given (the model's
// tokenizer, special tokens added). INVALID_ARGUMENT when there is text but
// no tokenizer.
absl::Status EncodePrompt(Request* request, const Tokenizer* tokenizer);

// Checks every parameter of `request` (its prompt as ids: EncodePrompt
// first) against the bounds table and `limits`. INVALID_ARGUMENT naming the
// field (FieldOf) on the first violation.
absl::Status Validate(const Request& request, const Limits& limits);
// The same checks but the prompt's, for a transport that has not encoded
// its prompt yet (moectl run, before it loads the model); the context
// window is then checked against max_new_tokens alone.
absl::Status ValidateParameters(const Request& request, const Limits& limits);

// The request's json_schema compiled (null when it has none), or the
// INVALID_ARGUMENT that Validate returns for it (naming the field).
absl::StatusOr<std::shared_ptr<const JsonGrammar>> GrammarFor(const Request& request);

// The field an INVALID_ARGUMENT from Validate names; "" when none.
std::string FieldOf(const absl::Status& status);

// The engine's options for a validated request (request_id, pre-gating and
// the json_schema's constraint are left for the runner: serving::Runner). A request without a seed gets a random one
// here, so each call may differ.
GenerateOptions ToGenerateOptions(const Request& request);

}  // namespace moe::serving

#endif  // MOECACHE_SERVICES_SERVING_REQUEST_H_
