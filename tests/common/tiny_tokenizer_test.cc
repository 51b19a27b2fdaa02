#include "common/tiny_tokenizer.h"

#include <map>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace moe {
namespace {

using ::testing::ElementsAre;

TEST(TinyTokenizerTest, Gpt2ByteAlphabet) {
  EXPECT_EQ(ByteToUnicode(' '), "\xc4\xa0");   // "Ġ" U+0120
  EXPECT_EQ(ByteToUnicode('\n'), "\xc4\x8a");  // "Ċ" U+010A
  EXPECT_EQ(ByteToUnicode('a'), "a");
  EXPECT_EQ(ByteToUnicode(0xff), "\xc3\xbf");  // "ÿ" maps to itself
  EXPECT_EQ(ByteToUnicode(0xad), "\xc5\x83");  // soft hyphen -> U+0143
  // GPT-2 ids: "!" is 0, "Ġ" is 220.
  ASSERT_EQ(ByteOrder().size(), 256u);
  EXPECT_EQ(ByteOrder()[0], '!');
  EXPECT_EQ(ByteOrder()[220], ' ');
  std::set<std::string> distinct;
  for (int b = 0; b < 256; ++b)
    distinct.insert(ByteToUnicode(static_cast<uint8_t>(b)));
  EXPECT_EQ(distinct.size(), 256u);
}

TEST(TinyTokenizerTest, PreTokenizeLikeGpt2) {
  EXPECT_THAT(PreTokenize("Hello world's  big\n\nday 2024!"),
              ElementsAre("Hello", " world", "'s", " ", " big", "\n", "\n",
                          "day", " 2024", "!"));
  EXPECT_THAT(PreTokenize("a  b"), ElementsAre("a", " ", " b"));
  EXPECT_THAT(PreTokenize("end  "), ElementsAre("end", "  "));
  EXPECT_THAT(PreTokenize("x\n y"), ElementsAre("x", "\n", " y"));
}

// Encodes with a plain reference BPE: repeatedly merge the lowest-rank pair.
std::vector<std::string> Encode(
    const std::string& word,
    const std::map<std::pair<std::string, std::string>, int>& ranks) {
  std::vector<std::string> sym;
  for (unsigned char b : word) sym.push_back(ByteToUnicode(b));
  while (sym.size() > 1) {
    int best = -1;
    size_t at = 0;
    for (size_t i = 0; i + 1 < sym.size(); ++i) {
      auto it = ranks.find({sym[i], sym[i + 1]});
      if (it != ranks.end() && (best < 0 || it->second < best)) {
        best = it->second;
        at = i;
      }
    }
    if (best < 0) break;
    sym[at] += sym[at + 1];
    sym.erase(sym.begin() + static_cast<long>(at) + 1);
  }
  return sym;
}

TEST(TinyTokenizerTest, WritesAConsistentHuggingFaceBpe) {
  auto tok = MakeTinyTokenizer(320, {"<|endoftext|>", "<|im_end|>"});
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ(tok->num_tokens, 320);
  EXPECT_EQ(tok->special_tokens[0].first, "<|endoftext|>");
  EXPECT_EQ(tok->special_tokens[0].second, 318);
  EXPECT_EQ(tok->special_tokens[1].second, 319);
  auto j = nlohmann::json::parse(tok->json);
  EXPECT_EQ(j["model"]["type"], "BPE");
  EXPECT_EQ(j["pre_tokenizer"]["type"], "ByteLevel");
  EXPECT_EQ(j["decoder"]["type"], "ByteLevel");
  EXPECT_EQ(j["added_tokens"][0]["content"], "<|endoftext|>");
  EXPECT_EQ(j["added_tokens"][0]["id"], 318);
  EXPECT_TRUE(j["added_tokens"][0]["special"].get<bool>());
  const auto& vocab = j["model"]["vocab"];
  EXPECT_EQ(vocab.size(), 318u);
  EXPECT_EQ(vocab["!"], 0);
  std::set<int> ids;
  for (const auto& [k, v] : vocab.items()) ids.insert(v.get<int>());
  EXPECT_EQ(ids.size(), vocab.size());
  EXPECT_EQ(*ids.rbegin(), 317);  // dense ids 0..317
  // Every merge joins two known tokens into a known token.
  std::map<std::pair<std::string, std::string>, int> ranks;
  int rank = 0;
  for (const auto& m : j["model"]["merges"]) {
    std::string s = m.get<std::string>();
    size_t sp = s.find(' ');
    ASSERT_NE(sp, std::string::npos);
    std::string a = s.substr(0, sp), b = s.substr(sp + 1);
    ASSERT_TRUE(vocab.contains(a) && vocab.contains(b) && vocab.contains(a + b))
        << s;
    ranks[{a, b}] = rank++;
  }
  EXPECT_EQ(rank, tok->num_merges);
  // The merges compress English: encode the training text with them.
  size_t bytes = 0, tokens = 0;
  for (const std::string& w : PreTokenize(BuiltinTrainingText())) {
    auto pieces = Encode(w, ranks);
    std::string joined;
    for (const auto& p : pieces) {
      ASSERT_TRUE(vocab.contains(p)) << p;
      joined += p;
    }
    std::string expect;
    for (unsigned char b : w) expect += ByteToUnicode(b);
    EXPECT_EQ(joined, expect);
    bytes += w.size();
    tokens += pieces.size();
  }
  EXPECT_LT(tokens * 100, bytes * 70)
      << tokens << " tokens for " << bytes << " bytes";
}

TEST(TinyTokenizerTest, DeterministicAndBounded) {
  auto a = MakeTinyTokenizer(512, {"<|endoftext|>"});
  auto b = MakeTinyTokenizer(512, {"<|endoftext|>"});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->json, b->json);
  // A tiny text runs out of repeated pairs before the vocabulary is full.
  auto small = MakeTinyTokenizer(1000, {"<|endoftext|>"}, "abab abab");
  ASSERT_TRUE(small.ok());
  EXPECT_LT(small->num_tokens, 1000);
  EXPECT_GT(small->num_merges, 0);
  EXPECT_FALSE(MakeTinyTokenizer(258, {"a", "b", "c"}).ok());
  auto exact = MakeTinyTokenizer(259, {"a", "b", "c"});
  ASSERT_TRUE(exact.ok());
  EXPECT_EQ(exact->num_merges, 0);
}

}  // namespace
}  // namespace moe
