// Structured output (json_schema.h, json_constraint.h): what each supported
// keyword accepts and refuses, and agreement with an independent
// non-incremental reference (json_test_util.h) on random and mutated
// instances (and prefix closure). Refused schemas and random schema-like
// documents are json_schema_test.cc's; the token mask's tests are in
// json_token_mask_test.cc.
#include "services/serving/json_constraint.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/serving/json_schema.h"
#include "tests/serving/json_test_util.h"

namespace moe::serving {
namespace {

using namespace json_test;  // NOLINT: the shared test vocabulary


// ---------------------------------------------------------------------------
// Random schemas (within what the reference compares exactly: enum/const of
// scalars, no floats or 0 in enums, no '/' in enum strings) and random
// valid instances of them, as text.

const std::vector<std::string> kNames = {"a", "b", "name", "na", "n\"q", "\xc3\xa9", "x y"};
const std::vector<std::string> kExtraNames = {"x1", "zz", "k\xc3\xa9y"};

json RandomScalar(Rng& rng) {
  static const std::vector<json> pool = {
      "red", "a\"b", "c\\d", "\xc3\xa9t\xc3\xa9", "x y", "line\nbreak", 1, -7, 12, 123, 42,
      true,  false,  nullptr};
  return pool[Uniform(rng, 0, static_cast<int>(pool.size()) - 1)];
}

json IntegerSchema(Rng& rng) {
  json s = {{"type", "integer"}};
  const int form = Uniform(rng, 0, 4);
  const int lo = Uniform(rng, -20, 10);
  if (form == 1 || form == 3) s["minimum"] = lo;
  if (form == 2 || form == 3) s["maximum"] = lo + Uniform(rng, 0, 40);
  if (form == 4) {
    s["minimum"] = -1000000;
    s["maximum"] = Uniform(rng, -200, 5000);
  }
  return s;
}

json RandomSchema(Rng& rng, int depth, bool* uses_ref) {
  const int kind = Uniform(rng, 0, depth >= 3 ? 6 : 12);
  json s;
  switch (kind) {
    case 0: {
      s = {{"type", "string"}};
      if (Chance(rng, 0.5)) {
        const int lo = Uniform(rng, 0, 3);
        s["minLength"] = lo;
        s["maxLength"] = lo + Uniform(rng, 0, 5);
      }
      break;
    }
    case 1:
      s = IntegerSchema(rng);
      break;
    case 2:
      s = {{"type", "number"}};
      break;
    case 3:
      s = {{"type", "boolean"}};
      break;
    case 4:
      s = {{"type", "null"}};
      break;
    case 5: {
      json values = json::array();
      for (int i = Uniform(rng, 1, 4); i > 0; --i) values.push_back(RandomScalar(rng));
      s = {{"enum", values}};
      break;
    }
    case 6:
      s = {{"const", RandomScalar(rng)}};
      break;
    case 7:
      s = Chance(rng, 0.5)
              ? json{{"type", {"string", "null"}}, {"maxLength", 4}}
              : json{{"type", {"integer", "boolean"}}, {"minimum", -3}, {"maximum", 30}};
      break;
    case 8: {
      s = {{"type", "object"}};
      std::vector<std::string> names = kNames;
      std::shuffle(names.begin(), names.end(), rng);
      names.resize(Uniform(rng, 0, 4));
      json props = json::object();
      json required = json::array();
      for (const std::string& n : names) {
        props[n] = RandomSchema(rng, depth + 1, uses_ref);
        if (Chance(rng, 0.5)) required.push_back(n);
      }
      s["properties"] = props;
      if (!required.empty()) s["required"] = required;
      const int ap = Uniform(rng, 0, 3);
      if (ap == 1) s["additionalProperties"] = true;
      if (ap == 2) s["additionalProperties"] = false;
      if (ap == 3) s["additionalProperties"] = {{"type", "integer"}};
      break;
    }
    case 9: {
      s = {{"type", "array"}, {"items", RandomSchema(rng, depth + 1, uses_ref)}};
      if (Chance(rng, 0.5)) {
        const int lo = Uniform(rng, 0, 2);
        s["minItems"] = lo;
        s["maxItems"] = lo + Uniform(rng, 0, 3);
      }
      break;
    }
    case 10: {
      json alts = json::array();
      for (int i = Uniform(rng, 2, 3); i > 0; --i) {
        alts.push_back(RandomSchema(rng, depth + 1, uses_ref));
      }
      s = {{Chance(rng, 0.7) ? "anyOf" : "oneOf", alts}};
      break;
    }
    case 11:
      s = Chance(rng, 0.5) ? json(true) : json{{"description", "anything"}};
      break;
    default:
      *uses_ref = true;
      s = {{"$ref", "#/$defs/node"}};
      break;
  }
  if (s.is_object() && Chance(rng, 0.2)) s["title"] = "t";
  return s;
}

json RandomRootSchema(Rng& rng) {
  bool uses_ref = false;
  json s = RandomSchema(rng, 0, &uses_ref);
  if (uses_ref) {
    if (!s.is_object()) s = json::object();
    s["$defs"] = {{"node", kTreeNode}};
  }
  return s;
}

struct InstanceGen {
  Rng& rng;
  const json& root;

