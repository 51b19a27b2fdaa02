// Lexer and parser of the Jinja subset (see jinja.h).
#include <cctype>
#include <cstdlib>
#include <set>

#include "absl/strings/str_cat.h"
#include "services/openai/jinja_ast.h"

namespace moe::jinja {
namespace {

// ---- template level: text, {{ }}, {% %}, {# #} ----------------------------

struct Chunk {
  enum Kind { kText, kVar, kTag } kind;
  std::string body;
  int line;
};

int LineAt(std::string_view s, size_t pos) {
  int line = 1;
  for (size_t i = 0; i < pos && i < s.size(); ++i) line += s[i] == '\n';
  return line;
}

// Splits the source, applying `-` whitespace control, trim_blocks (the
// newline after a tag or comment goes) and lstrip_blocks (spaces and tabs
// before a tag or comment at the start of a line go).
std::vector<Chunk> Split(std::string_view src) {
  std::vector<Chunk> out;
  size_t pos = 0;
  bool strip_next = false;  // a `-}` asked for the following whitespace
  bool trim_newline = false;
  while (pos < src.size()) {
    size_t open = src.find('{', pos);
    while (open != std::string_view::npos && open + 1 < src.size() &&
           src[open + 1] != '{' && src[open + 1] != '%' && src[open + 1] != '#') {
      open = src.find('{', open + 1);
    }
    if (open + 1 >= src.size()) open = std::string_view::npos;
    std::string text(src.substr(pos, open == std::string_view::npos ? std::string_view::npos
                                                                    : open - pos));
    if (strip_next) {
      size_t i = 0;
      while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
      text.erase(0, i);
    } else if (trim_newline && !text.empty() && text[0] == '\n') {
      text.erase(0, 1);
    } else if (trim_newline && text.size() >= 2 && text[0] == '\r' && text[1] == '\n') {
      text.erase(0, 2);
    }
    strip_next = trim_newline = false;
    if (open == std::string_view::npos) {
      if (!text.empty()) out.push_back({Chunk::kText, text, LineAt(src, pos)});
      break;
    }
    const char kind = src[open + 1];
    const char* close_str = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
    size_t close = src.find(close_str, open + 2);
    if (close == std::string_view::npos) {
      throw JinjaError(LineAt(src, open), absl::StrCat("unclosed '{", std::string(1, kind), "'"));
    }
    size_t inner_begin = open + 2, inner_end = close;
    const bool lstrip_manual = inner_begin < inner_end && src[inner_begin] == '-';
    const bool keep_lstrip = inner_begin < inner_end && src[inner_begin] == '+';
    if (lstrip_manual || keep_lstrip) ++inner_begin;
    const bool rstrip_manual = inner_end > inner_begin && src[inner_end - 1] == '-';
    const bool keep_trim = inner_end > inner_begin && src[inner_end - 1] == '+';
    if (rstrip_manual || keep_trim) --inner_end;
    if (lstrip_manual) {
      size_t n = text.size();
      while (n > 0 && std::isspace(static_cast<unsigned char>(text[n - 1]))) --n;
      text.resize(n);
    } else if (kind != '{' && !keep_lstrip) {
      size_t k = open;
      while (k > pos && (src[k - 1] == ' ' || src[k - 1] == '\t')) --k;
      const size_t blanks = open - k;
      if ((k == 0 || src[k - 1] == '\n') && blanks <= text.size()) {
        text.resize(text.size() - blanks);
      }
    }
    if (!text.empty()) out.push_back({Chunk::kText, text, LineAt(src, pos)});
    if (kind != '#') {
      out.push_back({kind == '{' ? Chunk::kVar : Chunk::kTag,
                     std::string(src.substr(inner_begin, inner_end - inner_begin)),
                     LineAt(src, open)});
    }
    strip_next = rstrip_manual;
    trim_newline = kind != '{' && !keep_trim;
    pos = close + 2;
  }
  return out;
}

// ---- expression tokens -----------------------------------------------------

struct Token {
  enum Kind { kName, kInt, kFloat, kString, kOp, kEnd } kind;
  std::string text;
  Json value;
};

std::vector<Token> Tokenize(const std::string& s, int line) {
  std::vector<Token> out;
  size_t i = 0;
  static const char* kOps2[] = {"==", "!=", "<=", ">=", "//", "**"};
  while (i < s.size()) {
    const char c = s[i];
    if (std::isspace(static_cast<unsigned char>(c))) {
      ++i;
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
      out.push_back({Token::kName, s.substr(i, j - i), {}});
      i = j;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t j = i;
      bool is_float = false;
      while (j < s.size() && (std::isdigit(static_cast<unsigned char>(s[j])) ||
                              (s[j] == '.' && !is_float && j + 1 < s.size() &&
                               std::isdigit(static_cast<unsigned char>(s[j + 1]))))) {
        is_float |= s[j] == '.';
        ++j;
      }
      const std::string num = s.substr(i, j - i);
      if (is_float) {
        out.push_back({Token::kFloat, num, Json(std::strtod(num.c_str(), nullptr))});
      } else {
        out.push_back({Token::kInt, num, Json(std::strtoll(num.c_str(), nullptr, 10))});
      }
      i = j;
    } else if (c == '\'' || c == '"') {
      std::string v;
      size_t j = i + 1;
      for (; j < s.size() && s[j] != c; ++j) {
        if (s[j] != '\\' || j + 1 >= s.size()) {
          v += s[j];
          continue;
        }
        const char e = s[++j];
        switch (e) {
          case 'n': v += '\n'; break;
          case 't': v += '\t'; break;
          case 'r': v += '\r'; break;
          case '0': v += '\0'; break;
          case '\\': v += '\\'; break;
          case '\'': v += '\''; break;
          case '"': v += '"'; break;
          case '\n': break;
          default: v += '\\'; v += e;
        }
      }
      if (j >= s.size()) throw JinjaError(line, "unterminated string literal");
      out.push_back({Token::kString, "", Json(v)});
      i = j + 1;
    } else {
      std::string op(1, c);
      if (i + 1 < s.size()) {
        for (const char* two : kOps2) {
          if (s.compare(i, 2, two) == 0) op = two;
        }
      }
      if (std::string("+-*/%~|.,:()[]{}=<>!").find(c) == std::string::npos) {
        throw JinjaError(line, absl::StrCat("unexpected character '", std::string(1, c), "'"));
      }
      if (op == "!") throw JinjaError(line, "unexpected '!'");
      out.push_back({Token::kOp, op, {}});
      i += op.size();
    }
  }
  out.push_back({Token::kEnd, "", {}});
  return out;
}

// ---- expressions -------------------------------------------------------------

const std::set<std::string>& KnownFilters() {
  static const std::set<std::string> k = {
      "length", "count", "default", "d", "safe", "string", "trim", "upper", "lower", "title",
      "capitalize", "replace", "tojson", "e", "escape", "int", "float", "abs", "round",
      "indent", "list", "first", "last", "reverse", "items", "unique", "join", "map",
      "selectattr", "rejectattr"};
  return k;
}

const std::set<std::string>& KnownTests() {
  static const std::set<std::string> k = {
      "defined", "undefined", "none", "string", "number", "integer", "float", "boolean",
      "true", "false", "mapping", "iterable", "sequence", "odd", "even", "divisibleby",
      "equalto", "eq", "==", "ne", "!=", "in"};
  return k;
}

class ExprParser {
 public:
  ExprParser(const std::string& s, int line) : toks_(Tokenize(s, line)), line_(line) {}

