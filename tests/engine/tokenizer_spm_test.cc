// The SentencePiece-style GGUF vocabulary (tokenizer.ggml.model "llama"):
// a hand-made vocabulary written as a GGUF file by the independent Python
// reference (tests/reference/spm_reference.py), which also encodes and
// decodes every test string; the C++ tokenizer must agree on each, and on
// hand-checked expectations that do not depend on either implementation.
// Malformed metadata is refused with INVALID_ARGUMENT (in-memory metadata).
#include <sys/wait.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/gguf.h"
#include "common/gguf_metadata.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/engine/tokenizer.h"
#include "services/engine/tokenizer_text.h"
#include "tests/common/gguf_metadata_builder.h"
#include "tests/common/test_util.h"

namespace moe {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using moe::testing::MetadataBuilder;

const std::string kReference = std::string(MOE_SOURCE_DIR) + "/tests/reference/spm_reference.py";

int Shell(const std::string& cmd) {
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string Hex(std::string_view s) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  for (char c : s) {
    out.push_back(kDigits[static_cast<uint8_t>(c) >> 4]);
    out.push_back(kDigits[static_cast<uint8_t>(c) & 15]);
  }
  return out;
}

std::string FromHex(std::string_view h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(std::string(h.substr(i, 2)), nullptr, 16)));
  }
  return out;
}

std::vector<int32_t> Ids(std::string_view s) {
  std::vector<int32_t> out;
  for (absl::string_view part : absl::StrSplit(absl::string_view(s.data(), s.size()), ' ',
                                               absl::SkipEmpty())) {
    out.push_back(std::stoi(std::string(part)));
  }
  return out;
}

// The reference's answer for one string.
struct Expected {
  std::vector<int32_t> plain, special;
  std::string decoded;  // of `plain`
};

// Fixed cases plus random concatenations of fragments chosen to meet every
// rule: merges and ties, runs of spaces, byte fallback (newline, tab, CJK,
// emoji, invalid UTF-8), special and user-defined tokens mid-text.
std::vector<std::string> TestStrings() {
  std::vector<std::string> out = {
      "",
      "hello world",
      "Hello World",
      "the café and the hello",
      " hello",
      "hello ",
      "  hello  world  ",
      "    ",
      " ",
      "a\nb",
      "line one\nline two\n\n",
      "tab\there",
      "\xe4\xb8\xad\xe6\x96\x87",                  // 中文
      "\xf0\x9f\x98\x80 smile \xf0\x9f\x98\x80",  // 😀
      "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e",      // 日本語
      "xabc xyz abcabc",
      "[INST] hello [INST]world",
      "<s>hello</s>",
      "<|tool|> call<|tool|>",
      "<unk>",
      "invalid \xff bytes \xe4\xb8 cut",
      "\xed\xa0\x80 surrogate, \xc0\xaf overlong",
      "The quick brown fox jumps over the lazy dog. 0123456789!?",
      "hello world. hello world. ",
  };
  const std::vector<std::string> fragments = {
      "a", "b", "c", "x", "y", "z", "h", "e", "l", "o", "w", "r", "d", "t", "n", "g", "i",
      " ", "  ", "\n", "\t", "\xc3\xa9", "\xe4\xb8\xad", "\xe6\x96\x87", "\xf0\x9f\x98\x80",
      "[INST]", "<|tool|>", "<s>", "</s>", ".", "A", "1", "caf", "hello", " the", "\xff",
      "\xe4\xb8", "<0x41>", "\xe2\x96\x81"};
  std::mt19937 rng(7);
  for (int i = 0; i < 400; ++i) {
    std::string s;
    const int n = static_cast<int>(rng() % 12);
    for (int k = 0; k < n; ++k) s += fragments[rng() % fragments.size()];
    out.push_back(std::move(s));
  }
  return out;
}

struct Variant {
  const char* name;
  const char* flags;  // for spm_reference.py
  bool add_space_prefix;
  bool add_eos;
};

void PrintTo(const Variant& v, std::ostream* os) { *os << v.name; }

