// The CUDA kernels' block math (kernels/cuda/gguf_block_math.h), compiled
// for the host, against the CPU: the same activation codes as the CPU
// quantizers, the same codes and scales as ggml's decoders, and per output
// the bits of the CPU's scalar kernels when its terms are added in the
// CPU's order; in the orders of the CUDA GEMV and tiled kernels, within
// 1e-6 of the sum of |terms|; and the float64 product of the decoded
// weights, within the f32 and the activation rounding bounds. This is the
// code the GPU runs (gguf_gemm.cu), checked where there is no GPU.
#include "kernels/cuda/gguf_block_math.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ios>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "common/dtype.h"
#include "gtest/gtest.h"
#include "kernels/cpu_gguf_quant.h"
#include "kernels/cpu_quant_matmul.h"
#include "tests/kernels/gguf_test_blocks.h"

namespace moe {
namespace {

namespace gm = gguf_math;
using gguf_test::kGgufBlockDTypes;
using gguf_test::RandomBlocks;

using gguf_test::WithKind;

// Activations as the header's quantizers round them (the CUDA kernels'
// operations): per 32 (q, d, sd) or per 256 (q, d, bsums).
struct Acts {
  int64_t k = 0;
  std::vector<int8_t> q;
  std::vector<float> d, sd;
  std::vector<int16_t> bsums;
};
Acts Quantize(bool per256, const std::vector<float>& x, int64_t m, int64_t k,
              bool q8_1 = false) {
  Acts a;
  a.k = k;
  const int64_t group = per256 ? 256 : 32, groups = m * k / group;
  a.q.resize(static_cast<size_t>(m * k));
  a.d.resize(static_cast<size_t>(groups));
  if (per256) {
    a.bsums.resize(static_cast<size_t>(m * k / 16));
    for (int64_t g = 0; g < groups; ++g) {
      gm::QuantizeGroup256(&x[g * 256], &a.q[g * 256], &a.d[g],
                           &a.bsums[g * 16]);
    }
  } else {
    a.sd.resize(static_cast<size_t>(groups));
    for (int64_t g = 0; g < groups; ++g) {
      gm::QuantizeGroup32(&x[g * 32], &a.q[g * 32], &a.d[g], &a.sd[g], q8_1);
    }
  }
  return a;
}

// The CUDA warp reduction (WarpSum: v += shfl_xor(v, o), o = 16 .. 1) as
// lane 0 sees it.
float Butterfly(std::vector<float> lanes) {
  for (int o = 16; o > 0; o /= 2) {
    std::vector<float> next(32);
    for (int l = 0; l < 32; ++l) next[l] = lanes[l] + lanes[l ^ o];
    lanes = next;
  }
  return lanes[0];
}

// One output (weight row `w` . activation row i) from the block math.
struct Dot {
  float cpu_order = 0;   // terms added as the CPU scalar kernel adds them
  float gemv_order = 0;  // as the CUDA GEMV adds them (gguf_gemm.cu)
  float tile_order = 0;  // as the CUDA tiled kernel adds them
  double abs_terms = 0;  // sum over the blocks of |dot| + |min|
};

template <int T>
Dot RowDot(const uint8_t* w, const Acts& a, int64_t i) {
  constexpr int kGroup = gm::BlockElems(T), kBytes = gm::BlockBytes(T);
  const int64_t blocks = a.k / kGroup;
  Dot out;
  std::vector<float> lanes(32, 0.0f);
  float acc = 0.0f, macc = 0.0f;  // the CPU's: the K-quants' min terms apart
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = w + b * kBytes;
    const int64_t base = i * a.k + b * kGroup;  // the block's first activation
    // The tiled kernel's staged path: every code, scale and min alone.
    int8_t codes[kGroup];
    int scales[gm::SubBlocks(T)], mins[gm::SubBlocks(T)];
    for (int e = 0; e < kGroup; ++e) {
      codes[e] = static_cast<int8_t>(gm::WeightCode<T>(blk, e));
    }
    for (int j = 0; j < gm::SubBlocks(T); ++j) {
      scales[j] = gm::SubScale<T>(blk, j);
      mins[j] = gm::SubMin<T>(blk, j);
    }
    const int32_t staged = gm::ScaledDot<T>(codes, scales, &a.q[base], kGroup);
    gm::BlockTerms t;
    int lane;
    if constexpr (gm::IsK(T)) {
      // The GEMV's path: eight units, integers added.
      int32_t isum = 0, msum = 0;
      for (int u = 0; u < 8; ++u) {
        gm::KUnit<T> unit;
        gm::LoadKUnit<T>(blk, u, &unit);
        int32_t is, ms;
        gm::KUnitSums<T>(unit, u, &a.q[base + 32 * u], &a.bsums[base / 16], &is,
                         &ms);
        isum += is;
        msum += ms;
      }
      EXPECT_EQ(staged, isum) << "block " << b;
      EXPECT_EQ(gm::MinSum<T>(mins, &a.bsums[base / 16], 8), msum)
          << "block " << b;
      t = gm::KTerms(gm::BlockD<T>(blk), gm::BlockMin<T>(blk), a.d[base / 256],
                     isum, msum);
      acc += t.dot;
      macc += -t.min;
      lane = 8 * static_cast<int>(b % 4);
    } else {
      int8_t unit[32];
      gm::DecodeUnit<T>(blk, 0, unit);
      const int32_t s = gm::ScaledDot<T>(unit, nullptr, &a.q[base], 32);
      EXPECT_EQ(staged, s) << "block " << b;
      t = gm::SmallTerms(gm::BlockD<T>(blk), gm::BlockMin<T>(blk), s,
                         a.d[base / 32], a.sd[base / 32], gm::HasMin(T));
      acc += t.dot;
      if (gm::HasMin(T)) acc += t.min;
      lane = static_cast<int>(b % 32);
    }
    lanes[lane] += t.dot + t.min;
    out.tile_order += t.dot + t.min;
    out.abs_terms += std::fabs(double(t.dot)) + std::fabs(double(t.min));
  }
  out.cpu_order = gm::IsK(T) ? acc - macc : acc;
  out.gemv_order = Butterfly(lanes);
  return out;
}

// The CPU scalar kernel's y[i, j] for weight row `w`.
float CpuScalar(DType t, const uint8_t* w, const std::vector<float>& x,
                int64_t m, int64_t k, int64_t i) {
  if (IsGgufKDType(t)) {
    KActivations ka;
    QuantizeKActivations(x.data(), m, k, &ka);
    float y = 0;
    GgufKRowsScalar(t)(w, 0, 1, ka, i, 1, nullptr, &y, 1);
    return y;
  }
  QuantizedActivations qa;
  QuantizeActivations(x.data(), m, k, &qa, ActRoundingFor(t));
  return GgufDotScalar(t)(w, qa, i);
}

class GgufBlockMathTest : public ::testing::TestWithParam<DType> {};

TEST_P(GgufBlockMathTest, RowsGiveTheCpuBitsAndTheFloat64Product) {
  const DType t = GetParam();
  const int64_t g = QuantGroupSize(t);
  const bool k256 = IsGgufKDType(t);
  std::mt19937 rng(static_cast<uint32_t>(t) * 104729u);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  double worst_order = 0, worst_rounded = 0;
  // Block counts: one; fewer and more than the GEMV's lanes (32 blocks of
  // 32, 4 K blocks a step), with tails.
  for (const int64_t blocks : k256 ? std::vector<int64_t>{1, 3, 4, 5, 13}
                                   : std::vector<int64_t>{1, 9, 32, 41, 70}) {
    const int64_t m = 3, n = 6, k = blocks * g;
    SCOPED_TRACE(::testing::Message() << DTypeName(t) << " k " << k);
    const std::vector<uint8_t> w = RandomBlocks(t, n, k, rng);
    std::vector<float> x(static_cast<size_t>(m * k));
    for (float& v : x) v = normal(rng);
    x[1] = 9.0f;  // an outlier: a coarse group
    std::fill(x.begin() + k, x.begin() + k + g, 0.0f);  // row 1, block 0: d = 0
    const Acts a = Quantize(k256, x, m, k, gm::UsesQ8_1(static_cast<int>(t)));
    std::vector<float> xr(x.size());  // the rounded activations, d * q
    for (size_t e = 0; e < x.size(); ++e) {
      xr[e] = a.d[e / (k256 ? 256 : 32)] * a.q[e];
    }
    const gguf_test::Reference rounded = gguf_test::Expected(t, w, xr, m, n, k, &x);
    const gguf_test::Reference exact = gguf_test::Expected(t, w, x, m, n, k);
    const int64_t row_bytes = WeightBytes(t, 1, k);
    for (int64_t j = 0; j < n; ++j) {
      const std::vector<float> wr = gguf_test::DecodedRow(t, w, j, k);
      for (int64_t i = 0; i < m; ++i) {
        SCOPED_TRACE(::testing::Message() << "y[" << i << ", " << j << "]");
        Dot dot;
        WithKind(t, [&](auto kind) {
          dot = RowDot<decltype(kind)::value>(&w[j * row_bytes], a, i);
        });
        const size_t o = static_cast<size_t>(i * n + j);
        const float cpu = CpuScalar(t, &w[j * row_bytes], x, m, k, i);
        ASSERT_EQ(dot.cpu_order, cpu)
            << std::hexfloat << dot.cpu_order << " vs " << cpu;
        // Only the order of the f32 additions differs.
        const double order_tol = 1e-6 * dot.abs_terms + 1e-30;
        EXPECT_LE(std::fabs(dot.gemv_order - dot.cpu_order), order_tol);
        EXPECT_LE(std::fabs(dot.tile_order - dot.cpu_order), order_tol);
        worst_order = std::max(
            {worst_order, std::fabs(dot.gemv_order - dot.cpu_order) / order_tol,
             std::fabs(dot.tile_order - dot.cpu_order) / order_tol});
        // The decoded weights times the rounded activations: f32 rounding.
        const double tol = 2e-6 * rounded.scale[o] + 1e-30;
        EXPECT_LE(std::fabs(dot.cpu_order - rounded.y[o]), tol);
        worst_rounded = std::max(worst_rounded,
                                 std::fabs(dot.cpu_order - rounded.y[o]) / tol);
        // Times the activations as given: half a step of each group's scale
        // per weight, at most (x * inv is rounded before rint: 0.501).
        double act_bound = 0;
        for (int64_t e = 0; e < k; ++e) {
          act_bound += std::fabs(double(wr[e])) * 0.501 *
                       a.d[(i * k + e) / (k256 ? 256 : 32)];
        }
        EXPECT_LE(std::fabs(dot.cpu_order - exact.y[o]), act_bound + tol);
      }
    }
  }
  std::printf("[%s] worst: order %.3g, f32 %.3g of the tolerance\n",
              std::string(DTypeName(t)).c_str(), worst_order, worst_rounded);
}

// Each weight's code and scales give ggml's decoded value: w = d sc code
// (- dmin min, + m); and the unit decoder reads the codes one at a time.
TEST_P(GgufBlockMathTest, CodesAndScalesDecodeAsGgml) {
  const DType t = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(t) * 31u);
  const int64_t g = QuantGroupSize(t), blocks = 64;
  const std::vector<uint8_t> w = RandomBlocks(t, 1, blocks * g, rng);
  const std::vector<float> want = gguf_test::DecodedRow(t, w, 0, blocks * g);
  WithKind(t, [&](auto kind) {
    constexpr int T = decltype(kind)::value;
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* blk = &w[b * gm::BlockBytes(T)];
      for (int u = 0; u < gm::Units(T); ++u) {
        int8_t unit[32];
        gm::DecodeUnit<T>(blk, u, unit);
        for (int l = 0; l < 32; ++l) {
          const int e = 32 * u + l;
          const int code = gm::WeightCode<T>(blk, e);
          ASSERT_EQ(unit[l], code) << b << " " << e;
          const int j = e / gm::SubElems(T);
          const double d = gm::BlockD<T>(blk), mn = gm::BlockMin<T>(blk);
          const double scaled = d * gm::SubScale<T>(blk, j) * code;
          const double offset = gm::IsK(T) ? -mn * gm::SubMin<T>(blk, j) : mn;
          const double got = scaled + offset;
          ASSERT_NEAR(got, want[b * g + e],
                      1e-6 * (std::fabs(scaled) + std::fabs(offset)))
              << "block " << b << " weight " << e;
        }
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Types, GgufBlockMathTest,
                         ::testing::ValuesIn(kGgufBlockDTypes),
                         gguf_test::DTypeParamName);

// The header's quantizers are the CPU's, bit for bit: codes, scales, sums;
// random rows, exact halves (ties to even), a group of zeros, tiny and huge.
TEST(GgufBlockMathActsTest, ActivationsAreTheCpuQuantizersBits) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  const int64_t m = 3, k = 6 * 256;
  std::vector<float> x(static_cast<size_t>(m * k));
  for (float& v : x) v = normal(rng);
  x[0] = 127.0f;  // codes are the values, halves are ties
  for (int j = 1; j < 40; ++j) x[j] = static_cast<float>(j) - 20.5f;
  std::fill(x.begin() + 256, x.begin() + 512, 0.0f);
  for (int j = 0; j < 256; ++j) x[512 + j] *= 1e-30f;
  for (int j = 0; j < 256; ++j) x[768 + j] *= 1e30f;
  x[1024 + 33] = -1000.0f;  // a negative max
  const Acts ours32 = Quantize(false, x, m, k),
             ours256 = Quantize(true, x, m, k);
  QuantizedActivations cpu32;
  QuantizeActivations(x.data(), m, k, &cpu32, ActRounding::kGgmlQ8_0);
  EXPECT_EQ(ours32.q, cpu32.q);
  EXPECT_EQ(ours32.d, cpu32.d);
  EXPECT_EQ(ours32.sd, cpu32.sd);
  // Q4_1 / Q5_1's activations: ggml's Q8_1 sum terms.
  const Acts ours32_1 = Quantize(false, x, m, k, /*q8_1=*/true);
  QuantizedActivations cpu32_1;
  QuantizeActivations(x.data(), m, k, &cpu32_1, ActRounding::kGgmlQ8_1);
  EXPECT_EQ(ours32_1.sd, cpu32_1.sd);
  EXPECT_NE(ours32_1.sd, ours32.sd);
  KActivations cpu256;
  QuantizeKActivations(x.data(), m, k, &cpu256);
  EXPECT_EQ(ours256.q,
            std::vector<int8_t>(cpu256.q.begin(), cpu256.q.begin() + m * k));
  EXPECT_EQ(ours256.d, std::vector<float>(cpu256.d.begin(),
                                          cpu256.d.begin() + m * k / 256));
  EXPECT_EQ(ours256.bsums,
            std::vector<int16_t>(cpu256.bsums.begin(),
                                 cpu256.bsums.begin() + m * k / 16));
  EXPECT_EQ(ours32.q[21], 0);  // 0.5 rounds to 0
  EXPECT_EQ(ours32.q[22], 2);  // 1.5 rounds to 2
}

TEST(GgufBlockMathActsTest, HalfToF32IsHalfToFloat) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float got = gm::HalfToF32(h),
                want = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << h;
    } else {
      ASSERT_EQ(dtype_internal::FloatBits(got), dtype_internal::FloatBits(want))
          << h;
    }
  }
}