  ExprPtr Parse() { return Conditional(); }
  ExprPtr ParseNoCond() { return Or(); }  // for `for ... in X if Y`
  bool AtEnd() const { return toks_[pos_].kind == Token::kEnd; }
  void ExpectEnd() {
    if (!AtEnd()) Fail(absl::StrCat("unexpected '", Describe(toks_[pos_]), "'"));
  }
  bool IsName(const char* n) const {
    return toks_[pos_].kind == Token::kName && toks_[pos_].text == n;
  }
  bool IsOp(const char* o) const { return toks_[pos_].kind == Token::kOp && toks_[pos_].text == o; }
  bool AcceptName(const char* n) { return IsName(n) ? (++pos_, true) : false; }
  bool AcceptOp(const char* o) { return IsOp(o) ? (++pos_, true) : false; }
  void ExpectOp(const char* o) {
    if (!AcceptOp(o)) Fail(absl::StrCat("expected '", o, "', got '", Describe(toks_[pos_]), "'"));
  }
  std::string ExpectName() {
    if (toks_[pos_].kind != Token::kName) {
      Fail(absl::StrCat("expected a name, got '", Describe(toks_[pos_]), "'"));
    }
    return toks_[pos_++].text;
  }
  [[noreturn]] void Fail(const std::string& m) const { throw JinjaError(line_, m); }

