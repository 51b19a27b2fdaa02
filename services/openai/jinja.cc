// Evaluator of the Jinja subset (see jinja.h). Filters: length count trim
// upper lower title capitalize tojson join first last default d string int
// float list reverse replace items selectattr rejectattr map safe e escape
// abs round unique indent. Tests: defined undefined none string number
// integer float boolean true false mapping iterable sequence odd even
// divisibleby equalto eq ne in (jinja_parse.cc refuses others). Methods: str strip lstrip rstrip split
// startswith endswith upper lower title capitalize replace find; dict get
// items keys values. Globals: range namespace raise_exception strftime_now.
#include "services/openai/jinja.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <optional>

#include "absl/strings/str_cat.h"
#include "services/openai/jinja_ast.h"
#include "services/openai/jinja_value.h"

namespace moe::jinja {
namespace {

enum class Flow { kNormal, kBreak, kContinue };

class Renderer {
 public:
  explicit Renderer(const Json& context) { scopes_.push_back(context); }

  void Render(const NodeList& nodes, std::string* out) {
    if (RenderList(nodes, out) != Flow::kNormal) {
      throw JinjaError(0, "break or continue outside a loop");
    }
  }

 private:
  [[noreturn]] static void Fail(int line, const std::string& m) { throw JinjaError(line, m); }

  Json* Lookup(const std::string& name) {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto f = it->find(name);
      if (f != it->end()) return &*f;
    }
    return nullptr;
  }

  Flow RenderList(const NodeList& nodes, std::string* out) {
    for (const NodePtr& n : nodes) {
      Flow f = RenderNode(*n, out);
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

  Flow RenderNode(const Node& n, std::string* out) {
    switch (n.kind) {
      case NodeKind::kText: *out += n.text; return Flow::kNormal;
      case NodeKind::kOutput: *out += Str(Eval(*n.expr)); return Flow::kNormal;
      case NodeKind::kBlock: return RenderList(n.body, out);
      case NodeKind::kBreak: return Flow::kBreak;
      case NodeKind::kContinue: return Flow::kContinue;
      case NodeKind::kIf:
        for (const auto& [cond, body] : n.branches) {
          if (Truthy(Eval(*cond))) return RenderList(body, out);
        }
        return RenderList(n.else_body, out);
      case NodeKind::kSet: Assign(n, Eval(*n.expr)); return Flow::kNormal;
      case NodeKind::kSetBlock: {
        std::string text;
        Render(n.body, &text);
        Assign(n, Json(text));
        return Flow::kNormal;
      }
      case NodeKind::kFor: return RenderFor(n, out);
    }
    return Flow::kNormal;
  }

  void Assign(const Node& n, Json value) {
    if (n.targets.size() == 1) {
      scopes_.back()[n.targets[0]] = std::move(value);
      return;
    }
    Json* ns = Lookup(n.targets[0]);
    if (ns == nullptr || !ns->is_object()) {
      Fail(n.line, absl::StrCat("cannot set an attribute of '", n.targets[0],
                                "': not a namespace"));
    }
    (*ns)[n.targets[1]] = std::move(value);
  }

  static Json Items(const Json& v) {
    Json out = Json::array();
    for (const auto& [k, x] : v.items()) out.push_back(Json::array({k, x}));
    return out;
  }

  Json Iterable(const Json& v, int line) {
    if (v.is_array()) return v;
    if (v.is_object()) {
      Json keys = Json::array();
      for (const auto& [k, x] : v.items()) keys.push_back(k);
      return keys;
    }
    if (v.is_string()) {
      Json chars = Json::array();
      for (char c : v.get<std::string>()) chars.push_back(std::string(1, c));
      return chars;
    }
    if (IsUndef(v) || v.is_null()) return Json::array();
    Fail(line, absl::StrCat("cannot iterate over ", Str(v)));
  }

  Flow RenderFor(const Node& n, std::string* out) {
    const Json all = Iterable(Eval(*n.expr), n.line);
    std::vector<Json> items;
    for (const Json& item : all) {
      if (n.filter == nullptr) {
        items.push_back(item);
        continue;
      }
      scopes_.emplace_back(Json::object());
      Bind(n, item);
      const bool keep = Truthy(Eval(*n.filter));
      scopes_.pop_back();
      if (keep) items.push_back(item);
    }
    if (items.empty()) return RenderList(n.else_body, out);
    const int64_t len = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < len; ++i) {
      scopes_.emplace_back(Json::object());
      Bind(n, items[i]);
      Json loop = {{"index", i + 1}, {"index0", i}, {"revindex", len - i},
                   {"revindex0", len - i - 1}, {"first", i == 0}, {"last", i == len - 1},
                   {"length", len}};
      if (i > 0) loop["previtem"] = items[i - 1];
      if (i + 1 < len) loop["nextitem"] = items[i + 1];
      scopes_.back()["loop"] = std::move(loop);
      Flow f = RenderList(n.body, out);
      scopes_.pop_back();
      if (f == Flow::kBreak) break;
    }
    return Flow::kNormal;
  }

  void Bind(const Node& n, const Json& item) {
    if (n.targets.size() == 1) {
      scopes_.back()[n.targets[0]] = item;
      return;
    }
    if (!item.is_array() || item.size() != n.targets.size()) {
      Fail(n.line, absl::StrCat("cannot unpack ", Str(item), " into ", n.targets.size(),
                                " names"));
    }
    for (size_t i = 0; i < n.targets.size(); ++i) scopes_.back()[n.targets[i]] = item[i];
  }

  // ---- expressions ----

  Json Eval(const Expr& e) {
    switch (e.kind) {
      case ExprKind::kLiteral: return e.value;
      case ExprKind::kName: {
        const Json* v = Lookup(e.name);
        return v != nullptr ? *v : Undefined();
      }
      case ExprKind::kList:
      case ExprKind::kTuple: {
        Json out = Json::array();
        for (const ExprPtr& a : e.args) out.push_back(Eval(*a));
        return out;
      }
      case ExprKind::kDict: {
        Json out = Json::object();
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          out[Str(Eval(*e.args[i]))] = Eval(*e.args[i + 1]);
        }
        return out;
      }
      case ExprKind::kAttr: return Attr(Eval(*e.args[0]), e.name);
      case ExprKind::kIndex: return Index(Eval(*e.args[0]), Eval(*e.args[1]), e.line);
      case ExprKind::kSlice: return Slice(e);
      case ExprKind::kCall: return Call(e);
      case ExprKind::kFilter: return Filter(e);
      case ExprKind::kTest: return Json(Test(e) != e.negate);
      case ExprKind::kUnary: {
        Json v = Eval(*e.args[0]);
        if (e.name == "not") return Json(!Truthy(v));
        if (v.is_number_integer()) return Json(-v.get<int64_t>());
        if (v.is_number()) return Json(-v.get<double>());
        Fail(e.line, absl::StrCat("bad operand for unary -: ", Repr(v)));
      }
      case ExprKind::kBinary: return Binary(e);
      case ExprKind::kCond:
        if (Truthy(Eval(*e.args[1]))) return Eval(*e.args[0]);
        return e.args[2] != nullptr ? Eval(*e.args[2]) : Undefined();
    }
    return Undefined();
  }

