// CPU-specific behaviour: the SIMD dispatcher (every path forced through the
// test seam gives the scalar results within tolerance), thread-count
// independence, and value checks only the CPU performs.
#include "kernels/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <random>
#include <vector>

#include "common/quant.h"
#include "gtest/gtest.h"
#include "kernels/cpu_matmul.h"
#include "kernels/cpu_ops.h"
#include "kernels/thread_pool.h"

namespace moe {
namespace {

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1, 1);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

std::vector<uint16_t> ToHalf(const std::vector<float>& f, DType dt) {
  std::vector<uint16_t> h(f.size());
  for (size_t i = 0; i < f.size(); ++i) {
    h[i] = dt == DType::kBF16 ? FloatToBF16(f[i]) : FloatToHalf(f[i]);
  }
  return h;
}

std::vector<float> RunMatMul(CpuBackend& b, const std::vector<float>& x,
                             const void* w, DType dt, int64_t m, int64_t n,
                             int64_t k) {
  std::vector<float> y(m * n, NAN);
  auto bias = Random(n, 99);
  EXPECT_TRUE(b.MatMul(x.data(), w, dt, bias.data(), y.data(), m, n, k).ok());
  return y;
}

TEST(CpuDispatchTest, DetectedLevelIsSupportedAndScalarAlwaysIs) {
  EXPECT_TRUE(SimdLevelSupported(SimdLevel::kScalar));
  EXPECT_TRUE(SimdLevelSupported(DetectSimdLevel()));
  // The best supported level is chosen.
  if (SimdLevelSupported(SimdLevel::kAmx)) {
    EXPECT_EQ(DetectSimdLevel(), SimdLevel::kAmx);
    setenv("MOE_CPU_SIMD", "avx512", 1);  // caps it
    EXPECT_EQ(DetectSimdLevel(), SimdLevel::kAvx512);
    unsetenv("MOE_CPU_SIMD");
  } else if (SimdLevelSupported(SimdLevel::kAvx512)) {
    EXPECT_EQ(DetectSimdLevel(), SimdLevel::kAvx512);
  } else if (SimdLevelSupported(SimdLevel::kAvx2)) {
    EXPECT_EQ(DetectSimdLevel(), SimdLevel::kAvx2);
  }
  setenv("MOE_CPU_SIMD", "scalar", 1);
  EXPECT_EQ(DetectSimdLevel(), SimdLevel::kScalar);
  unsetenv("MOE_CPU_SIMD");
}

// Each level the CPU supports agrees with the scalar kernel on odd shapes
// (vector tails in k, tile tails in m and n); levels it cannot run are
// refused by the seam instead of crashing.
TEST(CpuDispatchTest, EverySupportedPathMatchesScalar) {
  CpuBackend backend(3);
  struct Case {
    int64_t m, n, k;
  };
  int levels_run = 0;
  for (SimdLevel level : {SimdLevel::kAvx2, SimdLevel::kAvx512, SimdLevel::kAmx}) {
    absl::Status forced = backend.ForceSimdLevelForTest(level);
    if (!SimdLevelSupported(level)) {
      EXPECT_EQ(forced.code(), absl::StatusCode::kFailedPrecondition);
      continue;
    }
    ASSERT_TRUE(forced.ok()) << forced;
    ++levels_run;
    std::cout << "[ simd     ] comparing " << SimdLevelName(level)
              << " with scalar\n";
    // The last three have k a multiple of 32: AMX tiles for bf16 (UsesAmx),
    // with row and column tails.
    for (Case c : {Case{1, 1, 3}, Case{1, 67, 1031}, Case{5, 13, 2057},
                   Case{4, 3, 8}, Case{9, 70, 100}, Case{1, 45, 1024},
                   Case{37, 50, 96}, Case{16, 16, 32}}) {
      for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
        SCOPED_TRACE(testing::Message() << SimdLevelName(level) << " "
                                        << DTypeName(dt) << " " << c.m << "x"
                                        << c.n << "x" << c.k);
        auto x = Random(c.m * c.k, 1);
        // bf16 weights on AVX512_BF16 round the activations to bf16
        // (UsesBf16Dot): from activations that are bf16 already, both
        // sides multiply the same numbers.
        if (UsesBf16Dot(dt, level)) {
          for (float& v : x) v = BF16ToFloat(FloatToBF16(v));
        }
        auto wf = Random(c.n * c.k, 2);
        auto wh = ToHalf(wf, dt);
        const void* w = dt == DType::kF32 ? static_cast<const void*>(wf.data())
                                          : wh.data();
        ASSERT_TRUE(backend.ForceSimdLevelForTest(level).ok());
        auto fast = RunMatMul(backend, x, w, dt, c.m, c.n, c.k);
        ASSERT_TRUE(backend.ForceSimdLevelForTest(SimdLevel::kScalar).ok());
        auto slow = RunMatMul(backend, x, w, dt, c.m, c.n, c.k);
        for (size_t i = 0; i < fast.size(); ++i) {
          ASSERT_NEAR(fast[i], slow[i], 1e-5 * std::sqrt(double(c.k)))
              << "at " << i;
        }
      }
    }
  }
  // The x86-64 machines CI runs on have AVX2; the vector path must
  // really have been compared.
  EXPECT_GE(levels_run, SimdLevelSupported(SimdLevel::kAvx2) ? 1 : 0);
  EXPECT_EQ(backend.Info().simd,
            std::string(SimdLevelName(SimdLevel::kScalar)));
}