 private:
  static std::string Describe(const Token& t) {
    if (t.kind == Token::kEnd) return "end of expression";
    if (t.kind == Token::kString) return t.value.get<std::string>();
    return t.text;
  }
  std::shared_ptr<Expr> Make(ExprKind k, std::string name = {}) {
    auto e = std::make_shared<Expr>();
    e->kind = k;
    e->line = line_;
    e->name = std::move(name);
    return e;
  }
  ExprPtr Binary(std::string op, ExprPtr a, ExprPtr b) {
    auto e = Make(ExprKind::kBinary, std::move(op));
    e->args = {std::move(a), std::move(b)};
    return e;
  }

  ExprPtr Conditional() {
    ExprPtr then = Or();
    if (!AcceptName("if")) return then;
    auto e = Make(ExprKind::kCond);
    ExprPtr cond = Or();
    ExprPtr otherwise = AcceptName("else") ? Conditional() : nullptr;
    e->args = {then, cond, otherwise};
    return e;
  }
  ExprPtr Or() {
    ExprPtr a = And();
    while (AcceptName("or")) a = Binary("or", a, And());
    return a;
  }
  ExprPtr And() {
    ExprPtr a = Not();
    while (AcceptName("and")) a = Binary("and", a, Not());
    return a;
  }
  ExprPtr Not() {
    if (AcceptName("not")) {
      auto e = Make(ExprKind::kUnary, "not");
      e->args = {Not()};
      return e;
    }
    return Compare();
  }
  ExprPtr Compare() {
    ExprPtr a = Concat();
    while (true) {
      static const char* kCmp[] = {"==", "!=", "<", ">", "<=", ">="};
      bool matched = false;
      for (const char* op : kCmp) {
        if (AcceptOp(op)) {
          a = Binary(op, a, Concat());
          matched = true;
          break;
        }
      }
      if (matched) continue;
      if (AcceptName("in")) {
        a = Binary("in", a, Concat());
      } else if (IsName("not") && toks_[pos_ + 1].kind == Token::kName &&
                 toks_[pos_ + 1].text == "in") {
        pos_ += 2;
        auto e = Make(ExprKind::kBinary, "in");
        e->args = {a, Concat()};
        e->negate = true;
        a = e;
      } else if (AcceptName("is")) {
        auto e = Make(ExprKind::kTest);
        e->negate = AcceptName("not");
        e->name = ExpectName();
        if (KnownTests().count(e->name) == 0) Fail("unknown test '" + e->name + "'");
        e->args = {a};
        if (AcceptOp("(")) {
          ParseArgs(e.get());
        } else if (toks_[pos_].kind == Token::kString || toks_[pos_].kind == Token::kInt ||
                   toks_[pos_].kind == Token::kFloat) {
          e->args.push_back(Primary());  // `is divisibleby 3`, `is equalto 'x'`
        }
        a = e;
      } else {
        return a;
      }
    }
  }
  ExprPtr Concat() {
    ExprPtr a = Add();
    while (AcceptOp("~")) a = Binary("~", a, Add());
    return a;
  }
  ExprPtr Add() {
    ExprPtr a = Mul();
    while (true) {
      if (AcceptOp("+")) a = Binary("+", a, Mul());
      else if (AcceptOp("-")) a = Binary("-", a, Mul());
      else return a;
    }
  }
  ExprPtr Mul() {
    ExprPtr a = Pow();
    while (true) {
      if (AcceptOp("*")) a = Binary("*", a, Pow());
      else if (AcceptOp("//")) a = Binary("//", a, Pow());
      else if (AcceptOp("/")) a = Binary("/", a, Pow());
      else if (AcceptOp("%")) a = Binary("%", a, Pow());
      else return a;
    }
  }
  ExprPtr Pow() {
    ExprPtr a = Unary();
    while (AcceptOp("**")) a = Binary("**", a, Unary());
    return a;
  }
  // As Jinja2: filters apply to the negated value (`-3 | abs` is 3).
  ExprPtr Unary(bool with_filter = true) {
    ExprPtr a;
    if (AcceptOp("-")) {
      auto e = Make(ExprKind::kUnary, "-");
      e->args = {Unary(false)};
      a = e;
    } else if (AcceptOp("+")) {
      a = Unary(false);
    } else {
      a = Postfix(Primary());
    }
    return with_filter ? Filtered(a) : a;
  }
  ExprPtr Filtered(ExprPtr a) {
    while (AcceptOp("|")) {
      auto e = Make(ExprKind::kFilter, ExpectName());
      if (KnownFilters().count(e->name) == 0) Fail("unknown filter '" + e->name + "'");
      e->args = {a};
      if (AcceptOp("(")) ParseArgs(e.get());
      a = Postfix(e);
    }
    return a;
  }
  // After '(' : positional and keyword arguments up to ')'.
  void ParseArgs(Expr* e) {
    while (!AcceptOp(")")) {
      if (toks_[pos_].kind == Token::kName && toks_[pos_ + 1].kind == Token::kOp &&
          toks_[pos_ + 1].text == "=") {
        std::string key = toks_[pos_].text;
        pos_ += 2;
        e->kwargs.emplace_back(key, Parse());
      } else {
        e->args.push_back(Parse());
      }
      if (!IsOp(")")) ExpectOp(",");
    }
  }
  ExprPtr Postfix(ExprPtr a) {
    while (true) {
      if (AcceptOp(".")) {
        auto e = Make(ExprKind::kAttr);
        if (toks_[pos_].kind == Token::kInt) {  // tuple.0
          e->kind = ExprKind::kIndex;
          e->args = {a, Literal(toks_[pos_++].value)};
        } else {
          e->name = ExpectName();
          e->args = {a};
        }
        a = e;
      } else if (AcceptOp("[")) {
        ExprPtr parts[3];
        int colons = 0;
        while (!AcceptOp("]")) {
          if (AcceptOp(":")) {
            if (++colons > 2) Fail("too many ':' in a slice");
            continue;
          }
          if (parts[colons] != nullptr) Fail("expected ':' or ']'");
          parts[colons] = Parse();
        }
        if (colons == 0) {
          if (parts[0] == nullptr) Fail("empty subscript");
          auto e = Make(ExprKind::kIndex);
          e->args = {a, parts[0]};
          a = e;
        } else {
          auto e = Make(ExprKind::kSlice);
          e->args = {a, parts[0], parts[1], parts[2]};
          a = e;
        }
      } else if (AcceptOp("(")) {
        auto e = Make(ExprKind::kCall);
        e->args = {a};
        ParseArgs(e.get());
        a = e;
      } else {
        return a;
      }
    }
  }
  ExprPtr Literal(Json v) {
    auto e = Make(ExprKind::kLiteral);
    e->value = std::move(v);
    return e;
  }
  ExprPtr Primary() {
    const Token& t = toks_[pos_];
    switch (t.kind) {
      case Token::kInt:
      case Token::kFloat:
        ++pos_;
        return Literal(t.value);
      case Token::kString: {
        std::string s = t.value.get<std::string>();
        ++pos_;
        while (toks_[pos_].kind == Token::kString) {  // 'a' 'b' concatenates
          s += toks_[pos_++].value.get<std::string>();
        }
        return Literal(Json(s));
      }
      case Token::kName: {
        ++pos_;
        if (t.text == "true" || t.text == "True") return Literal(Json(true));
        if (t.text == "false" || t.text == "False") return Literal(Json(false));
        if (t.text == "none" || t.text == "None") return Literal(Json(nullptr));
        return Make(ExprKind::kName, t.text);
      }
      case Token::kOp:
        if (AcceptOp("(")) {
          if (AcceptOp(")")) return Make(ExprKind::kTuple);
          ExprPtr first = Parse();
          if (AcceptOp(")")) return first;
          auto e = Make(ExprKind::kTuple);
          e->args.push_back(first);
          while (AcceptOp(",")) {
            if (IsOp(")")) break;
            e->args.push_back(Parse());
          }
          ExpectOp(")");
          return e;
        }
        if (AcceptOp("[")) {
          auto e = Make(ExprKind::kList);
          while (!AcceptOp("]")) {
            e->args.push_back(Parse());
            if (!IsOp("]")) ExpectOp(",");
          }
          return e;
        }
        if (AcceptOp("{")) {
          auto e = Make(ExprKind::kDict);
          while (!AcceptOp("}")) {
            e->args.push_back(Parse());
            ExpectOp(":");
            e->args.push_back(Parse());
            if (!IsOp("}")) ExpectOp(",");
          }
          return e;
        }
        break;
      case Token::kEnd:
        break;
    }
    Fail(absl::StrCat("unexpected '", Describe(t), "'"));
  }