  std::string Ws() {
    if (!Chance(rng, 0.3)) return "";
    // The runs the grammar takes: one space or one line break.
    return Chance(rng, 0.5) ? " " : "\n";
  }

  std::string Char() {
    static const std::vector<std::string> pool = {"a",
                                                  "Z",
                                                  "0",
                                                  " ",
                                                  "~",
                                                  "{",
                                                  "}",
                                                  ":",
                                                  ",",
                                                  "\x7f",
                                                  "\\\"",
                                                  "\\\\",
                                                  "\\/",
                                                  "\\n",
                                                  "\\t",
                                                  "\\b",
                                                  "\\u00e9",
                                                  "\\u0000",
                                                  "\\ud83d\\ude00",
                                                  "\\uD834\\uDD1E",
                                                  "\xc3\xa9",
                                                  "\xe2\x82\xac",
                                                  "\xf0\x9f\x98\x80",
                                                  "\xe4\xb8\xad",
                                                  "/"};
    return pool[Uniform(rng, 0, static_cast<int>(pool.size()) - 1)];
  }

  std::string String(int lo, int hi) {
    std::string s = "\"";
    for (int n = Uniform(rng, lo, std::min(hi, lo + 6)); n > 0; --n) s += Char();
    return s + "\"";
  }

  std::string Number() {
    std::string s = Chance(rng, 0.3) ? "-" : "";
    if (Chance(rng, 0.3)) {
      s += "0";
    } else {
      s += std::to_string(Uniform(rng, 1, 99999));
    }
    if (Chance(rng, 0.4)) s += "." + std::to_string(Uniform(rng, 0, 9999));
    if (Chance(rng, 0.3)) {
      s += Chance(rng, 0.5) ? "e" : "E";
      if (Chance(rng, 0.5)) s += Chance(rng, 0.5) ? "+" : "-";
      s += std::to_string(Uniform(rng, 0, 99));
    }
    return s;
  }

  std::string Integer(const json& s) {
    const int64_t lo = std::max<int64_t>(s.value("minimum", int64_t{-100000}), -100000);
    const int64_t hi = std::min<int64_t>(s.value("maximum", int64_t{100000}), 100000);
    const int64_t v = std::uniform_int_distribution<int64_t>(lo, std::max(lo, hi))(rng);
    if (v == 0 && Chance(rng, 0.3)) return "-0";
    return std::to_string(v);
  }

  std::string Object(const std::vector<std::pair<std::string, std::string>>& members) {
    std::string out = "{" + Ws();
    for (size_t i = 0; i < members.size(); ++i) {
      if (i > 0) out += "," + Ws();
      out += json(members[i].first).dump() + Ws() + ":" + Ws() + members[i].second + Ws();
    }
    return out + "}";
  }

  std::string Array(const std::vector<std::string>& items) {
    std::string out = "[" + Ws();
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0) out += "," + Ws();
      out += items[i] + Ws();
    }
    return out + "]";
  }

  std::string Any(int depth) {
    const int kind = Uniform(rng, 0, depth >= 3 ? 5 : 7);
    switch (kind) {
      case 0:
        return String(0, 4);
      case 1:
        return Number();
      case 2:
        return "true";
      case 3:
        return "false";
      case 4:
        return "null";
      case 5:
        return std::to_string(Uniform(rng, -50, 50));
      case 6: {
        std::vector<std::pair<std::string, std::string>> m;
        std::vector<std::string> names = kNames;
        std::shuffle(names.begin(), names.end(), rng);
        for (int i = Uniform(rng, 0, 3); i > 0; --i) m.emplace_back(names[i], Any(depth + 1));
        return Object(m);
      }
      default: {
        std::vector<std::string> items;
        for (int i = Uniform(rng, 0, 3); i > 0; --i) items.push_back(Any(depth + 1));
        return Array(items);
      }
    }
  }

