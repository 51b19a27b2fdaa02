// Q4_K, q4 and q8 with 16 rows interleaved (DType::kQ4KR16, kQ4R16,
// kQ8R16; common/row_interleave.h): each layout is a lossless rearrangement
// of its row-major bytes, and the kernels
// that read it (kernels/cpu_gguf_quant.h) give the float64 reference's
// values at every SIMD level with the same bits at every level, thread
// count, row split and activation-row grouping.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/row_interleave.h"
#include "common/mxfp4.h"
#include "common/quant.h"
#include "common/checkpoint.h"
#include "common/fp8.h"
#include "common/gguf_quantize.h"
#include "common/gguf_types.h"
#include "gtest/gtest.h"
#include "kernels/cpu_gguf_quant.h"
#include "kernels/cpu_matmul.h"
#include "kernels/cpu_quant_matmul.h"
#include "kernels/thread_pool.h"
#include "tests/kernels/gguf_test_blocks.h"

namespace moe {
namespace {

using gguf_test::RandomBlocks;

std::vector<uint8_t> Interleaved(const std::vector<uint8_t>& plain, int64_t n,
                                 int64_t k) {
  std::vector<uint8_t> out(plain.size());
  EXPECT_TRUE(InterleaveQ4KRows16(plain.data(), n, k, out.data()).ok());
  return out;
}

std::vector<SimdLevel> Levels() { return gguf_test::SupportedLevels(); }

TEST(Q4KRows16LayoutTest, InterleavingIsLosslessAndMovesEveryByte) {
  std::mt19937 rng(3);
  for (const int64_t n : {16, 48}) {
    for (const int64_t k : {256, 768}) {
      const std::vector<uint8_t> plain = RandomBlocks(DType::kQ4K, n, k, rng);
      ASSERT_EQ(static_cast<int64_t>(plain.size()),
                WeightBytes(DType::kQ4KR16, n, k));
      const std::vector<uint8_t> inter = Interleaved(plain, n, k);
      EXPECT_NE(inter, plain);
      std::vector<uint8_t> back(plain.size());
      ASSERT_TRUE(DeinterleaveQ4KRows16(inter.data(), n, k, back.data()).ok());
      EXPECT_EQ(back, plain) << n << "x" << k;
      // Each row group starts where its first row does: the groups of the
      // rows [16, n) are the interleaving of those rows alone.
      const int64_t row_bytes = WeightBytes(DType::kQ4K, 1, k);
      if (n > 16) {
        std::vector<uint8_t> tail(plain.begin() + 16 * row_bytes, plain.end());
        const std::vector<uint8_t> tail_inter = Interleaved(tail, n - 16, k);
        EXPECT_TRUE(std::equal(tail_inter.begin(), tail_inter.end(),
                               inter.begin() + 16 * row_bytes));
      }
    }
  }
}

TEST(Q4KRows16LayoutTest, ConversionsGoThroughTheLayout) {
  std::mt19937 rng(5);
  const int64_t n = 32, k = 512;
  const std::vector<uint8_t> plain = RandomBlocks(DType::kQ4K, n, k, rng);
  std::vector<uint8_t> inter(plain.size()), back(plain.size());
  ASSERT_TRUE(ConvertWeights(plain.data(), DType::kQ4K, n, k, DType::kQ4KR16,
                             inter.data())
                  .ok());
  EXPECT_EQ(inter, Interleaved(plain, n, k));
  ASSERT_TRUE(ConvertWeights(inter.data(), DType::kQ4KR16, n, k, DType::kQ4K,
                             back.data())
                  .ok());
  EXPECT_EQ(back, plain);
  // To floats: the decoded Q4_K rows.
  std::vector<float> a(static_cast<size_t>(n * k)), b(a.size());
  ASSERT_TRUE(
      ConvertWeights(plain.data(), DType::kQ4K, n, k, DType::kF32, a.data())
          .ok());
  ASSERT_TRUE(
      ConvertWeights(inter.data(), DType::kQ4KR16, n, k, DType::kF32, b.data())
          .ok());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
}

TEST(Q4KRows16LayoutTest, RefusesPartialGroups) {
  std::vector<uint8_t> buf(
      static_cast<size_t>(WeightBytes(DType::kQ4K, 24, 256)));
  std::vector<uint8_t> out(buf.size());
  const absl::Status s = InterleaveQ4KRows16(buf.data(), 24, 256, out.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("groups of 16 rows"), std::string::npos) << s;
  EXPECT_FALSE(DeinterleaveQ4KRows16(buf.data(), 16, 100, out.data()).ok());
  EXPECT_FALSE(ConvertWeights(buf.data(), DType::kQ4K, 24, 256, DType::kQ4KR16,
                              out.data())
                   .ok());
  EXPECT_EQ(RowGroupOf(DType::kQ4KR16), 16);
  EXPECT_EQ(RowGroupOf(DType::kQ4K), 1);
  EXPECT_EQ(DTypeName(DType::kQ4KR16), "Q4_Kx16");
  EXPECT_EQ(*ParseWeightDType("Q4_Kx16"), DType::kQ4KR16);
  EXPECT_FALSE(ParseDType("Q4_Kx16").ok());  // never a file's dtype
}

// Through CpuMatMul (the thread pool's row split, the kernels' activation
// row grouping) at every level, 1 and 3 threads: within the float64
// reference's tolerance (that of gguf_quant_matmul_test), and the same
// bits everywhere.
TEST(Q4KRows16KernelTest, MatchesTheReferenceWithTheSameBitsEverywhere) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  ThreadPool one(1), three(3, /*min_parallel_macs=*/0);  // split every product
  struct Shape {
    int64_t m, n, k;
  };
  for (const Shape s :
       {Shape{1, 16, 256}, Shape{1, 64, 1024}, Shape{3, 32, 512},
        Shape{5, 48, 768}, Shape{9, 16, 256}, Shape{4, 512, 256}}) {
    SCOPED_TRACE(::testing::Message()
                 << "m " << s.m << " n " << s.n << " k " << s.k);
    const std::vector<uint8_t> plain = RandomBlocks(DType::kQ4K, s.n, s.k, rng);
    const std::vector<uint8_t> w = Interleaved(plain, s.n, s.k);
    std::vector<float> x(static_cast<size_t>(s.m * s.k));
    for (float& v : x) v = normal(rng);
    x[0] = 9.0f;  // an outlier: a coarse activation block
    if (s.m > 1)
      std::fill(x.begin() + s.k, x.begin() + s.k + 256, 0.0f);  // a zero block
    const gguf_test::Reference ref = gguf_test::Expected(
        DType::kQ4K, plain, RoundKActivations(x.data(), s.m, s.k), s.m, s.n,
        s.k);
    std::vector<float> first;
    for (SimdLevel level : Levels()) {
      for (ThreadPool* pool : {&one, &three}) {
        SCOPED_TRACE(::testing::Message()
                     << SimdLevelName(level) << " threads " << pool->size());
        std::vector<float> y(static_cast<size_t>(s.m * s.n));
        CpuMatMul(*pool, level,
                  MatMulArgs{x.data(), w.data(), DType::kQ4KR16, nullptr,
                             y.data(), s.m, s.n, s.k});
        for (size_t o = 0; o < y.size(); ++o) {
          const double tol = 2e-6 * ref.scale[o] + 1e-30;
          ASSERT_LE(std::fabs(y[o] - ref.y[o]), tol)
              << "output " << o << ": " << y[o] << " vs " << ref.y[o];
        }
        if (first.empty()) {
          first = y;
        } else {
          ASSERT_EQ(
              0, std::memcmp(y.data(), first.data(), y.size() * sizeof(float)));
        }
      }
    }
  }
}

// The rows kernel: any number of activation rows per call and of groups
// give each output the bits it gets alone, and a bias is added last.
TEST(Q4KRows16KernelTest, EachPairGetsTheBitsItGetsAloneAndTheBiasLast) {
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t k = 3 * kKBlock, n = 48;
  const int64_t row_bytes = WeightBytes(DType::kQ4KR16, 1, k);
  const std::vector<uint8_t> w =
      Interleaved(RandomBlocks(DType::kQ4K, n, k, rng), n, k);
  std::vector<float> bias(n);
  for (float& b : bias) b = normal(rng);
  std::vector<float> x(static_cast<size_t>(kKMaxRows * k));
  for (float& v : x) v = normal(rng);
  KActivations qa;
  QuantizeKActivations(x.data(), kKMaxRows, k, &qa);
  for (SimdLevel level : Levels()) {
    SCOPED_TRACE(SimdLevelName(level));
    const GgufKRowsFn f = GgufKRowsFor(DType::kQ4KR16, level);
    ASSERT_NE(f, nullptr);
    std::vector<float> alone(static_cast<size_t>(kKMaxRows * n)),
        plain(alone.size());
    for (int r = 0; r < kKMaxRows; ++r) {
      for (int64_t g = 0; g < n / 16; ++g) {
        f(w.data() + g * 16 * row_bytes, row_bytes, 16, qa, r, 1,
          bias.data() + 16 * g, &alone[static_cast<size_t>(r * n + 16 * g)], n);
        f(w.data() + g * 16 * row_bytes, row_bytes, 16, qa, r, 1, nullptr,
          &plain[static_cast<size_t>(r * n + 16 * g)], n);
      }
    }
    for (size_t o = 0; o < alone.size(); ++o) {
      ASSERT_EQ(alone[o], plain[o] + bias[o % n]) << o;
    }
    for (int rows = 1; rows <= kKMaxRows; ++rows) {
      std::vector<float> together(static_cast<size_t>(kKMaxRows * n));
      f(w.data(), row_bytes, n, qa, 0, rows, bias.data(), together.data(), n);
      for (int r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < n; ++c) {
          ASSERT_EQ(together[static_cast<size_t>(r * n + c)],
                    alone[static_cast<size_t>(r * n + c)])
              << rows << " rows, output " << r << "," << c;
        }
      }
    }
  }
}

