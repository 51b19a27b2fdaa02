// The CPU decoder of GGUF weight blocks (common/gguf_blocks.h) against an
// independent float64 decoder in Python (tests/reference/gguf_quants.py),
// on blocks that script quantizes and on blocks of random bits, read through
// the GGUF reader; plus a few blocks decoded by hand from the layouts.
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/gguf.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/gguf_blocks.h"
#include "tests/common/test_util.h"

namespace moe {
namespace {

using ::moe::testing::TempDir;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(GgufBlocksTest, MatchesFloat64ReferenceOnEveryType) {
  TempDir dir;
  const std::string path = dir.Sub("blocks.gguf");
  const std::string cmd = "/usr/bin/python3 " + std::string(MOE_SOURCE_DIR) +
                          "/tests/reference/gguf_quants.py " + path + " 7";
  int status = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << cmd;
  auto file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  int checked = 0;
  for (const GgufTensorInfo& t : (*file)->tensors()) {
    if (t.type == GgufType::kF64) continue;
    const GgufTensorInfo* want = (*file)->Find(t.name + ".expected");
    ASSERT_NE(want, nullptr) << t.name;
    ASSERT_EQ(want->numel, t.numel);
    std::vector<float> got(t.numel);
    ASSERT_TRUE(DequantizeGguf(t.type, (*file)->Data(t).data(), t.numel, got.data()).ok());
    std::vector<double> ref(t.numel);
    std::memcpy(ref.data(), (*file)->Data(*want).data(), 8 * ref.size());
    const int64_t block = GgufTypeInfoOf(t.type).block_elems;
    for (int64_t b = 0; b < t.numel / block; ++b) {
      double scale = 0;
      for (int64_t i = b * block; i < (b + 1) * block; ++i) scale = std::max(scale, std::abs(ref[i]));
      for (int64_t i = b * block; i < (b + 1) * block; ++i) {
        ASSERT_NEAR(got[i], ref[i], 1e-6 * scale) << t.name << " weight " << i;
      }
    }
    ++checked;
  }
  EXPECT_EQ(checked, 18);  // 9 types, quantized and random blocks
}

std::vector<uint8_t> Half(uint16_t bits) {
  return {static_cast<uint8_t>(bits & 0xFF), static_cast<uint8_t>(bits >> 8)};
}

TEST(GgufBlocksTest, Q8_0ByHand) {
  std::vector<uint8_t> b = Half(0x3800);  // 0.5
  for (int j = 0; j < 32; ++j) b.push_back(static_cast<uint8_t>(static_cast<int8_t>(j - 16)));
  float y[32];
  DequantizeQ8_0Block(b.data(), y);
  EXPECT_EQ(y[0], -8.0f);
  EXPECT_EQ(y[31], 7.5f);
}

TEST(GgufBlocksTest, Q5_1NibblesAndFifthBitsByHand) {
  std::vector<uint8_t> b = Half(0x3c00);  // d = 1
  for (uint8_t v : Half(0x4000)) b.push_back(v);  // m = 2
  for (uint8_t v : {0x01, 0x00, 0x01, 0x80}) b.push_back(v);  // qh: bits 0, 16, 31
  for (int j = 0; j < 16; ++j) b.push_back(static_cast<uint8_t>(j | (15 - j) << 4));
  float y[32];
  DequantizeQ5_1Block(b.data(), y);
  EXPECT_EQ(y[0], 0 + 16 + 2.0f);   // low nibble 0, fifth bit set
  EXPECT_EQ(y[1], 1 + 2.0f);
  EXPECT_EQ(y[16], 15 + 16 + 2.0f); // high nibble of byte 0, bit 16
  EXPECT_EQ(y[17], 14 + 2.0f);
  EXPECT_EQ(y[31], 0 + 16 + 2.0f);  // bit 31
}

TEST(GgufBlocksTest, Q4_KUpperSubBlockScalesByHand) {
  std::vector<uint8_t> b = Half(0x3c00);            // d = 1
  for (uint8_t v : Half(0x3800)) b.push_back(v);    // dmin = 0.5
  // Sub-block 5: scale 37 = 0b10'0101, min 50 = 0b11'0010. Low nibbles in
  // byte 9, top two bits in bytes 1 (scale) and 5 (min).
  uint8_t s[12] = {};
  s[1] = 2 << 6;
  s[5] = 3 << 6;
  s[9] = 5 | (2 << 4);
  b.insert(b.end(), s, s + 12);
  for (int j = 0; j < 128; ++j) b.push_back(j >= 64 && j < 96 ? 0x37 : 0);
  float y[256];
  DequantizeQ4_KBlock(b.data(), y);
  // Sub-block 5 = high nibbles of bytes 64..95: 3 * 37 - 0.5 * 50.
  EXPECT_EQ(y[160], 3 * 37 - 25.0f);
  // Sub-block 4 = their low nibbles, scale 0 and min 0.
  EXPECT_EQ(y[128], 0.0f);
}

TEST(GgufBlocksTest, Q6_KByHand) {
  std::vector<uint8_t> b(210, 0);
  b[0] = 0x21;     // ql[0]: weight 0 low nibble 1, weight 64 nibble 2
  b[128] = 0x1B;   // qh[0]: weight 0 +3<<4, weight 32 +2<<4, weight 64 +1<<4
  b[192] = 2;      // scale of weights 0-15
  b[196] = -3;     // scale of weights 64-79
  b[208] = 0x00;
  b[209] = 0x3c;   // d = 1
  float y[256];
  DequantizeQ6_KBlock(b.data(), y);
  EXPECT_EQ(y[0], 2.0f * ((1 | 3 << 4) - 32));
  EXPECT_EQ(y[64], -3.0f * ((2 | 1 << 4) - 32));
  EXPECT_EQ(y[1], 2.0f * -32);
}

TEST(GgufBlocksTest, Mxfp4ByHand) {
  std::vector<uint8_t> b = {127};                   // scale 1
  b.push_back(0xF7);                                // weight 0: 6, weight 16: -6
  b.push_back(0x19);                                // weight 1: -0.5, weight 17: 0.5
  b.resize(17, 0);
  float y[32];
  DequantizeMxfp4Block(b.data(), y);
  EXPECT_EQ(y[0], 6.0f);
  EXPECT_EQ(y[16], -6.0f);
  EXPECT_EQ(y[1], -0.5f);
  EXPECT_EQ(y[17], 0.5f);
  b[0] = 0;  // 2^-127: subnormal, still exact
  DequantizeMxfp4Block(b.data(), y);
  EXPECT_EQ(y[17], std::ldexp(0.5f, -127));
}

TEST(GgufBlocksTest, PlainTypesAndErrors) {
  const uint8_t f16[] = {0x00, 0x3c, 0x00, 0xc0};    // 1, -2
  const uint8_t bf16[] = {0x80, 0x3f, 0x40, 0x40};   // 1, 3
  float y[2];
  ASSERT_TRUE(DequantizeGguf(GgufType::kF16, f16, 2, y).ok());
  EXPECT_THAT(y, ElementsAre(1.0f, -2.0f));
  ASSERT_TRUE(DequantizeGguf(GgufType::kBF16, bf16, 2, y).ok());
  EXPECT_THAT(y, ElementsAre(1.0f, 3.0f));
  std::vector<uint8_t> zeros(210);
  std::vector<float> out(256);
  EXPECT_THAT(DequantizeGguf(GgufType::kQ4_K, zeros.data(), 100, out.data()).message(),
              HasSubstr("100 weights are not whole Q4_K blocks of 256"));
  EXPECT_THAT(DequantizeGguf(GgufType::kQ2_K, zeros.data(), 256, out.data()).message(),
              HasSubstr("no CPU decoder for GGUF type Q2_K"));
  EXPECT_FALSE(CanDequantizeGguf(GgufType::kIQ4_XS));
  EXPECT_TRUE(CanDequantizeGguf(GgufType::kMXFP4));
}

}  // namespace
}  // namespace moe
