#include "services/serving/json_schema.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace moe::serving {

using json_internal::Node;
using json_internal::TrieNode;
using nlohmann::json;

namespace {

constexpr int32_t kInfDepth = kJsonMaxDepth + 1;

constexpr absl::string_view kAnnotations[] = {"title",    "description", "default",  "examples",
                                              "$schema",  "$id",         "$comment", "deprecated",
                                              "readOnly", "writeOnly",   "strict"};
constexpr absl::string_view kValidation[] = {
    "type",     "properties", "required", "additionalProperties",
    "enum",     "const",      "items",    "minItems",
    "maxItems", "minimum",    "maximum",  "minLength",
    "maxLength"};

template <size_t N>
bool OneOf(const absl::string_view (&list)[N], absl::string_view key) {
  return std::find(std::begin(list), std::end(list), key) != std::end(list);
}

enum TypeBits : uint8_t {
  kTObject = 1,
  kTArray = 2,
  kTString = 4,
  kTInteger = 8,
  kTNumber = 16,
  kTBoolean = 32,
  kTNull = 64,
  kTAll = 127,
};

uint8_t TypeBit(absl::string_view name) {
  if (name == "object") return kTObject;
  if (name == "array") return kTArray;
  if (name == "string") return kTString;
  if (name == "integer") return kTInteger;
  if (name == "number") return kTNumber;
  if (name == "boolean") return kTBoolean;
  if (name == "null") return kTNull;
  return 0;
}

// The types a JSON value belongs to (an integral number is both).
uint8_t TypesOf(const json& v) {
  switch (v.type()) {
    case json::value_t::object:
      return kTObject;
    case json::value_t::array:
      return kTArray;
    case json::value_t::string:
      return kTString;
    case json::value_t::boolean:
      return kTBoolean;
    case json::value_t::null:
      return kTNull;
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return kTInteger | kTNumber;
    case json::value_t::number_float: {
      const double d = v.get<double>();
      return std::isfinite(d) && d == std::floor(d) ? (kTInteger | kTNumber) : kTNumber;
    }
    default:
      return 0;
  }
}

std::string PathText(const std::string& path) { return path.empty() ? "the root" : path; }

// One JSON-pointer reference token.
std::string PointerToken(absl::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}

absl::Status Bad(absl::string_view what, const std::string& path) {
  return absl::InvalidArgumentError(absl::StrCat(what, " at ", PathText(path)));
}

absl::Status Unsupported(absl::string_view key, const std::string& path,
                         absl::string_view why = "") {
  return Bad(absl::StrCat("unsupported JSON-schema keyword \"", key, "\"", why), path);
}

// dump() refuses strings that are not UTF-8 (a json built in code can hold them).
absl::StatusOr<std::string> Dump(const json& v, const std::string& path) {
  try {
    return v.dump();
  } catch (const json::exception&) {
    return Bad("a value that is not valid UTF-8", path);
  }
}

}  // namespace

class JsonGrammarBuilder {
 public:
  explicit JsonGrammarBuilder(const json* schema) : schema_(schema) {}

  absl::StatusOr<JsonGrammar> Compile() {
    absl::StatusOr<int32_t> root = CompileNode(*schema_, "", 0);
    if (!root.ok()) return root.status();
    return Finish(*root);
  }

  JsonGrammar AnyObject() {
    const int32_t any = Any();
    absl::StatusOr<JsonGrammar> g = Finish(g_.nodes_[any].members[0]);  // cannot fail
    return std::move(*g);
  }

 private:
  int32_t NewNode(Node::Kind kind, const std::string& path) {
    g_.nodes_.emplace_back();
    g_.nodes_.back().kind = kind;
    paths_.push_back(path);
    return static_cast<int32_t>(g_.nodes_.size() - 1);
  }

  int32_t NewTrie() {
    g_.tries_.emplace_back();
    return static_cast<int32_t>(g_.tries_.size() - 1);
  }