  std::string Value(const json& s, int depth) {
    if (s.is_boolean()) return Any(depth);
    if (s.contains("$ref")) {
      return Value(root["$defs"]["node"], depth);
    }
    for (const char* k : {"anyOf", "oneOf"}) {
      if (s.contains(k)) {
        return Value(s[k][Uniform(rng, 0, static_cast<int>(s[k].size()) - 1)], depth);
      }
    }
    if (s.contains("enum")) {
      return s["enum"][Uniform(rng, 0, static_cast<int>(s["enum"].size()) - 1)].dump();
    }
    if (s.contains("const")) return s["const"].dump();
    if (!s.contains("type")) return Any(depth);
    const json& t = s["type"];
    const std::string type =
        t.is_array() ? t[Uniform(rng, 0, static_cast<int>(t.size()) - 1)].get<std::string>()
                     : t.get<std::string>();
    if (type == "string") return String(s.value("minLength", 0), s.value("maxLength", 8));
    if (type == "integer") return Integer(s);
    if (type == "number") return Number();
    if (type == "boolean") return Chance(rng, 0.5) ? "true" : "false";
    if (type == "null") return "null";
    if (type == "array") {
      const int lo = s.value("minItems", 0);
      const int hi = depth > 4 ? lo : std::min(s.value("maxItems", lo + 3), lo + 3);
      std::vector<std::string> items;
      for (int n = Uniform(rng, lo, hi); n > 0; --n) {
        items.push_back(Value(s.value("items", json(true)), depth + 1));
      }
      return Array(items);
    }
    // object
    const json props = s.value("properties", json::object());
    const json required = s.value("required", json::array());
    std::vector<std::pair<std::string, std::string>> m;
    for (const auto& [name, sub] : props.items()) {
      const bool req = std::find(required.begin(), required.end(), json(name)) != required.end();
      if (req || (depth <= 4 && Chance(rng, 0.5))) m.emplace_back(name, Value(sub, depth + 1));
    }
    const json ap = s.value("additionalProperties", json(true));
    if (!(ap.is_boolean() && !ap.get<bool>()) && Chance(rng, 0.3)) {
      const std::string& extra = kExtraNames[Uniform(rng, 0, 2)];
      m.emplace_back(extra, ap.is_boolean() ? Any(depth + 1) : Value(ap, depth + 1));
    }
    std::shuffle(m.begin(), m.end(), rng);
    return Object(m);
  }

  std::string Instance() { return Ws() + Value(root, 0) + Ws(); }
};

std::string Mutate(std::string s, Rng& rng) {
  static const std::string alphabet = "{}[]:,\"\\ \n0123456789-+.eEtrufalsn/abxyz";
  auto byte = [&] {
    return Chance(rng, 0.1) ? static_cast<char>(Uniform(rng, 0, 255))
                            : alphabet[Uniform(rng, 0, static_cast<int>(alphabet.size()) - 1)];
  };
  for (int edits = Uniform(rng, 1, 2); edits > 0; --edits) {
    const int op = Uniform(rng, 0, 2);
    if (op == 0 || s.empty()) {
      s.insert(s.begin() + Uniform(rng, 0, static_cast<int>(s.size())), byte());
    } else if (op == 1) {
      s.erase(s.begin() + Uniform(rng, 0, static_cast<int>(s.size()) - 1));
    } else {
      s[Uniform(rng, 0, static_cast<int>(s.size()) - 1)] = byte();
    }
  }
  return s;
}

// ---------------------------------------------------------------------------
// Hand-picked strings per keyword.

TEST(JsonConstraintTest, TypesAndTypeLists) {
  ExpectAll(MustCompile(R"({"type":"boolean"})"), {"true", "false", " true "},
            {"null", "tru", "True", "1"});
  ExpectAll(MustCompile(R"({"type":"null"})"), {"null"}, {"nul", "true", "\"null\""});
  ExpectAll(MustCompile(R"({"type":["string","null"]})"), {"\"x\"", "null"}, {"1", "true"});
  ExpectAll(MustCompile(R"({"type":["integer","boolean"]})"), {"-3", "false"}, {"1.5", "null"});
  ExpectAll(MustCompile(R"({"type":"object"})"), {"{}", "{\"a\":[1,{}]}"}, {"[]", "1"});
  ExpectAll(MustCompile(R"({"type":"array"})"), {"[]", "[1,\"a\",[null]]"}, {"{}", "[1,]", "[,1]"});
  // No type: any value; `true` too.
  ExpectAll(MustCompile(R"({"description":"anything"})"), {"1", "\"s\"", "[]", "{}", "null"},
            {"", "x"});
  ExpectAll(MustCompile(json(true)), {"1", "{\"a\":1}"}, {"}", "1 2"});
}

TEST(JsonConstraintTest, Numbers) {
  const JsonGrammar num = MustCompile(R"({"type":"number"})");
  ExpectAll(num,
            {"0", "-0", "12", "-0.5", "1.25e10", "1E+2", "3e-07", "99999999999999999999",
             "0.1234567890123456", "1e99"},
            {"01", "-", "1.", ".5", "+1", "1e", "1e+", "--1", "0x10", "1.2.3",
             "999999999999999999999",  // 21 integer digits
             "0.12345678901234567",    // 17 fraction digits
             "1e100", "NaN", "Infinity"});
  const JsonGrammar integer = MustCompile(R"({"type":"integer"})");
  ExpectAll(integer, {"0", "-0", "7", "-12", "9223372036854775807", "-9223372036854775808"},
            {"1.0", "1e2", "01", "9223372036854775808", "-9223372036854775809", "-"});
}

