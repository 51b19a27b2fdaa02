#include "services/openai/chat_template.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

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

}  // namespace

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
  const std::string path = dir + "/tokenizer_config.json";
  std::ifstream in(path);
  if (!in) return std::unique_ptr<ChatTemplate>();
  std::stringstream ss;
  ss << in.rdbuf();
  Json config = Json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  }
  auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) return std::unique_ptr<ChatTemplate>();
  std::string source;
  if (it->is_string()) {
    source = it->get<std::string>();
  } else if (it->is_array()) {
    for (const Json& named : *it) {
      if (named.is_object() && named.value("name", "") == "default" &&
          named.contains("template") && named["template"].is_string()) {
        source = named["template"].get<std::string>();
      }
    }
    if (source.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": chat_template is a list without a \"default\" entry"));
    }
  } else {
    return absl::InvalidArgumentError(absl::StrCat(path, ": chat_template is not a string"));
  }
  absl::StatusOr<std::unique_ptr<ChatTemplate>> t =
      Create(source, SpecialToken(config, "bos_token"), SpecialToken(config, "eos_token"));
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