  static Json Attr(const Json& obj, const std::string& name) {
    if (obj.is_object()) {
      auto it = obj.find(name);
      return it != obj.end() ? *it : Undefined();
    }
    return Undefined();
  }

  static Json Index(const Json& obj, const Json& key, int line) {
    if (obj.is_object()) {
      auto it = obj.find(Str(key));
      return it != obj.end() ? *it : Undefined();
    }
    if ((obj.is_array() || obj.is_string()) && key.is_number_integer()) {
      const int64_t n = obj.is_array() ? obj.size() : obj.get_ref<const std::string&>().size();
      int64_t i = key.get<int64_t>();
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Undefined();
      if (obj.is_array()) return obj[i];
      return Json(std::string(1, obj.get_ref<const std::string&>()[i]));
    }
    if (IsUndef(obj)) return Undefined();
    Fail(line, absl::StrCat("cannot index ", Repr(obj), " with ", Repr(key)));
  }

  Json Slice(const Expr& e) {
    const Json obj = Eval(*e.args[0]);
    int64_t n;
    if (obj.is_array()) n = obj.size();
    else if (obj.is_string()) n = obj.get_ref<const std::string&>().size();
    else Fail(e.line, absl::StrCat("cannot slice ", Repr(obj)));
    auto part = [&](int i, int64_t dflt) -> std::optional<int64_t> {
      if (e.args[i] == nullptr) return std::nullopt;
      Json v = Eval(*e.args[i]);
      if (v.is_null()) return std::nullopt;
      if (!v.is_number_integer()) Fail(e.line, "slice indices must be integers");
      (void)dflt;
      return v.get<int64_t>();
    };
    const int64_t step = part(3, 1).value_or(1);
    if (step == 0) Fail(e.line, "slice step cannot be zero");
    auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
      if (!v.has_value()) return dflt;
      int64_t x = *v < 0 ? *v + n : *v;
      if (step > 0) return std::clamp<int64_t>(x, 0, n);
      return std::clamp<int64_t>(x, -1, n - 1);
    };
    const int64_t start = clamp(part(1, 0), step > 0 ? 0 : n - 1);
    const int64_t stop = clamp(part(2, 0), step > 0 ? n : -1);
    Json out = obj.is_array() ? Json::array() : Json("");
    std::string s;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (obj.is_array()) out.push_back(obj[i]);
      else s += obj.get_ref<const std::string&>()[i];
    }
    return obj.is_array() ? out : Json(s);
  }

  static double Num(const Json& v, int line) {
    if (v.is_number()) return v.get<double>();
    if (v.is_boolean()) return v.get<bool>() ? 1 : 0;
    Fail(line, absl::StrCat("expected a number, got ", Repr(v)));
  }
  static bool BothInt(const Json& a, const Json& b) {
    return (a.is_number_integer() || a.is_boolean()) && (b.is_number_integer() || b.is_boolean());
  }
  static int64_t Int(const Json& v) {
    return v.is_boolean() ? v.get<bool>() : v.get<int64_t>();
  }

  static bool Contains(const Json& hay, const Json& needle, int line) {
    if (hay.is_string()) {
      if (!needle.is_string()) Fail(line, "'in <string>' needs a string on the left");
      return hay.get_ref<const std::string&>().find(needle.get_ref<const std::string&>()) !=
             std::string::npos;
    }
    if (hay.is_array()) return std::find(hay.begin(), hay.end(), needle) != hay.end();
    if (hay.is_object()) return needle.is_string() && hay.contains(needle.get<std::string>());
    if (IsUndef(hay) || hay.is_null()) return false;
    Fail(line, absl::StrCat("'in' needs a string, list or mapping, got ", Repr(hay)));
  }

  Json Binary(const Expr& e) {
    const std::string& op = e.name;
    if (op == "and") {
      Json a = Eval(*e.args[0]);
      return Truthy(a) ? Eval(*e.args[1]) : a;
    }
    if (op == "or") {
      Json a = Eval(*e.args[0]);
      return Truthy(a) ? a : Eval(*e.args[1]);
    }
    const Json a = Eval(*e.args[0]);
    const Json b = Eval(*e.args[1]);
    if (op == "==") return Json(Equal(a, b));
    if (op == "!=") return Json(!Equal(a, b));
    if (op == "in") return Json(Contains(b, a, e.line) != e.negate);
    if (op == "~") return Json(Str(a) + Str(b));
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      int c;
      if (a.is_string() && b.is_string()) {
        c = a.get_ref<const std::string&>().compare(b.get_ref<const std::string&>());
      } else {
        const double x = Num(a, e.line), y = Num(b, e.line);
        c = x < y ? -1 : x > y ? 1 : 0;
      }
      return Json(op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0);
    }
    if (op == "+") {
      if (a.is_string() && b.is_string()) return Json(a.get<std::string>() + b.get<std::string>());
      if (a.is_array() && b.is_array()) {
        Json out = a;
        for (const Json& x : b) out.push_back(x);
        return out;
      }
    }
    if (op == "*" && a.is_string() && b.is_number_integer()) {
      std::string out;
      for (int64_t i = 0; i < b.get<int64_t>(); ++i) out += a.get<std::string>();
      return Json(out);
    }
    const double x = Num(a, e.line), y = Num(b, e.line);
    const bool ints = BothInt(a, b);
    if (op == "+") return ints ? Json(Int(a) + Int(b)) : Json(x + y);
    if (op == "-") return ints ? Json(Int(a) - Int(b)) : Json(x - y);
    if (op == "*") return ints ? Json(Int(a) * Int(b)) : Json(x * y);
    if (op == "**") return ints && Int(b) >= 0 ? Json(static_cast<int64_t>(std::pow(x, y)))
                                               : Json(std::pow(x, y));
    if (y == 0) Fail(e.line, "division by zero");
    if (op == "/") return Json(x / y);
    if (op == "//") return ints ? Json(static_cast<int64_t>(std::floor(x / y)))
                                : Json(std::floor(x / y));
    if (op == "%") {
      if (ints) {
        int64_t m = Int(a) % Int(b);
        if (m != 0 && ((m < 0) != (Int(b) < 0))) m += Int(b);
        return Json(m);
      }
      return Json(x - y * std::floor(x / y));
    }
    Fail(e.line, absl::StrCat("unknown operator ", op));
  }

  static bool Equal(const Json& a, const Json& b) {
    if (IsUndef(a) || IsUndef(b)) return IsUndef(a) && IsUndef(b);
    return a == b;
  }

  std::vector<Json> Args(const Expr& e, size_t from) {
    std::vector<Json> out;
    for (size_t i = from; i < e.args.size(); ++i) out.push_back(Eval(*e.args[i]));
    return out;
  }
  Json Kwarg(const Expr& e, const std::string& name, Json dflt) {
    for (const auto& [k, v] : e.kwargs) {
      if (k == name) return Eval(*v);
    }
    return dflt;
  }

  Json Call(const Expr& e);
  Json Method(const Expr& e, const Json& self, const std::string& name,
              const std::vector<Json>& args);
  // A str method; nullopt when `name` is none.
  std::optional<Json> StringMethod(const Expr& e, const std::string& s,
                                   const std::string& name,
                                   const std::vector<Json>& args);
  Json Filter(const Expr& e);
  Json ApplyFilter(const std::string& name, const Json& v, const std::vector<Json>& args,
                   const Expr& e);
  // ApplyFilter's halves: filters of one value (nullopt: not one of them)
  // and filters over a sequence (an error for an unknown name).
  std::optional<Json> ApplyValueFilter(const std::string& name, const Json& v,
                                       const std::vector<Json>& args,
                                       const Expr& e);
  Json ApplySequenceFilter(const std::string& name, const Json& v,
                           const std::vector<Json>& args, const Expr& e);
  bool Test(const Expr& e);
  bool ApplyTest(const std::string& name, const Json& v, const std::vector<Json>& args,
                 int line);

  std::vector<Json> scopes_;
};