TEST(JsonConstraintTest, IntegerRangeDigitByDigit) {
  const JsonGrammar g = MustCompile(R"({"type":"integer","minimum":-5,"maximum":12})");
  ExpectAll(g, {"-5", "-1", "-0", "0", "7", "10", "12"}, {"-6", "13", "-10", "100", "-50"});
  // Prefixes: "1" may become 1, 10, 11 or 12; "-" any of -5..-0; "13" never.
  EXPECT_TRUE(TakesPrefix(g, "1"));
  EXPECT_TRUE(TakesPrefix(g, "-"));
  EXPECT_FALSE(TakesPrefix(g, "13"));
  EXPECT_FALSE(TakesPrefix(g, "-6"));
  EXPECT_FALSE(TakesPrefix(g, "2") && TakesPrefix(g, "20"));

  const JsonGrammar high = MustCompile(R"({"type":"integer","minimum":100,"maximum":200})");
  ExpectAll(high, {"100", "150", "200"}, {"99", "201", "1", "20", "0", "-100"});
  EXPECT_TRUE(TakesPrefix(high, "1"));   // 1xx
  EXPECT_TRUE(TakesPrefix(high, "20"));  // 200
  EXPECT_FALSE(TakesPrefix(high, "3"));
  EXPECT_FALSE(TakesPrefix(high, "201"));
  EXPECT_FALSE(TakesPrefix(high, "0"));
  EXPECT_FALSE(TakesPrefix(high, "-"));

  const JsonGrammar negative = MustCompile(R"({"type":"integer","minimum":-200,"maximum":-100})");
  ExpectAll(negative, {"-100", "-150", "-200"}, {"-99", "-201", "-0", "100"});
  EXPECT_FALSE(TakesPrefix(negative, "-9"));  // -9x is above -100, -9xx below -200
  EXPECT_TRUE(TakesPrefix(negative, "-1"));
  EXPECT_FALSE(TakesPrefix(negative, "1"));

  // Bounds that are not whole numbers are rounded inwards.
  ExpectAll(MustCompile(R"({"type":"integer","minimum":0.5,"maximum":2.5})"), {"1", "2"},
            {"0", "3"});
}

TEST(JsonConstraintTest, StringsUtf8EscapesAndLength) {
  const JsonGrammar any = MustCompile(R"({"type":"string"})");
  ExpectAll(
      any,
      {"\"\"", "\"a b\"", "\"\\\" \\\\ \\/ \\b \\f \\n \\r \\t\"", "\"\\u00e9\\uD83D\\uDE00\"",
       "\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"", "\"\x7f\"", "\"\\u0000\"",
       "\"\xe0\xa0\x80\xed\x9f\xbf\xee\x80\x80\xf4\x8f\xbf\xbf\xf1\x80\x80\x80\""},
      {"\"a",
       "\"\n\"",
       "\"\t\"",
       "\"\x01\"",
       "\"\\x\"",
       "\"\\u12\"",
       "\"\\u12g4\"",
       "\"\xff\"",
       "\"\xc0\xaf\"",      // not UTF-8, overlong
       "\"\xed\xa0\x80\"",  // a surrogate in UTF-8
       "\"\xe0\x80\xaf\"",
       "\"\xf0\x80\x80\xaf\"",  // overlong
       "\"\x80\"",
       "\"\xc3\xa9\xa9\"",      // stray continuation
       "\"\xf4\x90\x80\x80\"",  // above U+10FFFF
       "\"\xe2\x82\"",          // cut short
       "\"\\ud800\"",
       "\"\\ud800x\"",  // high surrogate alone
       "\"\\udc00\"",   // low surrogate alone
       "\"\\ud800\\u0041\"",
       "'a'"});
  // Length in code points: an escape, a surrogate pair, a multi-byte
  // character each count as one.
  const JsonGrammar g = MustCompile(R"({"type":"string","minLength":2,"maxLength":3})");
  ExpectAll(g,
            {"\"ab\"", "\"abc\"", "\"\xc3\xa9\xe2\x82\xac\"", "\"\\n\\t\\u00e9\"",
             "\"\\ud83d\\ude00x\"", "\"\xf0\x9f\x98\x80\xf0\x9f\x98\x80\xf0\x9f\x98\x80\""},
            {"\"a\"", "\"\xc3\xa9\"", "\"\\n\"", "\"abcd\"", "\"ab\\n\\t\"",
             "\"\xf0\x9f\x98\x80\xf0\x9f\x98\x80\xf0\x9f\x98\x80\xf0\x9f\x98\x80\""});
  EXPECT_FALSE(TakesPrefix(g, "\"abc\\"));  // a fourth code point may not start
  // The default bound on any string.
  const std::string longest = "\"" + std::string(kJsonMaxStringLength, 'x') + "\"";
  EXPECT_TRUE(Accepts(any, longest));
  EXPECT_FALSE(Accepts(any, "\"" + std::string(kJsonMaxStringLength + 1, 'x') + "\""));
}