class SpmReferenceTest : public ::testing::TestWithParam<Variant> {
 protected:
  // Writes the vocabulary's GGUF and the reference's answers, and loads it.
  void SetUp() override {
    strings_ = TestStrings();
    std::ofstream in(dir_.Sub("strings.txt"));
    for (const std::string& s : strings_) in << Hex(s) << "\n";
    in.close();
    const std::string gguf = dir_.Sub("vocab.gguf");
    ASSERT_EQ(Shell(absl::StrCat("/usr/bin/python3 ", kReference, " --gguf ", gguf, " --strings ",
                                 dir_.Sub("strings.txt"), " --out ", dir_.Sub("ids.txt"), " ",
                                 GetParam().flags)),
              0);
    std::ifstream out(dir_.Sub("ids.txt"));
    std::string line;
    while (std::getline(out, line)) {
      std::vector<std::string> cols = absl::StrSplit(line, '\t');
      ASSERT_EQ(cols.size(), 3u) << line;
      expected_.push_back({Ids(cols[0]), Ids(cols[1]), FromHex(cols[2])});
    }
    ASSERT_EQ(expected_.size(), strings_.size());
    auto t = Tokenizer::ForModel(gguf);
    ASSERT_TRUE(t.ok()) << t.status();
    tok_ = std::move(*t);
  }

  std::vector<int32_t> Pieces(const std::vector<std::string>& texts) const {
    std::vector<int32_t> out;
    for (const std::string& t : texts) {
      const std::optional<int32_t> id = tok_->IdOf(t);
      EXPECT_TRUE(id.has_value()) << t;
      out.push_back(id.value_or(-1));
    }
    return out;
  }

  moe::testing::TempDir dir_;
  std::vector<std::string> strings_;
  std::vector<Expected> expected_;
  std::unique_ptr<Tokenizer> tok_;
};

TEST_P(SpmReferenceTest, EncodesAndDecodesAsTheReference) {
  ASSERT_NE(tok_, nullptr);
  for (size_t i = 0; i < strings_.size(); ++i) {
    const std::string& s = strings_[i];
    EXPECT_EQ(tok_->Encode(s), expected_[i].plain) << "text hex " << Hex(s);
    EXPECT_EQ(tok_->Encode(s, /*add_special=*/true), expected_[i].special) << "hex " << Hex(s);
    EXPECT_EQ(tok_->Decode(expected_[i].plain), expected_[i].decoded) << "hex " << Hex(s);
    // Every byte has a byte token, so any text comes back exactly, but
    // for a literal "▁", which reads back as a space (as in SentencePiece).
    if (s.find("\xe2\x96\x81") == std::string::npos) {
      EXPECT_EQ(tok_->Decode(tok_->Encode(s)), s) << "hex " << Hex(s);
    }
  }
}

// The concatenation of the streamed pieces is the valid-UTF-8 decode, also
// when a character's byte tokens arrive one at a time.
TEST_P(SpmReferenceTest, StreamsByteFallbackSplitOverTokens) {
  ASSERT_NE(tok_, nullptr);
  for (const std::string& s : strings_) {
    const std::vector<int32_t> ids = tok_->Encode(s, /*add_special=*/true);
    for (bool skip : {false, true}) {
      StreamDecoder d(*tok_, skip);
      std::string streamed;
      for (int32_t id : ids) streamed += d.Push(id);
      streamed += d.Flush();
      EXPECT_EQ(streamed, tok::ToValidUtf8(tok_->Decode(ids, skip))) << "hex " << Hex(s);
    }
  }
  const std::string emoji = "\xf0\x9f\x98\x80";
  StreamDecoder d(*tok_);
  std::vector<std::string> parts;
  for (int32_t id : tok_->Encode("x" + emoji)) parts.push_back(d.Push(id));
  parts.push_back(d.Flush());
  if (GetParam().add_space_prefix) {
    // "▁" "x" then the four byte tokens: nothing until the last byte.
    EXPECT_THAT(parts, ElementsAre("", "x", "", "", "", emoji, ""));
  } else {
    EXPECT_THAT(parts, ElementsAre("x", "", "", "", emoji, ""));
  }
}