  std::vector<Token> toks_;
  size_t pos_ = 0;
  int line_;
};

// ---- statements -------------------------------------------------------------

class Parser {
 public:
  explicit Parser(std::vector<Chunk> chunks) : chunks_(std::move(chunks)) {}

  NodePtr ParseAll() {
    auto root = std::make_shared<Node>();
    root->kind = NodeKind::kBlock;
    std::string end = ParseBody(&root->body, {});
    (void)end;
    return root;
  }

 private:
  static std::string TagName(const std::string& body) {
    size_t i = 0;
    while (i < body.size() && std::isspace(static_cast<unsigned char>(body[i]))) ++i;
    size_t j = i;
    while (j < body.size() && (std::isalnum(static_cast<unsigned char>(body[j])) || body[j] == '_')) ++j;
    return body.substr(i, j - i);
  }
  static std::string Rest(const std::string& body, const std::string& name) {
    return body.substr(body.find(name) + name.size());
  }

  // Parses nodes until a tag named in `ends` (returned, with its chunk
  // consumed: *end_chunk) or the end of the source (returns "").
  std::string ParseBody(NodeList* out, const std::set<std::string>& ends,
                        const Chunk** end_chunk = nullptr) {
    while (pos_ < chunks_.size()) {
      const Chunk& c = chunks_[pos_++];
      if (c.kind == Chunk::kText) {
        auto n = std::make_shared<Node>();
        n->kind = NodeKind::kText;
        n->text = c.body;
        out->push_back(n);
        continue;
      }
      if (c.kind == Chunk::kVar) {
        ExprParser p(c.body, c.line);
        auto n = std::make_shared<Node>();
        n->kind = NodeKind::kOutput;
        n->line = c.line;
        n->expr = p.Parse();
        p.ExpectEnd();
        out->push_back(n);
        continue;
      }
      const std::string name = TagName(c.body);
      if (ends.count(name) > 0) {
        if (end_chunk != nullptr) *end_chunk = &c;
        return name;
      }
      out->push_back(ParseTag(c, name));
    }
    if (!ends.empty()) {
      throw JinjaError(chunks_.empty() ? 1 : chunks_.back().line,
                       absl::StrCat("missing {% ", *ends.rbegin(), " %}"));
    }
    return "";
  }

