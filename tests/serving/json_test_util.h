// Shared by the structured-output tests (json_constraint_test,
// json_token_mask_test): compiling a schema that must compile, feeding a
// matcher, and the independent reference a matcher is checked against.
#ifndef MOECACHE_TESTS_SERVING_JSON_TEST_UTIL_H_
#define MOECACHE_TESTS_SERVING_JSON_TEST_UTIL_H_

#include <cstdint>
#include <initializer_list>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/serving/json_constraint.h"
#include "services/serving/json_schema.h"

namespace moe::serving::json_test {

using nlohmann::json;
using Rng = std::mt19937;

inline JsonGrammar MustCompile(const json& schema) {
  absl::StatusOr<JsonGrammar> g = CompileJsonSchema(schema);
  EXPECT_TRUE(g.ok()) << g.status() << " for " << schema.dump();
  if (!g.ok()) return AnyJsonObject();
  return std::move(*g);
}

inline JsonGrammar MustCompile(const char* schema_text) {
  return MustCompile(json::parse(schema_text));
}

// Feeds `text` one byte at a time: every byte taken and the whole complete.
// Also checks that one Advance of the whole text agrees.
inline bool Accepts(const JsonGrammar& g, std::string_view text) {
  JsonMatcher bytewise(g);
  bool ok = true;
  for (char c : text) {
    if (!bytewise.Advance(std::string_view(&c, 1))) {
      ok = false;
      break;
    }
  }
  ok = ok && bytewise.IsComplete();
  JsonMatcher whole(g);
  EXPECT_EQ(ok, whole.Advance(text) && whole.IsComplete()) << text;
  return ok;
}

// Whether `text` can be taken (as a prefix, complete or not).
inline bool TakesPrefix(const JsonGrammar& g, std::string_view text) {
  JsonMatcher m(g);
  return m.Advance(text);
}

inline void ExpectAll(const JsonGrammar& g, std::initializer_list<std::string_view> yes,
               std::initializer_list<std::string_view> no) {
  for (std::string_view t : yes) EXPECT_TRUE(Accepts(g, t)) << "should accept: " << t;
  for (std::string_view t : no) EXPECT_FALSE(Accepts(g, t)) << "should refuse: " << t;
}

// ---------------------------------------------------------------------------
// The reference: parse the whole text with nlohmann::json, check the grammar's
// extra bounds on the text, then the schema recursively on the value.

inline bool IsWs(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

inline int64_t CodePoints(const std::string& s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

// Marks, in a parsed object, the keys that appeared more than once (the
// parser keeps the last value). Not valid UTF-8: no parsed key equals it.
const std::string kDupKey =
    "\xff"
    "dup";

inline json ParseTracked(const std::string& text, bool* ok) {
  std::vector<std::set<std::string>> keys;
  std::vector<std::vector<std::string>> dups;
  json::parser_callback_t cb = [&](int, json::parse_event_t e, json& parsed) {
    if (e == json::parse_event_t::object_start) {
      keys.emplace_back();
      dups.emplace_back();
    } else if (e == json::parse_event_t::key && !keys.empty()) {
      const std::string k = parsed.get<std::string>();
      if (!keys.back().insert(k).second) dups.back().push_back(k);
    } else if (e == json::parse_event_t::object_end && !keys.empty()) {
      if (!dups.back().empty()) parsed[kDupKey] = dups.back();
      keys.pop_back();
      dups.pop_back();
    }
    return true;
  };
  json v = json::parse(text, cb, /*allow_exceptions=*/false);
  *ok = !v.is_discarded();
  return v;
}

// The grammar's limits beyond JSON, on the text of a valid JSON value.
inline bool WithinBounds(const std::string& t) {
  int depth = 0, ws = 0;
  size_t i = 0;
  while (i < t.size()) {
    const char c = t[i];
    if (IsWs(c)) {
      // At most one: a space or a line break.
      if (ws > 0 || (c != ' ' && c != '\n')) return false;
      ++ws;
      ++i;
      continue;
    }
    ws = 0;
    if (c == '{' || c == '[') {
      if (++depth > kJsonMaxDepth) return false;
      ++i;
    } else if (c == '}' || c == ']') {
      --depth;
      ++i;
    } else if (c == '"') {
      size_t j = i + 1;
      while (t[j] != '"') j += t[j] == '\\' ? 2 : 1;
      const std::string raw = t.substr(i, j + 1 - i);
      const std::string decoded = json::parse(raw).get<std::string>();
      if (CodePoints(decoded) > kJsonMaxStringLength) return false;
      size_t k = j + 1;
      while (k < t.size() && IsWs(t[k])) ++k;
      if (k < t.size() && t[k] == ':' && raw != json(decoded).dump()) return false;  // a key
      i = j + 1;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      size_t j = i + (c == '-');
      auto digits = [&] {
        int n = 0;
        while (j < t.size() && t[j] >= '0' && t[j] <= '9') ++j, ++n;
        return n;
      };
      const int int_digits = digits();
      int frac_digits = 0, exp_digits = 0;
      if (j < t.size() && t[j] == '.') ++j, frac_digits = digits();
      if (j < t.size() && (t[j] == 'e' || t[j] == 'E')) {
        ++j;
        if (t[j] == '+' || t[j] == '-') ++j;
        exp_digits = digits();
      }
      if (int_digits > kJsonMaxIntegerDigits || frac_digits > kJsonMaxFractionDigits ||
          exp_digits > kJsonMaxExponentDigits) {
        return false;
      }
      i = j;
    } else {
      ++i;
    }
  }
  return true;
}

inline std::string Dump(const json& v) {
  return v.dump(-1, ' ', false, json::error_handler_t::replace);
}

inline bool TypeMatches(const json& v, const std::string& type) {
  if (type == "object") return v.is_object();
  if (type == "array") return v.is_array();
  if (type == "string") return v.is_string();
  if (type == "boolean") return v.is_boolean();
  if (type == "null") return v.is_null();
  if (type == "number") return v.is_number();
  if (type == "integer") {
    return v.is_number_integer() &&
           !(v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX));
  }
  return false;
}

inline bool RefValid(const json& v, const json& s, const json& root) {
  if (s.is_boolean()) return s.get<bool>();
  if (s.contains("$ref")) {
    const std::string ref = s["$ref"];
    if (ref == "#") return RefValid(v, root, root);
    const size_t slash = ref.rfind('/');
    return RefValid(v, root[ref.substr(2, slash - 2)][ref.substr(slash + 1)], root);
  }
  for (const char* k : {"anyOf", "oneOf"}) {
    if (!s.contains(k)) continue;
    for (const json& alt : s[k]) {
      if (RefValid(v, alt, root)) return true;
    }
    return false;
  }
  if (s.contains("type")) {
    const json types = s["type"].is_array() ? s["type"] : json::array({s["type"]});
    if (std::none_of(types.begin(), types.end(),
                     [&](const json& t) { return TypeMatches(v, t.get<std::string>()); })) {
      return false;
    }
  }
  if (s.contains("enum") && std::none_of(s["enum"].begin(), s["enum"].end(),
                                         [&](const json& e) { return Dump(v) == e.dump(); })) {
    return false;
  }
  if (s.contains("const") && Dump(v) != s["const"].dump()) return false;
  if (v.is_object()) {
    const json props = s.value("properties", json::object());
    const json required = s.value("required", json::array());
    if (v.contains(kDupKey)) {
      for (const json& d : v[kDupKey]) {
        if (props.contains(d.get<std::string>()) ||
            std::find(required.begin(), required.end(), d) != required.end()) {
          return false;  // a listed property twice
        }
      }
    }
    for (const auto& [k, x] : v.items()) {
      if (k == kDupKey) continue;
      const json& sub = props.contains(k) ? props[k] : s.value("additionalProperties", json(true));
      if (!RefValid(x, sub, root)) return false;
    }
    for (const json& r : required) {
      if (!v.contains(r.get<std::string>())) return false;
    }
  }
  if (v.is_array()) {
    const json items = s.value("items", json(true));
    for (const json& x : v) {
      if (!RefValid(x, items, root)) return false;
    }
    if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return false;
    if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return false;
  }
  if (v.is_string()) {
    const int64_t n = CodePoints(v.get<std::string>());
    if (s.contains("minLength") && n < s["minLength"].get<int64_t>()) return false;
    if (s.contains("maxLength") && n > s["maxLength"].get<int64_t>()) return false;
  }
  if (v.is_number_integer() && !v.is_number_unsigned()) {
    const int64_t x = v.get<int64_t>();
    if (s.contains("minimum") && x < s["minimum"].get<int64_t>()) return false;
    if (s.contains("maximum") && x > s["maximum"].get<int64_t>()) return false;
  } else if (v.is_number_unsigned()) {
    const uint64_t x = v.get<uint64_t>();
    if (s.contains("maximum") && s["maximum"].get<int64_t>() >= 0 &&
        x > static_cast<uint64_t>(s["maximum"].get<int64_t>())) {
      return false;
    }
    if (s.contains("maximum") && s["maximum"].get<int64_t>() < 0) return false;
    if (s.contains("minimum") && s["minimum"].get<int64_t>() > 0 &&
        x < static_cast<uint64_t>(s["minimum"].get<int64_t>())) {
      return false;
    }
  }
  return true;
}

inline bool Reference(const json& schema, const std::string& text) {
  // nlohmann takes a NUL byte for the end of the input; JSON allows none.
  if (text.find('\0') != std::string::npos) return false;
  bool ok = false;
  const json v = ParseTracked(text, &ok);
  return ok && WithinBounds(text) && RefValid(v, schema, schema);
}

inline int Uniform(Rng& rng, int lo, int hi) {
  return std::uniform_int_distribution<int>(lo, hi)(rng);
}

inline bool Chance(Rng& rng, double p) { return std::bernoulli_distribution(p)(rng); }

// Two tools' calls (anyOf of two objects), as tool_choice "required" builds.
inline const char* kToolCallSchema = R"({
  "anyOf": [
    {"type": "object", "additionalProperties": false, "required": ["name", "arguments"],
     "properties": {
       "name": {"const": "get_weather"},
       "arguments": {"type": "object", "additionalProperties": false, "required": ["city"],
                     "properties": {"city": {"type": "string", "maxLength": 20},
                                    "days": {"type": "integer", "minimum": 1, "maximum": 7},
                                    "units": {"enum": ["celsius", "fahrenheit"]}}}}},
    {"type": "object", "additionalProperties": false, "required": ["name", "arguments"],
     "properties": {
       "name": {"const": "search"},
       "arguments": {"type": "object", "additionalProperties": false, "required": ["query"],
                     "properties": {"query": {"type": "string"},
                                    "max_results": {"type": "integer", "minimum": 1, "maximum": 10}}}}}
  ]
})";

