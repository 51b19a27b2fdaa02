#include "services/openai/chat_template.h"

#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/file_util.h"
#include "common/gguf.h"
#include "common/status_macros.h"

namespace moe::openai {
namespace {

using Json = nlohmann::ordered_json;

// A special token as tokenizer_config.json names it: a string or
// {"content": s}; "" when absent or null.
std::string SpecialToken(const Json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return "";
}

struct Builtin {
  const char* name;
  const char* source;
};

// Built-in templates (written for this project, in the shape each family's
// own tokenizer_config.json template produces).
constexpr Builtin kBuiltins[] = {
    // With `tools`: a system turn lists them (its own system message goes
    // first in it) and says to call one as <tool_call>{"name", "arguments"}
    // </tool_call> (tool_calls.h reads that back); tool results come back
    // as user turns in <tool_response>, as Hermes-style templates do.
    {"chatml",
     "{% if tools %}{{ '<|im_start|>system\n' }}"
     "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] + '\n\n' }}{% endif %}"
     "{{ '# Tools\n\nThese functions are available, described as JSON schemas inside "
     "<tools></tools>:\n<tools>' }}{% for tool in tools %}{{ '\n' }}{{ tool | tojson }}"
     "{% endfor %}{{ '\n</tools>\n\nTo call one, answer with its name and arguments as a JSON "
     "object inside <tool_call></tool_call> tags:\n<tool_call>\n{\"name\": \"NAME\", "
     "\"arguments\": {...}' + '}\n</tool_call><|im_end|>\n' }}{% endif %}"
     "{% for message in messages %}"
     "{% if tools and loop.first and message['role'] == 'system' %}"
     "{% elif message['role'] == 'tool' %}{{ '<|im_start|>user\n<tool_response>\n' + "
     "message['content'] + '\n</tool_response><|im_end|>\n' }}"
     "{% elif message['role'] == 'assistant' and message['tool_calls'] %}"
     "{{ '<|im_start|>assistant\n' + message['content'] }}"
     "{% for call in message['tool_calls'] %}{{ '\n<tool_call>\n{\"name\": \"' + "
     "call['function']['name'] + '\", \"arguments\": ' }}"
     "{% if call['function']['arguments'] is string %}{{ call['function']['arguments'] }}"
     "{% else %}{{ call['function']['arguments'] | tojson }}{% endif %}"
     "{{ '}\n</tool_call>' }}{% endfor %}{{ '<|im_end|>\n' }}"
     "{% else %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
     "'<|im_end|>' + '\n' }}{% endif %}{% endfor %}"
     "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"},
    {"llama3",
     "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
     "'<|end_header_id|>\n\n' + message['content'] + '<|eot_id|>' }}{% endfor %}"
     "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
     "{% endif %}"},
    // For base models trained on plain text: a transcript.
    {"plain",
     "{% for message in messages %}{% if message['role'] == 'system' %}{{ message['content'] + "
     "'\n\n' }}{% elif message['role'] == 'user' %}{{ 'User: ' + message['content'] + '\n' }}"
     "{% else %}{{ 'Assistant: ' + message['content'] + '\n' }}{% endif %}{% endfor %}"
     "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"},
};

constexpr char kFallback[] = "chatml";

const char* BuiltinSource(const std::string& name) {
  for (const Builtin& b : kBuiltins) {
    if (name == b.name) return b.source;
  }
  return nullptr;
}

absl::StatusOr<std::string> ReadText(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot be read"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool IsGguf(const std::string& path) {
  return absl::EndsWith(path, ".gguf") && IsRegularFile(path);
}

// A GGUF file's tokenizer.chat_template and bos/eos token texts, in the
// shape of a tokenizer_config.json.
absl::StatusOr<Json> GgufConfig(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<GgufCheckpoint> gguf, GgufCheckpoint::Open(path));
  const GgufMetadata& m = gguf->metadata();
  Json config = Json::object();
  if (m.Has("tokenizer.chat_template")) {
    ASSIGN_OR_RETURN(absl::string_view t, m.GetString("tokenizer.chat_template"));
    config["chat_template"] = std::string(t);
  }
  if (m.Has("tokenizer.ggml.tokens")) {
    ASSIGN_OR_RETURN(std::vector<absl::string_view> tokens,
                     m.GetStringArray("tokenizer.ggml.tokens"));
    for (const auto& [key, name] : {std::pair{"tokenizer.ggml.bos_token_id", "bos_token"},
                                    std::pair{"tokenizer.ggml.eos_token_id", "eos_token"}}) {
      if (!m.Has(key)) continue;
      ASSIGN_OR_RETURN(int64_t id, m.GetInt(key));
      if (id >= 0 && id < static_cast<int64_t>(tokens.size())) {
        config[name] = std::string(tokens[static_cast<size_t>(id)]);
      }
    }
  }
  return config;
}

// Where a model's own template comes from, for the start-up log.
std::string OwnTemplateOrigin(const std::string& model) {
  return IsGguf(model) ? absl::StrCat(model, " (tokenizer.chat_template)")
                       : absl::StrCat(model, "/tokenizer_config.json");
}

// tokenizer_config.json as an object (a GGUF file: its metadata, GgufConfig);
// an empty object when the file is absent. INVALID_ARGUMENT when it is not a
// JSON object.
absl::StatusOr<Json> ReadConfig(const std::string& dir) {
  if (IsGguf(dir)) return GgufConfig(dir);
  const std::string path = dir + "/tokenizer_config.json";
  absl::StatusOr<std::string> text = ReadText(path);
  if (!text.ok()) return Json::object();
  Json config = Json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  }
  return config;
}