Json Renderer::Call(const Expr& e) {
  const Expr& callee = *e.args[0];
  std::vector<Json> args = Args(e, 1);
  if (callee.kind == ExprKind::kAttr) {
    return Method(e, Eval(*callee.args[0]), callee.name, args);
  }
  if (callee.kind != ExprKind::kName) Fail(e.line, "only names and methods can be called");
  const std::string& f = callee.name;
  if (f == "raise_exception") {
    throw JinjaError(e.line, args.empty() ? "raise_exception()" : Str(args[0]), true);
  }
  if (f == "namespace" || f == "dict") {
    Json ns = Json::object();
    for (const auto& [k, v] : e.kwargs) ns[k] = Eval(*v);
    return ns;
  }
  if (f == "range") {
    int64_t start = 0, stop = 0, step = 1;
    for (const Json& a : args) {
      if (!a.is_number_integer()) Fail(e.line, "range() needs integers");
    }
    if (args.size() == 1) stop = args[0].get<int64_t>();
    else if (args.size() >= 2) start = args[0].get<int64_t>(), stop = args[1].get<int64_t>();
    if (args.size() == 3) step = args[2].get<int64_t>();
    if (step == 0 || args.empty() || args.size() > 3) Fail(e.line, "bad range() arguments");
    Json out = Json::array();
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.push_back(i);
    return out;
  }
  if (f == "strftime_now") {
    std::time_t t = std::time(nullptr);
    std::tm tm;
    localtime_r(&t, &tm);
    char buf[256];
    const std::string fmt = args.empty() ? "%Y-%m-%d" : Str(args[0]);
    return Json(std::string(buf, std::strftime(buf, sizeof(buf), fmt.c_str(), &tm)));
  }
  const Json* v = Lookup(f);
  Fail(e.line, absl::StrCat("'", f, "' ", v == nullptr ? "is undefined" : "is not callable"));
}

