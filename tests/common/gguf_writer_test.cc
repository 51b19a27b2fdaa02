// The GGUF writer (common/gguf_writer.h) read back by our reader
// (common/gguf.h): every metadata value type, arrays, tensors of plain and
// block types, alignment; and what it refuses, with messages naming the key
// or tensor. The block quantizers (common/gguf_quantize.h): valid blocks that
// our decoders (common/gguf_blocks.h) bring back within each scheme's bound,
// neutral codes for zero blocks, refusals, llama.cpp's fallback types.
// (Byte equality with tests/reference/gguf_quants.py, the quantizers'
// reference: tests/engine/gguf_make_model_test.cc.)
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "common/gguf.h"
#include "common/gguf_blocks.h"
#include "common/gguf_model.h"
#include "common/gguf_quantize.h"
#include "common/gguf_writer.h"
#include "common/splitmix64.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"

namespace moe {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// The file borrows `image` (GgufFile::Parse): keep it alive while f is.
std::unique_ptr<GgufFile> ParseBack(const std::string& image) {
  auto f = GgufFile::Parse(reinterpret_cast<const uint8_t*>(image.data()), image.size(), "w");
  EXPECT_TRUE(f.ok()) << f.status();
  return f.ok() ? std::move(*f) : nullptr;
}

TEST(GgufWriterTest, EveryValueTypeReadsBack) {
  GgufWriter w;
  ASSERT_TRUE(w.AddUint("u8", GgufValueType::kUint8, 255).ok());
  ASSERT_TRUE(w.AddInt("i8", GgufValueType::kInt8, -128).ok());
  ASSERT_TRUE(w.AddUint("u16", GgufValueType::kUint16, 65535).ok());
  ASSERT_TRUE(w.AddInt("i16", GgufValueType::kInt16, -32768).ok());
  ASSERT_TRUE(w.AddUint32("u32", 4000000000u).ok());
  ASSERT_TRUE(w.AddInt("i32", GgufValueType::kInt32, -7).ok());
  ASSERT_TRUE(w.AddFloat32("f32", 1e-6).ok());
  ASSERT_TRUE(w.AddBool("bool", true).ok());
  ASSERT_TRUE(w.AddString("str", std::string("a\0b", 3)).ok());
  ASSERT_TRUE(w.AddUint("u64", GgufValueType::kUint64, ~uint64_t{0}).ok());
  ASSERT_TRUE(w.AddInt("i64", GgufValueType::kInt64, std::numeric_limits<int64_t>::min()).ok());
  ASSERT_TRUE(w.AddFloat("f64", GgufValueType::kFloat64, 0.1).ok());
  ASSERT_TRUE(w.AddIntArray("ai32", GgufValueType::kInt32, {1, -2, 3}).ok());
  ASSERT_TRUE(w.AddIntArray("abool", GgufValueType::kBool, {1, 0}).ok());
  ASSERT_TRUE(w.AddFloatArray("af32", GgufValueType::kFloat32, {0.5, -2}).ok());
  ASSERT_TRUE(w.AddStringArray("astr", {"x", "", "yz"}).ok());
  const std::string image = w.Serialize();
  auto f = ParseBack(image);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->version(), 3u);
  const GgufMetadata& m = f->metadata();
  ASSERT_EQ(m.size(), 16u);
  EXPECT_EQ(m.entries()[0].key, "u8");  // in the order added
  EXPECT_EQ(*m.GetUint("u8"), 255u);
  EXPECT_EQ(*m.GetInt("i8"), -128);
  EXPECT_EQ(*m.GetUint("u16"), 65535u);
  EXPECT_EQ(*m.GetInt("i16"), -32768);
  EXPECT_EQ(*m.GetUint("u32"), 4000000000u);
  EXPECT_EQ(*m.GetInt("i32"), -7);
  EXPECT_EQ(*m.GetFloat("f32"), static_cast<double>(1e-6f));
  EXPECT_EQ(m.Find("f32")->type, GgufValueType::kFloat32);
  EXPECT_TRUE(*m.GetBool("bool"));
  EXPECT_EQ(*m.GetString("str"), std::string("a\0b", 3));
  EXPECT_EQ(*m.GetUint("u64"), ~uint64_t{0});
  EXPECT_EQ(*m.GetInt("i64"), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(*m.GetFloat("f64"), 0.1);
  EXPECT_THAT(*m.GetIntArray("ai32"), ElementsAre(1, -2, 3));
  EXPECT_EQ(m.Find("abool")->array_type, GgufValueType::kBool);
  int64_t b0 = -1, b1 = -1;
  ASSERT_EQ(m.Find("abool")->array_size, 2u);
  ASSERT_TRUE(GgufArrayInt(*m.Find("abool"), 0, &b0) && GgufArrayInt(*m.Find("abool"), 1, &b1));
  EXPECT_EQ(b0, 1);
  EXPECT_EQ(b1, 0);
  EXPECT_THAT(*m.GetFloatArray("af32"), ElementsAre(0.5, -2));
  EXPECT_THAT(*m.GetStringArray("astr"), ElementsAre("x", "", "yz"));
}

TEST(GgufWriterTest, TensorsReadBackAligned) {
  for (const uint32_t alignment : {32u, 64u, 1u}) {
    SCOPED_TRACE(alignment);
    GgufWriter w;
    if (alignment != 32) {
      ASSERT_TRUE(w.SetAlignment(alignment).ok());
    }
    std::vector<uint8_t> f32(4 * 3 * 5), q8(34 * 2 * 3), odd(2 * 7);
    for (size_t i = 0; i < f32.size(); ++i) f32[i] = static_cast<uint8_t>(i);
    for (size_t i = 0; i < q8.size(); ++i) q8[i] = static_cast<uint8_t>(3 * i + 1);
    ASSERT_TRUE(w.AddString("general.architecture", "qwen3moe").ok());
    ASSERT_TRUE(w.AddTensor("a", GgufType::kF32, {5, 3}, f32).ok());
    ASSERT_TRUE(w.AddTensor("b", GgufType::kF16, {7}, odd).ok());
    ASSERT_TRUE(w.AddTensor("c", GgufType::kQ8_0, {64, 1, 3}, q8).ok());
    EXPECT_EQ(w.tensor_count(), 3u);
    const std::string image = w.Serialize();
    EXPECT_EQ(image.size() % alignment, 0u);
    auto f = ParseBack(image);
    ASSERT_NE(f, nullptr);
    EXPECT_EQ(f->alignment(), alignment);
    ASSERT_EQ(f->tensors().size(), 3u);
    const GgufTensorInfo& c = f->tensors()[2];
    EXPECT_EQ(c.name, "c");
    EXPECT_EQ(c.type, GgufType::kQ8_0);
    EXPECT_THAT(c.dims, ElementsAre(64, 1, 3));
    EXPECT_EQ(c.offset % alignment, 0u);
    auto data = f->Data(c);
    ASSERT_EQ(data.size(), q8.size());
    EXPECT_EQ(std::memcmp(data.data(), q8.data(), q8.size()), 0);
    EXPECT_EQ(std::memcmp(f->Data(f->tensors()[0]).data(), f32.data(), f32.size()), 0);
    EXPECT_EQ(std::memcmp(f->Data(f->tensors()[1]).data(), odd.data(), odd.size()), 0);
  }
}

TEST(GgufWriterTest, WritesAFileAtomically) {
  moe::testing::TempDir dir;
  GgufWriter w;
  std::vector<uint8_t> bytes(8, 7);
  ASSERT_TRUE(w.AddTensor("t", GgufType::kF32, {2}, bytes).ok());
  ASSERT_TRUE(w.Write(dir.Sub("t.gguf")).ok());
  auto f = GgufFile::Open(dir.Sub("t.gguf"));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->tensors()[0].nbytes, 8u);
  EXPECT_FALSE(w.Write(dir.Sub("missing/t.gguf")).ok());
}