TEST(JsonConstraintTest, EnumAndConst) {
  const JsonGrammar g = MustCompile(
      R"({"enum":["a\"b", "c\\d", "\u00e9", 1, 12, 1.5, null, true, {"k":[1,2]}, []]})");
  ExpectAll(g,
            {"\"a\\\"b\"", "\"c\\\\d\"", "\"\xc3\xa9\"", "1", "12", "1.5", "null", "true",
             "{\"k\":[1,2]}", "[]", " 12 "},
            {"\"a\\u0022b\"", "\"ab\"", "\"\\u00e9\"", "2", "123", "1.50", "false",
             "{\"k\": [1,2]}", "{\"k\":[1,2,3]}", "[ ]"});
  // const with a type filter and a nested value.
  ExpectAll(MustCompile(R"({"const":{"a":[true,"x y"]}})"), {"{\"a\":[true,\"x y\"]}"},
            {"{\"a\":[true,\"x y\"] }x", "{\"a\":[true]}"});
  ExpectAll(MustCompile(R"({"type":"string","enum":["x", 1, "y"]})"), {"\"x\"", "\"y\""}, {"1"});
  ExpectAll(MustCompile(R"({"type":"integer","enum":[1, 2.5, "3"]})"), {"1"}, {"2.5", "\"3\""});
}

TEST(JsonConstraintTest, ObjectsRequiredAndAdditional) {
  const JsonGrammar closed = MustCompile(R"({"type":"object",
      "properties":{"a":{"type":"integer"},"b":{"type":"string"}},
      "required":["a"], "additionalProperties":false})");
  ExpectAll(closed, {"{\"a\":1}", "{\"b\":\"x\",\"a\":1}", "{ \"a\" : 1 , \"b\" : \"x\" }"},
            {"{}", "{\"b\":\"x\"}", "{\"a\":1,\"a\":2}", "{\"a\":1,\"c\":2}", "{\"a\":1,}",
             "{\"a\":\"1\"}", "{\"a\" 1}", "{,\"a\":1}", "{\"a\":1 \"b\":\"x\"}"});
  EXPECT_FALSE(TakesPrefix(closed, "{\"c"));                   // no such property
  EXPECT_FALSE(TakesPrefix(closed, "{\"a\":1,\"a"));           // seen already
  EXPECT_TRUE(TakesPrefix(closed, "{\"a\":1,\""));             // "b" may still come
  EXPECT_FALSE(TakesPrefix(closed, "{\"a\":1,\"b\":\"x\","));  // nothing may follow a comma

  const JsonGrammar open = MustCompile(R"({"type":"object",
      "properties":{"a":{"type":"integer"}}, "required":["a"]})");
  ExpectAll(open,
            {"{\"a\":1,\"c\":[1,{\"d\":null}]}", "{\"zz\":\"x\",\"a\":-1}", "{\"aa\":1,\"a\":1}"},
            {"{\"a\":1,\"a\":2}", "{\"c\":1}", "{\"a\":\"x\"}"});

  const JsonGrammar typed = MustCompile(R"({"type":"object",
      "properties":{"a":{"type":"integer"}}, "additionalProperties":{"type":"boolean"}})");
  ExpectAll(typed, {"{}", "{\"z\":true,\"a\":3}", "{\"a\":3,\"y\":false}"},
            {"{\"z\":1}", "{\"a\":true}"});

  // Required but unlisted, with other keys allowed: takes their schema.
  ExpectAll(MustCompile(
                R"({"type":"object","required":["id"],"additionalProperties":{"type":"integer"}})"),
            {"{\"id\":1}", "{\"x\":2,\"id\":1}"},
            {"{\"x\":2}", "{\"id\":\"1\"}", "{\"id\":1,\"id\":2}"});
}