Json Renderer::Method(const Expr& e, const Json& self, const std::string& name,
                      const std::vector<Json>& args) {
  if (self.is_string()) {
    if (std::optional<Json> r =
            StringMethod(e, self.get_ref<const std::string&>(), name, args)) {
      return *std::move(r);
    }
  }
  if (self.is_object()) {
    if (name == "get") {
      if (args.empty()) Fail(e.line, "get() needs a key");
      auto it = self.find(Str(args[0]));
      if (it != self.end()) return *it;
      return args.size() > 1 ? args[1] : Json(nullptr);
    }
    if (name == "items") return Items(self);
    if (name == "keys" || name == "values") {
      Json out = Json::array();
      for (const auto& [k, v] : self.items()) out.push_back(name == "keys" ? Json(k) : v);
      return out;
    }
  }
  Fail(e.line, absl::StrCat("no method '", name, "' on ", IsUndef(self) ? "undefined" : Repr(self)));
}

std::optional<Json> Renderer::StringMethod(const Expr& e, const std::string& s,
                                           const std::string& name,
                                           const std::vector<Json>& args) {
  auto arg_str = [&](size_t i, const std::string& dflt) {
    return i < args.size() && !args[i].is_null() ? Str(args[i]) : dflt;
  };
  if (name == "strip") return Json(Strip(s, arg_str(0, kSpace), true, true));
  if (name == "lstrip") return Json(Strip(s, arg_str(0, kSpace), true, false));
  if (name == "rstrip") return Json(Strip(s, arg_str(0, kSpace), false, true));
  if (name == "upper") return Json(Upper(s));
  if (name == "lower") return Json(Lower(s));
  if (name == "title") return Json(Title(s));
  if (name == "capitalize") return ApplyFilter("capitalize", Json(s), {}, e);
  if (name == "replace" && args.size() >= 2) {
    return Json(Replace(s, Str(args[0]), Str(args[1]),
                        args.size() > 2 ? args[2].get<int64_t>() : -1));
  }
  if (name == "find" && !args.empty()) {
    size_t f = s.find(Str(args[0]));
    return Json(f == std::string::npos ? int64_t{-1} : static_cast<int64_t>(f));
  }
  if (name == "startswith" || name == "endswith") {
    if (args.empty()) Fail(e.line, name + "() needs an argument");
    std::vector<std::string> options;
    if (args[0].is_array()) {
      for (const Json& x : args[0]) options.push_back(Str(x));
    } else {
      options.push_back(Str(args[0]));
    }
    for (const std::string& o : options) {
      if (o.size() <= s.size() &&
          (name == "startswith"
               ? s.compare(0, o.size(), o) == 0
               : s.compare(s.size() - o.size(), o.size(), o) == 0)) {
        return Json(true);
      }
    }
    return Json(false);
  }
  if (name == "split") {
    Json out = Json::array();
    const int64_t max = args.size() > 1 ? args[1].get<int64_t>() : -1;
    if (args.empty() || args[0].is_null()) {  // runs of whitespace
      size_t i = 0;
      int64_t done = 0;
      while (true) {
        while (i < s.size() && kSpace.find(s[i]) != std::string::npos) ++i;
        if (i >= s.size()) break;
        if (max >= 0 && done == max) {
          out.push_back(s.substr(i));
          break;
        }
        size_t j = i;
        while (j < s.size() && kSpace.find(s[j]) == std::string::npos) ++j;
        out.push_back(s.substr(i, j - i));
        ++done;
        i = j;
      }
      return out;
    }
    const std::string sep = Str(args[0]);
    if (sep.empty()) Fail(e.line, "empty separator");
    size_t pos = 0;
    for (int64_t done = 0; max < 0 || done < max; ++done) {
      size_t f = s.find(sep, pos);
      if (f == std::string::npos) break;
      out.push_back(s.substr(pos, f - pos));
      pos = f + sep.size();
    }
    out.push_back(s.substr(pos));
    return out;
  }
  return std::nullopt;
}

