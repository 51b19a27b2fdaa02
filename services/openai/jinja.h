// An interpreter for the subset of Jinja2 that Hugging Face chat templates
// use (tokenizer_config.json's `chat_template`), with the environment
// transformers renders them in: trim_blocks and lstrip_blocks on, loop
// controls (break/continue), `raise_exception`, no autoescape.
//
//   ASSIGN_OR_RETURN(JinjaTemplate t, JinjaTemplate::Parse(source));
//   ASSIGN_OR_RETURN(std::string text, t.Render(context_json));
//
// Supported: text, {{ }}, {% %} and {# #} with `-` whitespace control;
// for (tuple targets, `if` filter, else, loop.index/index0/revindex/
// revindex0/first/last/length/previtem/nextitem), if/elif/else, set (also
// `ns.attr` and block set), namespace(), generation blocks (rendered as
// their body), break, continue; literals, lists, dicts, tuples; the
// operators or and not, comparisons, in / not in, is / is not tests, ~ + -
// * / // % **, conditional expressions, attribute, subscript and slice
// access; the common filters, tests and string/dict methods (see jinja.cc).
// Values are JSON values (nlohmann::ordered_json); undefined is the
// "discarded" JSON value. Anything else is a parse error naming the line.
//
// Thread-safety: a parsed template is immutable; Render may be called from
// several threads at once.
#ifndef MOECACHE_SERVICES_OPENAI_JINJA_H_
#define MOECACHE_SERVICES_OPENAI_JINJA_H_

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace moe::jinja {

struct Node;  // parsed tree (jinja.cc)

class JinjaTemplate {
 public:
  // INVALID_ARGUMENT naming the line for syntax errors and for tags,
  // filters or tests outside the subset.
  static absl::StatusOr<JinjaTemplate> Parse(std::string_view source);

  // Renders with the variables of `context` (an object). raise_exception()
  // gives FAILED_PRECONDITION with its message; type errors and unknown
  // names called as functions give INVALID_ARGUMENT.
  absl::StatusOr<std::string> Render(const nlohmann::ordered_json& context) const;

 private:
  std::shared_ptr<const Node> root_;
};

// JSON as Python's json.dumps writes it (", " and ": " separators, or
// `indent` spaces per level when >= 0; non-ASCII kept): what `tojson`
// gives in transformers' environment.
std::string PythonJsonDumps(const nlohmann::ordered_json& value, int indent = -1);

}  // namespace moe::jinja

#endif  // MOECACHE_SERVICES_OPENAI_JINJA_H_
