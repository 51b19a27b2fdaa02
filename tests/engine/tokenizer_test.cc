#include "services/engine/tokenizer.h"

#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/model_maker.h"
#include "common/tiny_tokenizer.h"
#include "nlohmann/json.hpp"
#include "services/engine/tokenizer_text.h"

namespace moe {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using json = nlohmann::json;

// ---------------------------------------------------------------------------
// Hand-built vocabularies.

std::string ByteChar(uint8_t b) {
  std::string s;
  tok::AppendUtf8(tok::ByteToUnicode(b), &s);
  return s;
}

// A GPT-2 style byte-level tokenizer: ids 0..255 are the 256 byte characters
// (in byte order), then `extra` tokens in order, then `merges`.
json ByteLevelTokenizer(const std::vector<std::string>& extra, const json& merges,
                        const json& pre_tokenizer) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteChar(static_cast<uint8_t>(b))] = b;
  int next = 256;
  for (const std::string& t : extra) vocab[t] = next++;
  return {
      {"version", "1.0"},
      {"added_tokens", json::array()},
      {"normalizer", nullptr},
      {"pre_tokenizer", pre_tokenizer},
      {"post_processor", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
                 {"vocab", vocab}, {"merges", merges}}},
  };
}

json Gpt2PreTokenizer(bool add_prefix_space = false) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", add_prefix_space}, {"use_regex", true}};
}

std::unique_ptr<Tokenizer> MustLoad(const std::string& text) {
  auto t = Tokenizer::FromJson(text);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(*t) : nullptr;
}

// "Ġ" is the byte-level character of the space byte.
const std::vector<std::string> kGpt2Extra = {"Ġt", "he", "Ġthe", "lo", "low", "er", "aa"};
const json kGpt2Merges = json::array({"Ġ t", "h e", "Ġt he", "l o", "lo w", "e r", "a a"});

int32_t Id(const Tokenizer& t, const std::string& token) {
  auto id = t.IdOf(token);
  EXPECT_TRUE(id.has_value()) << token;
  return id.value_or(-1);
}