TEST(GgufWriterTest, RefusesWhatTheReaderWouldRefuse) {
  GgufWriter w;
  ASSERT_TRUE(w.AddUint32("k", 1).ok());
  auto expect = [](const absl::Status& s, const std::string& text) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(text));
  };
  expect(w.AddUint32("k", 2), "'k' was added already");
  expect(w.AddString("", "x"), "expected 1 to 65535");
  expect(w.AddString(std::string(70000, 'k'), "x"), "70000 bytes");
  expect(w.AddUint32("big", uint64_t{1} << 32), "4294967296 does not fit UINT32");
  expect(w.AddUint("u8", GgufValueType::kUint8, 256), "does not fit UINT8");
  expect(w.AddInt("i8", GgufValueType::kInt8, 128), "128 does not fit INT8");
  expect(w.AddInt("i16", GgufValueType::kInt16, -32769), "does not fit INT16");
  expect(w.AddUint("wrong", GgufValueType::kInt32, 1), "not an unsigned integer type");
  expect(w.AddInt("wrong", GgufValueType::kFloat32, 1), "not a signed integer type");
  expect(w.AddFloat("wrong", GgufValueType::kUint8, 1), "not FLOAT32 or FLOAT64");
  expect(w.AddFloat32("huge", 1e300), "does not fit FLOAT32");
  expect(w.AddIntArray("neg", GgufValueType::kUint32, {1, -1}), "-1 does not fit UINT32");
  expect(w.AddIntArray("bool", GgufValueType::kBool, {2}), "2 does not fit BOOL");
  expect(w.AddIntArray("nested", GgufValueType::kArray, {1}), "integer or BOOL element");
  expect(w.AddUint32(kGgufAlignmentKey, 64), "SetAlignment");
  expect(w.SetAlignment(48), "not a power of two");
  std::vector<uint8_t> four(4);
  expect(w.AddTensor("t", GgufType::kF32, {}, four), "0 dimensions");
  expect(w.AddTensor("t", GgufType::kF32, {1, 1, 1, 1, 1}, four), "5 dimensions");
  expect(w.AddTensor("t", GgufType::kF32, {0}, four), "not all >= 1");
  expect(w.AddTensor("t", GgufType::kF32, {int64_t{1} << 40, int64_t{1} << 40}, four),
         "overflows int64");
  expect(w.AddTensor("t", GgufType::kQ4_K, {32}, four), "rows of 32 are not whole Q4_K blocks");
  expect(w.AddTensor("t", GgufType::kF32, {2}, four), "needs 8 bytes, got 4");
  expect(w.AddTensor("t", static_cast<GgufType>(4), {1}, four), "unknown ggml type 4");
  ASSERT_TRUE(w.AddTensor("t", GgufType::kF32, {1}, four).ok());
  expect(w.AddTensor("t", GgufType::kF32, {1}, four), "'t' was added already");
  expect(w.SetAlignment(64), "before any tensor");
  // Nothing refused was added: the file holds "k" and "t" only.
  const std::string image = w.Serialize();
  auto f = ParseBack(image);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->metadata().size(), 1u);
  EXPECT_EQ(f->tensors().size(), 1u);
}

