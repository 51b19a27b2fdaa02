// The parsed form of a Jinja template (internal to jinja*.cc).
#ifndef MOECACHE_SERVICES_OPENAI_JINJA_AST_H_
#define MOECACHE_SERVICES_OPENAI_JINJA_AST_H_

#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "nlohmann/json.hpp"

namespace moe::jinja {

using Json = nlohmann::ordered_json;

// Thrown inside the parser and the evaluator only; JinjaTemplate turns it
// into an absl::Status before returning.
struct JinjaError : std::runtime_error {
  JinjaError(int line, const std::string& message, bool raised = false)
      : std::runtime_error(message), line(line), raised(raised) {}
  int line;
  bool raised;  // from raise_exception(): the template's own message
};

struct Expr;
using ExprPtr = std::shared_ptr<const Expr>;

enum class ExprKind {
  kLiteral,  // value
  kName,     // name
  kList,     // args: items
  kTuple,    // args: items
  kDict,     // args: key, value, key, value, ...
  kAttr,     // args[0].name
  kIndex,    // args[0][args[1]]
  kSlice,    // args[0][args[1]:args[2]:args[3]], absent parts null
  kCall,     // args[0](args[1..], kwargs)
  kFilter,   // args[0] | name(args[1..], kwargs)
  kTest,     // args[0] is [not] name(args[1..])
  kUnary,    // name args[0]: "not", "-", "+"
  kBinary,   // args[0] name args[1]
  kCond,     // args[0] if args[1] else args[2] (args[2] may be null)
};

struct Expr {
  ExprKind kind;
  int line = 0;
  Json value;
  std::string name;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  bool negate = false;  // `is not`, `not in`
};

enum class NodeKind {
  kText,      // text
  kOutput,    // {{ expr }}
  kIf,        // branches, else_body
  kFor,       // targets in expr [if filter]: body [else else_body]
  kSet,       // targets = [name] or [name, attr]; expr
  kSetBlock,  // {% set name %}body{% endset %}
  kBreak,
  kContinue,
  kBlock,     // body only ({% generation %})
};

struct Node;
using NodePtr = std::shared_ptr<const Node>;
using NodeList = std::vector<NodePtr>;

struct Node {
  NodeKind kind;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr filter;
  std::vector<std::string> targets;
  std::vector<std::pair<ExprPtr, NodeList>> branches;
  NodeList body;
  NodeList else_body;
};

// The template's tree (a kBlock node). Throws JinjaError.
NodePtr ParseTemplate(std::string_view source);

}  // namespace moe::jinja

#endif  // MOECACHE_SERVICES_OPENAI_JINJA_AST_H_
