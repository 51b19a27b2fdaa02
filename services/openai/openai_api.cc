#include "services/openai/openai_api.h"

#include <algorithm>
#include <limits>
#include <set>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "services/serving/json_schema.h"
#include "services/serving/request_proto.h"

namespace moe::openai {
namespace {

// Parameters each endpoint accepts; anything else is refused by name.
const std::set<std::string>& Known(bool chat) {
  static const std::set<std::string> kCompletion = {
      "model", "prompt", "max_tokens", "temperature", "top_p", "seed", "stop", "logprobs",
      "stream", "stream_options", "n", "user", "presence_penalty", "frequency_penalty",
      "logit_bias", "echo", "best_of", "suffix", "top_k", "min_p", "repetition_penalty",
      "ignore_eos"};
  static const std::set<std::string> kChat = {
      "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p",
      "seed", "stop", "logprobs", "top_logprobs", "stream", "stream_options", "n", "user",
      "presence_penalty", "frequency_penalty", "logit_bias", "tools", "tool_choice",
      "functions", "function_call", "response_format", "parallel_tool_calls", "top_k", "min_p",
      "repetition_penalty", "ignore_eos"};
  return chat ? kChat : kCompletion;
}

struct Refusal {
  ApiError error;
};

[[noreturn]] void Refuse(const std::string& param, const std::string& message, int status = 400,
                         const std::string& code = "") {
  ApiError e;
  e.http_status = status;
  e.param = param;
  e.message = message;
  e.code = code;
  throw Refusal{e};
}

bool IsAbsent(const Json& body, const char* key) {
  return !body.contains(key) || body[key].is_null();
}

// body[key] within [lo, hi], or `dflt` when absent; T is double (any
// number) or int64_t (integers only).
template <typename T>
T Bounded(const Json& body, const char* key, T lo, T hi, T dflt) {
  if (IsAbsent(body, key)) return dflt;
  const Json& v = body[key];
  constexpr bool kInt = std::is_integral_v<T>;
  if (kInt ? !v.is_number_integer() : !v.is_number()) {
    Refuse(key, absl::StrCat("'", key, "' must be ", kInt ? "an integer" : "a number"));
  }
  const T x = v.get<T>();
  if (x < lo || x > hi) {
    Refuse(key, absl::StrCat("'", key, "' must be in [", lo, ", ", hi, "], got ", x));
  }
  return x;
}

// body[key], or `dflt` when absent; T is double (any number) or int64_t
// (integers only). The range is serving::Validate's (one bounds table).
template <typename T>
T Number(const Json& body, const char* key, T dflt) {
  constexpr T kLowest = std::numeric_limits<T>::lowest();
  constexpr T kHighest = std::numeric_limits<T>::max();
  return Bounded<T>(body, key, kLowest, kHighest, dflt);
}

// Parameters that have a harmless default value and nothing else.
void RefuseUnsupported(const Json& body) {
  if (!IsAbsent(body, "n") && body["n"] != 1) {
    Refuse("n", "only n = 1 is supported (one choice per request)");
  }
  if (!IsAbsent(body, "echo") && body["echo"] != false) Refuse("echo", "'echo' is not supported");
  if (!IsAbsent(body, "best_of") && body["best_of"] != 1) {
    Refuse("best_of", "only best_of = 1 is supported");
  }
  if (!IsAbsent(body, "suffix")) Refuse("suffix", "'suffix' is not supported");
  if (!IsAbsent(body, "functions") && !body["functions"].empty()) {
    Refuse("functions", "the legacy 'functions' are not supported: use 'tools'");
  }
  if (!IsAbsent(body, "function_call") && body["function_call"] != "none") {
    Refuse("function_call", "the legacy 'function_call' is not supported: use 'tool_choice'");
  }
}

std::string MessageText(const Json& content, size_t i) {
  const std::string param = absl::StrCat("messages[", i, "].content");
  if (content.is_string()) return content.get<std::string>();
  if (content.is_null()) return "";
  if (!content.is_array()) Refuse(param, "content must be a string or an array of text parts");
  std::string text;
  for (const Json& part : content) {
    const std::string type = part.is_object() ? part.value("type", "") : "";
    if (type == "text" && part.contains("text") && part["text"].is_string()) {
      text += part["text"].get<std::string>();
    } else if (type == "image_url" || type == "input_audio" || type == "file") {
      Refuse(param, absl::StrCat("content parts of type '", type,
                                 "' are not supported (text only)"));
    } else {
      Refuse(param, "each content part must be {\"type\": \"text\", \"text\": ...}");
    }
  }
  return text;
}

// The conversation in the form Hugging Face templates expect: {role,
// content}, plus an assistant's tool_calls and a tool result's
// tool_call_id / name as the client sent them.
Json Messages(const Json& body) {
  if (IsAbsent(body, "messages") || !body["messages"].is_array() || body["messages"].empty()) {
    Refuse("messages", "'messages' must be a non-empty array");
  }
  Json out = Json::array();
  const Json& in = body["messages"];
  for (size_t i = 0; i < in.size(); ++i) {
    const Json& m = in[i];
    const std::string param = absl::StrCat("messages[", i, "]");
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      Refuse(param, "each message needs a string 'role'");
    }
    std::string role = m["role"].get<std::string>();
    if (role == "developer") role = "system";  // OpenAI's newer name for it
    if (role != "system" && role != "user" && role != "assistant" && role != "tool") {
      Refuse(param + ".role", absl::StrCat("role '", role,
                                           "' is not supported (system, user, assistant, tool)"));
    }
    Json msg = {{"role", role}, {"content", MessageText(m.value("content", Json()), i)}};
    for (const auto& [k, v] : m.items()) {
      if (k == "role" || k == "content" || v.is_null()) continue;
      if (k == "name" || (k == "tool_call_id" && role == "tool")) {
        if (!v.is_string()) Refuse(param + "." + k, absl::StrCat("'", k, "' must be a string"));
        msg[k] = v;
      } else if (k == "tool_calls" && role == "assistant") {
        if (!v.is_array()) Refuse(param + ".tool_calls", "'tool_calls' must be an array");
        for (const Json& call : v) {
          const bool shaped = call.is_object() && call.contains("function") &&
                              call["function"].is_object() &&
                              call["function"].value("name", Json()).is_string();
          if (!shaped) {
            Refuse(param + ".tool_calls",
                   "each tool call needs {\"type\": \"function\", \"function\": {\"name\", "
                   "\"arguments\"}}");
          }
        }
        if (!v.empty()) msg[k] = v;
      } else if (k == "function_call") {
        Refuse(param + "." + k, "the legacy 'function_call' is not supported: use 'tool_calls'");
      } else {
        Refuse(param + "." + k, absl::StrCat("unknown message field '", k, "'"));
      }
    }
    out.push_back(std::move(msg));
  }
  return out;
}

// A tool's function name: OpenAI's ^[a-zA-Z0-9_-]{1,64}$.
bool IsFunctionName(const std::string& name) {
  return !name.empty() && name.size() <= 64 &&
         std::all_of(name.begin(), name.end(), [](char c) {
           return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '_' || c == '-';
         });
}

// `tools`, `tool_choice` and `response_format` (chat only): the tool mode,
// the tools the chat template gets (null when none) and the JSON schema
// decoding is constrained to (null when none).
struct Structured {
  Json tools;
  Json schema;
};

Structured ParseStructured(const Json& body, bool chat, ApiRequest* r) {
  Structured out;
  if (!IsAbsent(body, "response_format")) {
    const Json& f = body["response_format"];
    const std::string type = f.is_object() && f.value("type", Json()).is_string()
                                 ? f["type"].get<std::string>()
                                 : "";
    if (type == "json_object") {
      out.schema = {{"type", "object"}};
    } else if (type == "json_schema") {
      const Json& js = f.value("json_schema", Json());
      if (!js.is_object()) {
        Refuse("response_format", "response_format json_schema needs a 'json_schema' object");
      }
      for (const auto& [k, v] : js.items()) {
        if (k != "name" && k != "schema" && k != "strict" && k != "description") {
          Refuse("response_format", absl::StrCat("unknown response_format.json_schema field '",
                                                 k, "'"));
        }
      }
      out.schema = js.contains("schema") && !js["schema"].is_null() ? js["schema"] : Json::object();
    } else if (type != "text") {
      Refuse("response_format",
             "response_format must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or "
             "{\"type\": \"json_schema\", \"json_schema\": {\"name\", \"schema\"}}");
    }
  }
  std::vector<Json> parameters;  // by tool
  if (!IsAbsent(body, "tools")) {
    const Json& tools = body["tools"];
    if (!tools.is_array()) Refuse("tools", "'tools' must be an array");
    if (static_cast<int>(tools.size()) > kMaxTools) {
      Refuse("tools", absl::StrCat("at most ", kMaxTools, " tools"));
    }
    for (size_t i = 0; i < tools.size(); ++i) {
      const Json& t = tools[i];
      const std::string param = absl::StrCat("tools[", i, "]");
      if (!t.is_object() || t.value("type", Json()) != "function" || !t.contains("function") ||
          !t["function"].is_object()) {
        Refuse(param, "each tool must be {\"type\": \"function\", \"function\": {...}}");
      }
      const Json& fn = t["function"];
      for (const auto& [k, v] : fn.items()) {
        if (k != "name" && k != "description" && k != "parameters" && k != "strict") {
          Refuse(param + ".function." + k, absl::StrCat("unknown function field '", k, "'"));
        }
      }
      const Json name = fn.value("name", Json());
      if (!name.is_string() || !IsFunctionName(name.get<std::string>())) {
        Refuse(param + ".function.name",
               "a function name must be 1-64 letters, digits, '_' or '-'");
      }
      if (std::find(r->tool_names.begin(), r->tool_names.end(), name.get<std::string>()) !=
          r->tool_names.end()) {
        Refuse(param + ".function.name",
               absl::StrCat("two tools are named '", name.get<std::string>(), "'"));
      }
      Json params = fn.contains("parameters") && !fn["parameters"].is_null()
                        ? fn["parameters"]
                        : Json{{"type", "object"}, {"properties", Json::object()}};
      if (absl::StatusOr<serving::JsonGrammar> g = serving::CompileJsonSchema(params); !g.ok()) {
        Refuse(param + ".function.parameters", std::string(g.status().message()));
      }
      r->tool_names.push_back(name.get<std::string>());
      parameters.push_back(std::move(params));
    }
  }
  if (!chat) return out;
  const bool has_tools = !r->tool_names.empty();
  r->tool_mode = has_tools ? ToolMode::kAuto : ToolMode::kNone;
  if (!IsAbsent(body, "tool_choice")) {
    const Json& c = body["tool_choice"];
    if (c == "none") {
      r->tool_mode = ToolMode::kNone;
    } else if (c == "auto" || c == "required") {
      if (!has_tools) Refuse("tool_choice", absl::StrCat("tool_choice '", c.get<std::string>(),
                                                         "' needs 'tools'"));
      r->tool_mode = c == "auto" ? ToolMode::kAuto : ToolMode::kRequired;
    } else if (c.is_object() && c.value("type", Json()) == "function" &&
               c.value("function", Json()).is_object() &&
               c["function"].value("name", Json()).is_string()) {
      r->tool_name = c["function"]["name"].get<std::string>();
      if (std::find(r->tool_names.begin(), r->tool_names.end(), r->tool_name) ==
          r->tool_names.end()) {
        Refuse("tool_choice", absl::StrCat("tool_choice names '", r->tool_name,
                                           "', which is not among the tools"));
      }
      r->tool_mode = ToolMode::kNamed;
    } else {
      Refuse("tool_choice",
             "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": "
             "\"function\", \"function\": {\"name\": ...}}");
    }
  }
  if (!IsAbsent(body, "parallel_tool_calls") && !body["parallel_tool_calls"].is_boolean()) {
    Refuse("parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
  }
  const bool forced = r->tool_mode == ToolMode::kNamed || r->tool_mode == ToolMode::kRequired;
  if (forced && !out.schema.is_null()) {
    Refuse("tool_choice", "a forced tool call and a response_format cannot both constrain "
                          "the output");
  }
  if (r->tool_mode != ToolMode::kNone) out.tools = body["tools"];
  if (r->tool_mode == ToolMode::kNamed) {
    const size_t i = static_cast<size_t>(
        std::find(r->tool_names.begin(), r->tool_names.end(), r->tool_name) -
        r->tool_names.begin());
    out.schema = parameters[i];
  } else if (r->tool_mode == ToolMode::kRequired) {
    Json calls = Json::array();
    for (size_t i = 0; i < parameters.size(); ++i) {
      calls.push_back({{"type", "object"},
                       {"properties",
                        {{"name", {{"const", r->tool_names[i]}}}, {"arguments", parameters[i]}}},
                       {"required", {"name", "arguments"}},
                       {"additionalProperties", false}});
    }
    out.schema = calls.size() == 1 ? calls[0] : Json{{"anyOf", calls}};
  }
  return out;
}

std::vector<int32_t> PromptIds(const Json& body, bool chat, const ModelInfo& model,
                               const Json& tools) {
  if (chat) {
    const Json messages = Messages(body);
    if (model.chat_template == nullptr) {
      Refuse("messages", "this model has no chat_template in tokenizer_config.json: use "
                         "/v1/completions", 400, "no_chat_template");
    }
    if (model.tokenizer == nullptr) Refuse("messages", "this model has no tokenizer.json");
    const Json extra = tools.is_null() ? Json::object() : Json{{"tools", tools}};
    absl::StatusOr<std::string> text = model.chat_template->Apply(messages, true, extra);
    if (!text.ok()) Refuse("messages", absl::StrCat("chat template: ", text.status().message()));
    // As transformers does: the template writes every special token itself.
    return model.tokenizer->Encode(*text, /*add_special=*/false);
  }
  if (IsAbsent(body, "prompt")) Refuse("prompt", "'prompt' is required");
  Json prompt = body["prompt"];
  if (prompt.is_array() && prompt.size() == 1 && (prompt[0].is_string() || prompt[0].is_array())) {
    prompt = prompt[0];  // a batch of one
  }
  if (prompt.is_string()) {
    if (model.tokenizer == nullptr) {
      Refuse("prompt", "this model has no tokenizer.json: send the prompt as token ids");
    }
    return model.tokenizer->Encode(prompt.get<std::string>(), /*add_special=*/true);
  }
  if (prompt.is_array() && !prompt.empty() &&
      std::all_of(prompt.begin(), prompt.end(), [](const Json& x) { return x.is_number_integer(); })) {
    // Checked as int64 (or uint64) first: get<int32_t> would truncate
    // 2^32 + 5 to the valid id 5. The vocabulary bound is the runner's.
    std::vector<int32_t> ids;
    for (const Json& x : prompt) {
      const bool fits = x.is_number_unsigned()
                            ? x.get<uint64_t>() <= static_cast<uint64_t>(INT32_MAX)
                            : x.get<int64_t>() >= 0 && x.get<int64_t>() <= INT32_MAX;
      if (!fits) {
        Refuse("prompt", absl::StrCat("prompt token id ", x.dump(), " is not in [0, ",
                                      INT32_MAX, "]"));
      }
      ids.push_back(static_cast<int32_t>(x.get<int64_t>()));
    }
    return ids;
  }
  if (prompt.is_array() && prompt.size() > 1) {
    Refuse("prompt", "only one prompt per request is supported (a string or one list of token ids)");
  }
  Refuse("prompt", "'prompt' must be a string or a non-empty array of token ids");
}

// The stop strings' shape; their number and emptiness are serving::Validate's.
std::vector<std::string> ParseStop(const Json& body) {
  std::vector<std::string> out;
  if (IsAbsent(body, "stop")) return out;
  Json stop = body["stop"];
  if (stop.is_string()) stop = Json::array({stop});
  if (!stop.is_array()) Refuse("stop", "'stop' must be a string or an array of strings");
  for (const Json& s : stop) {
    if (!s.is_string()) Refuse("stop", "each stop sequence must be a non-empty string");
    out.push_back(s.get<std::string>());
  }
  return out;
}

// logit_bias: {"token id": bias, ...} (OpenAI's shape: the ids are strings).
std::vector<std::pair<int32_t, double>> ParseLogitBias(const Json& body) {
  std::vector<std::pair<int32_t, double>> out;
  if (IsAbsent(body, "logit_bias")) return out;
  const Json& bias = body["logit_bias"];
  if (!bias.is_object()) Refuse("logit_bias", "'logit_bias' must be an object {token id: bias}");
  for (const auto& [key, value] : bias.items()) {
    int64_t id = -1;
    const bool digits = !key.empty() && key.size() <= 10 &&
                        std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (digits) id = std::stoll(key);
    if (!digits || id > INT32_MAX) {
      Refuse("logit_bias", absl::StrCat("logit_bias key '", key, "' is not a token id"));
    }
    if (!value.is_number()) Refuse("logit_bias", "each logit_bias value must be a number");
    out.emplace_back(static_cast<int32_t>(id), value.get<double>());
  }
  return out;
}

// The sampler chain's parameters; absent ones keep serving::Request's
// defaults (the same on every interface). Ranges are serving::Validate's.
void ParseSampling(const Json& body, serving::Request* q) {
  q->temperature = Number<double>(body, "temperature", q->temperature);
  q->top_p = Number<double>(body, "top_p", q->top_p);
  q->top_k = Number<int64_t>(body, "top_k", q->top_k);
  q->min_p = Number<double>(body, "min_p", q->min_p);
  q->repetition_penalty = Number<double>(body, "repetition_penalty", q->repetition_penalty);
  q->presence_penalty = Number<double>(body, "presence_penalty", q->presence_penalty);
  q->frequency_penalty = Number<double>(body, "frequency_penalty", q->frequency_penalty);
  q->logit_bias = ParseLogitBias(body);
  if (!IsAbsent(body, "seed")) {
    const Json& seed = body["seed"];
    if (!seed.is_number_integer() || (!seed.is_number_unsigned() && seed.get<int64_t>() < -1)) {
      Refuse("seed", "'seed' must be an integer >= 0, or -1 for a random seed");
    }
    // -1 as llama-server: a random seed, as when there is none.
    if (seed.is_number_unsigned() || seed.get<int64_t>() >= 0) q->seed = seed.get<uint64_t>();
  }
  if (!IsAbsent(body, "ignore_eos")) {
    if (!body["ignore_eos"].is_boolean()) Refuse("ignore_eos", "'ignore_eos' must be a boolean");
    q->ignore_eos = body["ignore_eos"].get<bool>();
  }
  q->stop = ParseStop(body);
}

// The request's parameters against the one bounds table (the model's
// vocabulary, --max-prompt-tokens and the tokenizer that stop strings need
// are the runner's to check).
void Validate(const serving::Request& q, const ModelInfo& model, ToolMode tools) {
  serving::Limits limits;
  limits.context_window = model.context_length;
  limits.max_new_tokens = model.max_new_tokens_limit;
  if (absl::Status s = serving::Validate(q, limits); !s.ok()) {
    std::string field = serving::FieldOf(s);
    // A forced tool call's schema is built from the tools, not sent.
    if (field == "response_format" && (tools == ToolMode::kNamed || tools == ToolMode::kRequired)) {
      field = "tool_choice";
    }
    Refuse(field, std::string(s.message()));
  }
}

ApiRequest Parse(const Json& body, bool chat, const ModelInfo& model) {
  if (!body.is_object()) Refuse("", "the request body must be a JSON object");
  for (const auto& [k, v] : body.items()) {
    if (Known(chat).count(k) == 0) Refuse(k, absl::StrCat("unknown parameter '", k, "'"));
  }
  if (!IsAbsent(body, "model")) {
    if (!body["model"].is_string()) Refuse("model", "'model' must be a string");
    const std::string asked = body["model"].get<std::string>();
    if (!model.Serves(asked)) {
      Refuse("model", absl::StrCat("the model '", asked, "' does not exist; this worker serves '",
                                   absl::StrJoin(model.Ids(), "', '"), "'"),
             404, "model_not_found");
    }
  }
  RefuseUnsupported(body);
  ApiRequest r;
  r.chat = chat;
  serving::Request q;
  q.transport = serving::Transport::kHttp;
  const Structured structured = ParseStructured(body, chat, &r);
  if (!structured.schema.is_null()) q.json_schema = structured.schema.dump();
  q.prompt_ids = PromptIds(body, chat, model, structured.tools);
  const int64_t room = std::max<int64_t>(
      1, std::min<int64_t>(model.max_new_tokens_limit,
                           model.context_length - static_cast<int64_t>(q.prompt_ids.size())));
  q.max_new_tokens = Number<int64_t>(body, "max_tokens", chat ? room : 16);
  q.max_new_tokens = Number<int64_t>(body, "max_completion_tokens", q.max_new_tokens);
  ParseSampling(body, &q);
  if (chat) {
    if (!IsAbsent(body, "logprobs") && !body["logprobs"].is_boolean()) {
      Refuse("logprobs", "'logprobs' must be a boolean");
    }
    r.logprobs = body.value("logprobs", false) == true;
    q.top_logprobs = Number<int64_t>(body, "top_logprobs", 0);
    if (q.top_logprobs != 0 && !r.logprobs) {
      Refuse("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    }
  } else if (!IsAbsent(body, "logprobs")) {
    // The legacy completions API's own limit, below the table's.
    r.logprobs = true;
    q.top_logprobs = Bounded<int64_t>(body, "logprobs", 0, 5, 0);
  }
  Validate(q, model, r.tool_mode);
  r.top_logprobs = static_cast<int>(q.top_logprobs);
  serving::ToProto(q, &r.generate);
  if (!IsAbsent(body, "stream") && !body["stream"].is_boolean()) {
    Refuse("stream", "'stream' must be a boolean");
  }
  r.stream = body.value("stream", false) == true;
  if (!IsAbsent(body, "stream_options")) {
    const Json& so = body["stream_options"];
    if (!r.stream) Refuse("stream_options", "'stream_options' needs 'stream': true");
    if (!so.is_object()) Refuse("stream_options", "'stream_options' must be an object");
    for (const auto& [k, v] : so.items()) {
      if (k != "include_usage" || !v.is_boolean()) {
        Refuse("stream_options", "only stream_options.include_usage (a boolean) is supported");
      }
    }
    r.include_usage = so.value("include_usage", false);
  }
  return r;
}

}  // namespace

Json ErrorBody(const ApiError& e) {
  return {{"error",
           {{"message", e.message},
            {"type", e.type},
            {"param", e.param.empty() ? Json() : Json(e.param)},
            {"code", e.code.empty() ? Json() : Json(e.code)}}}};
}

ApiError ErrorFromStatus(const absl::Status& s) {
  ApiError e;
  e.message = std::string(s.message());
  e.param = serving::FieldOf(s);
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange: e.http_status = 400; break;
    case absl::StatusCode::kUnauthenticated:
      e.http_status = 401;
      e.code = "invalid_api_key";
      break;
    case absl::StatusCode::kNotFound: e.http_status = 404; break;
    case absl::StatusCode::kResourceExhausted:
      e.http_status = 429;
      e.type = "rate_limit_error";
      break;
    case absl::StatusCode::kDeadlineExceeded:
      e.http_status = 504;
      e.type = "timeout";
      break;
    case absl::StatusCode::kUnavailable:
      e.http_status = 503;
      e.type = "server_error";
      break;
    default:
      e.http_status = 500;
      e.type = "server_error";
  }
  return e;
}

std::optional<ApiRequest> ParseApiRequest(const Json& body, bool chat, const ModelInfo& model,
                                          ApiError* error) {
  try {
    return Parse(body, chat, model);
  } catch (const Refusal& r) {
    *error = r.error;
  } catch (const Json::exception& e) {  // a value of the wrong JSON type
    error->http_status = 400;
    error->message = absl::StrCat("malformed request: ", e.what());
  }
  return std::nullopt;
}

namespace {

Json Tokenize(const Json& body, const ModelInfo& model) {
  if (!body.is_object()) Refuse("", "the request body must be a JSON object");
  for (const auto& [k, v] : body.items()) {
    if (k != "content" && k != "add_special" && k != "with_pieces") {
      Refuse(k, absl::StrCat("unknown parameter '", k, "'"));
    }
  }
  if (IsAbsent(body, "content") || !body["content"].is_string()) {
    Refuse("content", "'content' must be a string");
  }
  for (const char* flag : {"add_special", "with_pieces"}) {
    if (!IsAbsent(body, flag) && !body[flag].is_boolean()) {
      Refuse(flag, absl::StrCat("'", flag, "' must be a boolean"));
    }
  }
  if (model.tokenizer == nullptr) Refuse("content", "this model has no tokenizer.json");
  const std::vector<int32_t> ids = model.tokenizer->Encode(
      body["content"].get<std::string>(), body.value("add_special", false) == true);
  Json tokens = Json::array();
  const bool pieces = body.value("with_pieces", false) == true;
  for (int32_t id : ids) {
    if (pieces) {
      tokens.push_back({{"id", id}, {"piece", model.tokenizer->Decode(std::vector<int32_t>{id})}});
    } else {
      tokens.push_back(id);
    }
  }
  return {{"tokens", tokens}};
}

Json Detokenize(const Json& body, const ModelInfo& model) {
  if (!body.is_object()) Refuse("", "the request body must be a JSON object");
  for (const auto& [k, v] : body.items()) {
    if (k != "tokens") Refuse(k, absl::StrCat("unknown parameter '", k, "'"));
  }
  if (IsAbsent(body, "tokens") || !body["tokens"].is_array()) {
    Refuse("tokens", "'tokens' must be an array of token ids");
  }
  if (model.tokenizer == nullptr) Refuse("tokens", "this model has no tokenizer.json");
  const int64_t vocab = model.tokenizer->vocab_size();
  std::vector<int32_t> ids;
  ids.reserve(body["tokens"].size());
  for (const Json& x : body["tokens"]) {
    // Checked as a 64-bit integer before narrowing (2^32 + 5 is not 5).
    const bool in_vocab = x.is_number_integer() &&
                          (x.is_number_unsigned() ? x.get<uint64_t>() < static_cast<uint64_t>(vocab)
                                                  : x.get<int64_t>() >= 0 && x.get<int64_t>() < vocab);
    if (!in_vocab) {
      Refuse("tokens", absl::StrCat("token ", x.dump(), " is not an id in the vocabulary [0, ",
                                    vocab, ")"));
    }
    ids.push_back(static_cast<int32_t>(x.get<int64_t>()));
  }
  return {{"content", model.tokenizer->Decode(ids)}};
}

}  // namespace

std::optional<Json> TokenizeRequest(const Json& body, bool detokenize, const ModelInfo& model,
                                    ApiError* error) {
  try {
    return detokenize ? Detokenize(body, model) : Tokenize(body, model);
  } catch (const Refusal& r) {
    *error = r.error;
  } catch (const Json::exception& e) {
    error->http_status = 400;
    error->message = absl::StrCat("malformed request: ", e.what());
  }
  return std::nullopt;
}

std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

bool ModelInfo::Serves(const std::string& id) const {
  return id == name || std::find(aliases.begin(), aliases.end(), id) != aliases.end();
}

std::vector<std::string> ModelInfo::Ids() const {
  std::vector<std::string> ids = {name};
  ids.insert(ids.end(), aliases.begin(), aliases.end());
  return ids;
}

}  // namespace moe::openai
