#include "common/safetensors.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "tests/common/test_util.h"
#include "gtest/gtest.h"

namespace moe {
namespace {

using ::testing::HasSubstr;

// A safetensors image with the given header text and `data_size` data bytes.
std::string Image(const std::string& header, size_t data_size,
                  uint64_t n = ~0ull) {
  if (n == ~0ull) n = header.size();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  out += header;
  out.append(data_size, '\x11');
  return out;
}

absl::Status ParseStatus(const std::string& image) {
  return SafetensorsFile::Parse(reinterpret_cast<const uint8_t*>(image.data()),
                                image.size(), "test.safetensors")
      .status();
}

std::vector<uint8_t> Bytes(std::initializer_list<float> values) {
  std::vector<uint8_t> out(values.size() * 4);
  std::memcpy(out.data(), values.begin(), out.size());
  return out;
}

using ::moe::testing::TempDir;

TEST(SafetensorsWriterTest, RoundTripInMemory) {
  SafetensorsWriter w;
  auto a = Bytes({1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f});
  ASSERT_TRUE(w.Add("b.weight", DType::kF32, {2, 3}, a).ok());
  std::vector<uint8_t> bf(2 * 5, 0x7f);
  ASSERT_TRUE(w.Add("a.bias", DType::kBF16, {5}, bf).ok());
  ASSERT_TRUE(w.Add("empty", DType::kI64, {0, 4}, {}).ok());
  w.SetMetadata("format", "pt");
  EXPECT_EQ(w.data_bytes(), 24u + 10u);
  std::string image = w.Serialize();

  uint64_t n = 0;
  std::memcpy(&n, image.data(), 8);
  EXPECT_EQ(n % 8, 0u) << "header must be padded to 8 bytes";
  EXPECT_EQ(image.size(), 8 + n + 34);
  EXPECT_EQ(image[8], '{');

  auto file = SafetensorsFile::Parse(
      reinterpret_cast<const uint8_t*>(image.data()), image.size());
  ASSERT_TRUE(file.ok()) << file.status();
  const auto& f = **file;
  ASSERT_EQ(f.tensors().size(), 3u);
  EXPECT_EQ(f.tensors()[0].name, "a.bias");  // sorted by name
  const TensorInfo* b = f.Find("b.weight");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->dtype, DType::kF32);
  EXPECT_EQ(b->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(b->numel(), 6);
  auto data = f.Data(*b);
  ASSERT_EQ(data.size(), 24u);
  EXPECT_EQ(std::vector<uint8_t>(data.begin(), data.end()), a);
  EXPECT_EQ(f.Find("empty")->nbytes(), 0u);
  EXPECT_EQ(f.Find("missing"), nullptr);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.data_size(), 34u);
  // Zero-copy: the view points into the caller's buffer.
  EXPECT_GE(data.data(), reinterpret_cast<const uint8_t*>(image.data()));
  EXPECT_LT(data.data(),
            reinterpret_cast<const uint8_t*>(image.data() + image.size()));
}

TEST(SafetensorsWriterTest, WritesAtomicallyAndOpenMapsTheFile) {
  TempDir dir;
  std::string path = dir.path() + "/model.safetensors";
  SafetensorsWriter w;
  auto a = Bytes({0.5f, -0.25f});
  ASSERT_TRUE(w.Add("x", DType::kF32, {2}, a).ok());
  ASSERT_TRUE(w.Write(path).ok());
  int entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    (void)e;
    ++entries;
  }
  EXPECT_EQ(entries, 1) << "temporary file left behind";
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->source(), path);
  auto data = (*file)->Data(*(*file)->Find("x"));
  float v[2];
  std::memcpy(v, data.data(), 8);
  EXPECT_EQ(v[0], 0.5f);
  EXPECT_EQ(v[1], -0.25f);
}

TEST(SafetensorsWriterTest, RefusesBadTensors) {
  SafetensorsWriter w;
  auto a = Bytes({1.0f});
  EXPECT_TRUE(w.Add("x", DType::kF32, {1}, a).ok());
  EXPECT_FALSE(w.Add("x", DType::kF32, {1}, a).ok());
  EXPECT_FALSE(w.Add("__metadata__", DType::kF32, {1}, a).ok());
  EXPECT_FALSE(w.Add("", DType::kF32, {1}, a).ok());
  EXPECT_FALSE(w.Add("y", DType::kF32, {2}, a).ok());
  EXPECT_FALSE(w.Add("z", DType::kF32, {-1}, a).ok());
  EXPECT_EQ(w.tensor_count(), 1u);
}

