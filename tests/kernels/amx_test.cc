// bf16 products on AMX tiles (kernels/cpu_matmul.h, "bf16 products on
// AMX"): the level is detected and capped as the others, every output is
// within a stated bound of the float64 product of the bf16-rounded
// activations and the weights, and an output's bits depend on its row, its
// weight row and k only (not the threads, the column split, the rows beside
// it in a tile, or how many activation rows come together). On a CPU
// without AMX the tests check that nothing claims it.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "common/gguf_quantize.h"
#include "common/quant.h"
#include "common/row_interleave.h"
#include "gtest/gtest.h"
#include "kernels/cpu_backend.h"
#include "kernels/cpu_gguf_quant.h"
#include "kernels/cpu_matmul.h"
#include "kernels/cpu_quant_matmul.h"
#include "kernels/thread_pool.h"
#include "tests/kernels/normal_data.h"

namespace moe {
namespace {

std::vector<uint16_t> ToBf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = FloatToBF16(v[i]);
  return out;
}

std::vector<float> Product(ThreadPool& pool, SimdLevel level,
                           const std::vector<float>& x,
                           const std::vector<uint16_t>& w, const float* bias,
                           int64_t m, int64_t n, int64_t k) {
  std::vector<float> y(static_cast<size_t>(m * n), NAN);
  CpuMatMul(
      pool, level,
      MatMulArgs{x.data(), w.data(), DType::kBF16, bias, y.data(), m, n, k});
  return y;
}

// Without AMX (or with the kernel refusing the tile state): no level,
// product or backend claims it.
void ExpectNoAmx() {
  std::cout
      << "[ amx      ] this CPU (or kernel) has no AMX-BF16: checking that "
         "nothing claims it\n";
  EXPECT_FALSE(SimdLevelSupported(SimdLevel::kAmx));
  EXPECT_NE(DetectSimdLevel(), SimdLevel::kAmx);
  EXPECT_FALSE(UsesAmx(DType::kBF16, SimdLevel::kAmx, 64));
}

TEST(AmxTest, TheLevelFollowsTheCpuAndIsCapped) {
  CpuBackend backend(1);
  if (!AmxSupported()) {
    ExpectNoAmx();
    EXPECT_EQ(backend.ForceSimdLevelForTest(SimdLevel::kAmx).code(),
              absl::StatusCode::kFailedPrecondition);
    return;
  }
  EXPECT_TRUE(SimdLevelSupported(SimdLevel::kAmx));
  EXPECT_EQ(DetectSimdLevel(), SimdLevel::kAmx);
  EXPECT_EQ(backend.Info().simd, "amx");
  EXPECT_TRUE(backend.Info().bf16_rounds_activations);
  setenv("MOE_CPU_SIMD", "avx512", 1);
  EXPECT_EQ(DetectSimdLevel(), SimdLevel::kAvx512);
  unsetenv("MOE_CPU_SIMD");
  EXPECT_TRUE(UsesAmx(DType::kBF16, SimdLevel::kAmx, 64));
  EXPECT_FALSE(
      UsesAmx(DType::kBF16, SimdLevel::kAmx, 48));  // not whole tiles of k
  EXPECT_FALSE(UsesAmx(DType::kBF16, SimdLevel::kAmx, 0));
  EXPECT_FALSE(UsesAmx(DType::kF16, SimdLevel::kAmx, 64));
  EXPECT_FALSE(UsesAmx(DType::kBF16, SimdLevel::kAvx512, 64));
}

// |y - y64| <= 2^-22 (k / 32 + 1) sum_k |x w| + 2^-24 (|bias| + |y64|),
// y64 the float64 product of the rounded activations and the weights:
// TDPBF16PS loses at most a few units of 2^-24 of its 32 products'
// magnitudes to its alignment, each of the k / 32 accumulations rounds
// once, and so does the bias's addition (the share of the bound the worst
// output uses is printed).
TEST(AmxTest, WithinTheFloat64ProductOfTheRoundedActivations) {
  if (!AmxSupported()) return ExpectNoAmx();
  ThreadPool pool(2, /*min_parallel_macs=*/0);
  struct Case {
    int64_t m, n, k;
    float x_sd;
  };
  double worst = 0;
  for (Case c : {Case{1, 45, 1024, 1.0f}, Case{37, 50, 96, 1.0f},
                 Case{16, 16, 32, 3.0f}, Case{33, 70, 2048, 1.0f},
                 Case{5, 17, 64, 1e-3f}, Case{20, 33, 256, 1e4f}}) {
    SCOPED_TRACE(testing::Message() << c.m << "x" << c.n << "x" << c.k);
    const std::vector<float> x = Normal(c.m * c.k, 1, c.x_sd);
    const std::vector<uint16_t> w = ToBf16(Normal(c.n * c.k, 2, 0.05f));
    const std::vector<float> bias = Normal(c.n, 3, 0.5f);
    const std::vector<float> y =
        Product(pool, SimdLevel::kAmx, x, w, bias.data(), c.m, c.n, c.k);
    for (int64_t i = 0; i < c.m; ++i) {
      for (int64_t j = 0; j < c.n; ++j) {
        double want = bias[j], mag = 0;
        for (int64_t t = 0; t < c.k; ++t) {
          const double p = double(BF16ToFloat(FloatToBF16(x[i * c.k + t]))) *
                           BF16ToFloat(w[j * c.k + t]);
          want += p;
          mag += std::fabs(p);
        }
        const double bound =
            std::ldexp(mag * double(c.k / 32 + 1), -22) +
            std::ldexp(std::fabs(bias[j]) + std::fabs(want), -24);
        const double err = std::fabs(double(y[i * c.n + j]) - want);
        ASSERT_LE(err, bound) << "at " << i << "," << j << ": "
                              << y[i * c.n + j] << " vs " << want;
        worst = std::max(worst, err / bound);
      }
    }
  }
  std::cout << "[ amx      ] the worst error is " << worst << " of its bound\n";
  EXPECT_GT(worst, 0.0);  // the tiles ran: f64 sums are not f32 ones
}

TEST(AmxTest, AnOutputsBitsDependOnItsRowAndColumnOnly) {
  if (!AmxSupported()) return ExpectNoAmx();
  const int64_t m = 37, n = 70, k = 96;
  const std::vector<float> x = Normal(m * k, 4, 1.0f);
  const std::vector<uint16_t> w = ToBf16(Normal(n * k, 5, 0.05f));
  const std::vector<float> bias = Normal(n, 6, 0.5f);
  ThreadPool two(2, 0), one(1, 0);
  const std::vector<float> all =
      Product(two, SimdLevel::kAmx, x, w, bias.data(), m, n, k);
  // Each row alone (decode), on one thread.
  for (int64_t i = 0; i < m; ++i) {
    const std::vector<float> xi(x.begin() + i * k, x.begin() + (i + 1) * k);
    const std::vector<float> yi =
        Product(one, SimdLevel::kAmx, xi, w, bias.data(), 1, n, k);
    ASSERT_EQ(0, std::memcmp(yi.data(), all.data() + i * n, n * sizeof(float)))
        << "row " << i;
  }
  // Column ranges that start and end off the 16-row tiles.
  std::vector<uint16_t> xb(static_cast<size_t>(m * k));
  RoundToBf16(x.data(), m * k, xb.data());
  std::vector<uint16_t> packed(static_cast<size_t>(AmxPackedSize(m, k)));
  PackForAmx(xb.data(), m, k, packed.data());
  std::vector<float> split(all.size(), NAN);
  const MatMulArgs a{
      nullptr, w.data(), DType::kBF16, bias.data(), split.data(), m, n, k};
  for (auto [b, e] :
       {std::pair<int64_t, int64_t>{0, 5}, {5, 29}, {29, 30}, {30, 70}}) {
    AmxBf16Columns(packed.data(), a, b, e);
  }
  EXPECT_EQ(0,
            std::memcmp(split.data(), all.data(), all.size() * sizeof(float)));
  // The vdpbf16ps path rounds the same activations but sums otherwise: the
  // tiles really ran.
  const std::vector<float> dot =
      Product(two, SimdLevel::kAvx512, x, w, bias.data(), m, n, k);
  EXPECT_NE(0, std::memcmp(dot.data(), all.data(), all.size() * sizeof(float)));
}

// A k that is not whole tiles takes the vdpbf16ps path, bit for bit.
TEST(AmxTest, AKOffTheTilesIsTheAvx512Product) {
  if (!AmxSupported()) return ExpectNoAmx();
  const int64_t m = 9, n = 20, k = 48;
  const std::vector<float> x = Normal(m * k, 7, 1.0f);
  const std::vector<uint16_t> w = ToBf16(Normal(n * k, 8, 0.05f));
  ThreadPool pool(2, 0);
  EXPECT_EQ(Product(pool, SimdLevel::kAmx, x, w, nullptr, m, n, k),
            Product(pool, SimdLevel::kAvx512, x, w, nullptr, m, n, k));
}

// q8 (kQ8R16) and ggml's Q4_0 (kQ4_0R16) on AMX-INT8: the VNNI kernel's
// bits for every number of activation rows a call (1 to 16), with an odd
// block count (the tail block) and codes at both ends.
TEST(AmxTest, Int8BlocksGiveTheVnniBitsForEveryRowCount) {
  if (!AmxSupported()) return ExpectNoAmx();
  const int64_t m = 37, n = 48;
  for (const int64_t k : {64, 96, 256}) {
    for (const DType plain : {DType::kQ8, DType::kQ4_0}) {
      const DType inter = InterleavedOf(plain);
      SCOPED_TRACE(::testing::Message() << DTypeName(inter) << " k " << k);
      const std::vector<float> wf = Normal(n * k, 11, 0.05f);
      std::vector<uint8_t> rows(static_cast<size_t>(WeightBytes(plain, n, k)));
      if (plain == DType::kQ4_0) {
        ASSERT_TRUE(QuantizeGguf(GgufType::kQ4_0, wf.data(), n * k, rows.data()).ok());
      } else {
        ASSERT_TRUE(ConvertWeights(wf.data(), DType::kF32, n, k, plain, rows.data()).ok());
      }
      if (plain == DType::kQ8) {
        uint8_t* row = rows.data() + 5 * WeightBytes(plain, 1, k);
        row[2] = 0x80;  // -128: only a GGUF Q8_0 file holds it
        row[3] = 0x7F;
      }
      std::vector<uint8_t> w(rows.size());
      ASSERT_TRUE(InterleaveRows16(inter, rows.data(), n, k, w.data()).ok());
      std::vector<float> x = Normal(m * k, 12, 1.0f);
      x[1] = 30.0f;  // codes of +-127 in the first row
      QuantizedActivations qa;
      QuantizeActivations(x.data(), m, k, &qa, ActRoundingFor(inter));
      const std::vector<float> bias = Normal(n, 13, 0.5f);
      const int64_t stride = WeightBytes(inter, 1, k);
      std::vector<float> vnni(static_cast<size_t>(m * n), NAN);
      for (int64_t i = 0; i < m; i += kKMaxRows) {
        const int r = static_cast<int>(std::min<int64_t>(kKMaxRows, m - i));
        SmallRows16Avx512Vnni(inter)(w.data(), stride, n, qa, i, r, bias.data(), &vnni[i * n], n);
      }
      for (int rows_per_call = 1; rows_per_call <= kAmxMaxRows; ++rows_per_call) {
        std::vector<float> tiles(vnni.size(), NAN);
        for (int64_t i = 0; i < m; i += rows_per_call) {
          const int r = static_cast<int>(std::min<int64_t>(rows_per_call, m - i));
          SmallRows16Amx(inter)(w.data(), stride, n, qa, i, r, bias.data(), &tiles[i * n], n);
        }
        ASSERT_EQ(0, std::memcmp(tiles.data(), vnni.data(), vnni.size() * sizeof(float)))
            << rows_per_call << " rows a call";
      }
    }
  }
  EXPECT_EQ(SmallRows16Amx(DType::kQ4R16), nullptr);
}

}  // namespace
}  // namespace moe