// Extreme blocks: every scale and min 63, every code 15, activations at
// +-127 (the integer sums' largest magnitudes), and huge f16 scales: the
// levels still agree bit for bit (no int32 overflow in the SIMD sums).
TEST(Q4KRows16KernelTest, LargestIntegerSumsAgreeAtEveryLevel) {
  const int64_t n = 16, k = 1024;
  std::vector<uint8_t> plain(
      static_cast<size_t>(WeightBytes(DType::kQ4K, n, k)), 0xFF);
  for (int64_t b = 0; b < n * k / 256; ++b) {
    const uint16_t d = FloatToHalf(b % 2 == 0 ? 60000.0f : -3.0f);
    const uint16_t dmin = FloatToHalf(b % 3 == 0 ? 0.5f : 60000.0f);
    std::memcpy(&plain[static_cast<size_t>(b * 144)], &d, 2);
    std::memcpy(&plain[static_cast<size_t>(b * 144 + 2)], &dmin, 2);
  }
  const std::vector<uint8_t> w = Interleaved(plain, n, k);
  std::vector<float> x(static_cast<size_t>(2 * k));
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = i < static_cast<size_t>(k) ? 1.0f : -1.0f;
  const gguf_test::Reference ref = gguf_test::Expected(
      DType::kQ4K, plain, RoundKActivations(x.data(), 2, k), 2, n, k);
  ThreadPool pool(1);
  std::vector<float> first;
  for (SimdLevel level : Levels()) {
    std::vector<float> y(static_cast<size_t>(2 * n));
    CpuMatMul(pool, level,
              MatMulArgs{x.data(), w.data(), DType::kQ4KR16, nullptr, y.data(),
                         2, n, k});
    for (size_t o = 0; o < y.size(); ++o) {
      ASSERT_LE(std::fabs(y[o] - ref.y[o]), 2e-6 * ref.scale[o])
          << SimdLevelName(level) << o;
    }
    if (first.empty()) first = y;
    EXPECT_EQ(0, std::memcmp(y.data(), first.data(), y.size() * sizeof(float)))
        << SimdLevelName(level);
  }
}

}  // namespace
}  // namespace moe