Json Renderer::Filter(const Expr& e) {
  const Json v = Eval(*e.args[0]);
  return ApplyFilter(e.name, v, Args(e, 1), e);
}

Json Renderer::ApplyFilter(const std::string& f, const Json& v, const std::vector<Json>& args,
                           const Expr& e) {
  if (std::optional<Json> r = ApplyValueFilter(f, v, args, e))
    return *std::move(r);
  return ApplySequenceFilter(f, v, args, e);
}

std::optional<Json> Renderer::ApplyValueFilter(const std::string& f,
                                               const Json& v,
                                               const std::vector<Json>& args,
                                               const Expr& e) {
  const int line = e.line;
  if (f == "length" || f == "count") {
    if (v.is_string()) return Json(static_cast<int64_t>(v.get_ref<const std::string&>().size()));
    if (v.is_array() || v.is_object()) return Json(static_cast<int64_t>(v.size()));
    if (IsUndef(v)) return Json(int64_t{0});
    Fail(line, absl::StrCat("object of type ", v.type_name(), " has no length"));
  }
  if (f == "default" || f == "d") {
    const bool boolean = args.size() > 1 ? Truthy(args[1]) : Truthy(Kwarg(e, "boolean", false));
    const Json dflt = args.empty() ? Json("") : args[0];
    if (IsUndef(v) || (boolean && !Truthy(v))) return dflt;
    return v;
  }
  if (f == "safe") return v;
  if (f == "string") return Json(Str(v));
  if (f == "trim") return Json(Strip(Str(v), args.empty() ? kSpace : Str(args[0]), true, true));
  if (f == "upper") return Json(Upper(Str(v)));
  if (f == "lower") return Json(Lower(Str(v)));
  if (f == "title") return Json(Title(Str(v)));
  if (f == "capitalize") {
    std::string s = Lower(Str(v));
    if (!s.empty()) s[0] = std::toupper(static_cast<unsigned char>(s[0]));
    return Json(s);
  }
  if (f == "replace" && args.size() >= 2) return Json(Replace(Str(v), Str(args[0]), Str(args[1])));
  if (f == "tojson") {
    Json indent = args.empty() ? Kwarg(e, "indent", nullptr) : args[0];
    return Json(PythonJsonDumps(v, indent.is_number_integer() ? indent.get<int>() : -1));
  }
  if (f == "e" || f == "escape") {
    std::string out;
    for (char c : Str(v)) {
      switch (c) {
        case '&': out += "&amp;"; break;
        case '<': out += "&lt;"; break;
        case '>': out += "&gt;"; break;
        case '"': out += "&#34;"; break;
        case '\'': out += "&#39;"; break;
        default: out += c;
      }
    }
    return Json(out);
  }
  if (f == "int") {
    if (v.is_number()) return Json(static_cast<int64_t>(v.get<double>()));
    if (v.is_string()) return Json(std::strtoll(v.get<std::string>().c_str(), nullptr, 10));
    return Json(int64_t{0});
  }
  if (f == "float") {
    if (v.is_number()) return Json(v.get<double>());
    if (v.is_string()) return Json(std::strtod(v.get<std::string>().c_str(), nullptr));
    return Json(0.0);
  }
  if (f == "abs") {
    if (v.is_number_integer()) return Json(std::llabs(v.get<int64_t>()));
    return Json(std::fabs(Num(v, line)));
  }
  if (f == "round") {
    const int64_t digits = args.empty() ? 0 : args[0].get<int64_t>();
    const double scale = std::pow(10.0, static_cast<double>(digits));
    return Json(std::nearbyint(Num(v, line) * scale) / scale);
  }
  if (f == "indent") {
    const std::string pad(args.empty() ? 4 : args[0].get<int64_t>(), ' ');
    const bool first = args.size() > 1 ? Truthy(args[1]) : Truthy(Kwarg(e, "first", false));
    std::string s = Str(v), out = first ? pad : "";
    for (char c : s) {
      out += c;
      if (c == '\n') out += pad;
    }
    return Json(out);
  }
  return std::nullopt;
}

