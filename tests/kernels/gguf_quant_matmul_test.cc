// The CPU products that read ggml's blocks (kernels/cpu_gguf_quant.h,
// through CpuMatMul's dispatch) against a float64 reference built from
// the ggml decoders (common/gguf_blocks.h): every ggml block dtype, every
// SIMD level this machine runs plus the scalar path, odd shapes, 1 and 3
// threads. Random blocks (every code, scale and min bit pattern, finite
// f16 scales) rather than quantized floats, so that every field matters.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/gguf_blocks.h"
#include "gtest/gtest.h"
#include "kernels/cpu_gguf_quant.h"
#include "tests/kernels/gguf_test_blocks.h"
#include "kernels/cpu_matmul.h"
#include "kernels/cpu_quant_matmul.h"
#include "kernels/thread_pool.h"

namespace moe {
namespace {

constexpr auto& kGgufDTypes = gguf_test::kGgufBlockDTypes;
using gguf_test::RandomBlocks;
using gguf_test::Reference;

// y = dequantized W (ggml's decoder) x the activations rounded as the
// kernels round them, in float64 (gguf_test::Expected, with its scale).
Reference Expected(DType t, const std::vector<uint8_t>& w,
                   const std::vector<float>& x, int64_t m, int64_t n,
                   int64_t k) {
  // The 32-weight types meet activations rounded per 32, the K-quants per
  // 256 (kernels/cpu_gguf_quant.h).
  const std::vector<float> xr = IsGgufKDType(t)
                                    ? RoundKActivations(x.data(), m, k)
                                    : RoundActivations(x.data(), m, k, ActRoundingFor(t));
  return gguf_test::Expected(t, w, xr, m, n, k, &x);
}

std::vector<SimdLevel> Levels() { return gguf_test::SupportedLevels(); }

// Random blocks of `t` through CpuMatMul at every level, 1 and 3 threads,
// against Expected().
void CheckAgainstTheReference(DType t) {
  const int64_t g = QuantGroupSize(t);
  std::mt19937 rng(static_cast<uint32_t>(t) * 7919u);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  ThreadPool one(1), three(3, /*min_parallel_macs=*/0);  // split every product
  struct Shape {
    int64_t m, n, k;
  };
  // m = 1 with n = 37: decode, split between 3 threads.
  for (const Shape s : {Shape{1, 1, g}, Shape{1, 37, 2 * g}, Shape{3, 7, 3 * g},
                        Shape{5, 33, 2 * g},
                        Shape{2, 65, (g == 256 ? 4 : 9) * g}}) {
    SCOPED_TRACE(::testing::Message() << DTypeName(t) << " m " << s.m << " n "
                                      << s.n << " k " << s.k);
    const std::vector<uint8_t> w = RandomBlocks(t, s.n, s.k, rng);
    std::vector<float> x(static_cast<size_t>(s.m * s.k));
    for (float& v : x) v = normal(rng);
    x[0] = 9.0f;  // an outlier: a coarse activation group
    const Reference ref = Expected(t, w, x, s.m, s.n, s.k);
    for (SimdLevel level : Levels()) {
      SCOPED_TRACE(std::string(SimdLevelName(level)));
      std::vector<float> y1(static_cast<size_t>(s.m * s.n)), y3(y1.size());
      CpuMatMul(
          one, level,
          MatMulArgs{x.data(), w.data(), t, nullptr, y1.data(), s.m, s.n, s.k});
      CpuMatMul(
          three, level,
          MatMulArgs{x.data(), w.data(), t, nullptr, y3.data(), s.m, s.n, s.k});
      EXPECT_EQ(y1, y3);  // one thread reduces each output, in order
      double worst = 0;
      for (size_t o = 0; o < y1.size(); ++o) {
        // f32 rounding of each group's scale product and of the sums of
        // up to a hundred group terms: tens of f32 ulps (6e-8 each) of the
        // largest partial sums at most; measured worst: 0.8% of this.
        const double tol = 2e-6 * ref.scale[o] + 1e-30;
        const double err = std::fabs(y1[o] - ref.y[o]);
        worst = std::max(worst, err / tol);
        EXPECT_LE(err, tol)
            << "output " << o << ": " << y1[o] << " vs " << ref.y[o];
        if (err > tol) return;
      }
      std::printf("[%s %s %ldx%ldx%ld] worst error %.3g of the tolerance\n",
                  std::string(DTypeName(t)).c_str(),
                  std::string(SimdLevelName(level)).c_str(),
                  static_cast<long>(s.m), static_cast<long>(s.n),
                  static_cast<long>(s.k), worst);
    }
  }
}

class GgufQuantMatMulTest : public ::testing::TestWithParam<DType> {};

TEST_P(GgufQuantMatMulTest, MatchesTheFloat64ReferenceAtEveryLevel) {
  CheckAgainstTheReference(GetParam());
}

// GGUF Q8_0 experts run on the q8 kernels (kQ8 is Q8_0 byte for byte),
// including blocks with the code -128, which our quantizer never writes
// but a GGUF file may hold (random bytes hold many).
TEST(GgufQ8_0Test, RandomQ8_0BlocksMatchTheReferenceAtEveryLevel) {
  CheckAgainstTheReference(DType::kQ8);
}

// A product of several activation rows gives each row the bits it gets
// alone (a prompt and a decode step agree), at every level, every type.
TEST_P(GgufQuantMatMulTest, EachRowGetsTheBitsItGetsAlone) {
  const DType t = GetParam();
  std::mt19937 rng(29);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t m = 6, n = 9, k = QuantGroupSize(t) * (QuantGroupSize(t) == 256 ? 2 : 8);
  const std::vector<uint8_t> w = RandomBlocks(t, n, k, rng);
  std::vector<float> x(static_cast<size_t>(m * k));
  for (float& v : x) v = normal(rng);
  ThreadPool pool(2, /*min_parallel_macs=*/0);  // split every product
  for (SimdLevel level : Levels()) {
    SCOPED_TRACE(std::string(SimdLevelName(level)));
    std::vector<float> together(static_cast<size_t>(m * n));
    CpuMatMul(pool, level, MatMulArgs{x.data(), w.data(), t, nullptr, together.data(), m, n, k});
    for (int64_t i = 0; i < m; ++i) {
      std::vector<float> alone(static_cast<size_t>(n));
      CpuMatMul(pool, level,
                MatMulArgs{x.data() + i * k, w.data(), t, nullptr, alone.data(), 1, n, k});
      for (int64_t j = 0; j < n; ++j) EXPECT_EQ(together[i * n + j], alone[j]) << i << " " << j;
    }
  }
}

// One thread's kept activations serve products of every dtype in turn: a
// product gives the same bits after any other (a stale kernel from the
// previous dtype once ran a Q4_0 kernel on Q4_K rows).
TEST(GgufQuantMatMulTurnsTest, DtypesInTurnGiveTheirOwnResults) {
  std::mt19937 rng(31);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t m = 1, n = 16, k = 512;
  std::vector<float> x(static_cast<size_t>(m * k));
  for (float& v : x) v = normal(rng);
  const DType order[] = {DType::kQ4_0, DType::kQ4K, DType::kQ8, DType::kQ6K, DType::kQ5_1,
                         DType::kQ5K, DType::kQ4_0, DType::kQ4K};
  std::vector<std::vector<uint8_t>> w;
  for (DType t : order) w.push_back(RandomBlocks(t, n, k, rng));
  ThreadPool pool(1);
  for (SimdLevel level : Levels()) {
    SCOPED_TRACE(std::string(SimdLevelName(level)));
    std::vector<std::vector<float>> first;
    for (int pass = 0; pass < 2; ++pass) {
      for (size_t o = 0; o < std::size(order); ++o) {
        // Pass 0 in order, pass 1 backwards: each product follows another dtype.
        const size_t p = pass == 0 ? o : std::size(order) - 1 - o;
        std::vector<float> y(static_cast<size_t>(m * n));
        CpuMatMul(pool, level, MatMulArgs{x.data(), w[p].data(), order[p], nullptr, y.data(), m, n, k});
        if (pass == 0) {
          first.push_back(y);
        } else {
          EXPECT_EQ(y, first[p]) << DTypeName(order[p]);
        }
      }
    }
  }
}

// Bias goes on top; the dispatch picks a kernel for every level.
TEST_P(GgufQuantMatMulTest, AddsTheBiasAndHasAKernelAtEveryLevel) {
  const DType t = GetParam();
  if (IsGgufKDType(t)) {
    for (SimdLevel level : Levels()) EXPECT_NE(GgufKRowsFor(t, level), nullptr);
    EXPECT_NE(GgufKRowsScalar(t), nullptr);
    EXPECT_NE(GgufKRowsAvx2(t), nullptr);
    EXPECT_NE(GgufKRowsAvx512Vnni(t), nullptr);
    EXPECT_EQ(GgufDotScalar(t), nullptr);
  } else {
    for (SimdLevel level : Levels()) EXPECT_NE(GgufDotFor(t, level), nullptr);
    EXPECT_NE(GgufDotScalar(t), nullptr);
    EXPECT_NE(GgufDotAvx2(t), nullptr);
    EXPECT_EQ(GgufKRowsScalar(t), nullptr);
  }
  std::mt19937 rng(3);
  const int64_t k = QuantGroupSize(t) * 2;
  const std::vector<uint8_t> w = RandomBlocks(t, 2, k, rng);
  std::vector<float> x(static_cast<size_t>(k), 0.5f);
  const float bias[2] = {100.0f, -100.0f};
  float plain[2], biased[2];
  ThreadPool pool(1);
  CpuMatMul(pool, SimdLevel::kScalar,
            MatMulArgs{x.data(), w.data(), t, nullptr, plain, 1, 2, k});
  CpuMatMul(pool, SimdLevel::kScalar,
            MatMulArgs{x.data(), w.data(), t, bias, biased, 1, 2, k});
  EXPECT_FLOAT_EQ(biased[0], plain[0] + 100.0f);
  EXPECT_FLOAT_EQ(biased[1], plain[1] - 100.0f);
}

INSTANTIATE_TEST_SUITE_P(Types, GgufQuantMatMulTest,
                         ::testing::ValuesIn(kGgufDTypes),
                         gguf_test::DTypeParamName);

// K-quant rows against 1 to 4 activation rows at once, and 1 to 5 weight
// rows a call, give each pair the bits it gets alone, at every level (a
// prompt's tile, a decode step and any split of the rows agree), with each
// row's bias on top; a block of zero activations counts nothing.
TEST(GgufKRowsTest, EachPairGetsTheBitsItGetsAlone) {
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t k = 3 * kKBlock, n = 5;
  const float bias[n] = {0.5f, -1.0f, 2.0f, 0.25f, 8.0f};
  for (DType t : {DType::kQ4K, DType::kQ5K, DType::kQ6K}) {
    const int64_t row_bytes = WeightBytes(t, 1, k);
    const std::vector<uint8_t> w = RandomBlocks(t, n, k, rng);
    std::vector<float> x(static_cast<size_t>(kKMaxRows * k));
    for (float& v : x) v = normal(rng);
    std::fill(x.begin() + k, x.begin() + k + kKBlock, 0.0f);  // row 1, block 0
    KActivations qa;
    QuantizeKActivations(x.data(), kKMaxRows, k, &qa);
    EXPECT_EQ(qa.d[3], 0.0f);
    for (SimdLevel level : Levels()) {
      SCOPED_TRACE(::testing::Message() << DTypeName(t) << " " << SimdLevelName(level));
      const GgufKRowsFn f = GgufKRowsFor(t, level);
      float alone[kKMaxRows][n];
      for (int r = 0; r < kKMaxRows; ++r) {
        for (int c = 0; c < n; ++c) {
          f(w.data() + c * row_bytes, row_bytes, 1, qa, r, 1, bias + c, &alone[r][c], 1);
        }
      }
      for (int rows = 1; rows <= kKMaxRows; ++rows) {
        for (int64_t n_rows = 1; n_rows <= n; ++n_rows) {
          float together[kKMaxRows][n];
          f(w.data(), row_bytes, n_rows, qa, 0, rows, bias, &together[0][0], n);
          for (int r = 0; r < rows; ++r) {
            for (int c = 0; c < n_rows; ++c) {
              EXPECT_EQ(together[r][c], alone[r][c]) << rows << "x" << n_rows << " " << r << c;
            }
          }
        }
      }
      float plain;
      f(w.data(), row_bytes, 1, qa, 2, 1, nullptr, &plain, 1);
      EXPECT_EQ(plain + bias[0], alone[2][0]);
    }
  }
}

// The K-quants' activations are ggml's Q8_K: codes and bit-sums as its
// reference quantizer writes them (it stores both negated), here written out
// from its definition: iscale = -127 / (the signed value of max |x|).
TEST(GgufKRowsTest, ActivationsAreGgmlsQ8K) {
  std::mt19937 rng(19);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(2 * kKBlock);
  for (float& v : x) v = normal(rng);
  x[7] = -4.5f;  // the block's max |x| is negative
  KActivations qa;
  QuantizeKActivations(x.data(), 1, 2 * kKBlock, &qa);
  for (int b = 0; b < 2; ++b) {
    float max = 0, amax = 0;
    for (int j = 0; j < kKBlock; ++j) {
      if (std::fabs(x[b * kKBlock + j]) > amax) {
        amax = std::fabs(x[b * kKBlock + j]);
        max = x[b * kKBlock + j];
      }
    }
    const float iscale = -127.0f / max;
    for (int j = 0; j < kKBlock; ++j) {
      const int v = std::min(127, static_cast<int>(std::nearbyint(iscale * x[b * kKBlock + j])));
      const int ours = qa.q[b * kKBlock + j];
      ASSERT_EQ(max < 0 ? ours : -ours, v) << b << " " << j;
    }
    EXPECT_EQ(std::fabs(qa.d[b]), std::fabs(1 / iscale));
    for (int t = 0; t < 16; ++t) {
      int sum = 0;
      for (int l = 0; l < 16; ++l) sum += qa.q[b * kKBlock + 16 * t + l];
      EXPECT_EQ(qa.bsums[b * 16 + t], sum);
    }
  }
}

// The AVX-512 rounding of the K activations is the scalar one, bit for bit:
// random rows, exact halves (ties round to even), a block of zeros, tiny
// and huge values.
TEST(GgufKRowsTest, Avx512ActivationsEqualTheScalarOnes) {
  if (!Q8VnniSupported()) GTEST_SKIP() << "no AVX-512 VNNI on this CPU";
  std::mt19937 rng(23);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  const int64_t m = 3, k = 4 * kKBlock;
  std::vector<float> x(static_cast<size_t>(m * k));
  for (float& v : x) v = normal(rng);
  x[0] = 127.0f;  // block 0: codes are the values, halves are ties
  for (int j = 1; j < 40; ++j) x[j] = static_cast<float>(j) - 20.5f;
  std::fill(x.begin() + kKBlock, x.begin() + 2 * kKBlock, 0.0f);
  for (int j = 0; j < kKBlock; ++j) x[2 * kKBlock + j] *= 1e-30f;
  for (int j = 0; j < kKBlock; ++j) x[3 * kKBlock + j] *= 1e30f;
  KActivations want, got;
  QuantizeKActivations(x.data(), m, k, &want);
  QuantizeKActivationsAvx512(x.data(), m, k, &got);
  EXPECT_EQ(got.m, m);
  EXPECT_EQ(got.k, k);
  EXPECT_EQ(got.q, want.q);
  EXPECT_EQ(got.d, want.d);
  EXPECT_EQ(got.bsums, want.bsums);
  EXPECT_EQ(want.q[21], 0);  // 0.5 rounds to 0
  EXPECT_EQ(want.q[22], 2);  // 1.5 rounds to 2
}

// The dtype table: sizes are ggml's, and the names parse back.
TEST(GgufDTypeTest, SizesNamesAndMapping) {
  for (DType t : kGgufDTypes) {
    const GgufTypeInfo& info = GgufTypeInfoOf(*GgufTypeOfDType(t));
    EXPECT_EQ(QuantGroupSize(t), info.block_elems) << DTypeName(t);
    EXPECT_EQ(QuantBlockBytes(t), info.block_bytes) << DTypeName(t);
    EXPECT_EQ(DTypeName(t), info.name);
    EXPECT_TRUE(IsQuantDType(t) && IsGgufBlockDType(t));
    EXPECT_EQ(*ParseWeightDType(DTypeName(t)), t);
    EXPECT_FALSE(ParseDType(DTypeName(t)).ok());  // never a safetensors dtype
    EXPECT_EQ(HeldDTypeOfGguf(info.type), t);
  }
  EXPECT_EQ(WeightBytes(DType::kQ4K, 3, 512), 3 * 2 * 144);
  EXPECT_EQ(WeightBytes(DType::kQ6K, 1, 300), -1);
  EXPECT_EQ(HeldDTypeOfGguf(GgufType::kQ8_0), DType::kQ8);
  EXPECT_EQ(HeldDTypeOfGguf(GgufType::kMXFP4), DType::kMxfp4);
  EXPECT_FALSE(HeldDTypeOfGguf(GgufType::kQ2_K).has_value());
  EXPECT_FALSE(IsGgufBlockDType(DType::kQ8) || IsGgufBlockDType(DType::kMxfp4));
}

// ggml's MXFP4 nibble order repacked into kMxfp4's: the same 32 values.
TEST(GgufDTypeTest, Mxfp4RepackKeepsEveryWeight) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> byte(0, 255);
  std::vector<uint8_t> ggml(17 * 5), ours(ggml.size());
  for (uint8_t& b : ggml) b = static_cast<uint8_t>(byte(rng));
  for (int b = 0; b < 5; ++b) ggml[17 * b] = static_cast<uint8_t>(110 + 4 * b);
  RepackGgufMxfp4(ggml.data(), 5, ours.data());
  std::vector<float> want(160), got(160);
  ASSERT_TRUE(
      DequantizeGguf(GgufType::kMXFP4, ggml.data(), 160, want.data()).ok());
  DequantizeRow(ours.data(), DType::kMxfp4, 160, got.data());
  EXPECT_EQ(got, want);
}

}  // namespace
}  // namespace moe
