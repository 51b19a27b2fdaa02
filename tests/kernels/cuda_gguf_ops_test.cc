// ggml's block formats on the CUDA backend (kernels/cuda/gguf_gemm.cu)
// against the CPU backend: MatMul and ExpertFfn for every type with
// m = 1, 3, 17, 64 rows (the GEMV up to 8 rows, the tiled kernel above),
// column and row tails, biases, and experts of mixed types. The CUDA
// kernels round the activations as the CPU does and each block's terms are
// the CPU's bits (gguf_block_math_test), so MatMul differs from the CPU only
// by the order of f32 additions. The parity tests use a backend made
// without the start-up self-check, so that they show every difference even
// where the self-check would turn ggml blocks off; CudaGgufSelfCheckTest
// runs that check on the device. Skips with the reason where there is no
// CUDA device; under MOE_REQUIRE_CUDA=1 (scripts/gpu-check.sh) that fails.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cpu_gguf_quant.h"
#include "kernels/cpu_quant_matmul.h"
#include "kernels/cuda_backend.h"
#include "kernels/cuda_gguf_self_check.h"
#include "tests/kernels/gguf_test_blocks.h"

namespace moe {
namespace {

using gguf_test::RandomBlocks;

std::vector<float> Normal(size_t n, std::mt19937& rng, float sigma = 1.0f);

// Whether the CUDA backend could not be created (`created`: its status);
// then the test skips, and under MOE_REQUIRE_CUDA=1 it also fails.
bool NoCuda(const absl::Status& created) {
  if (created.ok()) return false;
  const char* require = std::getenv("MOE_REQUIRE_CUDA");
  EXPECT_FALSE(require != nullptr && *require == '1') << created;
  return true;
}

// The CUDA backend beside the CPU one (Base: a gtest fixture base).
template <typename Base>
class CudaVsCpu : public Base {
 protected:
  void SetUp() override {
    auto cuda = CreateCudaBackendWithoutSelfCheckForTest(/*device=*/0);
    if (NoCuda(cuda.status())) {
      GTEST_SKIP() << "no CUDA device: " << cuda.status().message();
    }
    cuda_ = std::move(*cuda);
    auto cpu = CreateBackend("cpu");
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    cpu_ = std::move(*cpu);
    ASSERT_TRUE(cuda_->Info().supports_gguf_blocks);
  }
  void TearDown() override {
    for (void* p : allocations_) cuda_->Free(p);
  }

  void* Upload(const void* data, size_t bytes) {
    auto p = cuda_->Alloc(std::max<size_t>(bytes, 1));
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return nullptr;
    allocations_.push_back(*p);
    EXPECT_TRUE(cuda_->CopyToDevice(*p, data, bytes).ok());
    return *p;
  }
  template <typename T>
  T* Upload(const std::vector<T>& v) {
    return static_cast<T*>(Upload(v.data(), v.size() * sizeof(T)));
  }
  std::vector<float> Download(const float* p, size_t n) {
    std::vector<float> out(n);
    absl::Status s = cuda_->Synchronize();
    EXPECT_TRUE(s.ok()) << s;
    s = cuda_->CopyToHost(out.data(), p, n * sizeof(float));
    EXPECT_TRUE(s.ok()) << s;
    return out;
  }

  // The CUDA ExpertFfn against the CPU backend's (rows empty: all tokens),
  // hidden 512 and inter 768. The activations before down are rounded
  // again (per 32 or 256), and gate and up differ from the CPU's in their
  // last bits, so rarely a code there lands on the other side of a
  // rounding tie. The tolerance per output: 2e-4 of sum |w_down act| plus
  // two such flips (max |w_down| * max |act| / 127 each). A misread field
  // errs by percents of that sum; one wrong weight can hide in it (the
  // MatMul test's bound is the tight one).
  void ExpectExpertFfnParity(const ExpertDTypes& dt, int64_t tokens,
                             const std::vector<int32_t>& rows, uint32_t seed,
                             double* worst);