// The block-format kernels: every supported level against scalar, decode and
// prefill shapes, one and several k-blocks, column tails.
TEST(CpuDispatchTest, QuantizedPathsMatchScalar) {
  CpuBackend backend(3);
  struct Case {
    int64_t m, n, k;
  };
  for (SimdLevel level : {SimdLevel::kAvx2, SimdLevel::kAvx512, SimdLevel::kAmx}) {
    if (!backend.ForceSimdLevelForTest(level).ok()) continue;
    for (Case c : {Case{1, 1, 64}, Case{1, 67, 1088}, Case{5, 13, 2176},
                   Case{4, 3, 128}, Case{9, 70, 192}}) {
      for (DType dt : {DType::kQ8, DType::kQ4}) {
        SCOPED_TRACE(testing::Message() << SimdLevelName(level) << " "
                                        << DTypeName(dt) << " " << c.m << "x"
                                        << c.n << "x" << c.k);
        auto x = Random(c.m * c.k, 1);
        // bf16 weights on AVX512_BF16 round the activations to bf16
        // (UsesBf16Dot): from activations that are bf16 already, both
        // sides multiply the same numbers.
        if (UsesBf16Dot(dt, level)) {
          for (float& v : x) v = BF16ToFloat(FloatToBF16(v));
        }
        auto wf = Random(c.n * c.k, 2);
        std::vector<uint8_t> w(WeightBytes(dt, c.n, c.k));
        for (int64_t r = 0; r < c.n; ++r) {
          ASSERT_TRUE(QuantizeRow(wf.data() + r * c.k, c.k, dt,
                                  w.data() + r * WeightBytes(dt, 1, c.k))
                          .ok());
        }
        ASSERT_TRUE(backend.ForceSimdLevelForTest(level).ok());
        auto fast = RunMatMul(backend, x, w.data(), dt, c.m, c.n, c.k);
        ASSERT_TRUE(backend.ForceSimdLevelForTest(SimdLevel::kScalar).ok());
        auto slow = RunMatMul(backend, x, w.data(), dt, c.m, c.n, c.k);
        for (size_t i = 0; i < fast.size(); ++i) {
          ASSERT_NEAR(fast[i], slow[i], 1e-5 * std::sqrt(double(c.k)))
              << "at " << i;
        }
      }
    }
  }
}

// Attention's vector helpers agree with scalar at every supported level.
TEST(CpuDispatchTest, AttentionPathsMatchScalar) {
  CpuBackend backend(2);
  AttentionShape s{5, 4, 2, 37, 12, 7};  // odd head_dim: vector tails
  auto kc = Random(12 * 2 * 37, 5), vc = Random(12 * 2 * 37, 6);
  auto q = Random(5 * 4 * 37, 7);
  std::vector<float> want(q.size()), got(q.size());
  ASSERT_TRUE(backend.ForceSimdLevelForTest(SimdLevel::kScalar).ok());
  ASSERT_TRUE(backend.Attention(q.data(), kc.data(), vc.data(), want.data(), s,
                                0.2f)
                  .ok());
  for (SimdLevel level : {SimdLevel::kAvx2, SimdLevel::kAvx512, SimdLevel::kAmx}) {
    if (!backend.ForceSimdLevelForTest(level).ok()) continue;
    ASSERT_TRUE(backend.Attention(q.data(), kc.data(), vc.data(), got.data(),
                                  s, 0.2f)
                    .ok());
    for (size_t i = 0; i < q.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], 1e-5) << SimdLevelName(level) << " " << i;
    }
  }
}