// The activation scale's f16 rounding (ActScale32Of) is common/dtype.h's,
// over every 61st non-negative finite float and the edges between ranges.
TEST(GgufBlockMathActsTest, RoundToHalfIsFloatToHalf) {
  auto check = [](uint32_t bits) {
    const float x = dtype_internal::BitsFloat(bits);
    const float want = HalfToFloat(FloatToHalf(x)), got = gm::RoundToHalfNonNeg(x);
    ASSERT_EQ(dtype_internal::FloatBits(got), dtype_internal::FloatBits(want)) << bits;
  };
  for (uint32_t bits = 0; bits < 0x7f800000u; bits += 61) check(bits);
  for (uint32_t edge : {0x33000000u, 0x33000001u, 0x33800000u, 0x387fe000u, 0x387ff000u,
                        0x38800000u, 0x477fe000u, 0x477fefffu, 0x477ff000u, 0x7f7fffffu}) {
    for (uint32_t bits = edge - 2; bits <= edge + 2 && bits < 0x7f800000u; ++bits) check(bits);
  }
}

// The K-quants' 6-bit scales and mins, one at a time, as the CPU unpacks them.
TEST(GgufBlockMathActsTest, KScalesUnpackAsTheCpu) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> byte(0, 255);
  for (int trial = 0; trial < 1000; ++trial) {
    uint8_t q[16];
    for (uint8_t& b : q) b = static_cast<uint8_t>(byte(rng));
    int sc[8], mn[8];
    gguf_quant_internal::UnpackKScales(q, sc, mn);
    for (int j = 0; j < 8; ++j) {
      int s, m;
      gm::KScaleMin(q, j, &s, &m);
      ASSERT_EQ(s, sc[j]) << trial << " " << j;
      ASSERT_EQ(m, mn[j]) << trial << " " << j;
    }
  }
}

// The header's numbering and sizes are the dtype table's (the CUDA ABI
// passes DType values).
TEST(GgufBlockMathActsTest, KindsAreTheDTypes) {
  for (DType t : kGgufBlockDTypes) {
    const int kind = static_cast<int>(t);
    EXPECT_TRUE(gm::IsKind(kind));
    EXPECT_EQ(gm::BlockElems(kind), QuantGroupSize(t)) << DTypeName(t);
    EXPECT_EQ(gm::BlockBytes(kind), QuantBlockBytes(t)) << DTypeName(t);
    EXPECT_EQ(gm::IsK(kind), IsGgufKDType(t)) << DTypeName(t);
  }
  EXPECT_FALSE(gm::IsKind(static_cast<int>(DType::kQ8)));
  EXPECT_FALSE(gm::IsKind(static_cast<int>(DType::kMxfp4)));
  static_assert(gm::kQ4_0 == static_cast<int>(DType::kQ4_0) &&
                gm::kQ6K == static_cast<int>(DType::kQ6K));
}

}  // namespace
}  // namespace moe
