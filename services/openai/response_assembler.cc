// ResponseAssembler (openai_api.h): the runner's per-token responses as
// OpenAI objects, chunks and whole answers, tool calls included
// (tool_calls.h). Request parsing is openai_api.cc's.
#include "services/openai/openai_api.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/openai/tool_calls.h"

namespace moe::openai {
namespace {

std::string TokenText(const ModelInfo& model, int32_t id) {
  if (model.tokenizer == nullptr) return "";
  return model.tokenizer->Decode(std::vector<int32_t>{id});
}

Json Bytes(const std::string& s) {
  Json out = Json::array();
  for (unsigned char c : s) out.push_back(static_cast<int>(c));
  return out;
}

}  // namespace

ResponseAssembler::ResponseAssembler(const ApiRequest& request, const ModelInfo& model,
                                     std::string id, int64_t created)
    : request_(request), model_(model), id_(std::move(id)), created_(created) {
  if (request_.chat) {
    logprobs_ = {{"content", Json::array()}};
  } else {
    logprobs_ = {{"tokens", Json::array()}, {"token_logprobs", Json::array()},
                 {"top_logprobs", Json::array()}, {"text_offset", Json::array()}};
  }
}

Json ResponseAssembler::Envelope(const char* object) const {
  return {{"id", id_}, {"object", object}, {"created", created_}, {"model", model_.name}};
}

Json ResponseAssembler::Logprobs(const v1::GenerateResponse& r) {
  const std::string token = TokenText(model_, r.token_id());
  if (request_.chat) {
    Json top = Json::array();
    for (const v1::TokenLogprob& alt : r.top_logprobs()) {
      const std::string t = TokenText(model_, alt.token_id());
      top.push_back({{"token", t}, {"logprob", alt.logprob()}, {"bytes", Bytes(t)}});
    }
    return {{"token", token}, {"logprob", r.logprob()}, {"bytes", Bytes(token)},
            {"top_logprobs", top}};
  }
  Json top = Json::object();
  for (const v1::TokenLogprob& alt : r.top_logprobs()) {
    top[TokenText(model_, alt.token_id())] = alt.logprob();
  }
  Json one = {{"tokens", {token}}, {"token_logprobs", {r.logprob()}}, {"top_logprobs", {top}},
              {"text_offset", {text_offset_}}};
  text_offset_ += static_cast<int>(r.text().size());
  return one;
}

Json ResponseAssembler::Usage() const {
  const int prompt = usage_.prompt_tokens(), completion = usage_.generated_tokens();
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion},
          // OpenAI's shape: prompt tokens served from the prefix cache.
          {"prompt_tokens_details", {{"cached_tokens", usage_.cached_prompt_tokens()}}},
          // Ours, beside OpenAI's fields: this request's expert cache outcome.
          {"moe_cache",
           {{"expert_hits", usage_.expert_hits()},
            {"expert_misses", usage_.expert_misses()},
            {"expert_stall_seconds", usage_.expert_stall_seconds()}}}};
}

Json ResponseAssembler::CallObject(size_t index, const ToolCall& call) const {
  // Unique per response: the completion's id and the call's index.
  const size_t dash = id_.find('-');
  return {{"id", absl::StrCat("call_", dash == std::string::npos ? id_ : id_.substr(dash + 1), "_",
                              index)},
          {"type", "function"},
          {"function", {{"name", call.name}, {"arguments", call.arguments}}}};
}

std::vector<ToolCall> ResponseAssembler::Calls(std::string* content) const {
  *content = text_;
  switch (request_.tool_mode) {
    case ToolMode::kNone:
      return {};
    case ToolMode::kNamed:
    case ToolMode::kRequired: {
      // A forced call cut short (max_tokens, a stop string) stays text.
      std::optional<ToolCall> call = ForcedToolCall(text_, request_.tool_name);
      if (!call.has_value() || finish_reason_ != "stop") return {};
      content->clear();
      return {*std::move(call)};
    }
    case ToolMode::kAuto: {
      ParsedText parsed = ParseToolCallBlocks(text_, request_.tool_names);
      if (!parsed.calls.empty()) *content = std::move(parsed.content);
      return std::move(parsed.calls);
    }
  }
  return {};
}