  // Adds `text` under trie `root`; marks `mask` along the way and `value` at
  // its end.
  void Insert(int32_t root, absl::string_view text, int32_t value, uint64_t mask) {
    int32_t at = root;
    g_.tries_[at].mask |= mask;
    for (char ch : text) {
      const uint8_t b = static_cast<uint8_t>(ch);
      int32_t next = g_.tries_[at].Child(b);
      if (next < 0) {
        next = NewTrie();
        auto& edges = g_.tries_[at].next;
        edges.insert(std::lower_bound(edges.begin(), edges.end(), std::make_pair(b, int32_t{-1})),
                     {b, next});
      }
      at = next;
      g_.tries_[at].mask |= mask;
    }
    g_.tries_[at].value = value;
  }

  int32_t Literal(std::initializer_list<absl::string_view> texts, const std::string& path) {
    const int32_t n = NewNode(Node::kLiteral, path);
    const int32_t trie = NewTrie();
    g_.nodes_[n].literal_trie = trie;
    for (absl::string_view t : texts) Insert(trie, t, 1, 0);
    return n;
  }

  // Any JSON value: built once, shared by `true`, `{}`, open objects and
  // unconstrained items.
  int32_t Any() {
    if (any_ >= 0) return any_;
    any_ = NewNode(Node::kUnion, "");
    const int32_t object = NewNode(Node::kObject, "");
    g_.nodes_[object].additional = any_;
    g_.nodes_[object].key_trie = NewTrie();
    const int32_t array = NewNode(Node::kArray, "");
    g_.nodes_[array].items = any_;
    const int32_t string = NewNode(Node::kString, "");
    const int32_t number = NewNode(Node::kNumber, "");
    const int32_t literals = Literal({"true", "false", "null"}, "");
    g_.nodes_[any_].members = {object, array, string, number, literals};
    return any_;
  }

  absl::StatusOr<uint64_t> Count(const json& s, const char* key, const std::string& path) {
    const json& v = s[key];
    if (v.is_number_unsigned()) return v.get<uint64_t>();
    if (v.is_number_integer() && v.get<int64_t>() >= 0) {
      return static_cast<uint64_t>(v.get<int64_t>());
    }
    if (v.is_number_float()) {
      const double d = v.get<double>();
      if (d >= 0 && d == std::floor(d) && d < 1.8e19) return static_cast<uint64_t>(d);
    }
    return Bad(absl::StrCat("\"", key, "\" must be a non-negative integer"), path);
  }