// dot_rows and axpy_rows are dot and axpy row by row, bit for bit, at every
// level, and their bf16-row forms those on the widened rows (registers held across rows, vector tails, chunks of 8 registers,
// AVX-512's 16 rows reduced at once: 37 rows are two such blocks and 5 more).
TEST(CpuDispatchTest, VectorRowHelpersAreTheOneRowHelpers) {
  for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512, SimdLevel::kAmx}) {
    if (!SimdLevelSupported(level)) continue;
    const VectorOps vo = VectorOpsFor(level);
    for (int64_t n : {1, 7, 16, 37, 64, 128, 200, 576}) {
      SCOPED_TRACE(testing::Message() << SimdLevelName(level) << " n=" << n);
      const int64_t rows = 37, stride = n + 3;
      auto a = Random(n, 10), b = Random(rows * stride, 11), alpha = Random(rows, 12);
      std::vector<float> got(rows), y0 = Random(n, 13);
      vo.dot_rows(a.data(), b.data(), stride, rows, n, 0.3f, got.data());
      for (int64_t j = 0; j < rows; ++j) {
        ASSERT_EQ(got[j], vo.dot(a.data(), b.data() + j * stride, n) * 0.3f) << j;
      }
      std::vector<float> want = y0, y = y0;
      for (int64_t j = 0; j < rows; ++j) vo.axpy(alpha[j], b.data() + j * stride, want.data(), n);
      vo.axpy_rows(alpha.data(), b.data(), stride, rows, y.data(), n);
      EXPECT_EQ(y, want);
      // The bf16-row helpers are the f32 ones on the widened rows.
      std::vector<uint16_t> b16(b.size());
      std::vector<float> widened(b.size());
      for (size_t i = 0; i < b.size(); ++i) {
        b16[i] = FloatToBF16(b[i]);
        widened[i] = BF16ToFloat(b16[i]);
      }
      std::vector<float> got16(rows), want16(rows);
      vo.dot_rows(a.data(), widened.data(), stride, rows, n, 0.3f, want16.data());
      vo.dot_rows_bf16(a.data(), b16.data(), stride, rows, n, 0.3f, got16.data());
      EXPECT_EQ(got16, want16);
      std::vector<float> y16 = y0, y16_want = y0;
      vo.axpy_rows(alpha.data(), widened.data(), stride, rows, y16_want.data(), n);
      vo.axpy_rows_bf16(alpha.data(), b16.data(), stride, rows, y16.data(), n);
      EXPECT_EQ(y16, y16_want);
    }
  }
}

// Attention's softmax step: exp_sum writes e^(x - shift) over exactly n
// values (the elements past n untouched: AVX-512's masked tail) within 2
// ulp of the exact value, and returns their sum; the scalar and AVX2 levels
// are the plain loop to the bit. max is the exact maximum at every level.
TEST(CpuDispatchTest, ExpSumIsTheSoftmaxNumeratorsAndTheirSum) {
  for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512, SimdLevel::kAmx}) {
    if (!SimdLevelSupported(level)) continue;
    const VectorOps vo = VectorOpsFor(level);
    for (int64_t n : {1, 5, 16, 37, 200}) {
      SCOPED_TRACE(testing::Message() << SimdLevelName(level) << " n=" << n);
      std::vector<float> x = Random(n + 8, static_cast<uint32_t>(20 + n));
      for (float& v : x) v *= 30.0f;  // scores spread over e^-60 .. 1
      const float shift = vo.max(x.data(), n);
      ASSERT_EQ(shift, *std::max_element(x.begin(), x.begin() + n));
      std::vector<float> got = x;
      const float sum = vo.exp_sum(got.data(), n, shift);
      double want_sum = 0;
      float plain_sum = 0;
      for (int64_t j = 0; j < n; ++j) {
        const float e = std::exp(x[j] - shift);
        plain_sum += e;
        want_sum += got[j];
        if (level == SimdLevel::kScalar || level == SimdLevel::kAvx2) {
          ASSERT_EQ(got[j], e) << j;
        } else {
          ASSERT_NEAR(got[j], e, 2 * std::abs(std::nextafter(e, 2 * e + 1) - e)) << j;
        }
      }
      for (int64_t j = n; j < n + 8; ++j) ASSERT_EQ(got[j], x[j]) << "past n: " << j;
      if (level == SimdLevel::kScalar || level == SimdLevel::kAvx2) {
        EXPECT_EQ(sum, plain_sum);
      } else {
        EXPECT_NEAR(sum, want_sum, 1e-6 * want_sum);
      }
    }
  }
}