TEST(JsonConstraintTest, KeysCanonicalAndPrefixNames) {
  // Names that are prefixes of one another, and names that need escapes.
  const JsonGrammar g = MustCompile(R"({"type":"object","additionalProperties":false,
      "properties":{"na":{"type":"integer"},"name":{"type":"string"},"n\"q":{"type":"null"},
                    "\u00e9":{"type":"boolean"},"tab\t":{"type":"integer"}}})");
  ExpectAll(g,
            {"{\"na\":1,\"name\":\"x\"}", "{\"name\":\"x\",\"na\":1}", "{\"n\\\"q\":null}",
             "{\"\xc3\xa9\":true}", "{\"tab\\t\":1}"},
            {"{\"nam\":1}", "{\"n\\u0061\":1}", "{\"\\u00e9\":true}", "{\"tab\\u0009\":1}",
             "{\"na\":\"x\"}", "{\"names\":\"x\"}"});
  // Other keys must be canonical too.
  const JsonGrammar open = AnyJsonObject();
  ExpectAll(open, {"{\"a\\\"b\":1}", "{\"\\u001f\":1}", "{\"\\n\":1}", "{\"a/b\":1}"},
            {"{\"a\\/b\":1}", "{\"\\u0041\":1}", "{\"\\u000a\":1}", "{\"\\u001F\":1}"});
}

TEST(JsonConstraintTest, ArraysNested) {
  const JsonGrammar g = MustCompile(R"({"type":"array","minItems":1,"maxItems":3,
      "items":{"type":"array","items":{"type":"integer","minimum":0,"maximum":9},"maxItems":2}})");
  ExpectAll(g, {"[[]]", "[[1,2],[3],[]]", "[ [ 0 , 9 ] ]"},
            {"[]", "[[1,2,3]]", "[[],[],[],[]]", "[[10]]", "[1]", "[[1],]", "[[-1]]"});
  EXPECT_FALSE(TakesPrefix(g, "[[],[],[],"));
  EXPECT_FALSE(TakesPrefix(g, "[[],[],[]") && TakesPrefix(g, "[[],[],[],"));

  const JsonGrammar objects = MustCompile(R"({"type":"object","properties":{
      "rows":{"type":"array","items":{"type":"object","properties":{"id":{"type":"integer"}},
              "required":["id"],"additionalProperties":false}}},
      "required":["rows"],"additionalProperties":false})");
  ExpectAll(objects, {"{\"rows\":[]}", "{\"rows\":[{\"id\":1},{\"id\":2}]}"},
            {"{\"rows\":[{}]}", "{\"rows\":[{\"id\":1,\"x\":2}]}", "{\"rows\":{}}"});
}


