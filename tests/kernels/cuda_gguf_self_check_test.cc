// The CUDA backend's start-up self-check of its ggml block kernels
// (kernels/cuda_gguf_self_check.h), on the host: the host's answer is the
// float64 product of ggml's decoded weights; the GPU GEMV's order of
// additions (the tiled kernel's is the host's) stays within the bound on
// these problems; the comparison passes the host's answer and
// fails one wrong output, a NaN or an infinity, naming the type and the
// output; the CPU backend's scalar kernels (the same terms in another order)
// pass the whole check, and a backend with one wrong type fails it naming
// that type. The device run is in cuda_gguf_ops_test.
#include "kernels/cuda_gguf_self_check.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu_backend.h"
#include "kernels/cpu_gguf_quant.h"
#include "kernels/cpu_quant_matmul.h"
#include "kernels/cuda/gguf_block_math.h"
#include "tests/kernels/gguf_test_blocks.h"

namespace moe {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

namespace gm = gguf_math;

std::string TypeName(DType t) { return std::string(DTypeName(t)); }

using gguf_test::WithKind;

TEST(GgufSelfCheckTest, ProblemsAreDeterministicAndValid) {
  for (DType t : kGgufCheckTypes) {
    for (int64_t m : kGgufCheckRows) {
      const GgufCheckProblem a = MakeGgufCheckProblem(t, m),
                             b = MakeGgufCheckProblem(t, m);
      EXPECT_EQ(a.w, b.w) << TypeName(t);
      EXPECT_EQ(a.x, b.x) << TypeName(t);
      EXPECT_EQ(a.bias, b.bias) << TypeName(t);
      ASSERT_EQ(static_cast<int64_t>(a.w.size()),
                WeightBytes(t, kGgufCheckN, kGgufCheckK));
      ASSERT_EQ(static_cast<int64_t>(a.x.size()), m * kGgufCheckK);
      EXPECT_EQ(a.bias.size(), m > 1 ? size_t{kGgufCheckN} : size_t{0});
      // Every weight decodes to a finite value (finite f16 scales).
      for (int64_t j = 0; j < kGgufCheckN; ++j) {
        for (float v : gguf_test::DecodedRow(t, a.w, j, kGgufCheckK)) {
          ASSERT_TRUE(std::isfinite(v)) << TypeName(t) << " row " << j;
        }
      }
    }
  }
}

// The host's answer is the product of ggml's decoded weights and the
// activations as the kernels round them, to f32 rounding.
TEST(GgufSelfCheckTest, HostAnswerIsTheFloat64Product) {
  for (DType t : kGgufCheckTypes) {
    for (int64_t m : kGgufCheckRows) {
      SCOPED_TRACE(::testing::Message() << TypeName(t) << " m " << m);
      const GgufCheckProblem p = MakeGgufCheckProblem(t, m);
      const GgufCheckExpected want = ExpectedGgufProduct(p);
      const std::vector<float> xr =
          IsGgufKDType(t) ? RoundKActivations(p.x.data(), p.m, p.k)
                          : RoundActivations(p.x.data(), p.m, p.k, ActRoundingFor(t));
      const gguf_test::Reference ref =
          gguf_test::Expected(t, p.w, xr, p.m, p.n, p.k, &p.x);
      ASSERT_EQ(want.y.size(), ref.y.size());
      double bias_abs = 0;
      for (size_t o = 0; o < ref.y.size(); ++o) {
        const double bias = p.bias.empty() ? 0.0 : p.bias[o % p.n];
        bias_abs += std::fabs(bias);
        EXPECT_NEAR(want.y[o], ref.y[o] + bias,
                    2e-6 * ref.scale[o] + 1e-6 * std::fabs(bias))
            << "y[" << o / p.n << ", " << o % p.n << "]";
        EXPECT_GT(want.bound[o], 0.0);
        EXPECT_LT(want.bound[o], 1e-5 * ref.scale[o] + 1e-5 * std::fabs(bias));
      }
      EXPECT_EQ(bias_abs > 0, m > 1);
    }
  }
}

TEST(GgufSelfCheckTest, TheHostAnswerPasses) {
  for (DType t : kGgufCheckTypes) {
    for (int64_t m : kGgufCheckRows) {
      const GgufCheckProblem p = MakeGgufCheckProblem(t, m);
      const GgufCheckExpected want = ExpectedGgufProduct(p);
      EXPECT_TRUE(CompareGgufProduct(p, want, want.y).ok()) << TypeName(t);
      // Anywhere within the bound passes too.
      std::vector<float> got = want.y;
      got[3] = static_cast<float>(want.y[3] + 0.5 * want.bound[3]);
      EXPECT_TRUE(CompareGgufProduct(p, want, got).ok()) << TypeName(t);
    }
  }
}

TEST(GgufSelfCheckTest, OneWrongOutputFailsNamingTheTypeAndOutput) {
  for (DType t : kGgufCheckTypes) {
    const GgufCheckProblem p = MakeGgufCheckProblem(t, 9);
    const GgufCheckExpected want = ExpectedGgufProduct(p);
    const size_t o = 5 * kGgufCheckN + 17;  // y[5, 17]
    std::vector<float> got = want.y;
    got[o] = static_cast<float>(want.y[o] + 3 * want.bound[o]);
    const absl::Status s = CompareGgufProduct(p, want, got);
    EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << TypeName(t);
    EXPECT_THAT(std::string(s.message()), HasSubstr(TypeName(t) + " m 9"));
    EXPECT_THAT(std::string(s.message()), HasSubstr("y[5, 17]"));
    EXPECT_THAT(std::string(s.message()), HasSubstr("> bound"));
    EXPECT_THAT(std::string(s.message()), HasSubstr("1 of 216 outputs"));
  }
}

TEST(GgufSelfCheckTest, NanAndInfinityFail) {
  for (DType t : kGgufCheckTypes) {
    const GgufCheckProblem p = MakeGgufCheckProblem(t, 1);
    const GgufCheckExpected want = ExpectedGgufProduct(p);
    for (float bad : {std::numeric_limits<float>::quiet_NaN(),
                      std::numeric_limits<float>::infinity()}) {
      std::vector<float> got = want.y;
      got[7] = bad;
      got[9] = static_cast<float>(want.y[9] + 2 * want.bound[9]);  // less bad
      const absl::Status s = CompareGgufProduct(p, want, got);
      EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << TypeName(t);
      EXPECT_THAT(std::string(s.message()), HasSubstr(TypeName(t) + " m 1"));
      EXPECT_THAT(std::string(s.message()), HasSubstr("y[0, 7]"));
      EXPECT_THAT(std::string(s.message()), HasSubstr("2 of 24 outputs"));
    }
  }
}

TEST(GgufSelfCheckTest, WrongSizeIsInvalidArgument) {
  const GgufCheckProblem p = MakeGgufCheckProblem(DType::kQ4K, 9);
  const GgufCheckExpected want = ExpectedGgufProduct(p);
  std::vector<float> got(want.y.begin(), want.y.end() - 1);
  EXPECT_EQ(CompareGgufProduct(p, want, got).code(),
            absl::StatusCode::kInvalidArgument);
}

// The GEMV's terms of output (i, j) (gguf_gemm.cu: DecodeUnit / KUnit
// decoding, the K blocks' integers added over 8 units), each added to its
// lane's sum, and the warp's butterfly (WarpSum: v += shfl_xor(v, o), o =
// 16 .. 1) as lane 0 sees it. The tiled kernel adds the host's terms in the
// host's order, so its result is the host's bits.
template <int T>
float GemvOrder(const GgufCheckProblem& p, int64_t i, int64_t j) {
  constexpr int kGroup = gm::BlockElems(T), kBytes = gm::BlockBytes(T);
  const int64_t blocks = p.k / kGroup;
  std::vector<int8_t> q(static_cast<size_t>(p.k));
  std::vector<float> d(static_cast<size_t>(blocks)), sd(d.size());
  std::vector<int16_t> bsums(static_cast<size_t>(p.k / 16));
  for (int64_t g = 0; g < blocks; ++g) {
    const float* x = &p.x[i * p.k + g * kGroup];
    if constexpr (gm::IsK(T)) {
      gm::QuantizeGroup256(x, &q[g * 256], &d[g], &bsums[g * 16]);
    } else {
      gm::QuantizeGroup32(x, &q[g * 32], &d[g], &sd[g], gm::UsesQ8_1(T));
    }
  }
  float lanes[32] = {};
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = &p.w[(j * blocks + b) * kBytes];
    gm::BlockTerms t;
    if constexpr (gm::IsK(T)) {
      int32_t isum = 0, msum = 0;
      for (int u = 0; u < 8; ++u) {
        gm::KUnit<T> unit;
        gm::LoadKUnit<T>(blk, u, &unit);
        int32_t is, ms;
        gm::KUnitSums<T>(unit, u, &q[b * 256 + 32 * u], &bsums[b * 16], &is,
                         &ms);
        isum += is;
        msum += ms;
      }
      t = gm::KTerms(gm::BlockD<T>(blk), gm::BlockMin<T>(blk), d[b], isum,
                     msum);
      lanes[8 * (b % 4)] += t.dot + t.min;
    } else {
      int8_t codes[32];
      gm::DecodeUnit<T>(blk, 0, codes);
      const int32_t s = gm::ScaledDot<T>(codes, nullptr, &q[b * 32], 32);
      t = gm::SmallTerms(gm::BlockD<T>(blk), gm::BlockMin<T>(blk), s, d[b],
                         sd[b], gm::HasMin(T));
      lanes[b % 32] += t.dot + t.min;
    }
  }
  for (int o = 16; o > 0; o /= 2) {
    float next[32];
    for (int l = 0; l < 32; ++l) next[l] = lanes[l] + lanes[l ^ o];
    std::copy(next, next + 32, lanes);
  }
  return lanes[0] + (p.bias.empty() ? 0.0f : p.bias[j]);
}