  std::unique_ptr<Backend> cuda_, cpu_;
  std::vector<void*> allocations_;
};

using CudaGgufOpsTest = CudaVsCpu<::testing::TestWithParam<DType>>;
class CudaGgufMixedTest : public CudaVsCpu<::testing::Test> {};

std::vector<float> Normal(size_t n, std::mt19937& rng, float sigma) {
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// x as the kernels round it for weights of `t`.
std::vector<float> Rounded(DType t, const std::vector<float>& x, int64_t m,
                           int64_t k) {
  return IsGgufKDType(t) ? RoundKActivations(x.data(), m, k)
                         : RoundActivations(x.data(), m, k, ActRoundingFor(t));
}

TEST_P(CudaGgufOpsTest, MatMulMatchesTheCpuBackend) {
  const DType t = GetParam();
  // K-quants: 5 blocks of 256 (the GEMV's 4 blocks a step, and a tail);
  // the others: 41 blocks of 32 (more than a warp's lanes).
  const int64_t k = IsGgufKDType(t) ? 5 * 256 : 41 * 32,
                n = 70;  // 64-column tiles + 6
  std::mt19937 rng(static_cast<uint32_t>(t) * 7u + 1u);
  double worst = 0;
  for (const int64_t m : {1, 3, 17, 64}) {
    SCOPED_TRACE(::testing::Message() << DTypeName(t) << " m " << m);
    const bool with_bias = m == 3 || m == 64;
    const std::vector<uint8_t> w = RandomBlocks(t, n, k, rng);
    std::vector<float> x = Normal(static_cast<size_t>(m * k), rng);
    x[2] = 12.0f;  // an outlier: a coarse activation group
    const std::vector<float> bias = Normal(static_cast<size_t>(n), rng);
    const float* b = with_bias ? bias.data() : nullptr;
    std::vector<float> want(static_cast<size_t>(m * n));
    ASSERT_TRUE(
        cpu_->MatMul(x.data(), w.data(), t, b, want.data(), m, n, k).ok());
    float* dy = Upload(std::vector<float>(static_cast<size_t>(m * n), NAN));
    absl::Status s =
        cuda_->MatMul(Upload(x), Upload(w.data(), w.size()), t,
                      with_bias ? Upload(bias) : nullptr, dy, m, n, k);
    ASSERT_TRUE(s.ok()) << s;
    const std::vector<float> got = Download(dy, want.size());
    const gguf_test::Reference ref =
        gguf_test::Expected(t, w, Rounded(t, x, m, k), m, n, k, &x);
    for (size_t o = 0; o < want.size(); ++o) {
      // The same terms, added in another order (and the bias once).
      const double tol =
          2e-6 * ref.scale[o] + 1e-6 * std::fabs(want[o]) + 1e-30;
      const double err = std::fabs(double(got[o]) - want[o]);
      worst = std::max(worst, err / tol);
      ASSERT_LE(err, tol) << "y[" << o / n << ", " << o % n << "]: " << got[o]
                          << " vs " << want[o];
      const double want64 = ref.y[o] + (with_bias ? bias[o % n] : 0.0f);
      ASSERT_LE(std::fabs(got[o] - want64), tol)
          << "against float64, output " << o;
    }
  }
  std::printf("[%s] MatMul worst error: %.3g of the tolerance\n",
              std::string(DTypeName(t)).c_str(), worst);
}

template <typename Base>
void CudaVsCpu<Base>::ExpectExpertFfnParity(const ExpertDTypes& dt,
                                            int64_t tokens,
                                            const std::vector<int32_t>& rows,
                                            uint32_t seed, double* worst) {
  const int64_t hidden = 512, inter = 768;  // multiples of 256
  std::mt19937 rng(seed);
  const std::vector<uint8_t> gate =
      RandomBlocks(dt.gate, inter, hidden, rng, 0.05f);
  const std::vector<uint8_t> up =
      RandomBlocks(dt.up, inter, hidden, rng, 0.05f);
  const std::vector<uint8_t> down =
      RandomBlocks(dt.down, hidden, inter, rng, 0.05f);
  const std::vector<float> x =
      Normal(static_cast<size_t>(tokens * hidden), rng);
  const int64_t count =
      rows.empty() ? tokens : static_cast<int64_t>(rows.size());
  std::vector<float> weights = Normal(static_cast<size_t>(count), rng, 0.5f);
  const std::vector<float> out0 =
      Normal(static_cast<size_t>(tokens * hidden), rng);
  std::vector<float> want = out0;
  const int32_t* rows_ptr = rows.empty() ? nullptr : rows.data();
  ASSERT_TRUE(cpu_->ExpertFfn(x.data(), rows_ptr, weights.data(), gate.data(),
                              up.data(), down.data(), dt, want.data(), tokens,
                              count, hidden, inter)
                  .ok());
  float* dout = Upload(out0);
  absl::Status s = cuda_->ExpertFfn(
      Upload(x), rows.empty() ? nullptr : Upload(rows), Upload(weights),
      Upload(gate.data(), gate.size()), Upload(up.data(), up.size()),
      Upload(down.data(), down.size()), dt, dout, tokens, count, hidden, inter);
  ASSERT_TRUE(s.ok()) << s;
  const std::vector<float> got = Download(dout, out0.size());
  // The tolerance's parts from the CPU's act = silu(gate x) * up x.
  std::vector<float> xg(static_cast<size_t>(count * hidden));
  for (int64_t i = 0; i < count; ++i) {
    std::copy_n(&x[(rows.empty() ? i : rows[i]) * hidden], hidden,
                &xg[i * hidden]);
  }
  std::vector<float> g(static_cast<size_t>(count * inter)), u(g.size());
  ASSERT_TRUE(cpu_->MatMul(xg.data(), gate.data(), dt.gate, nullptr, g.data(),
                           count, inter, hidden)
                  .ok());
  ASSERT_TRUE(cpu_->MatMul(xg.data(), up.data(), dt.up, nullptr, u.data(),
                           count, inter, hidden)
                  .ok());
  std::vector<float> wd(static_cast<size_t>(hidden * inter));
  for (int64_t o = 0; o < hidden; ++o) {
    const std::vector<float> row =
        gguf_test::DecodedRow(dt.down, down, o, inter);
    std::copy(row.begin(), row.end(), &wd[o * inter]);
  }
  for (int64_t i = 0; i < count; ++i) {
    std::vector<double> act(static_cast<size_t>(inter));
    double amax = 0;
    for (int64_t e = 0; e < inter; ++e) {
      const double gv = g[i * inter + e];
      act[e] = gv / (1.0 + std::exp(-gv)) * u[i * inter + e];
      amax = std::max(amax, std::fabs(act[e]));
    }
    const int64_t r = rows.empty() ? i : rows[i];
    for (int64_t o = 0; o < hidden; ++o) {
      double sum_abs = 0, wmax = 0;
      for (int64_t e = 0; e < inter; ++e) {
        sum_abs += std::fabs(wd[o * inter + e] * act[e]);
        wmax = std::max(wmax, double(std::fabs(wd[o * inter + e])));
      }
      const size_t at = static_cast<size_t>(r * hidden + o);
      const double tol =
          std::fabs(weights[i]) * (2e-4 * sum_abs + 2 * wmax * amax / 127) +
          1e-6 * std::fabs(want[at]) + 1e-30;
      const double err = std::fabs(double(got[at]) - want[at]);
      *worst = std::max(*worst, err / tol);
      ASSERT_LE(err, tol) << "out[" << r << ", " << o << "]: " << got[at]
                          << " vs " << want[at];
    }
  }
}

TEST_P(CudaGgufOpsTest, ExpertFfnMatchesTheCpuBackend) {
  const DType t = GetParam();
  double worst = 0;
  for (const int64_t tokens : {1, 3, 17, 64}) {
    SCOPED_TRACE(::testing::Message() << DTypeName(t) << " tokens " << tokens);
    ExpectExpertFfnParity(
        ExpertDTypes::All(t), tokens, {},
        static_cast<uint32_t>(tokens) * 13u + static_cast<uint32_t>(t), &worst);
  }
  // 5 of 17 tokens, gathered by row ids (the GEMV path).
  ExpectExpertFfnParity(ExpertDTypes::All(t), 17, {16, 0, 7, 3, 11}, 99u,
                        &worst);
  std::printf("[%s] ExpertFfn worst error: %.3g of the tolerance\n",
              std::string(DTypeName(t)).c_str(), worst);
}

INSTANTIATE_TEST_SUITE_P(Types, CudaGgufOpsTest,
                         ::testing::ValuesIn(gguf_test::kGgufBlockDTypes),
                         gguf_test::DTypeParamName);

// The backend as the executables create it ran the self-check at start and
// kept ggml blocks on; a second run gives the details if it did not.
TEST(CudaGgufSelfCheckTest, PassesOnTheDevice) {
  auto cuda = CreateBackend("cuda");
  if (NoCuda(cuda.status())) {
    GTEST_SKIP() << "no CUDA device: " << cuda.status().message();
  }
  const auto start = std::chrono::steady_clock::now();
  const absl::Status s = RunGgufSelfCheck(**cuda);
  const double ms = std::chrono::duration<double, std::milli>(
                        std::chrono::steady_clock::now() - start)
                        .count();
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_TRUE((*cuda)->Info().supports_gguf_blocks)
      << "the self-check at start failed (its WARNING is in the log)";
  std::printf("ggml self-check on %s: %.2f ms (a second run)\n",
              (*cuda)->Info().device_name.c_str(), ms);
}

// Experts of mixed types, as llama.cpp's Q4_K_M writes them (a Q6_K down
// beside Q4_K gate and up), and 32-weight types beside q8.
TEST_F(CudaGgufMixedTest, MixedDTypesMatchTheCpuBackend) {
  double worst = 0;
  for (const ExpertDTypes& dt :
       {ExpertDTypes{DType::kQ4K, DType::kQ4K, DType::kQ6K},
        ExpertDTypes{DType::kQ5_0, DType::kQ4_1, DType::kQ8}}) {
    for (const int64_t tokens : {1, 17}) {
      SCOPED_TRACE(::testing::Message()
                   << DTypeName(dt.gate) << "/" << DTypeName(dt.up) << "/"
                   << DTypeName(dt.down) << " tokens " << tokens);
      ExpectExpertFfnParity(dt, tokens, {}, 7u * static_cast<uint32_t>(tokens),
                            &worst);
    }
  }
  std::printf("mixed ExpertFfn worst error: %.3g of the tolerance\n", worst);
}

}  // namespace
}  // namespace moe