TEST(JsonConstraintTest, AnyOfToolCalls) {
  const JsonGrammar g = MustCompile(kToolCallSchema);
  ExpectAll(
      g,
      {R"({"name":"get_weather","arguments":{"city":"Paris"}})",
       R"({"name": "get_weather", "arguments": {"city": "Oslo", "days": 3, "units": "celsius"}})",
       R"({"arguments":{"units":"fahrenheit","city":"Rome"},"name":"get_weather"})",
       R"({"name":"search","arguments":{"query":"moe","max_results":10}})",
       R"({"arguments":{"query":"x"},"name":"search"})"},
      {R"({"name":"get_weather","arguments":{"query":"x"}})",
       R"({"name":"search","arguments":{"city":"Paris"}})",
       R"({"arguments":{"city":"Paris"},"name":"search"})",
       R"({"name":"get_weather","arguments":{"city":"Paris","days":8}})",
       R"({"name":"search","arguments":{"query":"x","max_results":0}})",
       R"({"name":"get_weather"})", R"({"name":"other","arguments":{}})"});
  // Both alternatives stay alive until the name decides.
  JsonMatcher m(g);
  ASSERT_TRUE(m.Advance(R"({"arguments":{)"));
  EXPECT_EQ(m.num_parses(), 2);
  ASSERT_TRUE(m.Advance(R"("city":"Paris"},"name":")"));
  EXPECT_EQ(m.num_parses(), 1);
  EXPECT_FALSE(m.CanAdvance("s"));
  EXPECT_TRUE(m.CanAdvance("get_weather\"}"));
}

TEST(JsonConstraintTest, ParsesMergedAndBounded) {
  // Alternatives that meet again become one parse.
  const JsonGrammar strings =
      MustCompile(R"({"anyOf":[{"type":"string"},{"type":"string","maxLength":5}]})");
  JsonMatcher m(strings);
  ASSERT_TRUE(m.Advance("\"ab"));
  EXPECT_EQ(m.num_parses(), 2);
  ASSERT_TRUE(m.Advance("\""));
  EXPECT_EQ(m.num_parses(), 1);
  EXPECT_TRUE(m.IsDone());

  // 8 x 8 nested alternatives: at most kJsonMaxParses stay alive, the
  // earlier ones, and what is kept stays valid.
  json inner = json::array(), outer = json::array();
  for (int i = 0; i < 8; ++i) {
    inner.push_back({{"type", "object"},
                     {"additionalProperties", false},
                     {"properties", {{"q" + std::to_string(i), {{"type", "integer"}}}}}});
  }
  for (int i = 0; i < 8; ++i) {
    outer.push_back(
        {{"type", "object"},
         {"additionalProperties", false},
         {"properties",
          {{"x", {{"anyOf", inner}}}, {"p" + std::to_string(i), {{"type", "integer"}}}}}});
  }
  const json schema = {{"anyOf", outer}};
  const JsonGrammar g = MustCompile(schema);
  JsonMatcher n(g);
  ASSERT_TRUE(n.Advance("{\"x\":{"));
  EXPECT_EQ(n.num_parses(), kJsonMaxParses);
  ASSERT_TRUE(n.Advance("\"q7\":1}"));
  EXPECT_EQ(n.num_parses(), 4);              // outer alternatives 0..3 kept
  EXPECT_FALSE(n.CanAdvance(",\"p7\":1}"));  // dropped: the documented cost
  ASSERT_TRUE(n.Advance(",\"p3\":1}"));
  EXPECT_TRUE(n.IsDone());
  EXPECT_TRUE(Reference(schema, "{\"x\":{\"q7\":1},\"p3\":1}"));
}

TEST(JsonConstraintTest, RefRecursionAndDepthLimit) {
  const JsonGrammar tree =
      MustCompile(json{{"$defs", {{"node", kTreeNode}}}, {"$ref", "#/$defs/node"}});
  ExpectAll(
      tree,
      {"{\"v\":1}", "{\"v\":0,\"kids\":[{\"v\":1},{\"v\":-3,\"kids\":[{\"v\":2,\"kids\":[]}]}]}"},
      {"{}", "{\"v\":4}", "{\"v\":1,\"kids\":[{}]}",
       "{\"v\":1,\"kids\":[{\"v\":1},{\"v\":1},{\"v\":1}]}"});
  // "definitions" and "#" work the same way.
  const JsonGrammar list = MustCompile(R"({"type":"object","properties":{
      "next":{"$ref":"#"}, "x":{"$ref":"#/definitions/x"}},"additionalProperties":false,
      "definitions":{"x":{"type":"integer"}}})");
  ExpectAll(list, {"{\"next\":{\"next\":{\"x\":1}}}"}, {"{\"next\":{\"y\":1}}"});

  // Each tree level opens an object and an array: kJsonMaxDepth / 2 levels
  // fit, the next object is refused, and the matcher can still finish.
  const std::string level = "{\"v\":1,\"kids\":[";
  JsonMatcher m(tree);
  int levels = 0;
  while (m.Advance(level)) ++levels;
  EXPECT_EQ(levels, kJsonMaxDepth / 2);
  EXPECT_FALSE(m.CanAdvance("{"));
  EXPECT_TRUE(m.CanAdvance("]"));
  std::string close;
  for (int i = 0; i < levels; ++i) close += "]}";
  EXPECT_TRUE(m.Advance(close));
  EXPECT_TRUE(m.IsDone());

  // A node whose required recursion always fits: it must stop in time.
  const JsonGrammar chain = MustCompile(R"({"$defs":{"n":{"anyOf":[{"type":"null"},
      {"type":"object","properties":{"n":{"$ref":"#/$defs/n"}},"required":["n"],"additionalProperties":false}]}},
      "$ref":"#/$defs/n"})");
  JsonMatcher c(chain);
  int opened = 0;
  while (c.Advance("{\"n\":")) ++opened;
  EXPECT_EQ(opened, kJsonMaxDepth);
  EXPECT_TRUE(c.Advance("null"));
  EXPECT_TRUE(c.Advance(std::string(opened, '}')));
  EXPECT_TRUE(c.IsDone());
}

TEST(JsonConstraintTest, WhitespaceBounded) {
  const JsonGrammar g = MustCompile(R"({"type":"object","properties":{"a":{"type":"array"}}})");
  ExpectAll(g,
            {"{\"a\":[1,2]}", " { \"a\" : [ 1 , 2 ] } ", "{\n\"a\":\n[\n1,\n2\n]\n}\n"},
            {"  {}", "{  }", "{}  ", "{\"a\":[1  ]}", "{\n  \"a\": 1}", "{\n\n}", "{ \n}", "{\t}",
             "{\r\n}", "{\"a\":[1 2]}", "{\"a\":[- 1]}", "{\f}", "{\v}"});
  // Inside strings spaces are text, not whitespace.
  EXPECT_TRUE(Accepts(MustCompile(R"({"type":"string"})"), "\"" + std::string(100, ' ') + "\""));
}