// Results are bit-identical for every thread count.
// RMSNorm is ggml's arithmetic to the bit (so 8-bit activation codes
// rounded after it are llama.cpp's): the f32 squares summed in double, the
// mean rounded to f32, 1 / sqrtf(mean + eps), then (x * inv) * w. Rows
// whose f32 sum of squares rounds differently are included: the test
// fails on an f32 accumulation.
TEST(CpuOpsTest, RmsNormIsGgmlsArithmetic) {
  const int64_t rows = 64, dim = 4096;
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(rows * dim), w(dim), y(rows * dim);
  for (int64_t r = 0; r < rows; ++r) {
    const float scale = std::ldexp(1.0f, static_cast<int>(r % 9) - 4);
    for (int64_t i = 0; i < dim; ++i) x[r * dim + i] = scale * normal(rng);
  }
  for (float& v : w) v = 1.0f + 0.1f * normal(rng);
  const float eps = 1e-5f;
  ThreadPool pool(2);
  cpu::RmsNorm(pool, x.data(), w.data(), y.data(), rows, dim, eps);
  int rows_where_f32_differs = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = &x[r * dim];
    double ss = 0.0;
    float ss32 = 0.0f;
    for (int64_t i = 0; i < dim; ++i) {
      ss += static_cast<double>(xr[i] * xr[i]);
      ss32 += xr[i] * xr[i];
    }
    const float mean = static_cast<float>(ss / static_cast<double>(dim));
    const float inv = 1.0f / std::sqrt(mean + eps);
    if (1.0f / std::sqrt(ss32 / static_cast<float>(dim) + eps) != inv) ++rows_where_f32_differs;
    for (int64_t i = 0; i < dim; ++i) {
      ASSERT_EQ(y[r * dim + i], xr[i] * inv * w[i]) << r << "," << i;
    }
  }
  EXPECT_GT(rows_where_f32_differs, 0) << "no row tells the two sums apart";
}

// silu(g) * u at every level against float64: the scalar level is std::exp's
// (correctly rounded or nearly); the AVX-512 vector exp is within 1 ulp, so
// the product within a few ulps; over gates where e^-g spans all normal
// floats, every tail length, and the special values, which give the
// scalar level's results exactly.
TEST(CpuOpsTest, SiluMulIsWithinUlpsOfFloat64AtEveryLevel) {
  std::vector<float> g, u;
  for (int i = 0; i <= 200000; ++i) {
    g.push_back(-87.0f + 190.0f * static_cast<float>(i) / 200000.0f);
    u.push_back(i % 3 == 0 ? 1.0f : -0.37f * static_cast<float>(i % 11));
  }
  const float specials[] = {0.0f,  -0.0f, INFINITY, -INFINITY, NAN,  1e30f,
                            -1e30f, 88.7f, -95.0f,   -104.5f,   1e-40f};
  for (float x : specials) {
    g.push_back(x);
    u.push_back(1.5f);
  }
  const int64_t n = static_cast<int64_t>(g.size());
  std::vector<float> scalar(n);
  cpu::SiluMul(SimdLevel::kScalar, g.data(), u.data(), scalar.data(), n);
  for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512, SimdLevel::kAmx}) {
    if (!SimdLevelSupported(level)) continue;
    SCOPED_TRACE(std::string(SimdLevelName(level)));
    std::vector<float> got(n);
    cpu::SiluMul(level, g.data(), u.data(), got.data(), n);
    double worst = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (i >= n - static_cast<int64_t>(std::size(specials))) {
        EXPECT_TRUE(got[i] == scalar[i] || (std::isnan(got[i]) && std::isnan(scalar[i])))
            << "g " << g[i] << ": " << got[i] << " against " << scalar[i];
        continue;
      }
      const double want = double(g[i]) / (1.0 + std::exp(-double(g[i]))) * double(u[i]);
      if (std::fabs(want) < 1e-30) {
        EXPECT_LE(std::fabs(got[i]), 1e-30) << g[i];
        continue;
      }
      const float w = static_cast<float>(want);
      const double ulp = std::fabs(double(std::nextafter(w, INFINITY)) - double(w));
      worst = std::max(worst, std::fabs(got[i] - want) / ulp);
    }
    EXPECT_LE(worst, 4.0);  // exp 1 ulp, then a division and a product
    // Tails: each prefix length is the same arithmetic as the whole.
    for (int64_t len = 1; len <= 33; ++len) {
      std::vector<float> part(len);
      cpu::SiluMul(level, g.data() + 1000, u.data() + 1000, part.data(), len);
      for (int64_t i = 0; i < len; ++i) ASSERT_EQ(part[i], got[1000 + i]) << len << "," << i;
    }
  }
}

