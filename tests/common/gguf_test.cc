// The GGUF reader on files written by an independent Python writer
// (tests/common/gguf_files.py over tests/reference/gguf_writer.py): v2 and v3
// files and a checkpoint split in two parts read back with the metadata,
// types, shapes, offsets and bytes that were written. The malformed files
// are in tests/fuzz/corpus/gguf (gguf_corpus_test).
#include <sys/wait.h>

#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "common/gguf.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/test_util.h"

namespace moe {
namespace {

using ::moe::testing::ReadText;
using ::moe::testing::TempDir;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Writes the files once for the whole suite; the manifest describes them.
class GgufTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    const std::string cmd = "/usr/bin/python3 " + std::string(MOE_SOURCE_DIR) +
                            "/tests/common/gguf_files.py " + dir_->path() + " >" +
                            dir_->Sub("manifest.json");
    int status = std::system(cmd.c_str());
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << cmd;
    manifest_ = new nlohmann::json(nlohmann::json::parse(ReadText(dir_->Sub("manifest.json"))));
  }
  static void TearDownTestSuite() {
    delete manifest_;
    delete dir_;
  }

  // byte i of tensor number k's data, as gguf_files.py writes it.
  static uint8_t Pattern(int k, uint64_t i) {
    return static_cast<uint8_t>((k * 37 + 11 * i) & 0xFF);
  }

  // Checks `file`'s tensors against the manifest entry `name`.
  static void ExpectTensorsAsWritten(const GgufFile& file, const std::string& name) {
    const nlohmann::json& m = (*manifest_)[name];
    EXPECT_EQ(file.data_offset(), m["data_offset"].get<uint64_t>()) << name;
    EXPECT_EQ(file.alignment(), m["alignment"].get<uint32_t>()) << name;
    ASSERT_EQ(file.tensors().size(), m["tensors"].size()) << name;
    for (size_t k = 0; k < file.tensors().size(); ++k) {
      const GgufTensorInfo& t = file.tensors()[k];
      const nlohmann::json& want = m["tensors"][k];
      EXPECT_EQ(t.name, want["name"].get<std::string>());
      EXPECT_EQ(static_cast<uint32_t>(t.type), want["type"].get<uint32_t>()) << t.name;
      EXPECT_EQ(t.dims, want["dims"].get<std::vector<int64_t>>()) << t.name;
      EXPECT_EQ(t.offset, want["offset"].get<uint64_t>()) << t.name;
      EXPECT_EQ(t.nbytes, want["nbytes"].get<uint64_t>()) << t.name;
      EXPECT_EQ(file.Find(t.name), &t);
      auto bytes = file.Data(t);
      const int seed = want["seed"].get<int>();
      bool same = bytes.size() == t.nbytes;
      for (uint64_t i = 0; same && i < bytes.size(); ++i) same = bytes[i] == Pattern(seed, i);
      EXPECT_TRUE(same) << t.name << " bytes differ from what was written";
    }
  }

  static TempDir* dir_;
  static nlohmann::json* manifest_;
};

TempDir* GgufTest::dir_ = nullptr;
nlohmann::json* GgufTest::manifest_ = nullptr;

TEST_F(GgufTest, ReadsV3AndV2) {
  for (const char* name : {"v3.gguf", "v2.gguf"}) {
    auto file = GgufFile::Open(dir_->Sub(name));
    ASSERT_TRUE(file.ok()) << file.status();
    EXPECT_EQ((*file)->version(), std::string(name) == "v3.gguf" ? 3u : 2u);
    EXPECT_EQ((*file)->alignment(), std::string(name) == "v3.gguf" ? 32u : 64u);
    EXPECT_EQ((*file)->data_offset() % (*file)->alignment(), 0u);
    ExpectTensorsAsWritten(**file, name);
  }
}

