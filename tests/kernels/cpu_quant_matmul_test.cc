// The CPU kernels of the block formats q8 and q4 (kernels/cpu_quant_matmul.h)
// at every SIMD level this CPU has: against the float64 product of the
// dequantized weights and the rounded activations; the AVX-512 activation
// rounding bit for bit the scalar one, its scales ggml's Q8_0; a row's result independent of the
// rows it is computed with (the prompt path's token tiles) and of the thread
// count; the fused gate/up bit for bit two products and SiluMul.
#include "kernels/cpu_quant_matmul.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/quant.h"
#include "gtest/gtest.h"
#include "kernels/cpu_matmul.h"
#include "kernels/cpu_ops.h"
#include "tests/kernels/reference_ops.h"

namespace moe {
namespace {

std::vector<float> Random(size_t n, uint32_t seed, float range = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-range, range);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

std::vector<uint8_t> Quantized(int64_t rows, int64_t cols, DType dt, uint32_t seed) {
  std::vector<float> f = Random(rows * cols, seed);
  std::vector<uint8_t> w(WeightBytes(dt, rows, cols));
  const int64_t row_bytes = WeightBytes(dt, 1, cols);
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_TRUE(QuantizeRow(f.data() + r * cols, cols, dt, w.data() + r * row_bytes).ok());
  }
  return w;
}

std::vector<SimdLevel> Levels() {
  std::vector<SimdLevel> levels;
  for (SimdLevel l : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512, SimdLevel::kAmx}) {
    if (SimdLevelSupported(l)) levels.push_back(l);
  }
  return levels;
}

std::vector<float> Product(ThreadPool& pool, SimdLevel level, const std::vector<float>& x,
                           const std::vector<uint8_t>& w, DType dt, const float* bias,
                           int64_t m, int64_t n, int64_t k) {
  std::vector<float> y(m * n, NAN);
  CpuQuantMatMul(pool, level, {x.data(), w.data(), dt, bias, y.data(), m, n, k});
  return y;
}

struct Shape {
  int64_t m, n, k;
};

// q8 block counts odd and even, below, at and past the 16 blocks of one
// scale gather; q4 likewise; 1 to 9 rows: every token tile and its tails.
constexpr Shape kShapes[] = {{1, 1, 64},    {1, 67, 1088}, {2, 5, 96},   {3, 17, 544},
                             {4, 9, 1024},  {5, 13, 2176}, {7, 3, 128},  {9, 70, 192},
                             {6, 33, 2112}, {8, 4, 64 * 33}};

TEST(CpuQuantMatMulTest, EveryLevelMatchesTheFloat64Reference) {
  ThreadPool pool(3, /*min_parallel_macs=*/0);  // split every product
  for (SimdLevel level : Levels()) {
    for (DType dt : {DType::kQ8, DType::kQ4}) {
      for (const Shape& s : kShapes) {
        if (s.k % QuantGroupSize(dt) != 0) continue;
        SCOPED_TRACE(testing::Message() << SimdLevelName(level) << " " << DTypeName(dt) << " "
                                        << s.m << "x" << s.n << "x" << s.k);
        const auto x = Random(s.m * s.k, 1, 2.0f);
        const auto w = Quantized(s.n, s.k, dt, 2);
        const auto bias = Random(s.n, 3);
        const auto want = ref::MatMul(RoundActivations(x.data(), s.m, s.k), w.data(), dt,
                                      bias.data(), s.m, s.n, s.k);
        const auto got = Product(pool, level, x, w, dt, bias.data(), s.m, s.n, s.k);
        for (size_t i = 0; i < got.size(); ++i) {
          ASSERT_NEAR(got[i], want[i], 4e-6 * std::sqrt(double(s.k)) * (1 + std::fabs(want[i])))
              << "at " << i;
        }
      }
    }
  }
}