// cpu::SumExp (the sampler's log-softmax denominator) at every level
// against a float64 sum of float64 exponentials: within a few float ulps of
// each term (the vector exp is 1 ulp; the difference x - shift is rounded to
// float first at every level); -inf terms add nothing; NaN gives NaN; tails
// of every length.
TEST(CpuBackendTest, SumExpMatchesAFloat64SumAtEveryLevel) {
  std::mt19937 rng(11);
  std::normal_distribution<float> logit(0.0f, 4.0f);
  for (const int64_t n : {int64_t{1}, int64_t{15}, int64_t{16}, int64_t{17}, int64_t{2048},
                          int64_t{151936}}) {
    std::vector<float> x(n);
    for (float& v : x) v = logit(rng);
    if (n > 20) x[7] = -INFINITY;  // a masked logit
    const float shift = *std::max_element(x.begin(), x.end());
    double want = 0;
    for (float v : x) want += std::exp(double(v - shift));
    for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512, SimdLevel::kAmx}) {
      if (!SimdLevelSupported(level)) continue;
      SCOPED_TRACE(std::string(SimdLevelName(level)) + " n=" + std::to_string(n));
      const double got = cpu::SumExp(level, x.data(), n, shift);
      EXPECT_NEAR(got, want, want * 4e-7);  // a few float ulps of each term
      // Tails: a prefix sums what the scalar path sums for it.
      const int64_t len = std::min<int64_t>(n, 33);
      double part = 0;
      for (int64_t i = 0; i < len; ++i) part += std::exp(double(x[i] - shift));
      EXPECT_NEAR(cpu::SumExp(level, x.data(), len, shift), part, part * 4e-7);
    }
  }
  std::vector<float> bad = {0.0f, NAN, 1.0f};
  for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512, SimdLevel::kAmx}) {
    if (!SimdLevelSupported(level)) continue;
    EXPECT_TRUE(std::isnan(cpu::SumExp(level, bad.data(), 3, 1.0f)));
    std::vector<float> all_masked(20, -INFINITY);
    all_masked[19] = 2.0f;  // only the tail lane counts: e^0
    EXPECT_DOUBLE_EQ(cpu::SumExp(level, all_masked.data(), 20, 2.0f), 1.0);
  }
}