// A correct GPU passes: the GEMV's order of additions stays within the
// bound on these very problems (they are the same on every run).
TEST(GgufSelfCheckTest, TheGemvOrderPasses) {
  for (DType t : kGgufCheckTypes) {
    for (int64_t m : kGgufCheckRows) {
      const GgufCheckProblem p = MakeGgufCheckProblem(t, m);
      const GgufCheckExpected want = ExpectedGgufProduct(p);
      std::vector<float> got(want.y.size());
      for (int64_t i = 0; i < p.m; ++i) {
        for (int64_t j = 0; j < p.n; ++j) {
          WithKind(t, [&](auto kind) {
            got[i * p.n + j] = GemvOrder<decltype(kind)::value>(p, i, j);
          });
        }
      }
      const absl::Status s = CompareGgufProduct(p, want, got);
      EXPECT_TRUE(s.ok()) << s;
    }
  }
}

// The CPU's scalar kernels form the same block terms as the GPU and add
// them in another order (a K block's dot products apart from its mins): the
// bound holds them. (Its AVX2 / AVX-512 kernels scale partial integer sums
// per SIMD lane, so their results are not the blocks' terms to the bit and
// may differ from the host by more than 1e-6 of sum |terms|.)
TEST(GgufSelfCheckTest, CpuScalarKernelsPass) {
  CpuBackend cpu(2);
  ASSERT_TRUE(cpu.ForceSimdLevelForTest(SimdLevel::kScalar).ok());
  const absl::Status s = RunGgufSelfCheck(cpu);
  EXPECT_TRUE(s.ok()) << s;
}