namespace moe {
namespace {

// Our q4 and q8, and ggml's Q4_0, with 16 rows interleaved (kQ4R16,
// kQ8R16, kQ4_0R16).
std::vector<uint8_t> Quantized(DType dtype, int64_t n, int64_t k, std::mt19937& rng,
                               std::vector<float>* f) {
  std::normal_distribution<float> normal(0.0f, 0.05f);
  f->resize(static_cast<size_t>(n * k));
  for (float& v : *f) v = normal(rng);
  std::vector<uint8_t> q(static_cast<size_t>(WeightBytes(dtype, n, k)));
  if (dtype == DType::kQ4_0) {  // ggml's quantizer (only files hold Q4_0)
    EXPECT_TRUE(QuantizeGguf(GgufType::kQ4_0, f->data(), n * k, q.data()).ok());
  } else {
    EXPECT_TRUE(ConvertWeights(f->data(), DType::kF32, n, k, dtype, q.data()).ok());
  }
  return q;
}

constexpr DType kSmallPlain[] = {DType::kQ4, DType::kQ8, DType::kQ4_0};

TEST(SmallRows16LayoutTest, InterleavingIsLosslessAndConversionsGoThroughIt) {
  std::mt19937 rng(23);
  const int64_t n = 48, k = 192;
  for (DType plain_dtype : kSmallPlain) {
    const DType inter_dtype = InterleavedOf(plain_dtype);
    SCOPED_TRACE(DTypeName(inter_dtype));
    std::vector<float> f;
    const std::vector<uint8_t> plain = Quantized(plain_dtype, n, k, rng, &f);
    ASSERT_EQ(static_cast<int64_t>(plain.size()), WeightBytes(inter_dtype, n, k));
    std::vector<uint8_t> inter(plain.size()), back(plain.size()), direct(plain.size());
    ASSERT_TRUE(InterleaveRows16(inter_dtype, plain.data(), n, k, inter.data()).ok());
    EXPECT_NE(inter, plain);
    ASSERT_TRUE(DeinterleaveRows16(inter_dtype, inter.data(), n, k, back.data()).ok());
    EXPECT_EQ(back, plain);
    // Floats straight to the interleaved layout: quantized, then interleaved
    // (ggml's types are only read from files: refused like their rows).
    const absl::Status direct_status =
        ConvertWeights(f.data(), DType::kF32, n, k, inter_dtype, direct.data());
    if (plain_dtype == DType::kQ4_0) {
      EXPECT_EQ(direct_status.code(), absl::StatusCode::kInvalidArgument);
    } else {
      ASSERT_TRUE(direct_status.ok()) << direct_status;
      EXPECT_EQ(direct, inter);
    }
    std::vector<float> a(f.size()), b(f.size());
    ASSERT_TRUE(ConvertWeights(plain.data(), plain_dtype, n, k, DType::kF32, a.data()).ok());
    ASSERT_TRUE(ConvertWeights(inter.data(), inter_dtype, n, k, DType::kF32, b.data()).ok());
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
    EXPECT_EQ(RowMajorOf(inter_dtype), plain_dtype);
    EXPECT_EQ(InterleavedHeld(plain_dtype, 48, 192, true), inter_dtype);
    EXPECT_EQ(InterleavedHeld(plain_dtype, 40, 192, true), plain_dtype);  // not whole groups
    EXPECT_EQ(InterleavedHeld(plain_dtype, 48, 192, false), plain_dtype);
    EXPECT_FALSE(InterleaveRows16(inter_dtype, plain.data(), 40, k, inter.data()).ok());
    EXPECT_EQ(RowGroupOf(inter_dtype), 16);
    EXPECT_EQ(*ParseWeightDType(DTypeName(inter_dtype)), inter_dtype);
  }
  EXPECT_EQ(InterleavedOf(DType::kQ4), DType::kQ4R16);
  EXPECT_EQ(InterleavedOf(DType::kQ8), DType::kQ8R16);
  EXPECT_EQ(InterleavedOf(DType::kQ4_0), DType::kQ4_0R16);
  EXPECT_EQ(DTypeName(DType::kQ4_0R16), "Q4_0x16");
  EXPECT_EQ(ActRoundingFor(DType::kQ4_0R16), ActRounding::kGgmlQ8_0);
  EXPECT_EQ(InterleavedHeld(DType::kMxfp4, 48, 192, true), DType::kMxfp4);
  EXPECT_EQ(DTypeName(DType::kQ4R16), "Q4x16");
  EXPECT_EQ(DTypeName(DType::kQ8R16), "Q8x16");
  EXPECT_EQ(InterleaveRows16(DType::kQ8, nullptr, 16, 32, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

// The q8 layout moves the codes as they are: a GGUF Q8_0 code of -128 (a
// byte no quantizer of ours writes) survives both ways.
TEST(SmallRows16LayoutTest, Q8CodesOfEveryValueSurvive) {
  const int64_t n = 16, k = 256;
  std::vector<uint8_t> plain(static_cast<size_t>(WeightBytes(DType::kQ8, n, k)));
  for (size_t i = 0; i < plain.size(); ++i) plain[i] = static_cast<uint8_t>(i * 7 + 3);
  std::vector<uint8_t> inter(plain.size()), back(plain.size());
  ASSERT_TRUE(InterleaveQ8Rows16(plain.data(), n, k, inter.data()).ok());
  ASSERT_TRUE(DeinterleaveQ8Rows16(inter.data(), n, k, back.data()).ok());
  EXPECT_EQ(back, plain);
  uint8_t blk[34];
  Q8R16RowBlock(inter.data(), 5, blk);
  EXPECT_EQ(0, std::memcmp(blk, plain.data() + 5 * WeightBytes(DType::kQ8, 1, k), 34));
}

// Views that every loader converts row by row (strided fused experts here)
// reach an interleaved layout through the row-major one, never as rows
// labelled interleaved; QuantizeRow refuses the interleaved dtypes.
TEST(SmallRows16LayoutTest, StridedViewsAreInterleavedWholeGroups) {
  std::mt19937 rng(31);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  const int64_t n = 32, k = 128;
  std::vector<float> t(static_cast<size_t>(k * n));  // [k, n]: the view is its transpose
  for (float& v : t) v = normal(rng);
  TensorView view;
  view.dtype = DType::kF32;
  view.shape = {n, k};
  view.data = reinterpret_cast<const uint8_t*>(t.data());
  view.nbytes = t.size() * sizeof(float);
  view.row_stride = 1;
  view.col_stride = n;
  std::vector<uint8_t> got;
  for (DType plain_dtype : {DType::kQ4, DType::kQ8}) {  // (Q4_0: files only)
    const DType inter_dtype = InterleavedOf(plain_dtype);
    std::vector<uint8_t> plain(static_cast<size_t>(WeightBytes(plain_dtype, n, k)));
    std::vector<uint8_t> expected(plain.size());
    got.assign(plain.size(), 0);
    ASSERT_TRUE(ConvertWeightView(view, plain_dtype, plain.data()).ok());
    ASSERT_TRUE(InterleaveRows16(inter_dtype, plain.data(), n, k, expected.data()).ok());
    ASSERT_TRUE(ConvertWeightView(view, inter_dtype, got.data()).ok());
    EXPECT_EQ(got, expected) << DTypeName(inter_dtype);
  }
  std::vector<float> row(static_cast<size_t>(k), 0.5f);
  for (DType d : {DType::kQ4R16, DType::kQ4KR16, DType::kQ8R16, DType::kQ4_0R16}) {
    const absl::Status s = QuantizeRow(row.data(), k, d, got.data());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << DTypeName(d);
  }
}

// Through CpuMatMul at every level, 1 and 3 threads: within the float64
// product of the dequantized weights and the rounded activations, and the
// same bits everywhere, whatever rows a call groups.
TEST(SmallRows16KernelTest, MatchesTheReferenceWithTheSameBitsEverywhere) {
  std::mt19937 rng(29);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  ThreadPool one(1), three(3, /*min_parallel_macs=*/0);  // split every product
  struct Shape {
    int64_t m, n, k;
  };
  for (DType plain_dtype : kSmallPlain) {
    const DType inter_dtype = InterleavedOf(plain_dtype);
    for (const Shape s : {Shape{1, 16, 64}, Shape{1, 64, 1024}, Shape{3, 32, 192},
                          Shape{5, 48, 512}, Shape{9, 16, 128}, Shape{20, 32, 128},
                          Shape{37, 16, 256}}) {
      SCOPED_TRACE(::testing::Message() << DTypeName(inter_dtype) << " m " << s.m << " n "
                                        << s.n << " k " << s.k);
      std::vector<float> f;
      std::vector<uint8_t> plain = Quantized(plain_dtype, s.n, s.k, rng, &f);
      if (plain_dtype == DType::kQ8) {
        // Codes at both ends (-128 only a GGUF Q8_0 file holds) in row 3.
        uint8_t* row = plain.data() + 3 * WeightBytes(DType::kQ8, 1, s.k);
        row[2] = 0x80;
        row[3] = 0x7F;
        row[4] = 0x81;
      }
      std::vector<uint8_t> w(plain.size());
      ASSERT_TRUE(InterleaveRows16(inter_dtype, plain.data(), s.n, s.k, w.data()).ok());
      std::vector<float> x(static_cast<size_t>(s.m * s.k));
      for (float& v : x) v = normal(rng);
      x[0] = 9.0f;
      // (Q4_0 meets ggml's Q8_0 activation scales: ActRoundingFor.)
      const std::vector<float> xr =
          RoundActivations(x.data(), s.m, s.k, ActRoundingFor(inter_dtype));
      std::vector<float> wd(f.size());
      ASSERT_TRUE(
          ConvertWeights(plain.data(), plain_dtype, s.n, s.k, DType::kF32, wd.data()).ok());
      std::vector<float> first;
      for (SimdLevel level : Levels()) {
        for (ThreadPool* pool : {&one, &three}) {
          SCOPED_TRACE(::testing::Message() << SimdLevelName(level) << " threads "
                                            << pool->size());
          std::vector<float> y(static_cast<size_t>(s.m * s.n));
          CpuMatMul(*pool, level,
                    MatMulArgs{x.data(), w.data(), inter_dtype, nullptr, y.data(), s.m, s.n,
                               s.k});
          for (int64_t i = 0; i < s.m; ++i) {
            for (int64_t j = 0; j < s.n; ++j) {
              double ref = 0, scale = 0;
              for (int64_t c = 0; c < s.k; ++c) {
                ref += double(wd[j * s.k + c]) * xr[i * s.k + c];
                scale += std::fabs(double(wd[j * s.k + c]) * xr[i * s.k + c]);
              }
              ASSERT_NEAR(y[i * s.n + j], ref, 1e-5 * scale + 1e-6) << i << "," << j;
            }
          }
          if (first.empty()) {
            first = y;
          } else {
            ASSERT_EQ(0, std::memcmp(y.data(), first.data(), y.size() * sizeof(float)));
          }
        }
      }
      // A rows kernel call per activation row gives the same bits.
      for (SimdLevel level : Levels()) {
        QuantizedActivations qa;
        QuantizeActivations(x.data(), s.m, s.k, &qa, ActRoundingFor(inter_dtype));
        std::vector<float> alone(first.size());
        for (int64_t i = 0; i < s.m; ++i) {
          SmallRows16For(inter_dtype, level)(w.data(), WeightBytes(inter_dtype, 1, s.k), s.n,
                                             qa, i, 1, nullptr, &alone[i * s.n], s.n);
        }
        EXPECT_EQ(0, std::memcmp(alone.data(), first.data(), first.size() * sizeof(float)))
            << SimdLevelName(level);
      }
    }
  }
  EXPECT_EQ(SmallRows16For(DType::kQ8, SimdLevel::kScalar), nullptr);
}

}  // namespace
}  // namespace moe