// cpu::MaxValue and cpu::ArgmaxRow (greedy sampling) at every level give
// exactly what the scalar scans give: on random rows of every tail length,
// with the maximum tied at two places, NaNs among the values or first,
// -inf everywhere but one place, signed zeros tied, and empty rows.
TEST(CpuBackendTest, MaxAndArgmaxEqualTheScalarScanAtEveryLevel) {
  auto scan_max = [](const std::vector<float>& x) {
    float m = -INFINITY;
    for (float v : x) m = std::max(m, v);
    return m;
  };
  auto scan_argmax = [](const std::vector<float>& x) {
    int64_t best = 0;
    for (size_t j = 1; j < x.size(); ++j) {
      if (x[j] > x[best]) best = static_cast<int64_t>(j);
    }
    return best;
  };
  std::mt19937 rng(5);
  std::normal_distribution<float> logit(0.0f, 4.0f);
  std::vector<std::vector<float>> rows = {{}, {NAN}, {NAN, 1.0f, 2.0f}, {-0.0f, 0.0f, -1.0f},
                                          {0.0f, -0.0f}, std::vector<float>(40, -INFINITY),
                                          std::vector<float>(17, NAN)};
  rows[5][37] = -3.0f;
  for (const size_t n : {size_t{1}, size_t{15}, size_t{16}, size_t{17}, size_t{33}, size_t{2048},
                         size_t{151936}}) {
    for (int variant = 0; variant < 4; ++variant) {
      std::vector<float> x(n);
      for (float& v : x) v = logit(rng);
      const size_t top = rng() % n;
      if (variant >= 1) x[top] = 100.0f;
      if (variant >= 1 && n > 1) x[(top + n / 2 + 1) % n] = 100.0f;  // a tie: the lower wins
      if (variant >= 2) {
        for (size_t i = 0; i < n; i += 7) x[i] = NAN;
      }
      if (variant == 3) x[n - 1] = INFINITY;
      rows.push_back(x);
    }
  }
  for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512, SimdLevel::kAmx}) {
    if (!SimdLevelSupported(level)) continue;
    for (size_t r = 0; r < rows.size(); ++r) {
      const std::vector<float>& x = rows[r];
      SCOPED_TRACE(std::string(SimdLevelName(level)) + " row " + std::to_string(r) + " n=" +
                   std::to_string(x.size()));
      const float want = scan_max(x), got = cpu::MaxValue(level, x.data(), x.size());
      EXPECT_TRUE(got == want || (std::isnan(got) && std::isnan(want))) << got << " " << want;
      EXPECT_EQ(cpu::ArgmaxRow(level, x.data(), x.size()), scan_argmax(x));
    }
  }
}

TEST(CpuBackendTest, ResultsDoNotDependOnThreadCount) {
  const int64_t m = 6, n = 150, k = 1500;
  auto x = Random(m * k, 3);
  auto w = ToHalf(Random(n * k, 4), DType::kBF16);
  CpuBackend one(1);
  auto want = RunMatMul(one, x, w.data(), DType::kBF16, m, n, k);
  for (int threads : {2, 3, 7}) {
    CpuBackend many(threads);
    EXPECT_EQ(RunMatMul(many, x, w.data(), DType::kBF16, m, n, k), want)
        << threads << " threads";
    EXPECT_EQ(many.Info().threads, threads);
  }
}

TEST(CpuBackendTest, OutOfRangeIdsAreInvalidArgument) {
  CpuBackend b(2);
  std::vector<float> table(4 * 3, 1.0f), out(2 * 3);
  std::vector<int32_t> ids = {1, 4};
  EXPECT_EQ(b.Embedding(table.data(), DType::kF32, ids.data(), out.data(), 2,
                        4, 3)
                .code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<float> x(2 * 3), w(3 * 3), o(2 * 3), wts = {1, 1};
  std::vector<int32_t> rows = {0, -1};
  EXPECT_EQ(b.ExpertFfn(x.data(), rows.data(), wts.data(), w.data(), w.data(),
                        w.data(), DType::kF32, o.data(), 2, 2, 3, 3)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CpuBackendTest, FactoryNamesAndInfo) {
  auto cpu = CreateBackend("cpu");
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  BackendInfo info = (*cpu)->Info();
  EXPECT_EQ(info.name, "cpu");
  EXPECT_FALSE(info.is_device);
  EXPECT_GE(info.threads, 1);
  EXPECT_EQ(CreateBackend("tpu").status().code(),
            absl::StatusCode::kInvalidArgument);
  auto cuda = CreateBackend("cuda");
  if (!cuda.ok()) {
    EXPECT_EQ(cuda.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_FALSE(cuda.status().message().empty());
    EXPECT_EQ(DefaultBackend().Info().name, "cpu");
  } else {
    EXPECT_EQ(DefaultBackend().Info().name, "cuda");
  }
  auto stream = (*cpu)->CreateStream();
  auto event = (*cpu)->CreateEvent();
  ASSERT_TRUE(stream.ok() && event.ok());
  EXPECT_TRUE((*cpu)->RecordEvent(*event, *stream).ok());
  EXPECT_TRUE((*cpu)->StreamWaitEvent(nullptr, *event).ok());
  EXPECT_TRUE((*cpu)->SynchronizeEvent(*event).ok());
  (*cpu)->DestroyEvent(*event);
  (*cpu)->DestroyStream(*stream);
}

}  // namespace
}  // namespace moe