Json Renderer::ApplySequenceFilter(const std::string& f, const Json& v,
                                   const std::vector<Json>& args,
                                   const Expr& e) {
  const int line = e.line;
  // Sequence filters.
  const Json seq = Iterable(v, line);
  if (f == "list") return seq;
  if (f == "first") return seq.empty() ? Undefined() : seq.front();
  if (f == "last") return seq.empty() ? Undefined() : seq.back();
  if (f == "reverse") {
    if (v.is_string()) {
      std::string s = v.get<std::string>();
      std::reverse(s.begin(), s.end());
      return Json(s);
    }
    Json out = seq;
    std::reverse(out.begin(), out.end());
    return out;
  }
  if (f == "items") {
    if (!v.is_object()) Fail(line, "items needs a mapping");
    return Items(v);
  }
  if (f == "unique") {
    Json out = Json::array();
    for (const Json& x : seq) {
      if (std::find(out.begin(), out.end(), x) == out.end()) out.push_back(x);
    }
    return out;
  }
  if (f == "join") {
    const std::string sep = args.empty() ? "" : Str(args[0]);
    const Json attr = args.size() > 1 ? args[1] : Kwarg(e, "attribute", Undefined());
    std::string out;
    for (size_t i = 0; i < seq.size(); ++i) {
      if (i > 0) out += sep;
      out += Str(IsUndef(attr) ? seq[i] : Attr(seq[i], Str(attr)));
    }
    return Json(out);
  }
  if (f == "map") {
    const Json attr = Kwarg(e, "attribute", Undefined());
    Json out = Json::array();
    for (const Json& x : seq) {
      if (!IsUndef(attr)) {
        Json a = Attr(x, Str(attr));
        out.push_back(IsUndef(a) ? Kwarg(e, "default", Undefined()) : a);
      } else if (!args.empty()) {
        out.push_back(ApplyFilter(Str(args[0]), x,
                                  std::vector<Json>(args.begin() + 1, args.end()), e));
      } else {
        Fail(line, "map needs a filter name or attribute=");
      }
    }
    return out;
  }
  if (f == "selectattr" || f == "rejectattr") {
    if (args.empty()) Fail(line, f + " needs an attribute name");
    const bool select = f == "selectattr";
    Json out = Json::array();
    for (const Json& x : seq) {
      const Json a = Attr(x, Str(args[0]));
      const bool pass = args.size() > 1
                            ? ApplyTest(Str(args[1]),  a,
                                        std::vector<Json>(args.begin() + 2, args.end()), line)
                            : Truthy(a);
      if (pass == select) out.push_back(x);
    }
    return out;
  }
  Fail(line, absl::StrCat("unknown filter '", f, "'"));
}