// The "chat_template" of a config object: "" when there is none.
absl::StatusOr<std::string> TemplateOf(const Json& config, const std::string& path) {
  auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) return std::string();
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": chat_template is not a string"));
  }
  for (const Json& named : *it) {
    if (named.is_object() && named.value("name", "") == "default" && named.contains("template") &&
        named["template"].is_string()) {
      return named["template"].get<std::string>();
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat(path, ": chat_template is a list without a \"default\" entry"));
}

}  // namespace

std::vector<std::string> BuiltinChatTemplateNames() {
  std::vector<std::string> names;
  for (const Builtin& b : kBuiltins) names.push_back(b.name);
  return names;
}

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::Resolve(const std::string& choice,
                                                                    const std::string& model_dir,
                                                                    bool* fallback,
                                                                    std::string* origin) {
  *fallback = false;
  absl::StatusOr<Json> config = ReadConfig(model_dir);
  if (!config.ok()) return config.status();
  const std::string bos = SpecialToken(*config, "bos_token");
  const std::string eos = SpecialToken(*config, "eos_token");
  std::string source;
  if (choice.empty()) {
    absl::StatusOr<std::unique_ptr<ChatTemplate>> own = FromModelDir(model_dir);
    if (!own.ok() || *own != nullptr) {
      *origin = OwnTemplateOrigin(model_dir);
      return own;
    }
    *fallback = true;
    *origin = absl::StrCat("built-in ", kFallback, " (the model has none)");
    source = BuiltinSource(kFallback);
  } else if (const char* builtin = BuiltinSource(choice); builtin != nullptr) {
    *origin = absl::StrCat("built-in ", choice);
    source = builtin;
  } else {
    absl::StatusOr<std::string> text = ReadText(choice);
    if (!text.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--chat-template ", choice, ": neither a built-in (",
          absl::StrJoin(BuiltinChatTemplateNames(), ", "), ") nor a readable file"));
    }
    source = *text;
    const Json j = Json::parse(source, nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded() && j.is_object()) {
      absl::StatusOr<std::string> inner = TemplateOf(j, choice);
      if (!inner.ok()) return inner.status();
      if (inner->empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--chat-template ", choice, ": a JSON object without chat_template"));
      }
      source = *inner;
    }
    *origin = choice;
  }
  absl::StatusOr<std::unique_ptr<ChatTemplate>> t = Create(source, bos, eos);
  if (!t.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--chat-template ", choice, ": ", t.status().message()));
  }
  return t;
}

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::Create(std::string source,
                                                                   std::string bos_token,
                                                                   std::string eos_token) {
  absl::StatusOr<jinja::JinjaTemplate> parsed = jinja::JinjaTemplate::Parse(source);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("chat_template cannot be parsed: ", parsed.status().message()));
  }
  std::unique_ptr<ChatTemplate> t(
      new ChatTemplate(*std::move(parsed), std::move(bos_token), std::move(eos_token)));
  const Json probe = Json::array({{{"role", "user"}, {"content", "Hello"}},
                                  {{"role", "assistant"}, {"content", "Hi."}},
                                  {{"role", "user"}, {"content", "How are you?"}}});
  absl::StatusOr<std::string> rendered = t->Apply(probe, /*add_generation_prompt=*/true);
  if (!rendered.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chat_template cannot render a user/assistant/user conversation: ",
        rendered.status().message()));
  }
  return t;
}

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::FromModelDir(const std::string& dir) {
  const std::string path = OwnTemplateOrigin(dir);
  absl::StatusOr<Json> config = ReadConfig(dir);
  if (!config.ok()) return config.status();
  absl::StatusOr<std::string> source = TemplateOf(*config, path);
  if (!source.ok()) return source.status();
  if (source->empty()) return std::unique_ptr<ChatTemplate>();
  absl::StatusOr<std::unique_ptr<ChatTemplate>> t =
      Create(*source, SpecialToken(*config, "bos_token"), SpecialToken(*config, "eos_token"));
  if (!t.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", t.status().message()));
  return t;
}

absl::StatusOr<std::string> ChatTemplate::Apply(const nlohmann::ordered_json& messages,
                                                bool add_generation_prompt,
                                                const nlohmann::ordered_json& extra) const {
  Json context = Json::object();
  if (extra.is_object()) context = extra;
  context["messages"] = messages;
  context["add_generation_prompt"] = add_generation_prompt;
  context["bos_token"] = bos_;
  context["eos_token"] = eos_;
  return template_.Render(context);
}

}  // namespace moe::openai