// The CPU backend with one type's first output of every product nudged out
// of bound, or with one type failing to run.
class FaultyCpuBackend : public CpuBackend {
 public:
  FaultyCpuBackend(DType type, bool fail)
      : CpuBackend(2), type_(type), fail_(fail) {
    EXPECT_TRUE(ForceSimdLevelForTest(SimdLevel::kScalar).ok());
  }

 protected:
  absl::Status DoMatMul(const float* x, const void* w, DType w_dtype,
                        const float* bias, float* y, int64_t m, int64_t n,
                        int64_t k, Stream stream) override {
    if (w_dtype == type_ && fail_) {
      return absl::InternalError("an illegal memory access was encountered");
    }
    absl::Status s =
        CpuBackend::DoMatMul(x, w, w_dtype, bias, y, m, n, k, stream);
    if (w_dtype == type_) y[0] = y[0] * 1.001f + 1e-3f;
    return s;
  }

 private:
  const DType type_;
  const bool fail_;
};

TEST(GgufSelfCheckTest, AWrongTypeFailsTheCheckNamingIt) {
  FaultyCpuBackend be(DType::kQ5K, /*fail=*/false);
  const absl::Status s = RunGgufSelfCheck(be);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(s.message()), HasSubstr("Q5_K m 1: y[0, 0]"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("Q5_K m 9: y[0, 0]"));
  EXPECT_THAT(std::string(s.message()), Not(HasSubstr("Q4_K")));
  EXPECT_THAT(std::string(s.message()), Not(HasSubstr("Q6_K")));
}

TEST(GgufSelfCheckTest, AnErrorStopsTheCheckNamingTheType) {
  FaultyCpuBackend be(DType::kQ4_1, /*fail=*/true);
  const absl::Status s = RunGgufSelfCheck(be);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(s.message()), HasSubstr("Q4_1 product (m 1)"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("illegal memory access"));
}

}  // namespace
}  // namespace moe