bool Renderer::Test(const Expr& e) {
  const Json v = Eval(*e.args[0]);
  return ApplyTest(e.name, v, Args(e, 1), e.line);
}

bool Renderer::ApplyTest(const std::string& t, const Json& v, const std::vector<Json>& args,
                         int line) {
  if (t == "defined") return !IsUndef(v);
  if (t == "undefined") return IsUndef(v);
  if (t == "none") return v.is_null();
  if (t == "string") return v.is_string();
  if (t == "number") return v.is_number();
  if (t == "integer") return v.is_number_integer();
  if (t == "float") return v.is_number_float();
  if (t == "boolean") return v.is_boolean();
  if (t == "true") return v.is_boolean() && v.get<bool>();
  if (t == "false") return v.is_boolean() && !v.get<bool>();
  if (t == "mapping") return v.is_object();
  if (t == "iterable") return v.is_array() || v.is_object() || v.is_string();
  if (t == "sequence") return v.is_array() || v.is_string() || v.is_object();
  if (t == "odd" || t == "even") {
    if (!v.is_number_integer()) Fail(line, "odd/even need an integer");
    return (v.get<int64_t>() % 2 != 0) == (t == "odd");
  }
  if (args.empty()) Fail(line, absl::StrCat("unknown test '", t, "' (or missing argument)"));
  if (t == "divisibleby") {
    return args[0].get<int64_t>() != 0 && Int(v) % args[0].get<int64_t>() == 0;
  }
  if (t == "equalto" || t == "eq" || t == "==") return Equal(v, args[0]);
  if (t == "ne" || t == "!=") return !Equal(v, args[0]);
  if (t == "in") return Contains(args[0], v, line);
  Fail(line, absl::StrCat("unknown test '", t, "'"));
}

}  // namespace

absl::StatusOr<JinjaTemplate> JinjaTemplate::Parse(std::string_view source) {
  try {
    JinjaTemplate t;
    t.root_ = ParseTemplate(source);
    return t;
  } catch (const JinjaError& e) {
    return absl::InvalidArgumentError(absl::StrCat("template line ", e.line, ": ", e.what()));
  }
}

absl::StatusOr<std::string> JinjaTemplate::Render(const nlohmann::ordered_json& context) const {
  if (!context.is_object()) return absl::InvalidArgumentError("context must be an object");
  try {
    Renderer r(context);
    std::string out;
    r.Render(root_->body, &out);
    return out;
  } catch (const JinjaError& e) {
    if (e.raised) return absl::FailedPreconditionError(e.what());
    return absl::InvalidArgumentError(absl::StrCat("template line ", e.line, ": ", e.what()));
  } catch (const std::exception& e) {  // a JSON type error deep inside
    return absl::InvalidArgumentError(absl::StrCat("template: ", e.what()));
  }
}

}  // namespace moe::jinja