TEST(JsonConstraintTest, CompleteAndDone) {
  const JsonGrammar object = MustCompile(R"({"type":"object"})");
  JsonMatcher m(object);
  EXPECT_FALSE(m.IsComplete());
  ASSERT_TRUE(m.Advance("{\"a\":1"));
  EXPECT_FALSE(m.IsComplete());
  ASSERT_TRUE(m.Advance("}"));
  EXPECT_TRUE(m.IsComplete());
  EXPECT_TRUE(m.IsDone());
  EXPECT_TRUE(m.Advance("\n"));
  EXPECT_FALSE(m.CanAdvance(" "));
  EXPECT_FALSE(m.CanAdvance("x"));

  const JsonGrammar small = MustCompile(R"({"type":"integer","minimum":0,"maximum":12})");
  JsonMatcher n(small);
  ASSERT_TRUE(n.Advance("1"));
  EXPECT_TRUE(n.IsComplete());
  EXPECT_FALSE(n.IsDone());  // 10..12 may follow
  ASSERT_TRUE(n.Advance("2"));
  EXPECT_TRUE(n.IsDone());

  const JsonGrammar number = MustCompile(R"({"type":"number"})");
  JsonMatcher x(number);
  ASSERT_TRUE(x.Advance("5"));
  EXPECT_TRUE(x.IsComplete());
  EXPECT_FALSE(x.IsDone());
  ASSERT_TRUE(x.Advance("."));
  EXPECT_FALSE(x.IsComplete());

  // Refusal leaves the state as it was.
  JsonMatcher y(object);
  ASSERT_TRUE(y.Advance("{\"a\":"));
  EXPECT_FALSE(y.Advance("1}x"));
  EXPECT_TRUE(y.Advance("2}"));
  EXPECT_TRUE(y.IsDone());
}

TEST(JsonConstraintTest, AnyJsonObject) {
  const JsonGrammar g = AnyJsonObject();
  ExpectAll(g, {"{}", "{\"a\":[1,2,{\"b\":null}],\"c\":\"x\",\"a\":3}", " { } "},
            {"[]", "1", "\"x\"", "null", "{\"a\"}", "{\"a\":}", "{a:1}"});
  std::string deep;
  for (int i = 0; i < kJsonMaxDepth - 1; ++i) deep += "{\"k\":";
  EXPECT_TRUE(Accepts(g, deep + "[]" + std::string(kJsonMaxDepth - 1, '}')));
  EXPECT_FALSE(TakesPrefix(g, deep + "[["));
}

// ---------------------------------------------------------------------------
// Errors.

TEST(JsonConstraintTest, MatchesReferenceOnRandomAndMutatedInstances) {
  Rng rng(20240611);
  int compared = 0, valid_mutants = 0, invalid_mutants = 0, instances = 0;
  for (int round = 0; round < 250; ++round) {
    const json schema = RandomRootSchema(rng);
    SCOPED_TRACE(schema.dump());
    const JsonGrammar g = MustCompile(schema);
    InstanceGen gen{rng, schema};
    for (int k = 0; k < 8; ++k) {
      const std::string text = gen.Instance();
      ASSERT_TRUE(Reference(schema, text)) << "the generator made an invalid instance: " << text;
      // Prefix closure: every byte of a valid instance is taken.
      JsonMatcher m(g);
      for (size_t i = 0; i < text.size(); ++i) {
        ASSERT_TRUE(m.Advance(text.substr(i, 1))) << "refused byte " << i << " of " << text;
      }
      EXPECT_TRUE(m.IsComplete()) << text;
      ++instances;
      for (int j = 0; j < 8; ++j) {
        const std::string mutant = Mutate(text, rng);
        const bool want = Reference(schema, mutant);
        EXPECT_EQ(Accepts(g, mutant), want) << "mutant: " << mutant << "\nfrom: " << text;
        (want ? valid_mutants : invalid_mutants) += 1;
        ++compared;
      }
    }
  }
  std::printf("reference check: %d instances, %d mutants (%d valid, %d invalid)\n", instances,
              compared, valid_mutants, invalid_mutants);
  EXPECT_GT(valid_mutants, compared / 50);  // both outcomes are exercised
  EXPECT_GT(invalid_mutants, compared / 2);
}

TEST(JsonConstraintTest, AnyJsonObjectMatchesReference) {
  Rng rng(7);
  const JsonGrammar g = AnyJsonObject();
  const json schema = {{"type", "object"}};
  InstanceGen gen{rng, schema};
  for (int k = 0; k < 300; ++k) {
    const std::string text = gen.Instance();
    EXPECT_TRUE(Accepts(g, text)) << text;
    for (int j = 0; j < 5; ++j) {
      const std::string mutant = Mutate(text, rng);
      EXPECT_EQ(Accepts(g, mutant), Reference(schema, mutant)) << mutant;
    }
  }
}

// ---------------------------------------------------------------------------
// Fuzz: random schema-like JSON compiles or is refused; what compiles stays
// live under random decoding.

}  // namespace
}  // namespace moe::serving
