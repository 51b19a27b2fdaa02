#include "common/checkpoint.h"

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"

namespace moe {
namespace {

using ::moe::testing::TempDir;
using ::moe::testing::WriteText;
using ::testing::HasSubstr;

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

// Writes a shard holding tensors `names`, each a U8 vector [i+1] of value i.
void WriteShard(const std::string& path,
                const std::vector<std::string>& names) {
  SafetensorsWriter w;
  for (size_t i = 0; i < names.size(); ++i) {
    std::vector<uint8_t> bytes(i + 1, static_cast<uint8_t>(i));
    ASSERT_TRUE(
        w.Add(names[i], DType::kU8, {static_cast<int64_t>(i + 1)}, bytes).ok());
  }
  ASSERT_TRUE(w.Write(path).ok());
}

TEST(CheckpointTest, OpensSingleFile) {
  TempDir dir;
  WriteShard(dir.Sub("model.safetensors"), {"b", "a"});
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_FALSE((*ckpt)->sharded());
  EXPECT_EQ((*ckpt)->names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE((*ckpt)->Has("a"));
  EXPECT_FALSE((*ckpt)->Has("c"));
  auto a = (*ckpt)->Get("a");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->dtype, DType::kU8);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2}));
  ASSERT_EQ(a->nbytes, 2u);
  EXPECT_EQ(a->data[0], 1);
  EXPECT_EQ(a->numel(), 2);
  auto missing = (*ckpt)->Get("c");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(missing.status()), HasSubstr("'c'"));
}

TEST(CheckpointTest, OpensShardsThroughTheIndex) {
  TempDir dir;
  WriteShard(dir.Sub("model-00001-of-00002.safetensors"), {"x", "y"});
  WriteShard(dir.Sub("model-00002-of-00002.safetensors"), {"z"});
  WriteText(dir.Sub("model.safetensors.index.json"), R"({
    "metadata": {"total_size": 4},
    "weight_map": {"x": "model-00001-of-00002.safetensors",
                   "y": "model-00001-of-00002.safetensors",
                   "z": "model-00002-of-00002.safetensors"}})");
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_TRUE((*ckpt)->sharded());
  EXPECT_EQ((*ckpt)->files().size(), 2u);
  EXPECT_EQ((*ckpt)->names(), (std::vector<std::string>{"x", "y", "z"}));
  auto y = (*ckpt)->Get("y");
  ASSERT_TRUE(y.ok());
  EXPECT_EQ(y->nbytes, 2u);
  EXPECT_EQ(y->data[1], 1);
  EXPECT_EQ((*ckpt)->FileOf("z"), (*ckpt)->files()[1].get());
}

TEST(CheckpointTest, SingleFileWinsOverIndex) {
  TempDir dir;
  WriteShard(dir.Sub("model.safetensors"), {"single"});
  WriteText(dir.Sub("model.safetensors.index.json"), "not json");
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_TRUE((*ckpt)->Has("single"));
}

TEST(CheckpointTest, EmptyDirectoryIsNotFound) {
  TempDir dir;
  auto ckpt = Checkpoint::Open(dir.path());
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(ckpt.status()), HasSubstr("model.safetensors"));
}

struct IndexCase {
  const char* label;
  std::string index;
  const char* message;
};

TEST(CheckpointTest, RefusesBadIndexes) {
  const std::vector<IndexCase> cases = {
      {"not json", "{", "not a JSON object"},
      {"no weight_map", R"({"metadata":{}})", "weight_map"},
      {"non-string file", R"({"weight_map":{"x":3}})", "not a file name"},
      {"missing shard", R"({"weight_map":{"x":"model-9.safetensors"}})",
       "model-9.safetensors"},
      {"tensor not in shard", R"({"weight_map":{"q":"s1.safetensors"}})",
       "does not contain it"},
      {"escapes dir", R"({"weight_map":{"x":"../s1.safetensors"}})",
       "not a plain relative"},
      {"absolute", R"({"weight_map":{"x":"/etc/passwd"}})",
       "not a plain relative"},
  };
  for (const auto& c : cases) {
    TempDir dir;
    WriteShard(dir.Sub("s1.safetensors"), {"x"});
    WriteText(dir.Sub("model.safetensors.index.json"), c.index);
    auto ckpt = Checkpoint::Open(dir.path());
    EXPECT_FALSE(ckpt.ok()) << c.label;
    EXPECT_THAT(Msg(ckpt.status()), HasSubstr(c.message)) << c.label;
  }
}

TEST(CheckpointTest, CorruptShardNamesTheFile) {
  TempDir dir;
  WriteText(dir.Sub("s1.safetensors"),
            std::string("\x02\0\0\0\0\0\0\0{}", 10) + "junk");
  WriteText(dir.Sub("bad.safetensors"), "xx");
  WriteText(dir.Sub("model.safetensors.index.json"),
            R"({"weight_map":{"a":"s1.safetensors","b":"bad.safetensors"}})");
  auto ckpt = Checkpoint::Open(dir.path());
  ASSERT_FALSE(ckpt.ok());
  // s1 parses (an empty header is fine) but lacks "a".
  EXPECT_THAT(Msg(ckpt.status()), HasSubstr("does not contain"));
  WriteText(dir.Sub("model.safetensors.index.json"),
            R"({"weight_map":{"b":"bad.safetensors"}})");
  ckpt = Checkpoint::Open(dir.path());
  ASSERT_FALSE(ckpt.ok());
  EXPECT_THAT(Msg(ckpt.status()), HasSubstr("bad.safetensors"));
  EXPECT_THAT(Msg(ckpt.status()), HasSubstr("too small"));
}

}  // namespace
}  // namespace moe