// --------------------------------------------------------- quantizers

// Blocks of weights: uniform, with an outlier, lopsided (all positive),
// small, and a block of zeros.
std::vector<float> TestWeights(int64_t n, uint64_t seed) {
  std::vector<float> x(static_cast<size_t>(n));
  uint64_t state = seed;
  for (int64_t i = 0; i < n; ++i) {
    const double u = static_cast<double>(SplitMix64(state) >> 11) * 0x1.0p-53 - 0.5;
    x[i] = static_cast<float>(u);
  }
  x[5] = 9.0f;  // an outlier
  for (int64_t i = n / 4; i < n / 2; ++i) x[i] = std::fabs(x[i]) + 2.0f;
  // Small, but not so small that Q6_K's d (max / 4064) loses its bits
  // among f16's subnormals (gguf_quantize.h).
  for (int64_t i = n / 2; i < 3 * n / 4; ++i) x[i] *= 0.05f;
  for (int64_t i = n - 256; i < n; ++i) x[i] = 0.0f;
  return x;
}

struct Bound {
  GgufType type;
  double max_error;  // per weight, relative to its block's max |x| (K: 256)
};

// From each scheme's arithmetic (gguf_quantize.h): half a step, plus the
// clamped top code (Q4_0 / Q5_0: a full step), plus the K-quants' 6-bit
// scale and minimum rounding; MXFP4's widest gap is 2 of 6.
constexpr Bound kBounds[] = {
    {GgufType::kQ8_0, 1.0 / 127}, {GgufType::kQ4_0, 1.0 / 8 + 1e-3},
    {GgufType::kQ5_0, 1.0 / 16 + 1e-3}, {GgufType::kQ4_1, 1.0 / 15 + 1e-3},
    {GgufType::kQ5_1, 1.0 / 31 + 1e-3}, {GgufType::kQ4_K, 0.1},
    {GgufType::kQ5_K, 0.06},         {GgufType::kQ6_K, 0.05},
    {GgufType::kMXFP4, 1.0 / 3},
};