// A token's outputs are the same bits whether it is computed alone (decode),
// at any place of a prompt's token tile, or on any number of threads.
TEST(CpuQuantMatMulTest, RowsDoNotDependOnTheirTileOrTheThreadCount) {
  ThreadPool one(1), three(3, /*min_parallel_macs=*/0);  // split every product
  const int64_t m = 9, n = 21, k = 1088;
  for (SimdLevel level : Levels()) {
    for (DType dt : {DType::kQ8, DType::kQ4}) {
      SCOPED_TRACE(testing::Message() << SimdLevelName(level) << " " << DTypeName(dt));
      const auto x = Random(m * k, 4, 3.0f);
      const auto w = Quantized(n, k, dt, 5);
      const auto all = Product(three, level, x, w, dt, nullptr, m, n, k);
      EXPECT_EQ(Product(one, level, x, w, dt, nullptr, m, n, k), all);
      for (int64_t i = 0; i < m; ++i) {
        const std::vector<float> xi(x.begin() + i * k, x.begin() + (i + 1) * k);
        const auto alone = Product(one, level, xi, w, dt, nullptr, 1, n, k);
        for (int64_t j = 0; j < n; ++j) ASSERT_EQ(alone[j], all[i * n + j]) << i << "," << j;
      }
    }
  }
}

// Products of fewer than kHotMinParallelWeights weights and
// kMinParallelMacs multiply-adds are one chunk (the calling thread runs
// them whole), at one row or sixteen; from kMinParallelMacs on they split
// between the threads; in between it depends on whether the workers are
// spinning (ThreadPoolTest.HotSplitsFollowTheWeights).
TEST(CpuQuantMatMulTest, SmallProductsStayOnTheCallingThread) {
  ThreadPool pool(3);
  const int64_t k = 1024;
  const int64_t small = kHotMinParallelWeights / k - 16, large = kMinParallelMacs / k;
  EXPECT_EQ(QuantColumnGrain(pool, 1, small, k, 16), small);
  EXPECT_EQ(QuantColumnGrain(pool, 4, small, k, 16), small);
  EXPECT_LT(QuantColumnGrain(pool, 1, large, k, 16), large);
  EXPECT_LT(QuantColumnGrain(pool, 16, large / 16, k, 16), large / 16);  // rows count too
  ThreadPool split(3, /*min_parallel_macs=*/0);
  EXPECT_LT(QuantColumnGrain(split, 1, 64, 64, 16), 64);
}

TEST(CpuQuantMatMulTest, Avx512RoundingIsTheScalarRounding) {
  if (!Q8VnniSupported()) GTEST_SKIP() << "no AVX-512 VNNI on this CPU";
  const int64_t m = 5, k = 320;
  auto x = Random(m * k, 6, 4.0f);
  for (int64_t i = 0; i < 32; ++i) x[i] = 0.0f;  // an all-zero group
  // A group with max |x| = 127 (scale 1): halves round to even.
  for (int64_t i = 32; i < 64; ++i) x[i] = static_cast<float>(i % 7) - 2.5f;
  x[32] = -127.0f;
  for (int64_t i = 64; i < 96; ++i) x[i] = (i % 2 ? 1 : -1) * 0.5f;
  for (ActRounding r : {ActRounding::kF32, ActRounding::kGgmlQ8_0, ActRounding::kGgmlQ8_1}) {
    QuantizedActivations want;
    QuantizeActivations(x.data(), m, k, &want, r);
    std::vector<int8_t> q(m * k);
    std::vector<float> d(m * k / kActGroup), sd(m * k / kActGroup);
    std::vector<int32_t> sums(m * k / kActGroup);
    QuantizeActivationsAvx512(x.data(), m, k, q.data(), d.data(), sd.data(), sums.data(), r);
    EXPECT_EQ(q, want.q);
    EXPECT_EQ(d, want.d);
    EXPECT_EQ(sums, want.s);
    EXPECT_EQ(sd, want.sd) << static_cast<int>(r);
  }
}

