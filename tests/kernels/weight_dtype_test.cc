#include "kernels/dtype.h"

#include <immintrin.h>

#include <cmath>
#include <limits>
#include <random>

#include "gtest/gtest.h"

namespace moe {
namespace {

TEST(DTypeTest, Bf16RoundTripAndRounding) {
  for (float f : {0.0f, -0.0f, 1.0f, -2.5f, std::ldexp(1.5f, 127),
                  std::ldexp(1.25f, -130)}) {
    EXPECT_EQ(BF16ToFloat(FloatToBF16(f)), f) << f;  // exactly representable
  }
  // 1 + 2^-8 is halfway between two bf16 values: ties go to even (1.0).
  EXPECT_EQ(BF16ToFloat(FloatToBF16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_EQ(BF16ToFloat(FloatToBF16(1.0f + 3.0f / 256)), 1.0f + 4.0f / 256);
  EXPECT_TRUE(std::isnan(BF16ToFloat(FloatToBF16(std::nanf("")))));
  EXPECT_TRUE(std::isinf(BF16ToFloat(FloatToBF16(INFINITY))));
}

__attribute__((target("f16c"))) float HwHalfToFloat(uint16_t h) {
  return _cvtsh_ss(h);
}
__attribute__((target("f16c"))) uint16_t HwFloatToHalf(float f) {
  return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
}

// The software conversions agree with the F16C instructions bit for bit.
TEST(DTypeTest, F16MatchesHardwareConversion) {
  if (!__builtin_cpu_supports("f16c")) {
    // Without F16C, check known values instead.
    EXPECT_EQ(HalfToFloat(0x3c00), 1.0f);
    EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));
    EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
    return;
  }
  for (uint32_t h = 0; h < 65536; ++h) {
    float sw = HalfToFloat(static_cast<uint16_t>(h));
    float hw = HwHalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(hw)) {
      ASSERT_TRUE(std::isnan(sw)) << h;
    } else {
      ASSERT_EQ(sw, hw) << h;
    }
  }
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    uint32_t b = bits(rng);
    float f;
    std::memcpy(&f, &b, 4);
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToHalf(f), HwFloatToHalf(f)) << f;
  }
  for (float f : {65504.0f, 65520.0f, 1e-8f, -3e-5f, 6.1e-5f}) {
    EXPECT_EQ(FloatToHalf(f), HwFloatToHalf(f)) << f;
  }
}

}  // namespace
}  // namespace moe
