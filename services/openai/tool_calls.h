// Tool calls in the OpenAI API: what the model's text means as calls.
//
// A request's `tools` and `tool_choice` (openai_api.h) pick a ToolMode:
// - kNamed ({"type": "function", "function": {"name": N}}): decoding is
//   constrained to the function's `parameters` schema; the text is the
//   call's arguments.
// - kRequired: constrained to one object {"name": one of the tools,
//   "arguments": that tool's parameters}; one call per turn.
// - kAuto (the default with tools): unconstrained; the model calls a tool
//   by writing <tool_call>{"name": ..., "arguments": {...}}</tool_call>
//   (the convention of Hermes/Qwen templates and of the built-in chatml
//   template), and each such block that names an offered tool and holds
//   arguments that are a JSON object becomes a call. Text outside the blocks
//   stays content.
// - kNone: no tools (they are not shown to the template either).
//
// Pure functions of text; thread-safe.
#ifndef MOECACHE_SERVICES_OPENAI_TOOL_CALLS_H_
#define MOECACHE_SERVICES_OPENAI_TOOL_CALLS_H_

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace moe::openai {

enum class ToolMode { kNone, kAuto, kRequired, kNamed };

struct ToolCall {
  std::string name;
  // A JSON object, OpenAI's "arguments" string: as the model wrote it for
  // kNamed (equal to what was streamed), compact otherwise.
  std::string arguments;
};

inline constexpr std::string_view kToolCallOpen = "<tool_call>";
inline constexpr std::string_view kToolCallClose = "</tool_call>";

// The call a constrained (kNamed / kRequired) text stands for; nullopt when
// the text is not a whole value (cut short by max_tokens or a stop string).
// `named`: the function of kNamed, "" for kRequired.
std::optional<ToolCall> ForcedToolCall(std::string_view text, const std::string& named);

struct ParsedText {
  std::string content;          // the text outside the calls, trimmed
  std::vector<ToolCall> calls;  // in order
};
// kAuto: the <tool_call> blocks of `text` that call one of `tools`; a
// block that does not (unknown name, not JSON, unclosed) stays content.
ParsedText ParseToolCallBlocks(std::string_view text, const std::vector<std::string>& tools);

// How much of `text` (kAuto, streaming) can go out as content now: up to
// the first <tool_call>, holding back a tail that may begin one.
size_t StreamableContent(std::string_view text);

}  // namespace moe::openai

#endif  // MOECACHE_SERVICES_OPENAI_TOOL_CALLS_H_