  NodePtr ParseTag(const Chunk& c, const std::string& name) {
    auto n = std::make_shared<Node>();
    n->line = c.line;
    ExprParser p(Rest(c.body, name), c.line);
    if (name == "if") {
      n->kind = NodeKind::kIf;
      ExprPtr cond = p.Parse();
      p.ExpectEnd();
      while (true) {
        NodeList body;
        const Chunk* end = nullptr;
        std::string tag = ParseBody(&body, {"elif", "else", "endif"}, &end);
        n->branches.emplace_back(cond, std::move(body));
        if (tag == "elif") {
          ExprParser q(Rest(end->body, "elif"), end->line);
          cond = q.Parse();
          q.ExpectEnd();
          continue;
        }
        if (tag == "else") ParseBody(&n->else_body, {"endif"});
        break;
      }
    } else if (name == "for") {
      n->kind = NodeKind::kFor;
      n->targets.push_back(p.ExpectName());
      while (p.AcceptOp(",")) n->targets.push_back(p.ExpectName());
      if (!p.AcceptName("in")) p.Fail("expected 'in' in a for tag");
      n->expr = p.ParseNoCond();
      if (p.AcceptName("if")) n->filter = p.ParseNoCond();
      if (p.AcceptName("recursive")) p.Fail("recursive loops are not supported");
      p.ExpectEnd();
      NodeList body;
      std::string tag = ParseBody(&n->body, {"else", "endfor"});
      if (tag == "else") ParseBody(&n->else_body, {"endfor"});
    } else if (name == "set") {
      std::string target = p.ExpectName();
      n->targets.push_back(target);
      if (p.AcceptOp(".")) n->targets.push_back(p.ExpectName());
      if (p.AcceptOp("=")) {
        n->kind = NodeKind::kSet;
        ExprPtr value = p.Parse();
        if (p.IsOp(",")) p.Fail("tuple assignment in set is not supported");
        n->expr = value;
        p.ExpectEnd();
      } else {
        p.ExpectEnd();
        if (n->targets.size() != 1) p.Fail("block set needs a plain name");
        n->kind = NodeKind::kSetBlock;
        ParseBody(&n->body, {"endset"});
      }
    } else if (name == "break" || name == "continue") {
      p.ExpectEnd();
      n->kind = name == "break" ? NodeKind::kBreak : NodeKind::kContinue;
    } else if (name == "generation") {
      p.ExpectEnd();
      n->kind = NodeKind::kBlock;
      ParseBody(&n->body, {"endgeneration"});
    } else {
      throw JinjaError(c.line, absl::StrCat("unsupported tag '", name.empty() ? c.body : name,
                                            "'"));
    }
    return n;
  }

  std::vector<Chunk> chunks_;
  size_t pos_ = 0;
};

}  // namespace

NodePtr ParseTemplate(std::string_view source) {
  // Jinja2's default (keep_trailing_newline off): one trailing newline goes.
  if (!source.empty() && source.back() == '\n') source.remove_suffix(1);
  if (!source.empty() && source.back() == '\r') source.remove_suffix(1);
  return Parser(Split(source)).ParseAll();
}

}  // namespace moe::jinja