// Sizes from ggml's block layouts, independent of the writer's table.
TEST_F(GgufTest, TensorSizesFollowTheBlockLayouts) {
  auto file = GgufFile::Open(dir_->Sub("v3.gguf"));
  ASSERT_TRUE(file.ok()) << file.status();
  auto bytes = [&](const char* n) { return (*file)->Find(n)->nbytes; };
  EXPECT_EQ(bytes("token_embd.weight"), 8u * 3 * 4);
  EXPECT_EQ(bytes("blk.0.attn_norm.weight"), 8u * 2);
  EXPECT_EQ(bytes("blk.0.attn_q.weight"), 32u * 2);
  EXPECT_EQ(bytes("blk.0.ffn_gate_exps.weight"), 2u * 12 * 34);  // Q8_0
  EXPECT_EQ(bytes("blk.0.ffn_up_exps.weight"), 12u * 18);        // Q4_0
  EXPECT_EQ(bytes("blk.0.ffn_down_exps.weight"), 8u * 20);       // Q4_1
  EXPECT_EQ(bytes("blk.1.ffn_gate_exps.weight"), 4u * 22);       // Q5_0
  EXPECT_EQ(bytes("blk.1.ffn_up_exps.weight"), 4u * 24);         // Q5_1
  EXPECT_EQ(bytes("blk.1.ffn_down_exps.weight"), 4u * 144);      // Q4_K
  EXPECT_EQ(bytes("blk.2.ffn_down_exps.weight"), 2u * 176);      // Q5_K
  EXPECT_EQ(bytes("output.weight"), 3u * 210);                   // Q6_K
  EXPECT_EQ(bytes("blk.2.ffn_gate_exps.weight"), 8u * 17);       // MXFP4
  const GgufTensorInfo* exps = (*file)->Find("blk.2.ffn_gate_exps.weight");
  EXPECT_EQ(exps->type, GgufType::kMXFP4);
  EXPECT_THAT(exps->shape(), ElementsAre(1, 2, 2, 64));
  EXPECT_EQ(exps->rows(), 4);
  EXPECT_EQ(exps->numel, 256);
}

TEST_F(GgufTest, TypedMetadata) {
  auto file = GgufFile::Open(dir_->Sub("v3.gguf"));
  ASSERT_TRUE(file.ok()) << file.status();
  const GgufMetadata& m = (*file)->metadata();
  EXPECT_EQ(m.size(), 18u);
  EXPECT_EQ(m.entries()[0].key, "general.architecture");
  EXPECT_EQ(*m.GetString("general.architecture"), "qwen3moe");
  EXPECT_EQ(*m.GetString("general.name"), "tiny \xc3\xa9");
  EXPECT_EQ(*m.GetUint("qwen3moe.block_count"), 3u);
  EXPECT_EQ(*m.GetInt("qwen3moe.expert_count"), 4);
  EXPECT_EQ(*m.GetInt("qwen3moe.expert_used_count"), 2);
  EXPECT_FLOAT_EQ(*m.GetFloat("qwen3moe.attention.layer_norm_rms_epsilon"), 1e-6f);
  EXPECT_EQ(*m.GetFloat("qwen3moe.rope.freq_base"), 1e6);
  EXPECT_EQ(*m.GetUint("general.file_type"), 15u);
  EXPECT_EQ(*m.GetInt("test.int8"), -5);
  EXPECT_EQ(*m.GetInt("test.int16"), -300);
  EXPECT_EQ(*m.GetInt("test.int64"), -(int64_t{1} << 40));
  EXPECT_EQ(*m.GetUint("test.uint8"), 250u);
  EXPECT_EQ(*m.GetUint("test.big"), std::numeric_limits<uint64_t>::max());
  EXPECT_TRUE(*m.GetBool("test.flag"));
  EXPECT_THAT(*m.GetStringArray("tokenizer.ggml.tokens"), ElementsAre("<s>", "</s>", "a", ""));
  EXPECT_THAT(*m.GetFloatArray("tokenizer.ggml.scores"), ElementsAre(0.0, -1.5, -2.25, 3.0));
  EXPECT_THAT(*m.GetIntArray("tokenizer.ggml.token_type"), ElementsAre(3, 3, 1, -1));
  EXPECT_TRUE(m.GetIntArray("test.empty")->empty());
}