TEST(SafetensorsFileTest, OpenErrors) {
  TempDir dir;
  EXPECT_EQ(
      SafetensorsFile::Open(dir.path() + "/nope.safetensors").status().code(),
      absl::StatusCode::kNotFound);
  EXPECT_FALSE(SafetensorsFile::Open(dir.path()).ok());
  std::string empty = dir.path() + "/empty.safetensors";
  FILE* f = std::fopen(empty.c_str(), "w");
  std::fclose(f);
  auto s = SafetensorsFile::Open(empty).status();
  EXPECT_THAT(std::string(s.message()), HasSubstr("empty.safetensors"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("too small"));
}

TEST(SafetensorsFileTest, AcceptsEmptyHeaderGapsAndPadding) {
  EXPECT_TRUE(ParseStatus(Image("{}", 0)).ok());
  EXPECT_TRUE(ParseStatus(Image("{}      ", 0)).ok());
  // A gap of 8 bytes between two tensors (aligned writers do this).
  EXPECT_TRUE(
      ParseStatus(
          Image(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                R"("b":{"dtype":"U8","shape":[4],"data_offsets":[12,16]}})",
                16))
          .ok());
  // Scalars have shape [] and one element.
  EXPECT_TRUE(
      ParseStatus(
          Image(R"({"s":{"dtype":"F64","shape":[],"data_offsets":[0,8]}})", 8))
          .ok());
}

struct BadCase {
  const char* label;
  std::string image;
  const char* message;
};

TEST(SafetensorsFileTest, RefusesMalformedFilesWithClearErrors) {
  const std::vector<BadCase> cases = {
      {"truncated", std::string(5, '\0'), "too small"},
      {"huge header", Image("{}", 0, 200ull << 20), "exceeds the limit"},
      {"past eof", Image("{}", 0, 64), "runs past the end"},
      {"not json", Image("{\"a\": ", 0), "not valid JSON"},
      {"not object", Image("[1,2]", 0), "not a JSON object"},
      {"entry not object", Image(R"({"a":3})", 0), "tensor 'a': entry is not"},
      {"no dtype", Image(R"({"a":{"shape":[2],"data_offsets":[0,8]}})", 8),
       "\"dtype\""},
      {"unknown dtype",
       Image(R"({"a":{"dtype":"F128","shape":[2],"data_offsets":[0,8]}})", 8),
       "unknown dtype 'F128'"},
      {"negative dim",
       Image(R"({"a":{"dtype":"U8","shape":[-2],"data_offsets":[0,2]}})", 2),
       "not a non-negative integer"},
      {"float dim",
       Image(R"({"a":{"dtype":"U8","shape":[2.5],"data_offsets":[0,2]}})", 2),
       "not a non-negative integer"},
      {"shape not array",
       Image(R"({"a":{"dtype":"U8","shape":2,"data_offsets":[0,2]}})", 2),
       "\"shape\""},
      {"one offset",
       Image(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0]}})", 2),
       "data_offsets"},
      {"negative offset",
       Image(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[-1,1]}})", 2),
       "data_offsets"},
      {"begin after end",
       Image(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[4,2]}})", 8),
       "begin > end"},
      {"out of range",
       Image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 8),
       "out of range"},
      {"size mismatch",
       Image(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
       "needs 12 bytes but data_offsets span 8"},
      {"overflow",
       Image(R"({"a":{"dtype":"F64","shape":[4294967296,4294967296],)"
             R"("data_offsets":[0,8]}})",
             8),
       "too many elements"},
      // A zero dimension makes the tensor empty, but the other dimensions
      // still take part in strides and row sizes: their product must fit.
      {"overflow after zero",
       Image(R"({"a":{"dtype":"U8","shape":[0,4294967296,4294967296],)"
             R"("data_offsets":[0,0]}})",
             0),
       "too many elements"},
      {"overflow bytes",
       Image(R"({"a":{"dtype":"F64","shape":[4294967296,2147483648],)"
             R"("data_offsets":[0,8]}})",
             8),
       "more than 2^64"},
      {"overlap",
       Image(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
             R"("b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})",
             8),
       "overlap"},
      {"metadata not map", Image(R"({"__metadata__":{"k":1}})", 0),
       "not a string"},
      {"metadata not object", Image(R"({"__metadata__":"x"})", 0),
       "not an object"},
  };
  for (const auto& c : cases) {
    absl::Status s = ParseStatus(c.image);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument)
        << c.label << ": " << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.message)) << c.label;
    EXPECT_THAT(std::string(s.message()), HasSubstr("test.safetensors"))
        << c.label;
  }
}

TEST(SafetensorsFileTest, ErrorNamesTheTensor) {
  auto s = ParseStatus(Image(
      R"({"model.layers.0.w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})",
      8));
  EXPECT_THAT(std::string(s.message()), HasSubstr("tensor 'model.layers.0.w'"));
}

}  // namespace
}  // namespace moe
