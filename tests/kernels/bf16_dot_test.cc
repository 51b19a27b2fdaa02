// bf16 products on AVX512_BF16 (kernels/cpu_matmul.h, UsesBf16Dot): the
// activations are rounded as FloatToBF16 rounds them, the products are
// within the float64 product of the rounded activations and the weights,
// and an output's bits do not depend on the threads, the column split, or
// how many activation rows come together (decode alone or a prompt's tile).
// On a CPU without AVX512_BF16 each test checks the fallback instead: no
// rounding, the f32 kernels' results.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "gtest/gtest.h"
#include "kernels/cpu_matmul.h"
#include "kernels/cpu_quant_matmul.h"
#include "kernels/thread_pool.h"
#include "tests/kernels/normal_data.h"

namespace moe {
namespace {

// Without AVX512_BF16 (or with MOE_BF16_DOT=0): nothing rounds, and a bf16
// product at the AVX-512 level (where the CPU has it) is the f32 kernel's.
void ExpectNoBf16Dot() {
  EXPECT_FALSE(UsesBf16Dot(DType::kBF16, SimdLevel::kAvx512));
  if (!SimdLevelSupported(SimdLevel::kAvx512)) return;
  ThreadPool pool(2, /*min_parallel_macs=*/0);  // split every product
  const int64_t m = 3, n = 20, k = 96;
  const std::vector<float> x = Normal(m * k, 7, 1.0f),
                           wf = Normal(n * k, 8, 0.05f);
  std::vector<uint16_t> w(wf.size());
  for (size_t i = 0; i < wf.size(); ++i) w[i] = FloatToBF16(wf[i]);
  std::vector<float> y(static_cast<size_t>(m * n)), want(y.size());
  const MatMulArgs a{x.data(), w.data(), DType::kBF16, nullptr, y.data(), m,
                     n,        k};
  CpuMatMul(pool, SimdLevel::kAvx512, a);
  MatMulArgs b = a;
  b.y = want.data();
  MatMulColumnsAvx512(b, 0, n);
  EXPECT_EQ(y, want);
}

TEST(Bf16DotTest, RoundsAsFloatToBf16) {
  if (!Bf16DotSupported()) return ExpectNoBf16Dot();
  std::vector<float> x = Normal(1000, 3, 10.0f);
  const float inf = std::numeric_limits<float>::infinity();
  const float specials[] = {0.0f,
                            -0.0f,
                            1.0f + 1.0f / 256,  // a tie: rounds to even
                            1.0f + 3.0f / 256,
                            inf,
                            -inf,
                            std::numeric_limits<float>::quiet_NaN(),
                            3.4e38f,  // rounds up to inf
                            1e-40f,   // a denormal
                            -1e-39f};
  x.insert(x.end(), std::begin(specials), std::end(specials));
  uint32_t signaling = 0x7f800001u;  // a NaN whose payload is all below bit 16
  float nan_low;
  std::memcpy(&nan_low, &signaling, 4);
  x.push_back(nan_low);
  std::vector<uint16_t> got(x.size());
  RoundToBf16(x.data(), static_cast<int64_t>(x.size()), got.data());
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(got[i], FloatToBF16(x[i])) << i << " " << x[i];
  }
}

struct Shape {
  int64_t m, n, k;
};

// Within the float64 product of the rounded activations (one rounding per
// pair-wise addition of k/16 terms per lane: 1e-6 of the magnitudes' sum),
// bias added; the same bits at 1 and 3 threads.
TEST(Bf16DotTest, MatchesTheRoundedReferenceWithTheSameBitsAtAnyThreadCount) {
  if (!Bf16DotSupported()) return ExpectNoBf16Dot();
  ThreadPool one(1), three(3, /*min_parallel_macs=*/0);  // split every product
  for (const Shape s :
       {Shape{1, 37, 64}, Shape{1, 64, 2100}, Shape{3, 33, 48},
        Shape{5, 70, 1030}, Shape{16, 48, 256}, Shape{9, 5, 7}}) {
    SCOPED_TRACE(::testing::Message()
                 << "m " << s.m << " n " << s.n << " k " << s.k);
    const std::vector<float> x = Normal(s.m * s.k, 1, 1.0f);
    const std::vector<float> wf = Normal(s.n * s.k, 2, 0.05f);
    const std::vector<float> bias = Normal(s.n, 4, 0.1f);
    std::vector<uint16_t> w(wf.size());
    for (size_t i = 0; i < wf.size(); ++i) w[i] = FloatToBF16(wf[i]);
    std::vector<float> first;
    for (ThreadPool* pool : {&one, &three}) {
      std::vector<float> y(static_cast<size_t>(s.m * s.n), NAN);
      CpuMatMul(*pool, SimdLevel::kAvx512,
                MatMulArgs{x.data(), w.data(), DType::kBF16, bias.data(),
                           y.data(), s.m, s.n, s.k});
      for (int64_t i = 0; i < s.m; ++i) {
        for (int64_t j = 0; j < s.n; ++j) {
          double ref = bias[j], mag = std::fabs(bias[j]);
          for (int64_t c = 0; c < s.k; ++c) {
            const double p = double(BF16ToFloat(FloatToBF16(x[i * s.k + c]))) *
                             BF16ToFloat(w[j * s.k + c]);
            ref += p;
            mag += std::fabs(p);
          }
          ASSERT_NEAR(y[i * s.n + j], ref, 1e-6 * mag + 1e-7) << i << "," << j;
        }
      }
      if (first.empty()) {
        first = y;
      } else {
        ASSERT_EQ(
            0, std::memcmp(y.data(), first.data(), y.size() * sizeof(float)));
      }
    }
    // Each activation row alone (decode's path for m < 4) gives its bits in
    // the batch.
    for (int64_t i = 0; i < s.m; ++i) {
      std::vector<float> alone(static_cast<size_t>(s.n));
      CpuMatMul(three, SimdLevel::kAvx512,
                MatMulArgs{x.data() + i * s.k, w.data(), DType::kBF16,
                           bias.data(), alone.data(), 1, s.n, s.k});
      ASSERT_EQ(0, std::memcmp(alone.data(), first.data() + i * s.n,
                               s.n * sizeof(float)))
          << "row " << i;
    }
  }
}

// The rounding is the only difference from the f32 kernels: activations
// that are bf16 already give those kernels' values (up to summation order),
// and MOE_BF16_DOT=0 (SetBf16DotForTest(false) here: the variable is read
// once) returns to the f32 kernels (f32 activations).
TEST(Bf16DotTest, RoundingIsTheOnlyChangeAndCanBeTurnedOff) {
  if (!Bf16DotSupported()) return ExpectNoBf16Dot();
  ThreadPool pool(2, /*min_parallel_macs=*/0);  // split every product
  const int64_t m = 6, n = 40, k = 512;
  std::vector<float> x = Normal(m * k, 5, 1.0f);
  const std::vector<float> wf = Normal(n * k, 6, 0.05f);
  std::vector<uint16_t> w(wf.size());
  for (size_t i = 0; i < wf.size(); ++i) w[i] = FloatToBF16(wf[i]);
  auto run = [&](const std::vector<float>& in) {
    std::vector<float> y(static_cast<size_t>(m * n));
    CpuMatMul(pool, SimdLevel::kAvx512,
              MatMulArgs{in.data(), w.data(), DType::kBF16, nullptr, y.data(),
                         m, n, k});
    return y;
  };
  const std::vector<float> dot = run(x);
  std::vector<float> xr = x;
  for (float& v : xr) v = BF16ToFloat(FloatToBF16(v));
  EXPECT_EQ(run(xr), dot);  // rounding first changes nothing
  SetBf16DotForTest(false);  // as MOE_BF16_DOT=0
  EXPECT_FALSE(UsesBf16Dot(DType::kBF16, SimdLevel::kAvx512));
  const std::vector<float> f32_rounded = run(xr), f32 = run(x);
  SetBf16DotForTest(std::nullopt);
  EXPECT_TRUE(UsesBf16Dot(DType::kBF16, SimdLevel::kAvx512));
  EXPECT_NE(f32, dot);  // the f32 activations were read
  for (size_t i = 0; i < dot.size(); ++i) {
    EXPECT_NEAR(dot[i], f32_rounded[i], 2e-5) << i;
  }
  EXPECT_FALSE(UsesBf16Dot(DType::kF16, SimdLevel::kAvx512));
  EXPECT_FALSE(UsesBf16Dot(DType::kBF16, SimdLevel::kAvx2));
}

}  // namespace
}  // namespace moe
