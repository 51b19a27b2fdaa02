// JSON-schema compilation (services/serving/json_schema.h): keywords we do
// not run, malformed schemas and limits are refused naming the keyword and
// its JSON pointer; random schema-like documents either compile into a
// matcher that stays live (every prefix it accepts can be completed) or are
// refused, never crash. The matcher's behaviour per keyword is
// json_constraint_test.cc's.
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/serving/json_constraint.h"
#include "services/serving/json_schema.h"
#include "tests/serving/json_test_util.h"

namespace moe::serving {
namespace {

using namespace json_test;  // NOLINT: the shared test vocabulary

void ExpectRefused(const json& schema, const std::vector<std::string>& parts) {
  absl::StatusOr<JsonGrammar> g = CompileJsonSchema(schema);
  ASSERT_FALSE(g.ok()) << schema.dump();
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument) << g.status();
  for (const std::string& p : parts) {
    EXPECT_NE(g.status().message().find(p), std::string::npos)
        << "\"" << g.status().message() << "\" lacks \"" << p << "\" for " << schema.dump();
  }
}

TEST(JsonSchemaTest, UnsupportedKeywordsNamed) {
  const json name_pattern =
      json::parse(R"({"type":"object","properties":{"name":{"type":"string","pattern":"^a"}}})");
  absl::StatusOr<JsonGrammar> g = CompileJsonSchema(name_pattern);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().message(),
            "unsupported JSON-schema keyword \"pattern\" at /properties/name");
  for (const char* k : {"pattern",
                        "format",
                        "multipleOf",
                        "exclusiveMinimum",
                        "exclusiveMaximum",
                        "patternProperties",
                        "not",
                        "allOf",
                        "if",
                        "then",
                        "else",
                        "dependentRequired",
                        "dependentSchemas",
                        "minProperties",
                        "maxProperties",
                        "uniqueItems",
                        "contains",
                        "prefixItems",
                        "propertyNames",
                        "unevaluatedProperties",
                        "$anchor",
                        "$dynamicRef",
                        "nullable",
                        "contentEncoding"}) {
    json inner = {{"type", "string"}, {k, 1}};
    json schema = {{"type", "object"},
                   {"properties", {{"a/b~", {{"type", "array"}, {"items", inner}}}}}};
    ExpectRefused(schema, {absl::StrCat("\"", k, "\""), "/properties/a~1b~0/items", "unsupported"});
    ExpectRefused(json{{k, 1}}, {absl::StrCat("\"", k, "\""), "the root"});
  }
  ExpectRefused(
      json::parse(R"({"anyOf":[{"type":"null"},{"type":"array","items":[{"type":"null"}]}]})"),
      {"\"items\"", "tuple", "/anyOf/1"});
  ExpectRefused(json::parse(R"({"type":"number","minimum":0})"), {"\"minimum\"", "integer"});
  ExpectRefused(json::parse(R"({"maximum":3})"), {"\"maximum\"", "integer"});
  ExpectRefused(json::parse(R"({"type":"object","properties":{"a":{"$defs":{}}}})"),
                {"\"$defs\"", "/properties/a"});
}

