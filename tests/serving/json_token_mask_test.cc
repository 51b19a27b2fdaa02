// The token mask (json_token_mask.cc): against brute force over every
// token, decoding under the mask ends in valid instances, and a
// large-vocabulary mask timing.
#include "services/serving/json_constraint.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/serving/json_test_util.h"

namespace moe::serving {
namespace {

using namespace json_test;  // NOLINT: the shared test vocabulary

struct MaskCase {
  json schema;
  std::vector<std::string> instances;
};

std::vector<MaskCase> MaskCases() {
  return {
      {json::parse(kToolCallSchema),
       {R"({"name": "get_weather", "arguments": {"city": "P\u00e9ris \ud83d\ude00", "days": 7}})",
        R"({"arguments":{"query":"na\"me","max_results":3},"name":"search"})"}},
      {json{{"$defs", {{"node", kTreeNode}}}, {"$ref", "#/$defs/node"}},
       {R"({"v":1,"kids":[{"v":-3},{"v":0,"kids":[]}]})"}},
      {json::parse(
           R"({"type":"array","items":{"type":"string","minLength":1,"maxLength":3},"maxItems":4})"),
       {"[\"\xc3\xa9\xe2\x82\xac\", \"a\"]"}},
      {json::parse(R"({"type":"integer","minimum":-5,"maximum":123})"), {"123", "-5"}},
      {json::parse(R"({"enum":["true", true, 12, "na\"me"]})"), {"\"na\\\"me\"", "12"}},
      {json(nullptr),
       {R"({"any": [1, 2.5e+1, {"x": null}, "\u00e9"], "b": false})"}},  // AnyJsonObject
  };
}

JsonGrammar CaseGrammar(const MaskCase& c) {
  return c.schema.is_null() ? AnyJsonObject() : MustCompile(c.schema);
}

TEST(JsonConstraintTest, MaskEqualsBruteForce) {
  const std::vector<std::string> vocab = SmallVocab();
  const TokenTrie trie(vocab);
  EXPECT_EQ(trie.vocab_size(), static_cast<int>(vocab.size()));
  const size_t true_id = std::find(vocab.begin(), vocab.end(), "true") - vocab.begin();
  ASSERT_LT(true_id, vocab.size() - 1);
  int steps = 0;
  for (const MaskCase& c : MaskCases()) {
    const JsonGrammar g = CaseGrammar(c);
    for (const std::string& text : c.instances) {
      JsonMatcher m(g);
      for (size_t i = 0; i <= text.size(); ++i) {
        std::vector<uint8_t> mask;
        m.AllowedTokens(trie, &mask);
        ASSERT_EQ(mask, BruteForce(m, vocab)) << "after " << text.substr(0, i);
        EXPECT_EQ(mask[0], 0);
        EXPECT_EQ(mask[vocab.size() - 1], mask[true_id]);  // same bytes, same answer
        if (i < text.size()) {
          // The instance's own next byte, when a one-byte token, is allowed.
          const uint8_t next = static_cast<uint8_t>(text[i]);
          if (next >= 0x20 && next < 0x7f) {
            EXPECT_EQ(mask[1 + next - 0x20], 1);
          }
          ASSERT_TRUE(m.Advance(text.substr(i, 1)));
        }
        ++steps;
      }
      EXPECT_TRUE(m.IsComplete());
    }
  }
  EXPECT_GT(steps, 200);
}

// Decodes under the mask with `pick` choosing among allowed ids (-1: end of
// sequence, offered when complete); returns the text, or fails.
template <typename Pick>
std::string Decode(const JsonGrammar& g, const TokenTrie& trie,
                   const std::vector<std::string>& vocab, int max_steps, Pick pick) {
  JsonMatcher m(g);
  std::string out;
  for (int step = 0; step < max_steps; ++step) {
    if (m.IsDone()) return out;
    std::vector<uint8_t> mask;
    m.AllowedTokens(trie, &mask);
    std::vector<int> allowed;
    for (size_t id = 0; id < mask.size(); ++id) {
      if (mask[id]) allowed.push_back(static_cast<int>(id));
    }
    if (m.IsComplete()) allowed.push_back(-1);
    EXPECT_FALSE(allowed.empty()) << "dead end after " << out;  // liveness
    if (allowed.empty()) return out;
    const int id = pick(allowed);
    if (id < 0) return out;
    EXPECT_TRUE(m.Advance(vocab[id]));
    out += vocab[id];
  }
  ADD_FAILURE() << "no end within " << max_steps << " steps: " << out.substr(0, 200);
  return out;
}