// ggml's 32-weight types meet ggml's Q8_0 scales (max|x| / 127 rounded to
// f16), so both engines multiply the same numbers; where the f16 would be
// infinite the f32 scale stays. Our formats keep the f32 scale.
TEST(CpuQuantMatMulTest, GgmlTypesMeetGgmlQ8_0Scales) {
  EXPECT_EQ(ActRoundingFor(DType::kQ4_0), ActRounding::kGgmlQ8_0);
  EXPECT_EQ(ActRoundingFor(DType::kQ5_1), ActRounding::kGgmlQ8_1);
  EXPECT_EQ(ActRoundingFor(DType::kQ8), ActRounding::kF32);
  EXPECT_EQ(ActRoundingFor(DType::kQ4K), ActRounding::kF32);  // Q8_K: KActivations
  const int64_t m = 2, k = 128;
  auto x = Random(m * k, 8, 3.0f);
  for (int64_t i = 32; i < 64; ++i) x[i] *= 1e7f;  // max|x| / 127 > 65504
  QuantizedActivations ggml, ours;
  QuantizeActivations(x.data(), m, k, &ggml, ActRounding::kGgmlQ8_0);
  QuantizeActivations(x.data(), m, k, &ours);
  for (int64_t g = 0; g < m * k / kActGroup; ++g) {
    float amax = 0.0f;
    for (int64_t t = 0; t < kActGroup; ++t) amax = std::max(amax, std::fabs(x[g * kActGroup + t]));
    const float f16 = HalfToFloat(FloatToHalf(amax / 127.0f));
    EXPECT_EQ(ours.d[g], amax / 127.0f) << g;
    if (g == 1) {
      EXPECT_TRUE(std::isinf(f16));
      EXPECT_EQ(ggml.d[g], amax / 127.0f);
    } else {
      EXPECT_EQ(ggml.d[g], f16) << g;
      EXPECT_NE(ggml.d[g], amax / 127.0f) << g;  // random maxima are not halves
    }
    int32_t sum = 0;
    for (int64_t t = 0; t < kActGroup; ++t) sum += ggml.q[g * kActGroup + t];
    EXPECT_EQ(ggml.sd[g], ggml.d[g] * static_cast<float>(sum)) << g;
    EXPECT_EQ(ggml.q, ours.q);
  }
}

// CpuGateUpSilu is two CpuMatMul calls and SiluMul, bit for bit, for the
// float and the block dtypes, at every level.
TEST(CpuQuantMatMulTest, FusedGateUpIsTwoProductsAndSiluMul) {
  ThreadPool pool(3, /*min_parallel_macs=*/0);  // split every product
  const int64_t n = 70, k = 192;
  for (SimdLevel level : Levels()) {
    for (DType dt : {DType::kBF16, DType::kF32, DType::kQ8, DType::kQ4}) {
      for (int64_t m : {1, 6}) {
        SCOPED_TRACE(testing::Message() << SimdLevelName(level) << " " << DTypeName(dt)
                                        << " m=" << m);
        const auto x = Random(m * k, 7);
        std::vector<uint8_t> gate, up;
        if (IsQuantDType(dt)) {
          gate = Quantized(n, k, dt, 8);
          up = Quantized(n, k, dt, 9);
        } else {
          for (auto* w : {&gate, &up}) {
            const auto f = Random(n * k, w == &gate ? 8 : 9);
            w->resize(n * k * DTypeSize(dt));
            for (int64_t i = 0; i < n * k; ++i) {
              if (dt == DType::kF32) {
                std::memcpy(w->data() + 4 * i, &f[i], 4);
              } else {
                const uint16_t h = FloatToBF16(f[i]);
                std::memcpy(w->data() + 2 * i, &h, 2);
              }
            }
          }
        }
        std::vector<float> g(m * n), u(m * n), want_g(m * n), want_u(m * n);
        CpuMatMul(pool, level, {x.data(), gate.data(), dt, nullptr, want_g.data(), m, n, k});
        CpuMatMul(pool, level, {x.data(), up.data(), dt, nullptr, want_u.data(), m, n, k});
        cpu::SiluMul(level, want_g.data(), want_u.data(), want_g.data(), m * n);
        CpuGateUpSilu(pool, level, x.data(), gate.data(), up.data(), dt, g.data(), u.data(), m,
                      n, k);
        EXPECT_EQ(g, want_g);
      }
    }
  }
}

}  // namespace
}  // namespace moe
