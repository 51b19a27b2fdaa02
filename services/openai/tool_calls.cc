#include "services/openai/tool_calls.h"

#include <algorithm>

#include "nlohmann/json.hpp"

namespace moe::openai {
namespace {

using Json = nlohmann::ordered_json;

std::optional<Json> ParseJson(std::string_view text) {
  Json j = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return std::nullopt;
  return j;
}

std::string_view Trim(std::string_view s) {
  auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

std::string Compact(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

// {"name": N, "arguments": {...} or "{...}"} with N among `tools` (any name
// when `tools` is null).
std::optional<ToolCall> CallOf(const Json& j, const std::vector<std::string>* tools) {
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return std::nullopt;
  const std::string name = j["name"].get<std::string>();
  if (tools != nullptr && std::find(tools->begin(), tools->end(), name) == tools->end()) {
    return std::nullopt;
  }
  Json args = j.contains("arguments") ? j["arguments"] : Json::object();
  if (args.is_string()) {
    std::optional<Json> parsed = ParseJson(args.get<std::string>());
    if (!parsed.has_value()) return std::nullopt;
    args = *parsed;
  }
  if (!args.is_object()) return std::nullopt;
  return ToolCall{name, Compact(args)};
}

}  // namespace

std::optional<ToolCall> ForcedToolCall(std::string_view text, const std::string& named) {
  std::optional<Json> j = ParseJson(text);
  if (!j.has_value()) return std::nullopt;
  if (!named.empty()) {
    if (!j->is_object()) return std::nullopt;
    // As written, so that it equals what was streamed.
    return ToolCall{named, std::string(text)};
  }
  return CallOf(*j, nullptr);
}

ParsedText ParseToolCallBlocks(std::string_view text, const std::vector<std::string>& tools) {
  ParsedText out;
  std::string content;
  size_t at = 0;
  while (at < text.size()) {
    const size_t open = text.find(kToolCallOpen, at);
    if (open == std::string_view::npos) break;
    const size_t body = open + kToolCallOpen.size();
    const size_t close = text.find(kToolCallClose, body);
    if (close == std::string_view::npos) break;
    std::optional<Json> j = ParseJson(Trim(text.substr(body, close - body)));
    std::optional<ToolCall> call = j.has_value() ? CallOf(*j, &tools) : std::nullopt;
    const size_t end = close + kToolCallClose.size();
    if (call.has_value()) {
      content.append(text.substr(at, open - at));
      out.calls.push_back(*std::move(call));
    } else {
      content.append(text.substr(at, end - at));
    }
    at = end;
  }
  content.append(text.substr(std::min(at, text.size())));
  out.content = std::string(Trim(content));
  return out;
}

size_t StreamableContent(std::string_view text) {
  const size_t open = text.find(kToolCallOpen);
  if (open != std::string_view::npos) return open;
  // A tail that is a proper prefix of the marker may still become one.
  const size_t longest = std::min(text.size(), kToolCallOpen.size() - 1);
  for (size_t n = longest; n > 0; --n) {
    if (text.substr(text.size() - n) == kToolCallOpen.substr(0, n)) return text.size() - n;
  }
  return text.size();
}

}  // namespace moe::openai