TEST(JsonSchemaTest, MalformedSchemasNamed) {
  struct Case {
    const char* schema;
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      {R"(42)", {"object or true", "the root"}},
      {R"("string")", {"object or true"}},
      {R"(null)", {"object or true"}},
      {R"(false)", {"false"}},
      {R"({"properties":{"a":false}})", {"false", "/properties/a"}},
      {R"({"items":[1]})", {"items"}},
      {R"({"type":"text"})", {"\"type\"", "text"}},
      {R"({"type":[]})", {"\"type\""}},
      {R"({"type":["string",1]})", {"\"type\""}},
      {R"({"type":"object","properties":[]})", {"\"properties\""}},
      {R"({"type":"object","required":"a"})", {"\"required\""}},
      {R"({"type":"object","required":[1]})", {"\"required\""}},
      {R"({"type":"object","properties":{"a":{}},"required":["b"],"additionalProperties":false})",
       {"\"required\"", "\"b\"", "additionalProperties"}},
      {R"({"type":"object","additionalProperties":1})", {"\"additionalProperties\""}},
      {R"({"type":"integer","minimum":5,"maximum":4})", {"\"minimum\"", "\"maximum\""}},
      {R"({"type":"integer","minimum":1.2,"maximum":1.8})", {"\"minimum\""}},
      {R"({"type":"integer","minimum":"1"})", {"\"minimum\""}},
      {R"({"type":"string","minLength":3,"maxLength":2})", {"\"minLength\"", "\"maxLength\""}},
      {R"({"type":"string","minLength":-1})", {"\"minLength\""}},
      {R"({"type":"string","maxLength":1.5})", {"\"maxLength\""}},
      {R"({"type":"string","minLength":5000})", {"\"minLength\"", "4096"}},
      {R"({"type":"array","minItems":3,"maxItems":2})", {"\"minItems\"", "\"maxItems\""}},
      {R"({"enum":[]})", {"\"enum\""}},
      {R"({"enum":"a"})", {"\"enum\""}},
      {R"({"enum":[1,2],"const":3})", {"\"enum\"", "\"const\""}},
      {R"({"type":"string","enum":[1,2]})", {"\"enum\"", "\"type\""}},
      {R"({"enum":["a"],"minLength":1})", {"\"enum\"", "\"minLength\""}},
      {R"({"anyOf":[]})", {"\"anyOf\""}},
      {R"({"oneOf":{}})", {"\"oneOf\""}},
      {R"({"anyOf":[{"type":"null"}],"type":"object"})", {"\"anyOf\"", "\"type\""}},
      {R"({"anyOf":[{"type":"null"}],"oneOf":[{"type":"null"}]})", {"\"anyOf\"", "\"oneOf\""}},
      {R"({"anyOf":[{"type":"null"},{"pattern":"x"}]})", {"\"pattern\"", "/anyOf/1"}},
      {R"({"$ref":"#/$defs/missing","$defs":{}})", {"\"$ref\"", "missing", "resolve"}},
      {R"({"$ref":"http://example.com/s.json"})", {"\"$ref\"", "http://example.com/s.json"}},
      {R"({"$ref":"#/properties/a"})", {"\"$ref\""}},
      {R"({"$ref":1})", {"\"$ref\""}},
      {R"({"$ref":"#/$defs/a","type":"object","$defs":{"a":{}}})", {"\"$ref\"", "\"type\""}},
      {R"({"$ref":"#/$defs/a","$defs":{"a":{"$ref":"#/$defs/b"},"b":{"anyOf":[{"$ref":"#/$defs/a"}]}}})",
       {"cycle", "/$defs/"}},
      {R"({"$ref":"#"})", {"cycle"}},
      {R"({"$defs":[],"type":"null"})", {"\"$defs\""}},
      {R"({"$defs":{"n":{"type":"object","properties":{"n":{"$ref":"#/$defs/n"}},"required":["n"]}},
           "$ref":"#/$defs/n"})",
       {"accepts no value", "32"}},
      {R"({"type":"array","minItems":1,"items":{"$ref":"#"}})", {"accepts no value"}},
  };
  for (const Case& c : cases) ExpectRefused(json::parse(c.schema), c.parts);
}

TEST(JsonSchemaTest, LimitsRefused) {
  json deep = {{"type", "string"}};
  for (int i = 0; i < kJsonSchemaMaxDepth + 2; ++i) deep = {{"type", "array"}, {"items", deep}};
  ExpectRefused(deep, {"deeper than 64", "/items/items"});

  json wide = {{"type", "object"}, {"properties", json::object()}};
  for (int i = 0; i <= kJsonSchemaMaxProperties; ++i) {
    wide["properties"]["p" + std::to_string(i)] = json(true);
  }
  ExpectRefused(wide, {"more than 64 properties"});

  json many = {{"type", "object"}, {"properties", json::object()}};
  for (int i = 0; i < 40; ++i) {
    json inner = {{"type", "object"}, {"properties", json::object()}};
    for (int j = 0; j < 60; ++j) {
      inner["properties"]["q" + std::to_string(j)] = {{"type", "string"}};
    }
    many["properties"]["p" + std::to_string(i)] = inner;
  }
  ExpectRefused(many, {"more than 2048 nodes"});

  json values = json::array();
  for (int i = 0; i <= kJsonSchemaMaxEnumValues; ++i) values.push_back(i);
  ExpectRefused(json{{"enum", values}}, {"\"enum\"", "more than 1024"});

  ExpectRefused(json{{"enum", {std::string(1 << 16, 'x')}}}, {"enum/const", "65536"});
  ExpectRefused(json{{"type", "object"}, {"properties", {{std::string(300, 'n'), json(true)}}}},
                {"longer than 256"});

  json alts = json::array();
  for (int i = 0; i <= kJsonSchemaMaxAlternatives; ++i) alts.push_back({{"const", i}});
  ExpectRefused(json{{"anyOf", alts}}, {"\"anyOf\"", "more than 32"});
  // Expanded by $ref and type lists past the bound.
  json nested = json::array();
  for (int i = 0; i < 7; ++i) {  // 5 leaves each (boolean and null share one)
    nested.push_back({{"type", {"string", "integer", "boolean", "array", "object", "null"}}});
  }
  ExpectRefused(json{{"anyOf", nested}}, {"more than 32 alternatives"});

  // Strings that are not UTF-8 inside the schema value (built in code).
  ExpectRefused(json{{"const", std::string("\xff")}}, {"UTF-8"});
}

// ---------------------------------------------------------------------------
// Against the reference.

json RandomSchemaLike(Rng& rng, int depth) {
  static const std::vector<std::string> keys = {"type",        "properties",
                                                "required",    "additionalProperties",
                                                "enum",        "const",
                                                "items",       "minItems",
                                                "maxItems",    "minimum",
                                                "maximum",     "minLength",
                                                "maxLength",   "anyOf",
                                                "oneOf",       "$ref",
                                                "$defs",       "description",
                                                "title",       "pattern",
                                                "format",      "not",
                                                "allOf",       "definitions",
                                                "uniqueItems", "x"};
  static const std::vector<json> types = {"object", "array",   "string", "integer",
                                          "number", "boolean", "null"};
  auto scalar = [&]() -> json {
    switch (Uniform(rng, 0, 6)) {
      case 0:
        return Uniform(rng, -3, 5);
      case 1:
        return Uniform(rng, 0, 3) * 0.5;
      case 2:
        return types[Uniform(rng, 0, 6)];
      case 3:
        return Chance(rng, 0.5);
      case 4:
        return nullptr;
      case 5:
        return Chance(rng, 0.5) ? "#/$defs/a" : "#";
      default:
        return "a";
    }
  };
  if (depth > 3 || Chance(rng, 0.15)) return Chance(rng, 0.5) ? json(true) : scalar();
  json s = json::object();
  for (int n = Uniform(rng, 0, 4); n > 0; --n) {
    const std::string& k = keys[Uniform(rng, 0, static_cast<int>(keys.size()) - 1)];
    if (k == "properties" || k == "$defs" || k == "definitions") {
      json p = json::object();
      for (int i = Uniform(rng, 0, 3); i > 0; --i) {
        p[std::string(1, static_cast<char>('a' + Uniform(rng, 0, 3)))] =
            RandomSchemaLike(rng, depth + 1);
      }
      s[k] = Chance(rng, 0.9) ? p : json(scalar());
    } else if (k == "anyOf" || k == "oneOf" || k == "enum" || k == "required") {
      json a = json::array();
      for (int i = Uniform(rng, 0, 3); i > 0; --i) {
        a.push_back(k == "required"
                        ? json(std::string(1, static_cast<char>('a' + Uniform(rng, 0, 3))))
                    : k == "enum" ? scalar()
                                  : RandomSchemaLike(rng, depth + 1));
      }
      s[k] = a;
    } else if (k == "items" || k == "additionalProperties") {
      s[k] = Chance(rng, 0.8) ? RandomSchemaLike(rng, depth + 1) : json(scalar());
    } else if (k == "type" && Chance(rng, 0.3)) {
      s[k] = {types[Uniform(rng, 0, 6)], types[Uniform(rng, 0, 6)]};
    } else {
      s[k] = scalar();
    }
  }
  return s;
}

TEST(JsonSchemaTest, RandomSchemasCompileOrRefuseAndStayLive) {
  Rng rng(1234);
  const std::vector<std::string> vocab = SmallVocab();
  const TokenTrie trie(vocab);
  int compiled = 0, refused = 0;
  for (int iter = 0; iter < 300; ++iter) {
    const json schema = RandomSchemaLike(rng, 0);
    SCOPED_TRACE(schema.dump());
    absl::StatusOr<JsonGrammar> g = CompileJsonSchema(schema);
    if (!g.ok()) {
      EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument) << g.status();
      EXPECT_FALSE(g.status().message().empty());
      ++refused;
      continue;
    }
    ++compiled;
    // A random walk over single bytes: until done, some byte is always
    // allowed (or the value is complete).
    JsonMatcher m(*g);
    std::string text;
    for (int step = 0; step < 150 && !m.IsDone(); ++step) {
      std::vector<int> bytes;
      for (int c = 0; c < 256; ++c) {
        if (m.CanAdvance(std::string(1, static_cast<char>(c)))) bytes.push_back(c);
      }
      if (bytes.empty()) {
        EXPECT_TRUE(m.IsComplete()) << "dead end after " << text;
        break;
      }
      if (step % 25 == 0) {
        std::vector<uint8_t> mask;
        m.AllowedTokens(trie, &mask);
        EXPECT_EQ(mask, BruteForce(m, vocab)) << text;
      }
      const char c = static_cast<char>(bytes[Uniform(rng, 0, static_cast<int>(bytes.size()) - 1)]);
      ASSERT_TRUE(m.Advance(std::string(1, c)));
      text += c;
    }
  }
  std::printf("random schemas: %d compiled, %d refused\n", compiled, refused);
  EXPECT_GT(compiled, 20);
  EXPECT_GT(refused, 20);
}

}  // namespace
}  // namespace moe::serving