// Hand-derived from the scores in spm_reference.py's test_vocabulary().
TEST_P(SpmReferenceTest, HandCheckedEncodings) {
  ASSERT_NE(tok_, nullptr);
  const bool prefix = GetParam().add_space_prefix;
  auto expect = [&](const std::string& text, std::vector<std::string> with_prefix,
                    std::vector<std::string> without_prefix) {
    EXPECT_EQ(tok_->Encode(text), Pieces(prefix ? with_prefix : without_prefix)) << text;
  };
  // he, ▁he, ll, llo, ▁hello / or, ld, ▁w, ▁wor, ▁world.
  expect("hello world", {"▁hello", "▁world"}, {"hello", "▁world"});
  // "ab" and "bc" tie at -7: the leftmost pair wins.
  expect("xabc", {"▁", "x", "ab", "c"}, {"x", "ab", "c"});
  // "yz" (-6) beats "xy" (-8) although it is further right.
  expect("xyz", {"▁", "x", "yz"}, {"x", "yz"});
  // Three ▁: ties at -4, leftmost first, and no "▁▁▁" piece.
  expect("  ", {"▁▁", "▁"}, {"▁▁"});
  expect("   x", {"▁▁▁▁", "x"}, {"▁▁", "▁", "x"});
  // Characters that are no piece fall back to their UTF-8 bytes.
  expect("a\nb", {"▁a", "<0x0A>", "b"}, {"a", "<0x0A>", "b"});
  expect("中文", {"▁中", "<0xE6>", "<0x96>", "<0x87>"}, {"中", "<0xE6>", "<0x96>", "<0x87>"});
  // Special and user-defined tokens are matched whole; the prefix goes to
  // the start of the text only, not after them.
  expect("[INST] hello", {"[INST]", "▁hello"}, {"[INST]", "▁hello"});
  expect("hello<|tool|>x", {"▁hello", "<|tool|>", "x"}, {"hello", "<|tool|>", "x"});
  // The text of a byte token is plain text.
  expect("<0x41>", {"▁", "<0x3C>", "0", "x", "4", "1", "<0x3E>"},
         {"<0x3C>", "0", "x", "4", "1", "<0x3E>"});
  expect("\xe2\x96\x81", {"▁▁"}, {"▁"});
  EXPECT_EQ(tok_->Decode(tok_->Encode("\xe2\x96\x81")), " ");
  EXPECT_THAT(tok_->Encode(""), IsEmpty());
  std::vector<int32_t> bos_only = {1};
  if (GetParam().add_eos) bos_only.push_back(2);
  EXPECT_EQ(tok_->Encode("", /*add_special=*/true), bos_only);
}

TEST_P(SpmReferenceTest, DecodesPiecesBytesAndSpecials) {
  ASSERT_NE(tok_, nullptr);
  const bool prefix = GetParam().add_space_prefix;
  EXPECT_EQ(tok_->Decode(Pieces({"▁hello", "▁world"})), prefix ? "hello world" : " hello world");
  // Only the first piece of a decode loses its space.
  EXPECT_EQ(tok_->Decode(Pieces({"<s>", "▁hello"})), "<s> hello");
  EXPECT_EQ(tok_->Decode(Pieces({"<s>", "▁hello"}), /*skip_special=*/true),
            prefix ? "hello" : " hello");
  EXPECT_EQ(tok_->Decode(Pieces({"hello", "<|tool|>", "</s>"}), true), "hello<|tool|>");
  // Byte tokens join into characters; a lone byte stays a raw byte.
  EXPECT_EQ(tok_->Decode(Pieces({"<0xE6>", "<0x96>", "<0x87>"})), "文");
  EXPECT_EQ(tok_->Decode(Pieces({"a", "<0xE6>", "<0x96>"})), "a\xe6\x96");
  EXPECT_EQ(tok::ToValidUtf8(tok_->Decode(Pieces({"a", "<0xE6>", "<0x96>"}))),
            "a\xef\xbf\xbd\xef\xbf\xbd");
  EXPECT_EQ(tok_->Decode({-1, 100000}), "");
}

TEST_P(SpmReferenceTest, ReadsTheSpecialTokens) {
  ASSERT_NE(tok_, nullptr);
  EXPECT_EQ(tok_->kind(), Tokenizer::Kind::kSentencePiece);
  EXPECT_EQ(tok_->bos_id(), 1);
  EXPECT_EQ(tok_->eos_id(), 2);
  EXPECT_EQ(tok_->vocab_size(), 3 + 256 + 1 + 26 + 26 + 10 + 10 + 2 + 39 + 3);
  EXPECT_TRUE(tok_->IsSpecial(*tok_->IdOf("<s>")));
  EXPECT_TRUE(tok_->IsSpecial(*tok_->IdOf("[INST]")));
  EXPECT_TRUE(tok_->IsSpecial(*tok_->IdOf("<unk>")));
  EXPECT_FALSE(tok_->IsSpecial(*tok_->IdOf("<|tool|>")));
  EXPECT_FALSE(tok_->IsSpecial(*tok_->IdOf("▁hello")));
  EXPECT_EQ(tok_->TokenText(3 + 0x41), "<0x41>");
}

INSTANTIATE_TEST_SUITE_P(
    Flags, SpmReferenceTest,
    ::testing::Values(Variant{"Default", "", true, false},
                      Variant{"NoSpacePrefixWithEos", "--no-space-prefix --add-eos", false, true}),
    [](const ::testing::TestParamInfo<Variant>& i) { return std::string(i.param.name); });

