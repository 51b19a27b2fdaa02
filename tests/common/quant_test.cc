// The block formats' layouts and quantization error bounds.
#include "common/quant.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace moe {
namespace {

std::vector<float> Random(size_t n, uint32_t seed, float range) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-range, range);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

TEST(QuantTest, SizesAndNames) {
  EXPECT_EQ(WeightBytes(DType::kQ8, 3, 64), 3 * 2 * 34);
  EXPECT_EQ(WeightBytes(DType::kQ4, 3, 128), 3 * 2 * 36);
  EXPECT_EQ(WeightBytes(DType::kBF16, 3, 5), 30);
  EXPECT_EQ(WeightBytes(DType::kQ4, 1, 32), -1);
  EXPECT_TRUE(IsQuantDType(DType::kQ8));
  EXPECT_FALSE(IsQuantDType(DType::kBF16));
  EXPECT_EQ(DTypeName(DType::kQ4), "Q4");
  // Not safetensors dtypes: a file can never claim them.
  EXPECT_FALSE(ParseDType("Q8").ok());
  EXPECT_FALSE(ParseDType("Q4").ok());
  // Bytes per weight relative to bf16: ~1.88x and ~3.56x fewer.
  EXPECT_NEAR(2.0 * 32 / 34, 1.88, 0.01);
  EXPECT_NEAR(2.0 * 64 / 36, 3.56, 0.01);
}

// Every weight comes back within half a step of its block (plus the f16
// rounding of the scale and minimum).
TEST(QuantTest, RoundTripErrorIsHalfAStep) {
  for (DType dt : {DType::kQ8, DType::kQ4}) {
    const int64_t cols = 256, g = QuantGroupSize(dt);
    auto w = Random(cols, 7, 0.5f);
    w[3] = 0.0f;
    std::vector<uint8_t> q(WeightBytes(dt, 1, cols));
    ASSERT_TRUE(QuantizeRow(w.data(), cols, dt, q.data()).ok());
    std::vector<float> back(cols);
    DequantizeRow(q.data(), dt, cols, back.data());
    for (int64_t b = 0; b < cols / g; ++b) {
      float lo = w[b * g], hi = w[b * g];
      for (int64_t i = 0; i < g; ++i) {
        lo = std::min(lo, w[b * g + i]);
        hi = std::max(hi, w[b * g + i]);
      }
      const float step = dt == DType::kQ8
                             ? std::max(std::fabs(lo), std::fabs(hi)) / 127
                             : (hi - lo) / 15;
      for (int64_t i = 0; i < g; ++i) {
        EXPECT_LE(std::fabs(back[b * g + i] - w[b * g + i]),
                  0.5f * step * 1.01f + 1e-3f * std::fabs(w[b * g + i]) + 1e-4f)
            << DTypeName(dt) << " at " << b * g + i;
      }
    }
  }
}

TEST(QuantTest, Q4NibbleOrderAndQ8Layout) {
  std::vector<float> w(64);
  for (int i = 0; i < 64; ++i) w[i] = float(i % 16);  // min 0, step 1
  std::vector<uint8_t> q(36);
  ASSERT_TRUE(QuantizeRow(w.data(), 64, DType::kQ4, q.data()).ok());
  uint16_t d, m;
  std::memcpy(&d, q.data(), 2);
  std::memcpy(&m, q.data() + 2, 2);
  EXPECT_EQ(HalfToFloat(d), 1.0f);
  EXPECT_EQ(HalfToFloat(m), 0.0f);
  for (int j = 0; j < 32; ++j) {
    EXPECT_EQ(q[4 + j] & 0x0f, j % 16);
    EXPECT_EQ(q[4 + j] >> 4, (j + 32) % 16);
  }
  std::vector<float> v(32, 0.0f);
  v[5] = -2.54f;
  v[6] = 1.27f;
  std::vector<uint8_t> q8(34);
  ASSERT_TRUE(QuantizeRow(v.data(), 32, DType::kQ8, q8.data()).ok());
  EXPECT_EQ(static_cast<int8_t>(q8[2 + 5]), -127);
  EXPECT_EQ(static_cast<int8_t>(q8[2 + 6]), 63);  // 1.27 / f16(0.02) = 63.49
  EXPECT_EQ(q8[2 + 0], 0);
}

TEST(QuantTest, BadInputsAreRefused) {
  std::vector<float> w(64, 1.0f);
  std::vector<uint8_t> q(64);
  EXPECT_FALSE(QuantizeRow(w.data(), 48, DType::kQ8, q.data()).ok());
  EXPECT_FALSE(QuantizeRow(w.data(), 32, DType::kQ4, q.data()).ok());
  EXPECT_FALSE(QuantizeRow(w.data(), 64, DType::kBF16, q.data()).ok());
  w[9] = NAN;
  EXPECT_FALSE(QuantizeRow(w.data(), 32, DType::kQ8, q.data()).ok());
  std::vector<float> zeros(64, 0.0f);
  ASSERT_TRUE(QuantizeRow(zeros.data(), 64, DType::kQ4, q.data()).ok());
  std::vector<float> back(64, 1.0f);
  DequantizeRow(q.data(), DType::kQ4, 64, back.data());
  for (float b : back) EXPECT_EQ(b, 0.0f);
}

}  // namespace
}  // namespace moe