void ResponseAssembler::ToolDelta(const v1::GenerateResponse& r, Json* delta,
                                  std::string* finish) {
  const bool first = text_.empty() && streamed_ == 0;
  text_ += r.text();
  const bool last = !finish->empty();
  if (request_.tool_mode == ToolMode::kNamed) {
    // The text is the arguments: streamed as they come.
    if (first) {
      Json call = CallObject(0, {request_.tool_name, r.text()});
      call["index"] = 0;
      (*delta)["tool_calls"] = Json::array({call});
    } else if (!r.text().empty()) {
      (*delta)["tool_calls"] = {{{"index", 0}, {"function", {{"arguments", r.text()}}}}};
    }
    if (last && *finish == "stop" && ForcedToolCall(text_, request_.tool_name).has_value()) {
      *finish = "tool_calls";
    }
    streamed_ = text_.size();
    return;
  }
  if (request_.tool_mode == ToolMode::kAuto && !last) {
    // Content until a <tool_call> may begin; the rest waits for the end.
    const size_t n = StreamableContent(text_);
    if (n > streamed_) {
      (*delta)["content"] = text_.substr(streamed_, n - streamed_);
      streamed_ = n;
    }
    return;
  }
  if (!last) return;  // kRequired: the call goes out whole, at the end
  finish_reason_ = *finish;
  std::string content;
  std::vector<ToolCall> calls = Calls(&content);
  if (calls.empty()) {
    if (text_.size() > streamed_) (*delta)["content"] = text_.substr(streamed_);
    return;
  }
  // kAuto: what was held back beside the calls (the content before them was
  // streamed already).
  if (request_.tool_mode == ToolMode::kAuto) {
    const std::string rest = ParseToolCallBlocks(text_.substr(streamed_), request_.tool_names).content;
    if (!rest.empty()) (*delta)["content"] = rest;
  }
  Json list = Json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    Json call = CallObject(i, calls[i]);
    call["index"] = i;
    list.push_back(std::move(call));
  }
  (*delta)["tool_calls"] = std::move(list);
  *finish = "tool_calls";
}

Json ResponseAssembler::Chunk(const v1::GenerateResponse& r) {
  if (r.has_usage()) usage_ = r.usage();
  Json choice = {{"index", 0}};
  std::string finish = r.finish_reason();
  if (request_.chat) {
    Json delta = Json::object();
    if (!sent_role_) delta["role"] = "assistant";
    sent_role_ = true;
    if (request_.tool_mode == ToolMode::kNone) {
      delta["content"] = r.text();
    } else {
      ToolDelta(r, &delta, &finish);
    }
    choice["delta"] = delta;
  } else {
    choice["text"] = r.text();
  }
  if (request_.logprobs) {
    Json lp = Logprobs(r);
    choice["logprobs"] = request_.chat ? Json{{"content", {lp}}} : lp;
  } else {
    choice["logprobs"] = nullptr;
  }
  choice["finish_reason"] = finish.empty() ? Json() : Json(finish);
  Json chunk = Envelope(request_.chat ? "chat.completion.chunk" : "text_completion");
  chunk["choices"] = Json::array({choice});
  if (request_.include_usage) chunk["usage"] = nullptr;
  return chunk;
}

Json ResponseAssembler::UsageChunk() const {
  Json chunk = Envelope(request_.chat ? "chat.completion.chunk" : "text_completion");
  chunk["choices"] = Json::array();
  chunk["usage"] = Usage();
  return chunk;
}

void ResponseAssembler::Add(const v1::GenerateResponse& r) {
  if (r.has_usage()) usage_ = r.usage();
  if (!r.finish_reason().empty()) finish_reason_ = r.finish_reason();
  if (request_.logprobs) {
    Json lp = Logprobs(r);
    if (request_.chat) {
      logprobs_["content"].push_back(lp);
    } else {
      for (const char* k : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
        logprobs_[k].push_back(lp[k][0]);
      }
    }
  }
  text_ += r.text();
}

Json ResponseAssembler::Final() const {
  Json choice = {{"index", 0}};
  std::string finish = finish_reason_;
  if (request_.chat) {
    std::string content;
    const std::vector<ToolCall> calls = Calls(&content);
    choice["message"] = {{"role", "assistant"}, {"content", content}};
    if (!calls.empty()) {
      if (content.empty()) choice["message"]["content"] = nullptr;
      Json list = Json::array();
      for (size_t i = 0; i < calls.size(); ++i) list.push_back(CallObject(i, calls[i]));
      choice["message"]["tool_calls"] = std::move(list);
      finish = "tool_calls";
    }
  } else {
    choice["text"] = text_;
  }
  choice["logprobs"] = request_.logprobs ? logprobs_ : Json();
  choice["finish_reason"] = finish;
  Json out = Envelope(request_.chat ? "chat.completion" : "text_completion");
  out["choices"] = Json::array({choice});
  out["usage"] = Usage();
  return out;
}

}  // namespace moe::openai
