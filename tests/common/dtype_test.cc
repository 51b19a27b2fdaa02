#include "common/dtype.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace moe {
namespace {

uint32_t Bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  return x;
}

float FromBits(uint32_t x) {
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

TEST(DTypeTest, NamesSizesAndParsing) {
  const std::vector<std::pair<DType, size_t>> all = {
      {DType::kBool, 1}, {DType::kU8, 1},  {DType::kI8, 1},   {DType::kU16, 2},
      {DType::kI16, 2},  {DType::kF16, 2}, {DType::kBF16, 2}, {DType::kU32, 4},
      {DType::kI32, 4},  {DType::kF32, 4}, {DType::kU64, 8},  {DType::kI64, 8},
      {DType::kF64, 8}};
  for (const auto& [dtype, size] : all) {
    EXPECT_EQ(DTypeSize(dtype), size) << DTypeName(dtype);
    auto parsed = ParseDType(DTypeName(dtype));
    ASSERT_TRUE(parsed.ok()) << DTypeName(dtype);
    EXPECT_EQ(*parsed, dtype);
  }
  EXPECT_EQ(DTypeName(DType::kBF16), "BF16");
  EXPECT_EQ(DTypeName(DType::kBool), "BOOL");
  for (size_t i = 0; i < all.size(); ++i) {
    // The table is indexed by enum value: every entry must name its own.
    EXPECT_EQ(*ParseDType(DTypeName(static_cast<DType>(i))),
              static_cast<DType>(i));
  }
  EXPECT_EQ(static_cast<int>(DType::kF32), 0);  // CUDA module ABI
  EXPECT_EQ(static_cast<int>(DType::kF16), 1);
  EXPECT_EQ(static_cast<int>(DType::kBF16), 2);
  auto bad = ParseDType("bf16");  // case-sensitive, as in the format
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("'bf16'"), std::string::npos);
  // The 8-bit floats of FP8 checkpoints are one byte; the block formats are
  // ours and never parsed from a file.
  ASSERT_TRUE(ParseDType("F8_E4M3").ok());
  EXPECT_EQ(*ParseDType("F8_E4M3"), DType::kF8E4M3);
  EXPECT_EQ(*ParseDType("F8_E5M2"), DType::kF8E5M2);
  EXPECT_EQ(DTypeSize(DType::kF8E4M3), 1u);
  EXPECT_FALSE(ParseDType("Q8").ok());
  EXPECT_FALSE(ParseDType("F8_E4M3FN").ok());
  EXPECT_TRUE(IsFloatDType(DType::kBF16));
  EXPECT_FALSE(IsFloatDType(DType::kF64));
}

TEST(BF16Test, KnownBitPatterns) {
  EXPECT_EQ(FloatToBF16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBF16(-2.0f), 0xc000);
  EXPECT_EQ(FloatToBF16(0.0f), 0x0000);
  EXPECT_EQ(FloatToBF16(-0.0f), 0x8000);
  EXPECT_EQ(FloatToBF16(3.140625f), 0x4049);
  EXPECT_EQ(BF16ToFloat(0x3f80), 1.0f);
  EXPECT_EQ(BF16ToFloat(0x4049), 3.140625f);
  EXPECT_EQ(FloatToBF16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(FloatToBF16(-std::numeric_limits<float>::infinity()), 0xff80);
}

TEST(BF16Test, RoundsToNearestEven) {
  // 1 + 2^-8 is exactly halfway between bf16 1.0 (even) and 1.0078125.
  EXPECT_EQ(FloatToBF16(FromBits(0x3f808000)), 0x3f80);
  // 1.0078125 + half ulp: halfway, the upper neighbour 0x3f82 is even.
  EXPECT_EQ(FloatToBF16(FromBits(0x3f818000)), 0x3f82);
  // Just above halfway rounds up, just below rounds down.
  EXPECT_EQ(FloatToBF16(FromBits(0x3f808001)), 0x3f81);
  EXPECT_EQ(FloatToBF16(FromBits(0x3f807fff)), 0x3f80);
  // The largest finite float rounds to infinity.
  EXPECT_EQ(FloatToBF16(std::numeric_limits<float>::max()), 0x7f80);
}

TEST(BF16Test, NaNStaysNaN) {
  // A NaN whose payload lives only in the low 16 bits must not become inf.
  float nan_low = FromBits(0x7f800001);
  ASSERT_TRUE(std::isnan(nan_low));
  uint16_t b = FloatToBF16(nan_low);
  EXPECT_TRUE(std::isnan(BF16ToFloat(b)));
  EXPECT_TRUE(std::isnan(BF16ToFloat(FloatToBF16(-nan_low))));
  EXPECT_EQ(FloatToBF16(-nan_low) & 0x8000, 0x8000);
  EXPECT_TRUE(std::isnan(BF16ToFloat(FloatToBF16(std::nanf("")))));
}

TEST(HalfTest, KnownBitPatterns) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(0.5f), 0x3800);
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(HalfToFloat(0x3c00), 1.0f);
  EXPECT_EQ(HalfToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(HalfToFloat(0x3555), 0.333251953125f);
  EXPECT_EQ(HalfToFloat(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(HalfToFloat(0xfc00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7e00)));
}

TEST(HalfTest, SubnormalsAndOverflow) {
  const float min_sub = std::ldexp(1.0f, -24);
  EXPECT_EQ(HalfToFloat(0x0001), min_sub);
  EXPECT_EQ(HalfToFloat(0x03ff), std::ldexp(1023.0f, -24));
  EXPECT_EQ(HalfToFloat(0x0400), std::ldexp(1.0f, -14));
  EXPECT_EQ(FloatToHalf(min_sub), 0x0001);
  EXPECT_EQ(FloatToHalf(std::ldexp(1023.0f, -24)), 0x03ff);
  // 2^-25 is a tie between 0 and the smallest subnormal: to even (0).
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(FloatToHalf(std::ldexp(3.0f, -26)), 0x0001);  // 0.75 ulp: up
  EXPECT_EQ(FloatToHalf(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 ulp: even 2
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -30)), 0x0000);
  // Rounding the largest subnormal up reaches the smallest normal.
  EXPECT_EQ(FloatToHalf(std::ldexp(1023.75f, -24)), 0x0400);
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);
  EXPECT_EQ(FloatToHalf(1e10f), 0x7c00);
  EXPECT_EQ(FloatToHalf(-1e10f), 0xfc00);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::infinity()), 0x7c00);
  uint16_t nan = FloatToHalf(FromBits(0x7f800001));
  EXPECT_TRUE(std::isnan(HalfToFloat(nan)));
}