TEST(GgufQuantizeTest, BlocksDecodeWithinTheSchemesBound) {
  const int64_t n = 4 * 256;
  const std::vector<float> x = TestWeights(n, 3);
  for (const Bound& b : kBounds) {
    const GgufTypeInfo& info = GgufTypeInfoOf(b.type);
    SCOPED_TRACE(std::string(info.name));
    std::vector<uint8_t> q(static_cast<size_t>(n / info.block_elems * info.block_bytes));
    ASSERT_TRUE(QuantizeGguf(b.type, x.data(), n, q.data()).ok());
    std::vector<float> y(static_cast<size_t>(n));
    ASSERT_TRUE(DequantizeGguf(b.type, q.data(), n, y.data()).ok());
    double worst = 0;
    for (int64_t blk = 0; blk < n / 256; ++blk) {
      double a = 0;
      for (int i = 0; i < 256; ++i) a = std::max(a, std::fabs(double{x[blk * 256 + i]}));
      for (int i = 0; i < 256; ++i) {
        const double err = std::fabs(double{y[blk * 256 + i]} - x[blk * 256 + i]);
        if (a == 0) {
          EXPECT_EQ(y[blk * 256 + i], 0.0f) << "a zero block decodes to zeros";
        } else {
          worst = std::max(worst, err / a);
        }
      }
    }
    std::printf("%s: max error %.4f of the block's max\n", std::string(info.name).c_str(), worst);
    EXPECT_LE(worst, b.max_error);
    EXPECT_GT(worst, 0.0);
  }
}

TEST(GgufQuantizeTest, PlainTypesConvert) {
  const float x[4] = {1.0f, -2.5f, 1.0f / 3.0f, 65504.0f};
  uint8_t out[16];
  ASSERT_TRUE(QuantizeGguf(GgufType::kF32, x, 4, out).ok());
  EXPECT_EQ(std::memcmp(out, x, 16), 0);
  ASSERT_TRUE(QuantizeGguf(GgufType::kBF16, x, 4, out).ok());
  uint16_t h;
  std::memcpy(&h, out + 2, 2);
  EXPECT_EQ(BF16ToFloat(h), -2.5f);
  ASSERT_TRUE(QuantizeGguf(GgufType::kF16, x, 4, out).ok());
  std::memcpy(&h, out + 6, 2);
  EXPECT_EQ(HalfToFloat(h), 65504.0f);
}

TEST(GgufQuantizeTest, RefusesWhatItCannotWrite) {
  std::vector<float> x(256, 1.0f);
  std::vector<uint8_t> out(1024);
  EXPECT_THAT(std::string(QuantizeGguf(GgufType::kQ2_K, x.data(), 256, out.data()).message()),
              HasSubstr("cannot quantize to GGUF type Q2_K"));
  EXPECT_THAT(std::string(QuantizeGguf(GgufType::kQ4_K, x.data(), 32, out.data()).message()),
              HasSubstr("32 weights are not whole Q4_K blocks of 256"));
  x[3] = std::nanf("");
  EXPECT_THAT(std::string(QuantizeGguf(GgufType::kQ8_0, x.data(), 32, out.data()).message()),
              HasSubstr("weight 3 is nan"));
  x[3] = 70000.0f;
  EXPECT_FALSE(QuantizeGguf(GgufType::kF16, x.data(), 32, out.data()).ok());
}

TEST(GgufQuantizeTest, RowsThatAreNotWholeBlocksFallBackAsLlamaCppDoes) {
  EXPECT_EQ(GgufTypeForRow(GgufType::kQ4_K, 512), GgufType::kQ4_K);
  EXPECT_EQ(GgufTypeForRow(GgufType::kQ4_K, 96), GgufType::kQ5_0);
  EXPECT_EQ(GgufTypeForRow(GgufType::kQ5_K, 64), GgufType::kQ5_1);
  EXPECT_EQ(GgufTypeForRow(GgufType::kQ6_K, 32), GgufType::kQ8_0);
  EXPECT_EQ(GgufTypeForRow(GgufType::kQ6_K, 48), GgufType::kF32);
  EXPECT_EQ(GgufTypeForRow(GgufType::kQ4_0, 48), GgufType::kF32);
  EXPECT_EQ(GgufTypeForRow(GgufType::kMXFP4, 64), GgufType::kMXFP4);
  EXPECT_EQ(GgufTypeForRow(GgufType::kBF16, 3), GgufType::kBF16);
}

// The names a writer inverts are the reader's own: each maps, and the
// mapping of the ones that name one tensor of ours is one to one.
TEST(GgufTensorNamesOfTest, EveryNameMaps) {
  for (const FamilyTraits& f : AllFamilies()) {
    SCOPED_TRACE(f.model_type);
    std::set<std::string> ours;
    for (const int layer : {-1, 3}) {
      for (const std::string& name : GgufTensorNamesOf(f.family, layer)) {
        auto n = MapGgufTensorName(f.family, name);
        ASSERT_TRUE(n.ok()) << name << ": " << n.status();
        EXPECT_EQ(n->layer, layer < 0 ? -1 : layer) << name;
        EXPECT_TRUE(ours.insert(n->ours).second) << name << " -> " << n->ours;
      }
    }
    EXPECT_GE(ours.size(), 10u);
  }
}

}  // namespace
}  // namespace moe