// A recursive schema: a tree of integers (its own $ref).
inline const json kTreeNode = json::parse(R"({
  "type": "object",
  "properties": {
    "v": {"type": "integer", "minimum": -3, "maximum": 3},
    "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}
  },
  "required": ["v"],
  "additionalProperties": false
})");

// A small vocabulary: every printable byte and multi-byte tokens, odd ones
// included (see the list).
inline std::vector<std::string> SmallVocab() {
  std::vector<std::string> v = {""};  // id 0: no bytes, never allowed
  for (int c = 0x20; c < 0x7f; ++c) v.push_back(std::string(1, static_cast<char>(c)));
  for (const char* t : {"\n",
                        "\t",
                        "{\"",
                        "\":",
                        "\",",
                        "\"}",
                        "\":\"",
                        "true",
                        "false",
                        "null",
                        "123",
                        "-5",
                        "0.5",
                        "e+1",
                        "\"na",
                        "me\"",
                        "name",
                        "get_weather",
                        "search",
                        "arguments",
                        "city",
                        "query",
                        "{\"name\":\"",
                        "\\\"",
                        "\\u00e9",
                        "\\ud83d",
                        "\\ude00",
                        "  ",
                        "\n  ",
                        "]}",
                        "}}",
                        ",\"",
                        "[{\"",
                        "\"a\xff\"",
                        "\xff",
                        "\xc3",
                        "\xa9",
                        "\xc3\xa9",
                        "\xe2\x82",
                        "\xac",
                        "\xf0\x9f\x98\x80",
                        "12",
                        "7}",
                        "\"\"",
                        "[]",
                        "{}",
                        "nu",
                        "ll",
                        "tr",
                        "ue",
                        "\"v\":",
                        "\"kids\":["}) {
    v.push_back(t);
  }
  v.push_back("true");  // the same bytes as another id: both allowed or neither
  return v;
}

// The mask by brute force: each token tried on its own.
inline std::vector<uint8_t> BruteForce(const JsonMatcher& m,
                                       const std::vector<std::string>& vocab) {
  std::vector<uint8_t> mask(vocab.size(), 0);
  for (size_t id = 0; id < vocab.size(); ++id) {
    mask[id] = !vocab[id].empty() && m.CanAdvance(vocab[id]);
  }
  return mask;
}

}  // namespace moe::serving::json_test

#endif  // MOECACHE_TESTS_SERVING_JSON_TEST_UTIL_H_