TEST(JsonConstraintTest, MaskDecodingTerminatesValid) {
  const std::vector<std::string> vocab = SmallVocab();
  const TokenTrie trie(vocab);
  // Smallest id, on schemas whose every string and array is bounded.
  for (
      const char* s :
      {kToolCallSchema,
       R"({"type":"array","items":{"type":"integer","minimum":3,"maximum":250},"minItems":2,"maxItems":4})",
       R"({"type":"object","properties":{"a":{"type":"string","maxLength":5},"b":{"enum":["x","yy"]},
                           "c":{"type":"array","maxItems":2,"items":{"type":"boolean"}}},"required":["a","b","c"],"additionalProperties":false})"}) {
    const json schema = json::parse(s);
    const JsonGrammar g = MustCompile(schema);
    const std::string text = Decode(
        g, trie, vocab, 5000, [](const std::vector<int>& a) { return a[0] < 0 ? a.back() : a[0]; });
    EXPECT_TRUE(Reference(schema, text)) << text;
    std::printf("smallest-id decode: %s\n", text.c_str());
  }
  // Seeded random choices, on every mask case's schema.
  Rng rng(99);
  for (const MaskCase& c : MaskCases()) {
    const JsonGrammar g = CaseGrammar(c);
    const json schema = c.schema.is_null() ? json{{"type", "object"}} : c.schema;
    for (int k = 0; k < 20; ++k) {
      const std::string text = Decode(g, trie, vocab, 20000, [&](const std::vector<int>& a) {
        return a[Uniform(rng, 0, static_cast<int>(a.size()) - 1)];
      });
      EXPECT_TRUE(Reference(schema, text)) << text;
    }
  }
}

TEST(JsonConstraintTest, MaskOnLargeVocabulary) {
  Rng rng(5);
  const std::string alphabet = "{}[]:,\"\\ \n0123456789-+.eEabcdefghijklmnopqrstuvwxyz_";
  std::vector<std::string> vocab;
  for (int i = 0; i < 50000; ++i) {
    std::string t;
    for (int n = Uniform(rng, 1, 8); n > 0; --n) {
      t += alphabet[Uniform(rng, 0, static_cast<int>(alphabet.size()) - 1)];
    }
    vocab.push_back(t);
  }
  const TokenTrie trie(vocab);
  const JsonGrammar g = MustCompile(kToolCallSchema);
  const std::string text =
      R"({"name": "get_weather", "arguments": {"city": "Paris", "days": 3, "units": "celsius"}})";
  JsonMatcher m(g);
  double total_us = 0, max_us = 0;
  int masks = 0;
  for (size_t i = 0; i < 50 && i < text.size(); ++i) {
    std::vector<uint8_t> mask;
    const auto start = std::chrono::steady_clock::now();
    m.AllowedTokens(trie, &mask);
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    total_us += us;
    max_us = std::max(max_us, us);
    ++masks;
    ASSERT_EQ(mask, BruteForce(m, vocab)) << "after " << text.substr(0, i);
    // The instance's next byte, as a one-byte token, is allowed.
    const auto one = std::find(vocab.begin(), vocab.end(), text.substr(i, 1));
    if (one != vocab.end()) {
      EXPECT_EQ(mask[one - vocab.begin()], 1) << i;
    }
    ASSERT_TRUE(m.Advance(text.substr(i, 1)));
  }
  std::printf("mask over %zu tokens (%d trie nodes): mean %.1f us, max %.1f us over %d steps\n",
              vocab.size(), trie.num_nodes(), total_us / masks, max_us, masks);
}

}  // namespace
}  // namespace moe::serving