  // minimum (up = true: rounded up) or maximum, clamped to int64's range;
  // `empty` when no int64 can satisfy it.
  absl::StatusOr<int64_t> Bound(const json& s, const char* key, bool up, bool* empty,
                                const std::string& path) {
    const json& v = s[key];
    if (v.is_number_integer() && !v.is_number_unsigned()) return v.get<int64_t>();
    if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      if (u <= static_cast<uint64_t>(INT64_MAX)) return static_cast<int64_t>(u);
      if (up) *empty = true;
      return INT64_MAX;
    }
    if (v.is_number_float() && std::isfinite(v.get<double>())) {
      const double d = up ? std::ceil(v.get<double>()) : std::floor(v.get<double>());
      constexpr double kTwo63 = 9223372036854775808.0;
      if (d >= kTwo63) {
        if (up) *empty = true;
        return INT64_MAX;
      }
      if (d < -kTwo63) {
        if (!up) *empty = true;
        return INT64_MIN;
      }
      return static_cast<int64_t>(d);
    }
    return Bad(absl::StrCat("\"", key, "\" must be a number"), path);
  }

  absl::StatusOr<int32_t> CompileNode(const json& s, const std::string& path, int depth) {
    if (depth > kJsonSchemaMaxDepth) {
      return Bad(absl::StrCat("schema nested deeper than ", kJsonSchemaMaxDepth,
                              " levels (counting $ref)"),
                 path);
    }
    if (++compiled_ > kJsonSchemaMaxNodes) {
      return Bad(absl::StrCat("schema has more than ", kJsonSchemaMaxNodes, " nodes"), path);
    }
    if (s.is_boolean()) {
      if (s.get<bool>()) return Any();
      return Bad("schema false (which accepts nothing) is not supported", path);
    }
    if (!s.is_object()) {
      return Bad(absl::StrCat("schema must be an object or true, not ", s.type_name()), path);
    }
    std::string combinator;  // anyOf, oneOf or $ref
    std::string validation;  // the first validation keyword
    for (const auto& [key, value] : s.items()) {
      if (OneOf(kAnnotations, key)) continue;
      if (key == "$defs" || key == "definitions") {
        if (&s != schema_) return Unsupported(key, path, " (only at the root)");
        if (!value.is_object()) return Bad(absl::StrCat("\"", key, "\" must be an object"), path);
        continue;
      }
      if (key == "anyOf" || key == "oneOf" || key == "$ref") {
        if (!combinator.empty()) {
          return Bad(absl::StrCat("\"", combinator, "\" cannot be combined with \"", key, "\""),
                     path);
        }
        combinator = key;
        continue;
      }
      if (!OneOf(kValidation, key)) return Unsupported(key, path);
      if (validation.empty()) validation = key;
    }
    if (!combinator.empty() && !validation.empty()) {
      return Bad(absl::StrCat("\"", combinator, "\" cannot be combined with \"", validation, "\""),
                 path);
    }
    if (combinator == "$ref") {
      if (!s["$ref"].is_string()) return Bad("\"$ref\" must be a string", path);
      return Ref(s["$ref"].get<std::string>(), path, depth);
    }
    if (!combinator.empty()) {
      const json& list = s[combinator];
      if (!list.is_array() || list.empty()) {
        return Bad(absl::StrCat("\"", combinator, "\" must be a non-empty array"), path);
      }
      if (list.size() > static_cast<size_t>(kJsonSchemaMaxAlternatives)) {
        return Bad(absl::StrCat("\"", combinator, "\" has more than ", kJsonSchemaMaxAlternatives,
                                " alternatives"),
                   path);
      }
      std::vector<int32_t> members;
      for (size_t i = 0; i < list.size(); ++i) {
        absl::StatusOr<int32_t> m =
            CompileNode(list[i], absl::StrCat(path, "/", combinator, "/", i), depth + 1);
        if (!m.ok()) return m.status();
        members.push_back(*m);
      }
      const int32_t u = NewNode(Node::kUnion, path);
      g_.nodes_[u].members = std::move(members);
      return u;
    }
    return CompileTyped(s, path, depth);
  }

  absl::StatusOr<int32_t> Ref(const std::string& ref, const std::string& path, int depth) {
    if (ref == "#") {
      if (self_ < 0) self_ = NewNode(Node::kUnion, "");
      return self_;
    }
    std::string container;
    for (const char* c : {"$defs", "definitions"}) {
      const std::string prefix = absl::StrCat("#/", c, "/");
      if (ref.compare(0, prefix.size(), prefix) == 0) container = c;
    }
    const std::string token = container.empty() ? "" : ref.substr(container.size() + 3);
    if (container.empty() || token.empty() || token.find('/') != std::string::npos) {
      return Bad(absl::StrCat("unsupported \"$ref\" \"", ref,
                              "\" (only \"#\", \"#/$defs/NAME\" and \"#/definitions/NAME\")"),
                 path);
    }
    std::string name;  // the token, unescaped
    for (size_t i = 0; i < token.size(); ++i) {
      if (token[i] == '~' && i + 1 < token.size() && (token[i + 1] == '0' || token[i + 1] == '1')) {
        name += token[i + 1] == '0' ? '~' : '/';
        ++i;
      } else {
        name += token[i];
      }
    }
    const std::string key = absl::StrCat(container, "/", name);
    if (auto it = defs_.find(key); it != defs_.end()) return it->second;
    if (!schema_->is_object() || !schema_->contains(container) ||
        !(*schema_)[container].is_object() || !(*schema_)[container].contains(name)) {
      return Bad(absl::StrCat("\"$ref\" \"", ref, "\" does not resolve"), path);
    }
    // The placeholder goes in first, so that the definition may refer to itself.
    const std::string def_path = absl::StrCat("/", container, "/", token);
    const int32_t placeholder = NewNode(Node::kUnion, def_path);
    defs_[key] = placeholder;
    absl::StatusOr<int32_t> target = CompileNode((*schema_)[container][name], def_path, depth + 1);
    if (!target.ok()) return target.status();
    g_.nodes_[placeholder].members = {*target};
    return placeholder;
  }

  // A schema object of validation keywords only.
  absl::StatusOr<int32_t> CompileTyped(const json& s, const std::string& path, int depth) {
    uint8_t types = kTAll;
    if (s.contains("type")) {
      const json& t = s["type"];
      std::vector<json> names;
      if (t.is_string()) {
        names.push_back(t);
      } else if (t.is_array() && !t.empty() && t.size() <= 7) {
        names.assign(t.begin(), t.end());
      } else {
        return Bad("\"type\" must be a type name or a non-empty array of them", path);
      }
      types = 0;
      for (const json& n : names) {
        const uint8_t bit = n.is_string() ? TypeBit(n.get<std::string>()) : 0;
        if (bit == 0) return Bad(absl::StrCat("unknown \"type\" ", n.dump()), path);
        types |= bit;
      }
    }
    // Every present keyword is checked for form, whatever the types.
    uint64_t min_items = 0, max_items = UINT64_MAX;
    uint64_t min_length = 0, max_length = kJsonMaxStringLength;
    const std::pair<const char*, uint64_t*> counts[] = {{"minItems", &min_items},
                                                        {"maxItems", &max_items},
                                                        {"minLength", &min_length},
                                                        {"maxLength", &max_length}};
    for (const auto& [key, out] : counts) {
      if (!s.contains(key)) continue;
      absl::StatusOr<uint64_t> n = Count(s, key, path);
      if (!n.ok()) return n.status();
      *out = *n;
    }
    if (min_items > max_items) return Bad("\"minItems\" is greater than \"maxItems\"", path);
    if (min_length > static_cast<uint64_t>(kJsonMaxStringLength)) {
      return Bad(absl::StrCat("\"minLength\" is above the limit of ", kJsonMaxStringLength), path);
    }
    if (min_length > max_length) return Bad("\"minLength\" is greater than \"maxLength\"", path);
    max_length = std::min<uint64_t>(max_length, kJsonMaxStringLength);
    int64_t minimum = INT64_MIN, maximum = INT64_MAX;
    const bool ranged = s.contains("minimum") || s.contains("maximum");
    bool empty = false;
    if (s.contains("minimum")) {
      absl::StatusOr<int64_t> b = Bound(s, "minimum", /*up=*/true, &empty, path);
      if (!b.ok()) return b.status();
      minimum = *b;
    }
    if (s.contains("maximum")) {
      absl::StatusOr<int64_t> b = Bound(s, "maximum", /*up=*/false, &empty, path);
      if (!b.ok()) return b.status();
      maximum = *b;
    }
    if (empty || minimum > maximum) {
      return Bad("\"minimum\" is greater than \"maximum\" (no integer in range)", path);
    }
    if (ranged && (types & kTNumber)) {
      return Unsupported(s.contains("minimum") ? "minimum" : "maximum", path,
                         " (supported only with \"type\": \"integer\")");
    }
    if (types & kTNumber) types &= ~kTInteger;  // number covers integer

    if (s.contains("enum") || s.contains("const")) return CompileLiteral(s, types, path);

    std::vector<int32_t> leaves;
    if (types & kTObject) {
      absl::StatusOr<int32_t> o = CompileObject(s, path, depth);
      if (!o.ok()) return o.status();
      leaves.push_back(*o);
    } else if (absl::Status st = CheckObjectForm(s, path, depth); !st.ok()) {
      return st;
    }
    if (types & kTArray) {
      const int32_t a = NewNode(Node::kArray, path);
      int32_t items = -1;
      if (s.contains("items")) {
        if (s["items"].is_array()) {
          return Unsupported("items", path, " as an array (tuple validation)");
        }
        absl::StatusOr<int32_t> i =
            CompileNode(s["items"], absl::StrCat(path, "/items"), depth + 1);
        if (!i.ok()) return i.status();
        items = *i;
      } else {
        items = Any();
      }
      g_.nodes_[a].items = items;
      g_.nodes_[a].min_items = min_items;
      g_.nodes_[a].max_items = max_items;
      leaves.push_back(a);
    } else if (s.contains("items")) {
      // Checked for form even when unused.
      if (s["items"].is_array()) {
        return Unsupported("items", path, " as an array (tuple validation)");
      }
      absl::StatusOr<int32_t> i = CompileNode(s["items"], absl::StrCat(path, "/items"), depth + 1);
      if (!i.ok()) return i.status();
    }
    if (types & kTString) {
      const int32_t n = NewNode(Node::kString, path);
      g_.nodes_[n].min_length = static_cast<uint32_t>(min_length);
      g_.nodes_[n].max_length = static_cast<uint32_t>(max_length);
      leaves.push_back(n);
    }
    if (types & kTInteger) {
      const int32_t n = NewNode(Node::kInteger, path);
      g_.nodes_[n].minimum = minimum;
      g_.nodes_[n].maximum = maximum;
      leaves.push_back(n);
    }
    if (types & kTNumber) leaves.push_back(NewNode(Node::kNumber, path));
    if ((types & kTBoolean) && (types & kTNull)) {
      leaves.push_back(Literal({"true", "false", "null"}, path));
    } else if (types & kTBoolean) {
      leaves.push_back(Literal({"true", "false"}, path));
    } else if (types & kTNull) {
      leaves.push_back(Literal({"null"}, path));
    }
    if (leaves.size() == 1) return leaves[0];
    const int32_t u = NewNode(Node::kUnion, path);
    g_.nodes_[u].members = std::move(leaves);
    return u;
  }

  // properties/required/additionalProperties on a schema whose types
  // exclude objects: checked for form only.
  absl::Status CheckObjectForm(const json& s, const std::string& path, int depth) {
    if (!s.contains("properties") && !s.contains("required") &&
        !s.contains("additionalProperties")) {
      return absl::OkStatus();
    }
    absl::StatusOr<int32_t> o = CompileObject(s, path, depth);
    return o.status();
  }

  absl::StatusOr<int32_t> CompileObject(const json& s, const std::string& path, int depth) {
    const int32_t obj = NewNode(Node::kObject, path);
    const int32_t trie = NewTrie();
    g_.nodes_[obj].key_trie = trie;
    std::vector<std::string> names;
    auto add = [&](const std::string& name, int32_t node, const std::string& at) -> absl::Status {
      if (names.size() >= static_cast<size_t>(kJsonSchemaMaxProperties)) {
        return Bad(absl::StrCat("more than ", kJsonSchemaMaxProperties, " properties"), at);
      }
      if (name.size() > static_cast<size_t>(kJsonSchemaMaxNameBytes)) {
        return Bad(absl::StrCat("a property name longer than ", kJsonSchemaMaxNameBytes, " bytes"),
                   at);
      }
      absl::StatusOr<std::string> text = Dump(json(name), at);
      if (!text.ok()) return text.status();
      const int32_t index = static_cast<int32_t>(names.size());
      Insert(trie, absl::string_view(*text).substr(1, text->size() - 2), index,
             uint64_t{1} << index);
      names.push_back(name);
      g_.nodes_[obj].properties.push_back(node);
      return absl::OkStatus();
    };
    if (s.contains("properties")) {
      const json& props = s["properties"];
      if (!props.is_object()) return Bad("\"properties\" must be an object", path);
      if (props.size() > static_cast<size_t>(kJsonSchemaMaxProperties)) {
        return Bad(absl::StrCat("more than ", kJsonSchemaMaxProperties, " properties"), path);
      }
      for (const auto& [name, sub] : props.items()) {
        const std::string at = absl::StrCat(path, "/properties/", PointerToken(name));
        absl::StatusOr<int32_t> child = CompileNode(sub, at, depth + 1);
        if (!child.ok()) return child.status();
        if (absl::Status st = add(name, *child, at); !st.ok()) return st;
      }
    }
    int32_t additional = -1;
    if (!s.contains("additionalProperties") || s["additionalProperties"].is_boolean()) {
      if (!s.contains("additionalProperties") || s["additionalProperties"].get<bool>()) {
        additional = Any();
      }
    } else if (s["additionalProperties"].is_object()) {
      absl::StatusOr<int32_t> a = CompileNode(
          s["additionalProperties"], absl::StrCat(path, "/additionalProperties"), depth + 1);
      if (!a.ok()) return a.status();
      additional = *a;
    } else {
      return Bad("\"additionalProperties\" must be a boolean or a schema", path);
    }
    g_.nodes_[obj].additional = additional;
    if (s.contains("required")) {
      const json& req = s["required"];
      if (!req.is_array()) return Bad("\"required\" must be an array of strings", path);
      for (const json& r : req) {
        if (!r.is_string()) return Bad("\"required\" must be an array of strings", path);
        const std::string name = r.get<std::string>();
        auto it = std::find(names.begin(), names.end(), name);
        if (it == names.end()) {
          if (additional < 0) {
            return Bad(absl::StrCat("\"required\" names \"", name,
                                    "\", which is not in \"properties\" while "
                                    "additionalProperties is false"),
                       path);
          }
          // Required but unlisted: a property with the additional schema.
          if (absl::Status st = add(name, additional, path); !st.ok()) return st;
          it = names.end() - 1;
        }
        g_.nodes_[obj].required |= uint64_t{1} << (it - names.begin());
      }
    }
    return obj;
  }

  absl::StatusOr<int32_t> CompileLiteral(const json& s, uint8_t types, const std::string& path) {
    for (const auto& [key, value] : s.items()) {
      if (OneOf(kValidation, key) && key != "type" && key != "enum" && key != "const") {
        return Bad(absl::StrCat("\"", s.contains("enum") ? "enum" : "const",
                                "\" cannot be combined with \"", key, "\""),
                   path);
      }
    }
    std::vector<json> values;
    if (s.contains("enum")) {
      const json& e = s["enum"];
      if (!e.is_array() || e.empty()) return Bad("\"enum\" must be a non-empty array", path);
      if (e.size() > static_cast<size_t>(kJsonSchemaMaxEnumValues)) {
        return Bad(absl::StrCat("\"enum\" has more than ", kJsonSchemaMaxEnumValues, " values"),
                   path);
      }
      for (const json& v : e) {
        if (!s.contains("const") || v == s["const"]) values.push_back(v);
      }
      if (values.empty()) return Bad("\"enum\" and \"const\" have no value in common", path);
    } else {
      values.push_back(s["const"]);
    }
    const int32_t n = NewNode(Node::kLiteral, path);
    const int32_t trie = NewTrie();
    g_.nodes_[n].literal_trie = trie;
    bool any = false;
    for (const json& v : values) {
      if ((TypesOf(v) & types) == 0) continue;
      absl::StatusOr<std::string> text = Dump(v, path);
      if (!text.ok()) return text.status();
      literal_bytes_ += static_cast<int64_t>(text->size());
      if (literal_bytes_ > kJsonSchemaMaxLiteralBytes) {
        return Bad(absl::StrCat("enum/const values longer than ", kJsonSchemaMaxLiteralBytes,
                                " bytes in all"),
                   path);
      }
      Insert(trie, *text, 1, 0);
      any = true;
    }
    if (!any) {
      return Bad(absl::StrCat("no value of \"", s.contains("enum") ? "enum" : "const",
                              "\" has the schema's \"type\""),
                 path);
    }
    return n;
  }

  // Expands unions into leaves (refusing cycles that enter no object or
  // array) and computes each node's min_depth.
  absl::StatusOr<JsonGrammar> Finish(int32_t root) {
    if (self_ >= 0) g_.nodes_[self_].members = {root};
    std::vector<uint8_t> state(g_.nodes_.size(), 0);  // 0 new, 1 expanding, 2 done
    for (size_t n = 0; n < g_.nodes_.size(); ++n) {
      if (absl::Status st = Expand(static_cast<int32_t>(n), &state); !st.ok()) return st;
    }
    std::vector<Node>& nodes = g_.nodes_;
    for (Node& n : nodes) n.min_depth = kInfDepth;
    auto depth_of = [&](int32_t id) {
      int32_t d = kInfDepth;
      for (int32_t leaf : nodes[id].leaves) d = std::min(d, nodes[leaf].min_depth);
      return d;
    };
    // After pass k every node whose min_depth is <= k is final: at most
    // kInfDepth + 1 passes.
    for (bool changed = true; changed;) {
      changed = false;
      for (Node& n : nodes) {
        int32_t d = 0;
        if (n.kind == Node::kUnion) {
          continue;
        } else if (n.kind == Node::kObject) {
          d = 1;
          for (size_t i = 0; i < n.properties.size(); ++i) {
            if (n.required >> i & 1) d = std::max(d, 1 + depth_of(n.properties[i]));
          }
        } else if (n.kind == Node::kArray) {
          d = 1 + (n.min_items > 0 ? depth_of(n.items) : 0);
        }
        d = std::min(d, kInfDepth);
        if (d < n.min_depth) {
          n.min_depth = d;
          changed = true;
        }
      }
    }
    for (Node& n : nodes) {
      if (n.kind == Node::kUnion) n.min_depth = depth_of(static_cast<int32_t>(&n - nodes.data()));
    }
    if (nodes[root].min_depth > kJsonMaxDepth) {
      return Bad(absl::StrCat("the schema accepts no value that nests at most ", kJsonMaxDepth,
                              " objects/arrays deep"),
                 paths_[root]);
    }
    g_.root_ = root;
    return std::move(g_);
  }

  absl::Status Expand(int32_t n, std::vector<uint8_t>* state) {
    Node& node = g_.nodes_[n];
    if ((*state)[n] == 2) return absl::OkStatus();
    if (node.kind != Node::kUnion) {
      node.leaves = {n};
      (*state)[n] = 2;
      return absl::OkStatus();
    }
    if ((*state)[n] == 1) {
      return Bad("a \"$ref\" cycle that enters no object or array", paths_[n]);
    }
    (*state)[n] = 1;
    std::vector<int32_t> leaves;
    for (int32_t m : std::vector<int32_t>(node.members)) {
      if (absl::Status st = Expand(m, state); !st.ok()) return st;
      for (int32_t leaf : g_.nodes_[m].leaves) {
        if (std::find(leaves.begin(), leaves.end(), leaf) == leaves.end()) leaves.push_back(leaf);
      }
    }
    if (leaves.size() > static_cast<size_t>(kJsonSchemaMaxAlternatives)) {
      return Bad(absl::StrCat("more than ", kJsonSchemaMaxAlternatives,
                              " alternatives (after expanding anyOf, $ref and type lists)"),
                 paths_[n]);
    }
    g_.nodes_[n].leaves = std::move(leaves);
    (*state)[n] = 2;
    return absl::OkStatus();
  }

  const json* schema_;
  JsonGrammar g_;
  std::vector<std::string> paths_;  // node -> the schema path it came from
  std::map<std::string, int32_t> defs_;
  int32_t any_ = -1;
  int32_t self_ = -1;  // "$ref": "#"
  int compiled_ = 0;
  int64_t literal_bytes_ = 0;
};

absl::StatusOr<JsonGrammar> CompileJsonSchema(const json& schema) {
  return JsonGrammarBuilder(&schema).Compile();
}

JsonGrammar AnyJsonObject() {
  const json none;
  return JsonGrammarBuilder(&none).AnyObject();
}

}  // namespace moe::serving