TEST(HalfTest, RoundTripOfEveryHalfIsExact) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f))));
      continue;
    }
    ASSERT_EQ(FloatToHalf(f), h) << std::hex << h;
  }
}

TEST(BF16Test, RoundTripOfEveryBF16IsExact) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    float f = BF16ToFloat(static_cast<uint16_t>(b));
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToBF16(f), b) << std::hex << b;
    ASSERT_EQ(Bits(f) >> 16, b);
  }
}

TEST(HalfTest, MatchesNearestRepresentableOnAGrid) {
  // Exhaustive-ish check against a brute-force nearest search over all halves.
  std::vector<float> halves;
  for (uint32_t h = 0; h < 0x7c00; ++h) halves.push_back(HalfToFloat(h));
  for (float x = 0.0f; x < 70000.0f; x = x * 1.37f + 0.0001f) {
    uint16_t got = FloatToHalf(x);
    if (x >= 65520.0f) {
      EXPECT_EQ(got, 0x7c00);
      continue;
    }
    float best = std::abs(halves[got] - x);
    // No other half is strictly closer than the one chosen.
    if (got > 0) {
      EXPECT_GE(std::abs(halves[got - 1] - x), best) << x;
    }
    if (got + 1 < static_cast<int>(halves.size())) {
      EXPECT_GE(std::abs(halves[got + 1] - x), best) << x;
    }
  }
}

TEST(ConvertTest, ConvertsBuffersOfEachFloatType) {
  const std::vector<float> values = {0.0f, 1.0f, -1.5f, 0.25f, 1024.0f};
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    std::vector<uint8_t> buf(values.size() * DTypeSize(dtype) + 1);
    // Offset by one byte: conversions must not assume alignment.
    ASSERT_TRUE(
        ConvertFromFloat(values.data(), values.size(), dtype, buf.data() + 1)
            .ok());
    std::vector<float> back(values.size());
    ASSERT_TRUE(
        ConvertToFloat(buf.data() + 1, dtype, values.size(), back.data()).ok());
    EXPECT_EQ(back, values) << DTypeName(dtype);
  }
  // Bit-level check of the BF16 layout (little-endian).
  const uint8_t bf16_bytes[] = {0x80, 0x3f, 0x00, 0xc0};
  float out[2];
  ASSERT_TRUE(ConvertToFloat(bf16_bytes, DType::kBF16, 2, out).ok());
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -2.0f);
  float unused;
  EXPECT_EQ(ConvertToFloat(bf16_bytes, DType::kI32, 1, &unused).code(),
            absl::StatusCode::kInvalidArgument);
  uint8_t scratch[4];
  EXPECT_FALSE(ConvertFromFloat(out, 1, DType::kU8, scratch).ok());
}

}  // namespace
}  // namespace moe