// <unk> <s> </s>, then "▁", "a", "b", "ab", "▁a" and one byte token.
MetadataBuilder SmallVocab() {
  MetadataBuilder b;
  b.Str("tokenizer.ggml.model", "llama")
      .Strings("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "▁", "a", "b", "ab", "▁a",
                                         "<0x0A>"})
      .F32s("tokenizer.ggml.scores", {0, 0, 0, -10, -11, -12, -1, -2, 0})
      .I32s("tokenizer.ggml.token_type", {2, 3, 3, 1, 1, 1, 1, 1, 6});
  return b;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Load(const MetadataBuilder& b) {
  return Tokenizer::FromGguf(b.Build());
}

std::string Message(const MetadataBuilder& b) {
  auto t = Load(b);
  EXPECT_FALSE(t.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(t.status())) << t.status();
  return std::string(t.status().message());
}

TEST(SpmMetadataTest, LlamaCppDefaultsWithoutTheOptionalKeys) {
  auto t = Load(SmallVocab());
  ASSERT_TRUE(t.ok()) << t.status();
  // ids 0/1/2, a leading bos, no eos, the space prefix.
  EXPECT_EQ((*t)->bos_id(), 1);
  EXPECT_EQ((*t)->eos_id(), 2);
  // "▁ab": "ab" (-1) is merged before "▁a" (-2).
  EXPECT_THAT((*t)->Encode("ab", true), ElementsAre(1, 3, 6));
  // Without byte tokens for them, each unknown character is one <unk>.
  EXPECT_THAT((*t)->Encode("a\nc\xc3\xa9"), ElementsAre(7, 8, 0, 0));
  EXPECT_EQ((*t)->Decode({7, 8, 0, 5}), "a\n<unk>b");
  EXPECT_EQ((*t)->Decode({7, 8, 0, 5}, /*skip_special=*/true), "a\nb");
}

TEST(SpmMetadataTest, FlagsAndIdsFromTheKeys) {
  MetadataBuilder b = SmallVocab();
  b.U32("tokenizer.ggml.bos_token_id", 2)
      .U32("tokenizer.ggml.eos_token_id", 1)
      .Bool("tokenizer.ggml.add_bos_token", false)
      .Bool("tokenizer.ggml.add_eos_token", true)
      .Bool("tokenizer.ggml.add_space_prefix", false)
      .U32("tokenizer.ggml.padding_token_id", 99);  // unused: tolerated, as llama.cpp does
  auto t = Load(b);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->bos_id(), 2);
  EXPECT_EQ((*t)->eos_id(), 1);
  EXPECT_THAT((*t)->Encode("a b", true), ElementsAre(4, 3, 5, 1));
  EXPECT_EQ((*t)->Decode({3, 4}), " a");
}

TEST(SpmMetadataTest, WithoutScoresTheLeftmostPairMerges) {
  MetadataBuilder b = SmallVocab();
  b.Drop("tokenizer.ggml.scores").Drop("tokenizer.ggml.token_type");
  auto t = Load(b);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_THAT((*t)->Encode("ab"), ElementsAre(7, 5));  // "▁a", "b"
  // Without token types nothing is special, and "<unk>" is plain text.
  EXPECT_FALSE((*t)->IsSpecial(1));
}

// llama.cpp's default ids apply only where the vocabulary has them.
TEST(SpmMetadataTest, DefaultIdsNeedTheirTokens) {
  MetadataBuilder one;
  one.Str("tokenizer.ggml.model", "llama").Strings("tokenizer.ggml.tokens", {"<unk>"});
  auto t = Load(one);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->bos_id(), std::nullopt);
  EXPECT_EQ((*t)->eos_id(), std::nullopt);
  // "▁" and "b" are no pieces and have no byte tokens: <unk> each.
  EXPECT_THAT((*t)->Encode("b", /*add_special=*/true), ElementsAre(0, 0));
}

