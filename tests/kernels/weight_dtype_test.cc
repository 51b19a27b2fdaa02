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
    EXPECT_EQ(Bf16ToF32(F32ToBf16(f)), f) << f;  // exactly representable
  }
  // 1 + 2^-8 is halfway between two bf16 values: ties go to even (1.0).
  EXPECT_EQ(Bf16ToF32(F32ToBf16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_EQ(Bf16ToF32(F32ToBf16(1.0f + 3.0f / 256)), 1.0f + 4.0f / 256);
  EXPECT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(std::nanf("")))));
  EXPECT_TRUE(std::isinf(Bf16ToF32(F32ToBf16(INFINITY))));
}

__attribute__((target("f16c"))) float HwF16ToF32(uint16_t h) {
  return _cvtsh_ss(h);
}
__attribute__((target("f16c"))) uint16_t HwF32ToF16(float f) {
  return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
}

// The software conversions agree with the F16C instructions bit for bit.
TEST(DTypeTest, F16MatchesHardwareConversion) {
  if (!__builtin_cpu_supports("f16c")) {
    // Without F16C, check known values instead.
    EXPECT_EQ(F16ToF32(0x3c00), 1.0f);
    EXPECT_EQ(F16ToF32(0x0001), std::ldexp(1.0f, -24));
    EXPECT_EQ(F32ToF16(65504.0f), 0x7bff);
    return;
  }
  for (uint32_t h = 0; h < 65536; ++h) {
    float sw = F16ToF32(static_cast<uint16_t>(h));
    float hw = HwF16ToF32(static_cast<uint16_t>(h));
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
    ASSERT_EQ(F32ToF16(f), HwF32ToF16(f)) << f;
  }
  for (float f : {65504.0f, 65520.0f, 1e-8f, -3e-5f, 6.1e-5f}) {
    EXPECT_EQ(F32ToF16(f), HwF32ToF16(f)) << f;
  }
}

}  // namespace
}  // namespace moe