TEST_F(GgufTest, MetadataErrorsNameKeyAndType) {
  auto file = GgufFile::Open(dir_->Sub("v3.gguf"));
  ASSERT_TRUE(file.ok()) << file.status();
  const GgufMetadata& m = (*file)->metadata();
  auto message = [](const auto& r) { return std::string(r.status().message()); };
  EXPECT_EQ(m.GetUint("qwen3moe.nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(message(m.GetUint("qwen3moe.nope")), HasSubstr("'qwen3moe.nope' is missing"));
  EXPECT_THAT(message(m.GetFloat("qwen3moe.block_count")),
              HasSubstr("'qwen3moe.block_count' is UINT32, expected FLOAT32 or FLOAT64"));
  EXPECT_THAT(message(m.GetUint("test.int8")), HasSubstr("'test.int8' is -5, expected >= 0"));
  EXPECT_THAT(message(m.GetInt("test.big")), HasSubstr("more than int64 holds"));
  EXPECT_THAT(message(m.GetString("tokenizer.ggml.tokens")),
              HasSubstr("is ARRAY of STRING, expected STRING"));
  EXPECT_THAT(message(m.GetIntArray("tokenizer.ggml.scores")),
              HasSubstr("is ARRAY of FLOAT32, expected an ARRAY of integers"));
  EXPECT_THAT(message(m.GetBool("general.name")), HasSubstr("is STRING, expected BOOL"));
}

TEST_F(GgufTest, SplitCheckpointFromEitherPart) {
  for (const char* part : {"split-00001-of-00002.gguf", "split-00002-of-00002.gguf"}) {
    auto ckpt = GgufCheckpoint::Open(dir_->Sub(part));
    ASSERT_TRUE(ckpt.ok()) << ckpt.status();
    ASSERT_EQ((*ckpt)->file_count(), 2u);
    EXPECT_EQ(*(*ckpt)->metadata().GetString("general.architecture"), "qwen3moe");
    EXPECT_EQ(*(*ckpt)->metadata().GetUint("split.tensors.count"), 12u);
    ASSERT_EQ((*ckpt)->tensors().size(), 12u);
    ExpectTensorsAsWritten((*ckpt)->file(0), "split-00001-of-00002.gguf");
    ExpectTensorsAsWritten((*ckpt)->file(1), "split-00002-of-00002.gguf");
    const GgufTensorInfo* out = (*ckpt)->Find("output.weight");
    ASSERT_NE(out, nullptr);
    EXPECT_EQ(out->file_index, 1);
    EXPECT_EQ((*ckpt)->Find("token_embd.weight")->file_index, 0);
    auto bytes = (*ckpt)->Data(*out);
    ASSERT_EQ(bytes.size(), 630u);
    EXPECT_EQ(bytes[5], Pattern(11, 5));  // output.weight is tensor 11
  }
}

TEST_F(GgufTest, SingleFileCheckpoint) {
  auto ckpt = GgufCheckpoint::Open(dir_->Sub("v2.gguf"));
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->file_count(), 1u);
  EXPECT_EQ((*ckpt)->tensors().size(), 12u);
  EXPECT_EQ(GgufCheckpoint::Open(dir_->Sub("absent.gguf")).status().code(),
            absl::StatusCode::kNotFound);
}

// Every strict prefix of a valid file is refused with an error, none
// crashes (the last tensor ends at the end of the file).
TEST_F(GgufTest, EveryTruncationIsRefused) {
  const std::string bytes = ReadText(dir_->Sub("v3.gguf"));
  ASSERT_TRUE(GgufFile::Parse(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size())
                  .ok());
  for (size_t n = 0; n < bytes.size(); ++n) {
    std::vector<uint8_t> prefix(bytes.begin(), bytes.begin() + n);
    auto file = GgufFile::Parse(prefix.data(), n, "prefix");
    ASSERT_FALSE(file.ok()) << "accepted a prefix of " << n << " bytes";
    EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(GgufSplitPathTest, ParsesPartNames) {
  std::string prefix;
  int part = 0, count = 0;
  ASSERT_TRUE(ParseGgufSplitPath("/m/Qwen3-30B-Q4_K_M-00002-of-00003.gguf", &prefix, &part,
                                 &count));
  EXPECT_EQ(prefix, "/m/Qwen3-30B-Q4_K_M");
  EXPECT_EQ(part, 2);
  EXPECT_EQ(count, 3);
  EXPECT_EQ(GgufSplitPath(prefix, 1, 3), "/m/Qwen3-30B-Q4_K_M-00001-of-00003.gguf");
  ASSERT_TRUE(ParseGgufSplitPath("a-123456-of-123456.gguf", &prefix, &part, &count));
  EXPECT_EQ(count, 123456);
  EXPECT_FALSE(ParseGgufSplitPath("a-1-of-2.gguf", &prefix, &part, &count));
  EXPECT_FALSE(ParseGgufSplitPath("a-00001-of-00002.bin", &prefix, &part, &count));
  EXPECT_FALSE(ParseGgufSplitPath("a-00001-00002.gguf", &prefix, &part, &count));
  EXPECT_FALSE(ParseGgufSplitPath("00001-of-00002.gguf", &prefix, &part, &count));
  EXPECT_FALSE(ParseGgufSplitPath("a-0000000001-of-00002.gguf", &prefix, &part, &count));
  EXPECT_FALSE(ParseGgufSplitPath("model.gguf", &prefix, &part, &count));
}

}  // namespace
}  // namespace moe