TEST(SpmMetadataTest, MalformedMetadataIsInvalidArgument) {
  EXPECT_THAT(Message(SmallVocab().F32s("tokenizer.ggml.scores", {0, 1})),
              HasSubstr("tokenizer.ggml.scores has 2 entries for 9 tokens"));
  EXPECT_THAT(Message(SmallVocab().I32s("tokenizer.ggml.token_type",
                                        {1, 1, 1, 1, 1, 1, 1, 1, 1, 1})),
              HasSubstr("tokenizer.ggml.token_type has 10 entries for 9 tokens"));
  EXPECT_THAT(Message(SmallVocab().F32s("tokenizer.ggml.scores",
                                        {0, 0, 0, std::nanf(""), 0, 0, 0, 0, 0})),
              HasSubstr("tokenizer.ggml.scores[3] is not a number"));
  EXPECT_THAT(Message(SmallVocab().U32("tokenizer.ggml.bos_token_id", 9)),
              HasSubstr("tokenizer.ggml.bos_token_id is 9, outside the 9 tokens"));
  EXPECT_THAT(Message(SmallVocab().U32("tokenizer.ggml.unknown_token_id", 1000)),
              HasSubstr("unknown_token_id is 1000"));
  EXPECT_THAT(Message(SmallVocab().Strings("tokenizer.ggml.tokens", {})),
              HasSubstr("tokenizer.ggml.tokens has 0 tokens"));
  EXPECT_THAT(Message(SmallVocab().I32s("tokenizer.ggml.scores", {0, 0, 0, 0, 0, 0, 0, 0, 0})),
              HasSubstr("tokenizer.ggml.scores"));
  EXPECT_THAT(Message(SmallVocab().Str("tokenizer.ggml.add_space_prefix", "yes")),
              HasSubstr("tokenizer.ggml.add_space_prefix"));
  EXPECT_THAT(Message(SmallVocab().Str("tokenizer.ggml.tokens", "a")),
              HasSubstr("tokenizer.ggml.tokens"));
  EXPECT_THAT(Message(SmallVocab().Str("tokenizer.ggml.padding_token_id", "0")),
              HasSubstr("tokenizer.ggml.padding_token_id"));
  // Every message says where it comes from.
  EXPECT_THAT(Message(SmallVocab().F32s("tokenizer.ggml.scores", {0})),
              HasSubstr("GGUF tokenizer: "));
  // A missing vocabulary and another model keep their codes.
  EXPECT_TRUE(absl::IsNotFound(Load(SmallVocab().Drop("tokenizer.ggml.tokens")).status()));
  EXPECT_TRUE(
      absl::IsUnimplemented(Load(SmallVocab().Str("tokenizer.ggml.model", "bert")).status()));
  // llama.cpp's "none" (a file of token ids only) is no vocabulary.
  EXPECT_TRUE(absl::IsNotFound(Load(SmallVocab().Str("tokenizer.ggml.model", "none")).status()));
}

// Odd but well-formed vocabularies: duplicate and empty pieces, control
// tokens with empty text, unknown type numbers. No crash, text round-trips.
TEST(SpmMetadataTest, OddVocabulariesStillWork) {
  std::vector<std::string> tokens = {"<unk>", "", "a", "a", "▁", "▁a"};
  std::vector<int32_t> types = {2, 3, 1, 1, 0, 77};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    tokens.push_back(name);
    types.push_back(6);
  }
  MetadataBuilder m;
  m.Str("tokenizer.ggml.model", "llama")
      .Strings("tokenizer.ggml.tokens", tokens)
      .I32s("tokenizer.ggml.token_type", types);
  auto t = Load(m);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_THAT((*t)->Encode("aa"), ElementsAre(5, 2));  // the first of two equal pieces
  for (const std::string s : {"", "a a", "\xff\xfe x"}) {
    EXPECT_EQ((*t)->Decode((*t)->Encode(s)), s);
  }
}

// The llama vocabularies among fuzz_gguf's seeds (tests/fuzz/
// make_gguf_corpus.py): well-formed GGUF files whose tokenizer is read or
// refused as the file's arrays say.
TEST(SpmCorpusTest, TheFuzzSeedsVocabularies) {
  const std::string dir = std::string(MOE_SOURCE_DIR) + "/tests/fuzz/corpus/gguf/";
  auto load = [&](const std::string& name) -> absl::StatusOr<std::unique_ptr<Tokenizer>> {
    auto file = GgufCheckpoint::Open(dir + name);
    if (!file.ok()) return file.status();
    return Tokenizer::FromGguf((*file)->metadata());
  };
  auto t = load("vocab_llama.gguf");
  ASSERT_TRUE(t.ok()) << t.status();
  const std::string text = "[INST] Hello world\n\xc3\xb6<|x|>";
  const std::vector<int32_t> ids = (*t)->Encode(text, /*add_special=*/true);
  EXPECT_EQ(ids.front(), 1);
  EXPECT_EQ((*t)->Decode(ids, /*skip_special=*/true), "Hello world\n\xc3\xb6<|x|>");
  EXPECT_THAT(load("vocab_llama_short_scores.gguf").status().message(),
              HasSubstr("tokenizer.ggml.scores has 21 entries for 22 tokens"));
  EXPECT_THAT(load("vocab_llama_short_types.gguf").status().message(),
              HasSubstr("tokenizer.ggml.token_type has 19 entries for 22 tokens"));
}

}  // namespace
}  // namespace moe
