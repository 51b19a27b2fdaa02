// The OpenAI-compatible request and response shapes, translated to and from
// moe.v1 Generate messages (no HTTP here: services/moe_worker/http_server
// carries them).
//
//   ApiError error;
//   std::optional<ApiRequest> r = ParseApiRequest(body, /*chat=*/true, model, &error);
//   ... runner->Submit(serving::FromProto(r->generate, Transport::kHttp), ...) ...
//   ResponseAssembler out(*r, model, id, created);
//   out.Chunk(token_response)  // streaming: one `data:` object per token
//   out.Add(token_response); out.Final()  // or one object at the end
//
// Everything a request asks for is either honoured or refused with a 400
// naming the parameter ("param": the field as the client spelled it):
// unknown parameters, n > 1, the legacy functions/function_call, images,
// echo, best_of > 1 are refused, never ignored. response_format
// (json_object, json_schema) becomes serving::Request::json_schema; tools
// and tool_choice are tool_calls.h's (the chat template gets `tools`). The samplers (temperature, top_k, top_p, min_p, the
// penalties, logit_bias, seed, ignore_eos, stop) take serving::Request's
// defaults when absent, the same as gRPC's and moectl's. Numeric ranges,
// stop strings and the context window are serving::Validate's (one bounds
// table for every transport); this file checks only the JSON's shape.
#ifndef MOECACHE_SERVICES_OPENAI_OPENAI_API_H_
#define MOECACHE_SERVICES_OPENAI_OPENAI_API_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "moe/v1/inference.pb.h"
#include "nlohmann/json.hpp"
#include "services/engine/tokenizer.h"
#include "services/openai/chat_template.h"
#include "services/openai/tool_calls.h"

namespace moe::openai {

using Json = nlohmann::ordered_json;

// An error in OpenAI's shape: {"error": {"message", "type", "param", "code"}}.
struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // "" : null
  std::string code;   // "" : null
};
Json ErrorBody(const ApiError& error);
// The status's field (serving::FieldOf) becomes "param".
// INVALID_ARGUMENT and FAILED_PRECONDITION -> 400, UNAUTHENTICATED -> 401,
// NOT_FOUND -> 404, RESOURCE_EXHAUSTED -> 429, DEADLINE_EXCEEDED -> 504,
// UNAVAILABLE -> 503, anything else -> 500.
ApiError ErrorFromStatus(const absl::Status& status);

// What the served model offers to the translation. Pointers not owned;
// `tokenizer` and `chat_template` may be null (then only token-id prompts,
// and no chat).
struct ModelInfo {
  std::string name;  // the id answers carry
  const Tokenizer* tokenizer = nullptr;
  const ChatTemplate* chat_template = nullptr;
  int64_t context_length = 0;
  int max_new_tokens_limit = 0;  // the engine's ceiling
  // Other ids that reach this model (--served-model-name beyond the first,
  // and then the directory's name).
  std::vector<std::string> aliases;

  // True for `name` and every alias.
  bool Serves(const std::string& id) const;
  // `name`, then the aliases (as /v1/models lists them).
  std::vector<std::string> Ids() const;
};

struct ApiRequest {
  bool chat = false;
  v1::GenerateRequest generate;  // prompt as token ids, ready for the runner
  bool stream = false;
  bool include_usage = false;    // stream_options.include_usage
  bool logprobs = false;
  int top_logprobs = 0;
  ToolMode tool_mode = ToolMode::kNone;
  std::string tool_name;                // kNamed: the function
  std::vector<std::string> tool_names;  // the functions offered
};

// The most tools a request may offer.
inline constexpr int kMaxTools = 128;

// The body of POST /v1/completions (`chat` false) or /v1/chat/completions.
// On failure returns nullopt and fills *error (400 or 404 for a model that
// is not served).
std::optional<ApiRequest> ParseApiRequest(const Json& body, bool chat, const ModelInfo& model,
                                          ApiError* error);

// llama-server's POST /tokenize ({"content": TEXT, "add_special": false,
// "with_pieces": false} -> {"tokens": [ids]} or [{"id", "piece"}]) and
// POST /detokenize ({"tokens": [ids]} -> {"content": TEXT}); `detokenize`
// picks which. Ids are checked against the tokenizer's vocabulary; the body
// size bounds everything else. On failure returns nullopt and fills *error
// (400 naming the field).
std::optional<Json> TokenizeRequest(const Json& body, bool detokenize, const ModelInfo& model,
                                    ApiError* error);

// Turns the runner's per-token responses into OpenAI objects for one
// request. Not thread-safe.
class ResponseAssembler {
 public:
  ResponseAssembler(const ApiRequest& request, const ModelInfo& model, std::string id,
                    int64_t created);

  // Streaming: the chunk object for one token response (the first chat
  // chunk also carries the role). The last token's chunk carries
  // finish_reason. With tools (tool_calls.h): kNamed streams the arguments
  // as tool_calls deltas; kRequired sends its call with the last chunk;
  // kAuto streams content up to a <tool_call> and sends the calls with the
  // last chunk. finish_reason is then "tool_calls".
  Json Chunk(const v1::GenerateResponse& response);
  // Streaming with include_usage: the final chunk (empty choices, usage).
  Json UsageChunk() const;
  // Non-streaming: collect, then the whole object.
  void Add(const v1::GenerateResponse& response);
  Json Final() const;

 private:
  Json Logprobs(const v1::GenerateResponse& r);
  // The chat delta's content or tool_calls for one streamed response;
  // *finish may become "tool_calls".
  void ToolDelta(const v1::GenerateResponse& r, Json* delta, std::string* finish);
  // The calls the whole text stands for (none when it is content) and the
  // content left beside them.
  std::vector<ToolCall> Calls(std::string* content) const;
  Json CallObject(size_t index, const ToolCall& call) const;
  Json Usage() const;
  Json Envelope(const char* object) const;

  const ApiRequest& request_;
  const ModelInfo& model_;
  std::string id_;
  int64_t created_;
  bool sent_role_ = false;
  std::string text_;
  size_t streamed_ = 0;  // kAuto: bytes of text_ sent as content
  std::string finish_reason_;
  Json logprobs_;  // accumulated (non-streaming)
  int text_offset_ = 0;
  v1::Usage usage_;
};

// The JSON text of `j` on one line; invalid UTF-8 is replaced, never thrown.
std::string Dump(const Json& j);

}  // namespace moe::openai

#endif  // MOECACHE_SERVICES_OPENAI_OPENAI_API_H_