// SentencePiece-style (Mixtral/Llama) tokenizer.json text, as such files are
// laid out; the 256 byte-fallback tokens are spliced in at BYTE_TOKENS.
std::string SentencePieceJson(bool byte_fallback) {
  std::string bytes;
  for (int b = 0; b < 256; ++b) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "\"<0x%02X>\": %d, ", b, 3 + b);
    bytes += buf;
  }
  std::string text = R"json({
  "version": "1.0",
  "truncation": null,
  "padding": null,
  "added_tokens": [
    {"id": 0, "content": "<unk>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
    {"id": 1, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
    {"id": 2, "content": "</s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}
  ],
  "normalizer": {"type": "Sequence", "normalizers": [
    {"type": "Prepend", "prepend": "▁"},
    {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
  "pre_tokenizer": null,
  "post_processor": {"type": "TemplateProcessing",
    "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
    "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
             {"SpecialToken": {"id": "<s>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
    "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
  "decoder": {"type": "Sequence", "decoders": [
    {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
    {"type": "ByteFallback"}, {"type": "Fuse"},
    {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
  "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>",
    "continuing_subword_prefix": null, "end_of_word_suffix": null,
    "fuse_unk": true, "byte_fallback": BYTE_FALLBACK,
    "vocab": {"<unk>": 0, "<s>": 1, "</s>": 2, BYTE_TOKENS
      "▁": 259, "h": 260, "e": 261, "l": 262, "o": 263, "w": 264, "r": 265, "d": 266,
      "▁h": 267, "ll": 268, "▁he": 269, "llo": 270, "▁hello": 271, "▁w": 272,
      "or": 273, "▁wor": 274},
    "merges": ["▁ h", "l l", "▁h e", "ll o", "▁he llo", "▁ w", "o r", "▁w or"]}
})json";
  text.replace(text.find("BYTE_TOKENS"), 11, bytes);
  text.replace(text.find("BYTE_FALLBACK"), 13, byte_fallback ? "true" : "false");
  return text;
}

// ---------------------------------------------------------------------------
// Pre-tokenizer split patterns.

std::vector<std::string> Split(std::string_view text, tok::SplitPattern p) {
  std::vector<std::string> out;
  for (std::string_view s : tok::SplitText(text, p)) out.emplace_back(s);
  return out;
}

TEST(SplitTest, Gpt2Pattern) {
  const auto p = tok::SplitPattern::kGpt2;
  EXPECT_THAT(Split("I'm  fine,\tthanks 2024!!", p),
              ElementsAre("I", "'m", " ", " fine", ",", "\t", "thanks", " 2024", "!!"));
  EXPECT_THAT(Split("a\n\n  b", p), ElementsAre("a", "\n\n ", " b"));
  EXPECT_THAT(Split("x  ", p), ElementsAre("x", "  "));
  EXPECT_THAT(Split("I'M", p), ElementsAre("I", "'", "M"));
  EXPECT_THAT(Split("héllo wörld 你好 ١٢", p),
              ElementsAre("héllo", " wörld", " 你好", " ١٢"));
  EXPECT_THAT(Split("hi 👋🏽!", p), ElementsAre("hi", " 👋🏽!"));
}

TEST(SplitTest, Qwen2AndLlama3Patterns) {
  const auto q = tok::SplitPattern::kQwen2;
  EXPECT_THAT(Split("I'm  fine,\tthanks 2024!!", q),
              ElementsAre("I", "'m", " ", " fine", ",", "\tthanks", " ", "2", "0", "2", "4", "!!"));
  EXPECT_THAT(Split("I'm  fine,\tthanks 2024!!", tok::SplitPattern::kLlama3),
              ElementsAre("I", "'m", " ", " fine", ",", "\tthanks", " ", "202", "4", "!!"));
  EXPECT_THAT(Split("a\n\n  b", q), ElementsAre("a", "\n\n", " ", " b"));
  EXPECT_THAT(Split("I'M", q), ElementsAre("I", "'M"));
  EXPECT_THAT(Split("x.\n\ny", q), ElementsAre("x", ".\n\n", "y"));
  EXPECT_THAT(Split("(hello", q), ElementsAre("(hello"));
}

TEST(SplitTest, RecognisesKnownRegexesOnly) {
  EXPECT_TRUE(tok::SplitPatternFromRegex(
                  R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)")
                  .ok());
  auto bad = tok::SplitPatternFromRegex(R"(\w+)");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kUnimplemented);
}

TEST(Utf8Test, CompletePrefixAndSanitising) {
  EXPECT_EQ(tok::CompleteUtf8Prefix("ab\xF0\x9F\x98"), 2u);
  EXPECT_EQ(tok::CompleteUtf8Prefix("ab\xF0\x9F\x98\x80"), 6u);
  EXPECT_EQ(tok::CompleteUtf8Prefix("a\xFF"), 2u);      // never valid: complete
  EXPECT_EQ(tok::CompleteUtf8Prefix("a\xE2\x28"), 3u);  // broken, not truncated
  EXPECT_EQ(tok::ToValidUtf8("a\xFF" "b"), "a\xEF\xBF\xBD" "b");
  EXPECT_EQ(tok::ToValidUtf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
}

// ---------------------------------------------------------------------------
// Byte-level BPE.

TEST(ByteLevelTest, KnownSegmentation) {
  auto t = MustLoad(ByteLevelTokenizer(kGpt2Extra, kGpt2Merges, Gpt2PreTokenizer()).dump());
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->kind(), Tokenizer::Kind::kByteLevel);
  EXPECT_EQ(t->vocab_size(), 256 + static_cast<int>(kGpt2Extra.size()));
  EXPECT_THAT(t->Encode(" the lower"),
              ElementsAre(Id(*t, "Ġthe"), Id(*t, "Ġ"), Id(*t, "low"), Id(*t, "er")));
  // Leftmost first among equal ranks: "aaa" -> "aa" "a", not "a" "aa".
  EXPECT_THAT(t->Encode("aaa"), ElementsAre(Id(*t, "aa"), Id(*t, "a")));
  EXPECT_EQ(t->Decode(t->Encode(" the lower")), " the lower");
  EXPECT_EQ(t->TokenText(Id(*t, "Ġthe")), "Ġthe");
  EXPECT_EQ(t->TokenText(100000), "");
}

TEST(ByteLevelTest, LowerRankMergesFirst) {
  // "b c" has rank 0, "a b" rank 1: "abc" -> "a" "bc", never "ab" "c".
  auto t = MustLoad(
      ByteLevelTokenizer({"bc", "ab"}, json::array({"b c", "a b"}), Gpt2PreTokenizer()).dump());
  ASSERT_NE(t, nullptr);
  EXPECT_THAT(t->Encode("abc"), ElementsAre(Id(*t, "a"), Id(*t, "bc")));
  // The list form of merges of newer files means the same.
  auto t2 = MustLoad(ByteLevelTokenizer({"bc", "ab"}, json::array({json::array({"a", "b"}),
                                                                  json::array({"b", "c"})}),
                                        Gpt2PreTokenizer())
                         .dump());
  ASSERT_NE(t2, nullptr);
  EXPECT_THAT(t2->Encode("abc"), ElementsAre(Id(*t2, "ab"), Id(*t2, "c")));
}

TEST(ByteLevelTest, AddPrefixSpace) {
  auto t = MustLoad(ByteLevelTokenizer(kGpt2Extra, kGpt2Merges, Gpt2PreTokenizer(true)).dump());
  ASSERT_NE(t, nullptr);
  EXPECT_THAT(t->Encode("the"), ElementsAre(Id(*t, "Ġthe")));
  EXPECT_THAT(t->Encode(" the"), ElementsAre(Id(*t, "Ġthe")));  // no second space
}

TEST(ByteLevelTest, QwenStyleSplitThenByteLevel) {
  json pre = {{"type", "Sequence"},
              {"pretokenizers",
               json::array(
                   {{{"type", "Split"},
                     {"pattern",
                      {{"Regex",
                        R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}}},
                     {"behavior", "Isolated"},
                     {"invert", false}},
                    {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}};
  json j = ByteLevelTokenizer({"12"}, json::array({"1 2"}), pre);
  j["normalizer"] = {{"type", "NFC"}};
  auto t = MustLoad(j.dump());
  ASSERT_NE(t, nullptr);
  // Digits are split one by one before BPE, so the "1 2" merge cannot apply.
  EXPECT_THAT(t->Encode("12"), ElementsAre(Id(*t, "1"), Id(*t, "2")));
  auto gpt2 = MustLoad(ByteLevelTokenizer({"12"}, json::array({"1 2"}), Gpt2PreTokenizer()).dump());
  ASSERT_NE(gpt2, nullptr);
  EXPECT_THAT(gpt2->Encode("12"), ElementsAre(Id(*gpt2, "12")));
}

std::string RandomText(std::mt19937* rng, bool allow_invalid) {
  static const std::vector<std::string> kPool = {
      "a", "b", "Z", "the", " ", "  ", "\n", "\t", "1", "42", ".", ",", "'s", "!", "é", "ß",
      "你", "好", "١", "😀", "👋🏽", "🇫🇷", "\xE2\x82\xAC"};
  std::uniform_int_distribution<int> len(0, 24), pick(0, kPool.size() - 1), coin(0, 9),
      byte(0x80, 0xFF);
  std::string s;
  for (int i = len(*rng); i > 0; --i) {
    if (allow_invalid && coin(*rng) == 0) {
      s.push_back(static_cast<char>(byte(*rng)));  // stray byte, mostly invalid
    } else {
      s += kPool[pick(*rng)];
    }
  }
  return s;
}

TEST(ByteLevelTest, RoundTripsRandomBytes) {
  auto t = MustLoad(ByteLevelTokenizer(kGpt2Extra, kGpt2Merges, Gpt2PreTokenizer()).dump());
  ASSERT_NE(t, nullptr);
  std::mt19937 rng(1234);
  for (int i = 0; i < 500; ++i) {
    const std::string text = RandomText(&rng, /*allow_invalid=*/true);
    const std::vector<int32_t> ids = t->Encode(text);
    for (int32_t id : ids) ASSERT_LT(id, t->vocab_size());
    ASSERT_EQ(t->Decode(ids), text) << "case " << i;
  }
}

json WithAddedTokens(json j) {
  const int n = j["model"]["vocab"].size();
  j["added_tokens"] = json::array(
      {{{"id", n}, {"content", "<|endoftext|>"}, {"special", true}},
       {{"id", n + 1}, {"content", "<think>"}, {"special", false}},
       {{"id", n + 2}, {"content", "<|endoftext|>x"}, {"special", true}},
       {{"id", n + 3}, {"content", "<pad>"}, {"special", true}, {"lstrip", true}, {"rstrip", true}}});
  return j;
}

TEST(ByteLevelTest, AddedTokensAreMatchedFirstAndNeverSplit) {
  auto t = MustLoad(
      WithAddedTokens(ByteLevelTokenizer(kGpt2Extra, kGpt2Merges, Gpt2PreTokenizer())).dump());
  ASSERT_NE(t, nullptr);
  const int32_t eot = Id(*t, "<|endoftext|>"), think = Id(*t, "<think>");
  EXPECT_THAT(t->Encode("<think> the<|endoftext|>"),
              ElementsAre(think, Id(*t, "Ġthe"), eot));
  // The longest added token wins.
  EXPECT_THAT(t->Encode("<|endoftext|>x"), ElementsAre(Id(*t, "<|endoftext|>x")));
  // lstrip / rstrip absorb the surrounding spaces.
  EXPECT_THAT(t->Encode("a <pad> b"), ElementsAre(Id(*t, "a"), Id(*t, "<pad>"), Id(*t, "b")));
  const std::vector<int32_t> ids = t->Encode("<think>hi<|endoftext|>");
  EXPECT_EQ(t->Decode(ids), "<think>hi<|endoftext|>");
  EXPECT_EQ(t->Decode(ids, /*skip_special=*/true), "<think>hi");
  EXPECT_TRUE(t->IsSpecial(eot));
  EXPECT_FALSE(t->IsSpecial(think));
  EXPECT_EQ(t->eos_id(), eot);
  EXPECT_EQ(t->bos_id(), std::nullopt);
}

// ---------------------------------------------------------------------------
// SentencePiece-style BPE with byte fallback.

TEST(SentencePieceTest, KnownSegmentation) {
  auto t = MustLoad(SentencePieceJson(true));
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->kind(), Tokenizer::Kind::kSentencePiece);
  EXPECT_THAT(t->Encode("hello world"), ElementsAre(271, 274, 262, 266));
  EXPECT_THAT(t->Encode("hello world", /*add_special=*/true), ElementsAre(1, 271, 274, 262, 266));
  EXPECT_EQ(t->bos_id(), 1);
  EXPECT_EQ(t->eos_id(), 2);
  EXPECT_EQ(t->Decode({1, 271, 274, 262, 266}), "<s> hello world");
  EXPECT_EQ(t->Decode({1, 271, 274, 262, 266}, /*skip_special=*/true), "hello world");
  // "é" is not in the vocabulary: its two UTF-8 bytes fall back to <0xC3> <0xA9>.
  EXPECT_THAT(t->Encode("hé"), ElementsAre(267, 3 + 0xC3, 3 + 0xA9));
  EXPECT_EQ(t->Decode(t->Encode("hé")), "hé");
  // A leading space survives: "▁▁x" decodes to "  x", stripped once.
  EXPECT_EQ(t->Decode(t->Encode(" hello")), " hello");
  // Special tokens in the text are never split, and Prepend applies to
  // every segment between them.
  EXPECT_THAT(t->Encode("<s>hello</s>"), ElementsAre(1, 271, 2));
}

TEST(SentencePieceTest, UnknownCharactersWithoutByteFallback) {
  auto t = MustLoad(SentencePieceJson(false));
  ASSERT_NE(t, nullptr);
  // "x" and "z" are unknown; fuse_unk folds them into one <unk>.
  EXPECT_THAT(t->Encode("hxz"), ElementsAre(267, 0));
  EXPECT_THAT(t->Encode("hxzo"), ElementsAre(267, 0, 263));
}

TEST(SentencePieceTest, RoundTripsRandomBytes) {
  auto t = MustLoad(SentencePieceJson(true));
  ASSERT_NE(t, nullptr);
  std::mt19937 rng(99);
  for (int i = 0; i < 500; ++i) {
    const std::string text = RandomText(&rng, /*allow_invalid=*/true);
    const std::vector<int32_t> ids = t->Encode(text, /*add_special=*/true);
    ASSERT_EQ(t->Decode(ids, /*skip_special=*/true), text) << "case " << i;
  }
}

TEST(SentencePieceTest, MetaspacePreTokenizerAndDecoder) {
  json j = json::parse(SentencePieceJson(true));
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "▁"},
                        {"prepend_scheme", "first"}, {"split", false}};
  j["decoder"] = {{"type", "Sequence"},
                  {"decoders", json::array({{{"type", "Metaspace"}, {"replacement", "▁"},
                                             {"prepend_scheme", "first"}, {"split", false}},
                                            {{"type", "ByteFallback"}},
                                            {{"type", "Fuse"}}})}};
  auto t = MustLoad(j.dump());
  ASSERT_NE(t, nullptr);
  EXPECT_THAT(t->Encode("hello world"), ElementsAre(271, 274, 262, 266));
  // "first": no ▁ is prepended to text that follows an added token.
  EXPECT_THAT(t->Encode("<s>hello"), ElementsAre(1, 260, 261, 270));
  EXPECT_EQ(t->Decode({271, 274, 262, 266}), "hello world");
}

// ---------------------------------------------------------------------------
// Streaming decode.

std::string StreamAll(const Tokenizer& t, const std::vector<int32_t>& ids, bool skip,
                      std::vector<std::string>* pieces = nullptr) {
  StreamDecoder d(t, skip);
  std::string out;
  for (int32_t id : ids) {
    std::string p = d.Push(id);
    if (pieces) pieces->push_back(p);
    out += p;
  }
  return out + d.Flush();
}

TEST(StreamDecoderTest, HoldsBackPartialCharacters) {
  auto t = MustLoad(ByteLevelTokenizer({}, json::array(), Gpt2PreTokenizer()).dump());
  ASSERT_NE(t, nullptr);
  const std::vector<int32_t> ids = t->Encode("a😀b");  // no merges: one id per byte
  ASSERT_EQ(ids.size(), 6u);
  std::vector<std::string> pieces;
  EXPECT_EQ(StreamAll(*t, ids, false, &pieces), "a😀b");
  EXPECT_THAT(pieces, ElementsAre("a", "", "", "", "😀", "b"));
}

TEST(StreamDecoderTest, InvalidBytesBecomeReplacementCharacters) {
  auto t = MustLoad(ByteLevelTokenizer({}, json::array(), Gpt2PreTokenizer()).dump());
  ASSERT_NE(t, nullptr);
  StreamDecoder d(*t);
  EXPECT_EQ(d.Push(0xFF), "\xEF\xBF\xBD");  // can never start a character
  EXPECT_EQ(d.Push(0xE2), "");              // may start one: held back
  EXPECT_EQ(d.Push('a'), "\xEF\xBF\xBD" "a");
  EXPECT_EQ(d.Push(0xF0), "");
  EXPECT_EQ(d.Flush(), "\xEF\xBF\xBD");  // truncated at the end
}

TEST(StreamDecoderTest, SentencePieceSpacesAcrossTokens) {
  auto t = MustLoad(SentencePieceJson(true));
  ASSERT_NE(t, nullptr);
  std::vector<std::string> pieces;
  EXPECT_EQ(StreamAll(*t, {1, 271, 274, 262, 266}, /*skip=*/true, &pieces), "hello world");
  EXPECT_THAT(pieces, ElementsAre("", "hello", " wor", "l", "d"));
}

TEST(StreamDecoderTest, MatchesWholeDecodeOnRandomText) {
  auto bl = MustLoad(
      WithAddedTokens(ByteLevelTokenizer(kGpt2Extra, kGpt2Merges, Gpt2PreTokenizer())).dump());
  auto sp = MustLoad(SentencePieceJson(true));
  ASSERT_NE(bl, nullptr);
  ASSERT_NE(sp, nullptr);
  std::mt19937 rng(7);
  for (int i = 0; i < 300; ++i) {
    for (const Tokenizer* t : {bl.get(), sp.get()}) {
      const std::string text = RandomText(&rng, true) + "<|endoftext|>" + RandomText(&rng, true);
      const std::vector<int32_t> ids = t->Encode(text, true);
      for (bool skip : {false, true}) {
        ASSERT_EQ(StreamAll(*t, ids, skip), tok::ToValidUtf8(t->Decode(ids, skip)))
            << "case " << i;
      }
    }
  }
}

// ---------------------------------------------------------------------------
// The tokenizer.json our tiny test models ship (common/tiny_tokenizer.h).

TEST(TinyTokenizerTest, LoadsAndRoundTrips) {
  auto made = MakeTinyTokenizer(400, {"<|endoftext|>", "<|im_start|>"});
  ASSERT_TRUE(made.ok()) << made.status();
  auto t = MustLoad(made->json);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->vocab_size(), made->num_tokens);
  EXPECT_EQ(t->kind(), Tokenizer::Kind::kByteLevel);
  const std::string text(BuiltinTrainingText());
  const std::vector<int32_t> ids = t->Encode(text);
  EXPECT_EQ(t->Decode(ids), text);
  // Its learned merges apply: far fewer tokens than bytes.
  EXPECT_LT(ids.size(), text.size() * 7 / 10);
  std::mt19937 rng(5);
  for (int i = 0; i < 200; ++i) {
    const std::string s = RandomText(&rng, true);
    ASSERT_EQ(t->Decode(t->Encode(s)), s) << "case " << i;
  }
  const int32_t eot = made->special_tokens[0].second;
  EXPECT_EQ(t->IdOf("<|endoftext|>"), eot);
  EXPECT_THAT(t->Encode("<|endoftext|>"), ElementsAre(eot));
  EXPECT_EQ(t->Decode(t->Encode("Hi<|im_start|>there<|endoftext|>"), /*skip_special=*/true),
            "Hithere");
}

TEST(TinyTokenizerTest, LoadsTheTokenizerOfAMadeModel) {
  const std::string dir = ::testing::TempDir() + "/tokenizer_test_made_model";
  MakeModelOptions opts = TinyPreset(ModelFamily::kQwen3Moe);
  opts.seed = 3;
  ASSERT_TRUE(MakeModel(opts, dir).ok());
  auto t = Tokenizer::FromFile(dir + "/tokenizer.json");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->vocab_size(), opts.vocab);
  // tokenizer_config.json names the first special token as eos.
  EXPECT_EQ((*t)->eos_id(), (*t)->IdOf(TinySpecialTokens()[0]));
  ASSERT_TRUE((*t)->eos_id().has_value());
  const std::string text = "The quick brown fox 🦊 jumps over 13 lazy dogs.\n";
  EXPECT_EQ((*t)->Decode((*t)->Encode(text)), text);
  const std::string with_eos = text + TinySpecialTokens()[0];
  std::vector<int32_t> ids = (*t)->Encode(with_eos);
  EXPECT_EQ(ids.back(), *(*t)->eos_id());
  EXPECT_EQ((*t)->Decode(ids, /*skip_special=*/true), text);
}

// ---------------------------------------------------------------------------
// Errors and files.

TEST(TokenizerErrorsTest, BadInputGivesClearErrors) {
  auto malformed = Tokenizer::FromJson("{\"model\": ");
  EXPECT_EQ(malformed.status().code(), absl::StatusCode::kInvalidArgument);

  json wordpiece = ByteLevelTokenizer({}, json::array(), Gpt2PreTokenizer());
  wordpiece["model"]["type"] = "WordPiece";
  auto wp = Tokenizer::FromJson(wordpiece.dump());
  EXPECT_EQ(wp.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(wp.status().message()), HasSubstr("only BPE"));

  auto unknown_merge = Tokenizer::FromJson(
      ByteLevelTokenizer({}, json::array({"Ġ nosuchtoken"}), Gpt2PreTokenizer()).dump());
  EXPECT_EQ(unknown_merge.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(unknown_merge.status().message()), HasSubstr("nosuchtoken"));

  auto missing_result = Tokenizer::FromJson(
      ByteLevelTokenizer({}, json::array({"a b"}), Gpt2PreTokenizer()).dump());
  EXPECT_EQ(missing_result.status().code(), absl::StatusCode::kInvalidArgument);

  json wrong_type = ByteLevelTokenizer({}, json::array(), Gpt2PreTokenizer());
  wrong_type["model"]["vocab"]["a"] = "not a number";
  EXPECT_EQ(Tokenizer::FromJson(wrong_type.dump()).status().code(),
            absl::StatusCode::kInvalidArgument);

  json huge_id = ByteLevelTokenizer({}, json::array(), Gpt2PreTokenizer());
  huge_id["added_tokens"] = json::array({{{"id", int64_t{1} << 40}, {"content", "<x>"}}});
  EXPECT_EQ(Tokenizer::FromJson(huge_id.dump()).status().code(),
            absl::StatusCode::kInvalidArgument);

  json regex = ByteLevelTokenizer({}, json::array(), Gpt2PreTokenizer());
  regex["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "\\w+"}}},
                            {"behavior", "Isolated"}, {"invert", false}};
  EXPECT_EQ(Tokenizer::FromJson(regex.dump()).status().code(), absl::StatusCode::kUnimplemented);

  EXPECT_EQ(Tokenizer::FromFile("/nonexistent/tokenizer.json").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(TokenizerFileTest, ReadsSpecialTokensFromTokenizerConfig) {
  const std::string dir = ::testing::TempDir() + "/tokenizer_file_test";
  std::string cmd = "mkdir -p " + dir;
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  std::ofstream(dir + "/tokenizer.json") << SentencePieceJson(true);
  std::ofstream(dir + "/tokenizer_config.json")
      << R"({"bos_token": "</s>", "eos_token": {"content": "<unk>"}})";
  auto t = Tokenizer::FromFile(dir + "/tokenizer.json");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->bos_id(), 2);
  EXPECT_EQ((*t)->eos_id(), 0);
  EXPECT_EQ((*t)->Decode((*t)->Encode("hello")), "hello");
}

}  // namespace
}  // namespace moe
