// A model's chat template: tokenizer_config.json's `chat_template` (a
// string, or a list of {name, template} of which "default" is used),
// rendered the way transformers' apply_chat_template does: variables
// `messages`, `add_generation_prompt`, `bos_token`, `eos_token` (plus any
// extra variables given).
//
//   ASSIGN_OR_RETURN(auto t, ChatTemplate::FromModelDir(dir));  // or null
//   ASSIGN_OR_RETURN(std::string prompt, t->Apply(messages, true));
//
// The worker's --chat-template FILE|NAME chooses through Resolve(): a
// built-in template by name (BuiltinChatTemplateNames(): chatml, llama3,
// plain), a file, or the model's own, with ChatML as the fallback for a
// model that has none.
//
// Thread-safe after construction.
#ifndef MOECACHE_SERVICES_OPENAI_CHAT_TEMPLATE_H_
#define MOECACHE_SERVICES_OPENAI_CHAT_TEMPLATE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "services/openai/jinja.h"

namespace moe::openai {

class ChatTemplate {
 public:
  // Parses `source` and renders a probe conversation (user, assistant,
  // user; add_generation_prompt) so that a template this interpreter cannot
  // render fails here, at start, not at the first request.
  static absl::StatusOr<std::unique_ptr<ChatTemplate>> Create(std::string source,
                                                              std::string bos_token,
                                                              std::string eos_token);
  // From `dir`/tokenizer_config.json (a `.gguf` file: its
  // tokenizer.chat_template, bos and eos). Null (OK) when the model has no
  // chat template; INVALID_ARGUMENT for one that cannot be parsed or
  // rendered.
  static absl::StatusOr<std::unique_ptr<ChatTemplate>> FromModelDir(const std::string& dir);

  // What the worker serves chat with (--chat-template `choice`):
  //   a built-in NAME -> that template;
  //   anything else non-empty -> a FILE: a Jinja template, or a JSON object
  //     with a "chat_template" (a tokenizer_config.json);
  //   "" -> the model's tokenizer_config.json template, or ChatML when it
  //     has none (then *fallback is true: the caller warns).
  // bos/eos tokens are the model's (tokenizer_config.json) in every case.
  // *origin says which it was, for the start-up log. INVALID_ARGUMENT
  // naming the flag for an unknown name, a missing file or a template that
  // cannot be rendered.
  static absl::StatusOr<std::unique_ptr<ChatTemplate>> Resolve(const std::string& choice,
                                                               const std::string& model_dir,
                                                               bool* fallback,
                                                               std::string* origin);

  // `messages` is an array of {role, content}. FAILED_PRECONDITION when the
  // template raises (e.g. roles that do not alternate), INVALID_ARGUMENT
  // for other render errors.
  absl::StatusOr<std::string> Apply(const nlohmann::ordered_json& messages,
                                    bool add_generation_prompt,
                                    const nlohmann::ordered_json& extra = {}) const;

 private:
  ChatTemplate(jinja::JinjaTemplate t, std::string bos, std::string eos)
      : template_(std::move(t)), bos_(std::move(bos)), eos_(std::move(eos)) {}
  jinja::JinjaTemplate template_;
  std::string bos_;
  std::string eos_;
};

// The names --chat-template accepts besides a file.
std::vector<std::string> BuiltinChatTemplateNames();

}  // namespace moe::openai

#endif  // MOECACHE_SERVICES_OPENAI_CHAT_TEMPLATE_H_
