// Every op on every available backend against the double-precision scalar
// reference (reference_ops.h), in the spirit of ggml's test-backend-ops.
// Tolerances are per op and weight dtype; odd sizes exercise vector tails.
// The CUDA instance skips, with the reason, when there is no usable device.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "common/quant.h"
#include "kernels/backend.h"
#include "tests/kernels/backend_test_fixture.h"
#include "kernels/cpu_matmul.h"
#include "kernels/cpu_quant_matmul.h"
#include "tests/kernels/reference_ops.h"

namespace moe {
namespace {

// Weights of `dt` as raw bytes (16-bit types rounded from random f32).
std::vector<uint8_t> RandomWeights(size_t n, DType dt, uint32_t seed,
                                   float range = 1.0f) {
  std::vector<float> f = RandomVec(n, seed, -range, range);
  std::vector<uint8_t> bytes(n * DTypeSize(dt));
  for (size_t i = 0; i < n; ++i) {
    if (dt == DType::kF32) {
      std::memcpy(bytes.data() + 4 * i, &f[i], 4);
    } else {
      uint16_t h = dt == DType::kBF16 ? FloatToBF16(f[i]) : FloatToHalf(f[i]);
      std::memcpy(bytes.data() + 2 * i, &h, 2);
    }
  }
  return bytes;
}

// A [rows, cols] matrix of block format `dt` quantized from random floats.
std::vector<uint8_t> QuantizedWeights(int64_t rows, int64_t cols, DType dt,
                                      uint32_t seed, float range = 1.0f) {
  std::vector<float> f = RandomVec(rows * cols, seed, -range, range);
  std::vector<uint8_t> bytes(WeightBytes(dt, rows, cols));
  const int64_t row_bytes = WeightBytes(dt, 1, cols);
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_TRUE(QuantizeRow(f.data() + r * cols, cols, dt,
                            bytes.data() + r * row_bytes)
                    .ok());
  }
  return bytes;
}

// Max over i of |got - want| / (atol + rtol * |want|); <= 1 passes.
double ErrorRatio(const std::vector<float>& got, const std::vector<float>& want,
                  double atol, double rtol) {
  EXPECT_EQ(got.size(), want.size());
  double worst = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    double err = std::fabs(double(got[i]) - want[i]);
    if (std::isnan(got[i]) != std::isnan(want[i])) return INFINITY;
    worst = std::max(worst, err / (atol + rtol * std::fabs(want[i])));
  }
  return worst;
}

class BackendOpsTest : public BackendParamTest {
 protected:
  // MatMul tolerance scales with sqrt(k). On a device, prefill-shaped
  // products (m > 8) run through cuBLAS with activations rounded to the
  // weight dtype.
  // `rounded`: the reference already rounds the activations as the
  // backend does (MatMul); else bf16 products on a backend that rounds them
  // are within the rounding's error (ExpertFfn's intermediate activations).
  double MatMulAtol(DType dt, int64_t m, int64_t k, bool rounded = false) const {
    double base = 2e-6;
    if (is_device() && m > 8 && dt != DType::kF32) {
      base = dt == DType::kBF16 ? 4e-3 : 5e-4;
    }
    if (!rounded && dt == DType::kBF16 && backend_->Info().bf16_rounds_activations) {
      base = 4e-3;
    }
    return base * std::sqrt(double(k) + 1.0);
  }
};

struct MatMulCase {
  int64_t m, n, k;
  bool bias;
};

TEST_P(BackendOpsTest, MatMulMatchesReference) {
  const MatMulCase cases[] = {{1, 1, 1, false},    {1, 37, 129, true},
                              {3, 17, 67, false},  {5, 64, 1000, true},
                              {7, 33, 1030, false}, {16, 48, 256, true},
                              {1, 300, 2100, true}, {13, 5, 7, true}};
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (const MatMulCase& c : cases) {
      SCOPED_TRACE(testing::Message() << DTypeName(dt) << " m=" << c.m
                                      << " n=" << c.n << " k=" << c.k);
      auto x = RandomVec(c.m * c.k, 1);
      auto w = RandomWeights(c.n * c.k, dt, 2);
      auto bias = RandomVec(c.n, 3);
      // A backend that rounds activations to bf16 for bf16 weights
      // (AVX512_BF16) multiplies the rounded ones exactly.
      std::vector<float> xr = x;
      if (dt == DType::kBF16 && backend_->Info().bf16_rounds_activations) {
        for (float& v : xr) v = BF16ToFloat(FloatToBF16(v));
      }
      auto want = ref::MatMul(xr, w.data(), dt, c.bias ? bias.data() : nullptr,
                              c.m, c.n, c.k);
      float* dy = Upload(std::vector<float>(c.m * c.n, NAN));
      ASSERT_TRUE(backend_
                      ->MatMul(Upload(x), UploadBytes(w.data(), w.size()), dt,
                               c.bias ? Upload(bias) : nullptr, dy, c.m, c.n,
                               c.k)
                      .ok());
      EXPECT_LE(ErrorRatio(Download(dy, c.m * c.n), want,
                           MatMulAtol(dt, c.m, c.k, /*rounded=*/true), 1e-5),
                1.0);
    }
  }
}

TEST_P(BackendOpsTest, RmsNormMatchesReferenceAndWorksInPlace) {
  for (auto [rows, dim] : {std::pair<int64_t, int64_t>{1, 1}, {7, 130},
                           {5, 4096}, {24, 64}}) {
    SCOPED_TRACE(testing::Message() << rows << "x" << dim);
    auto x = RandomVec(rows * dim, 4, -3, 3);
    auto w = RandomVec(dim, 5, 0.5, 1.5);
    auto want = ref::RmsNorm(x, w, rows, dim, 1e-6);
    float* dx = Upload(x);
    float* dy = Upload(std::vector<float>(x.size()));
    ASSERT_TRUE(backend_->RmsNorm(dx, Upload(w), dy, rows, dim, 1e-6f).ok());
    EXPECT_LE(ErrorRatio(Download(dy, x.size()), want, 1e-6, 1e-5), 1.0);
    ASSERT_TRUE(backend_->RmsNorm(dx, Upload(w), dx, rows, dim, 1e-6f).ok());
    EXPECT_LE(ErrorRatio(Download(dx, x.size()), want, 1e-6, 1e-5), 1.0);
  }
}

TEST_P(BackendOpsTest, RopeMatchesReference) {
  struct Case {
    int64_t tokens, qh, kvh, hd;
    float theta;
  };
  for (Case c : {Case{1, 1, 1, 2, 10000.f}, Case{5, 4, 2, 6, 10000.f},
                 Case{9, 8, 2, 64, 1e6f}, Case{3, 2, 1, 128, 10000.f}}) {
    SCOPED_TRACE(testing::Message() << c.tokens << " " << c.hd);
    auto q = RandomVec(c.tokens * c.qh * c.hd, 6);
    auto k = RandomVec(c.tokens * c.kvh * c.hd, 7);
    std::vector<int32_t> pos(c.tokens);
    for (int64_t t = 0; t < c.tokens; ++t) pos[t] = int32_t(t * 997 % 5000);
    float* dq = Upload(q);
    float* dk = Upload(k);
    ASSERT_TRUE(backend_
                    ->Rope(dq, dk, Upload(pos), c.tokens, c.qh, c.kvh, c.hd,
                           c.theta)
                    .ok());
    ref::Rope(q, pos, c.tokens, c.qh, c.hd, c.theta);
    ref::Rope(k, pos, c.tokens, c.kvh, c.hd, c.theta);
    EXPECT_LE(ErrorRatio(Download(dq, q.size()), q, 1e-5, 1e-5), 1.0);
    EXPECT_LE(ErrorRatio(Download(dk, k.size()), k, 1e-5, 1e-5), 1.0);
  }
}

// Prefill a first chunk, then append more (a second prefill chunk or one
// decode token) and attend; the cache must hold exactly what was appended.
TEST_P(BackendOpsTest, KvCacheAndAttentionMatchReference) {
  struct Case {
    int64_t first, more, heads, kv_heads, hd, max_seq;
  };
  for (Case c : {Case{0, 7, 4, 2, 16, 8}, Case{9, 1, 6, 6, 64, 16},
                 Case{299, 1, 8, 1, 128, 320}, Case{5, 6, 4, 4, 5, 11},
                 Case{40, 33, 4, 2, 64, 80}}) {
    SCOPED_TRACE(testing::Message() << c.first << "+" << c.more << " h"
                                    << c.heads << "/" << c.kv_heads << " d"
                                    << c.hd);
    const int64_t row = c.kv_heads * c.hd, total = c.first + c.more;
    auto keys = RandomVec(total * row, 8);
    auto values = RandomVec(total * row, 9);
    float* kc = Upload(std::vector<float>(c.max_seq * row, 0.f));
    float* vc = Upload(std::vector<float>(c.max_seq * row, 0.f));
    AttentionShape s{c.first, c.heads, c.kv_heads, c.hd, c.max_seq, 0};
    std::vector<float> k0(keys.begin(), keys.begin() + c.first * row);
    std::vector<float> v0(values.begin(), values.begin() + c.first * row);
    ASSERT_TRUE(backend_->KvCacheAppend(Upload(k0), Upload(v0), kc, vc, s).ok());
    s.tokens = c.more;
    s.start_pos = c.first;
    std::vector<float> k1(keys.begin() + c.first * row, keys.end());
    std::vector<float> v1(values.begin() + c.first * row, values.end());
    ASSERT_TRUE(backend_->KvCacheAppend(Upload(k1), Upload(v1), kc, vc, s).ok());
    auto cached = Download(kc, c.max_seq * row);
    EXPECT_TRUE(std::equal(keys.begin(), keys.end(), cached.begin()));
    EXPECT_EQ(cached[total * row - 1], keys.back());
    auto q = RandomVec(c.more * c.heads * c.hd, 10, -2, 2);
    float* dout = Upload(std::vector<float>(q.size(), NAN));
    const float scale = 1.0f / std::sqrt(float(c.hd));
    ASSERT_TRUE(backend_->Attention(Upload(q), kc, vc, dout, s, scale).ok());
    auto want = ref::Attention(q, keys, values, s, scale);
    EXPECT_LE(ErrorRatio(Download(dout, q.size()), want, 2e-6, 1e-5), 1.0);
  }
}

TEST_P(BackendOpsTest, RouterTopKMatchesReferenceWithTies) {
  struct Case {
    int64_t tokens, experts, k;
  };
  for (Case c : {Case{1, 1, 1}, Case{9, 8, 2}, Case{5, 60, 4}, Case{3, 128, 8}}) {
    for (bool renorm : {false, true}) {
      SCOPED_TRACE(testing::Message() << c.experts << " top" << c.k << " "
                                      << renorm);
      auto logits = RandomVec(c.tokens * c.experts, 11, -4, 4);
      // Ties: copy the best logit of token 0 into a later expert.
      if (c.experts > 2) logits[c.experts - 1] = logits[1] = 5.0f;
      std::vector<int32_t> want_ids;
      std::vector<float> want_w;
      ref::Router(logits, c.tokens, c.experts, c.k, renorm, &want_ids, &want_w);
      int32_t* ids = Upload(std::vector<int32_t>(c.tokens * c.k, -1));
      float* w = Upload(std::vector<float>(c.tokens * c.k));
      ASSERT_TRUE(backend_
                      ->RouterTopK(Upload(logits), ids, w, c.tokens, c.experts,
                                   c.k, renorm)
                      .ok());
      EXPECT_EQ(Download(ids, want_ids.size()), want_ids);
      EXPECT_LE(ErrorRatio(Download(w, want_w.size()), want_w, 1e-6, 1e-5), 1.0);
    }
  }
}

TEST_P(BackendOpsTest, ExpertFfnAccumulatesWeightedRows) {
  const int64_t tokens = 6, hidden = 67, inter = 45;
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (bool all_rows : {false, true}) {
      SCOPED_TRACE(testing::Message() << DTypeName(dt) << " all=" << all_rows);
      auto x = RandomVec(tokens * hidden, 12);
      auto gate = RandomWeights(inter * hidden, dt, 13, 0.3f);
      auto up = RandomWeights(inter * hidden, dt, 14, 0.3f);
      auto down = RandomWeights(hidden * inter, dt, 15, 0.3f);
      std::vector<int32_t> rows = {4, 1, 3};
      std::vector<float> wts = {0.5f, 0.25f, 0.125f};
      if (all_rows) {
        rows = {0, 1, 2, 3, 4, 5};
        wts.assign(6, 1.0f);
      }
      auto out0 = RandomVec(tokens * hidden, 16);
      auto want = out0;
      ref::ExpertFfn(x, rows, wts, gate.data(), up.data(), down.data(), dt,
                     want, hidden, inter);
      float* dout = Upload(out0);
      ASSERT_TRUE(backend_
                      ->ExpertFfn(Upload(x), all_rows ? nullptr : Upload(rows),
                                  all_rows ? nullptr : Upload(wts),
                                  UploadBytes(gate.data(), gate.size()),
                                  UploadBytes(up.data(), up.size()),
                                  UploadBytes(down.data(), down.size()), dt,
                                  dout, tokens, int64_t(rows.size()), hidden,
                                  inter)
                      .ok());
      EXPECT_LE(ErrorRatio(Download(dout, out0.size()), want,
                           MatMulAtol(dt, int64_t(rows.size()), hidden), 1e-5),
                1.0);
    }
  }
}

// The block formats against the float64 product of the dequantized weights
// (ref::MatMul reads them through LoadAsF32) and the rounded activations.
TEST_P(BackendOpsTest, QuantizedMatMulMatchesReference) {
  const MatMulCase cases[] = {{1, 1, 64, false},   {1, 37, 128, true},
                              {3, 17, 192, false}, {5, 64, 1088, true},
                              {7, 33, 2176, false}, {16, 48, 256, true},
                              {1, 300, 2112, true}, {13, 5, 64, true},
                              // Several 32 x 64 tiles of the CUDA prefill
                              // kernel, with row and column tails.
                              {40, 130, 320, false}, {70, 65, 128, true}};
  for (DType dt : {DType::kQ8, DType::kQ4}) {
    for (const MatMulCase& c : cases) {
      SCOPED_TRACE(testing::Message() << DTypeName(dt) << " m=" << c.m
                                      << " n=" << c.n << " k=" << c.k);
      auto x = RandomVec(c.m * c.k, 1);
      auto w = QuantizedWeights(c.n, c.k, dt, 2);
      auto bias = RandomVec(c.n, 3);
      // The op's definition rounds x to 8 bits per 32 (cpu_quant_matmul.h).
      auto xr = RoundActivations(x.data(), c.m, c.k);
      auto want = ref::MatMul(xr, w.data(), dt, c.bias ? bias.data() : nullptr,
                              c.m, c.n, c.k);
      float* dy = Upload(std::vector<float>(c.m * c.n, NAN));
      absl::Status s = backend_->MatMul(
          Upload(x), UploadBytes(w.data(), w.size()), dt,
          c.bias ? Upload(bias) : nullptr, dy, c.m, c.n, c.k);
      ASSERT_TRUE(s.ok()) << s;
      EXPECT_LE(ErrorRatio(Download(dy, c.m * c.n), want,
                           MatMulAtol(DType::kF32, c.m, c.k), 1e-5),
                1.0);
    }
  }
}

TEST_P(BackendOpsTest, QuantizedExpertFfnMatchesReference) {
  const int64_t hidden = 128, inter = 192;
  // 6 tokens: the decode (matvec) kernels; 20: the prefill (tiled) ones.
  for (const int64_t tokens : {6, 20}) {
  for (DType dt : {DType::kQ8, DType::kQ4}) {
    for (bool all_rows : {false, true}) {
      SCOPED_TRACE(testing::Message() << DTypeName(dt) << " all=" << all_rows
                                      << " tokens=" << tokens);
      auto x = RandomVec(tokens * hidden, 12);
      auto gate = QuantizedWeights(inter, hidden, dt, 13, 0.3f);
      auto up = QuantizedWeights(inter, hidden, dt, 14, 0.3f);
      auto down = QuantizedWeights(hidden, inter, dt, 15, 0.3f);
      std::vector<int32_t> rows = {4, 1, 3};
      std::vector<float> wts = {0.5f, 0.25f, 0.125f};
      if (all_rows) {
        rows.resize(tokens);
        for (int64_t t = 0; t < tokens; ++t) rows[t] = static_cast<int32_t>(t);
        wts.assign(tokens, 1.0f);
      }
      auto out0 = RandomVec(tokens * hidden, 16);
      auto want = out0;
      ref::ExpertFfn(x, rows, wts, gate.data(), up.data(), down.data(), dt,
                     want, hidden, inter);
      float* dout = Upload(out0);
      absl::Status s = backend_->ExpertFfn(
          Upload(x), all_rows ? nullptr : Upload(rows),
          all_rows ? nullptr : Upload(wts),
          UploadBytes(gate.data(), gate.size()),
          UploadBytes(up.data(), up.size()),
          UploadBytes(down.data(), down.size()), dt, dout, tokens,
          int64_t(rows.size()), hidden, inter);
      ASSERT_TRUE(s.ok()) << s;
      EXPECT_LE(ErrorRatio(Download(dout, out0.size()), want,
                           MatMulAtol(DType::kF32, int64_t(rows.size()), inter),
                           1e-5),
                1.0);
    }
  }
  }
}

// Against the exact product (activations not rounded): the rounding of x
// (half a step of max|x| / 127 per 32) bounds the difference.
TEST_P(BackendOpsTest, QuantizedMatMulIsCloseToTheUnroundedProduct) {
  const int64_t m = 3, n = 40, k = 512;
  for (DType dt : {DType::kQ8, DType::kQ4}) {
    SCOPED_TRACE(DTypeName(dt));
    auto x = RandomVec(m * k, 5);
    auto w = QuantizedWeights(n, k, dt, 6);
    auto want = ref::MatMul(x, w.data(), dt, nullptr, m, n, k);
    float* dy = Upload(std::vector<float>(m * n, NAN));
    absl::Status s = backend_->MatMul(Upload(x), UploadBytes(w.data(), w.size()), dt,
                                      nullptr, dy, m, n, k);
    ASSERT_TRUE(s.ok()) << s;
    // sum |w| * (1 / 254): |w| <= 1 and |x| <= 1 here.
    EXPECT_LE(ErrorRatio(Download(dy, m * n), want, double(k) / 254, 0), 1.0);
    EXPECT_LE(ErrorRatio(Download(dy, m * n), want, 0.1, 0), 1.0);  // typical: ~0.03
  }
}

// Rows that are not whole blocks are refused before any work.
TEST_P(BackendOpsTest, QuantizedRowsMustBeWholeBlocks) {
  float* buf = Upload(std::vector<float>(4096, 0.0f));
  EXPECT_EQ(backend_->MatMul(buf, buf, DType::kQ8, nullptr, buf, 1, 2, 48).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend_->MatMul(buf, buf, DType::kQ4, nullptr, buf, 1, 2, 96).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend_->ExpertFfn(buf, nullptr, nullptr, buf, buf, buf, DType::kQ4,
                                buf, 1, 1, 64, 32)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend_->Embedding(buf, DType::kQ8, nullptr, buf, 0, 1, 32).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_P(BackendOpsTest, EmbeddingAndConvertAreExact) {
  const int64_t vocab = 11, hidden = 19;
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    auto table = RandomWeights(vocab * hidden, dt, 17);
    std::vector<int32_t> ids = {3, 0, 10, 3};
    float* out = Upload(std::vector<float>(ids.size() * hidden));
    ASSERT_TRUE(backend_
                    ->Embedding(UploadBytes(table.data(), table.size()), dt,
                                Upload(ids), out, int64_t(ids.size()), vocab,
                                hidden)
                    .ok());
    auto got = Download(out, ids.size() * hidden);
    for (size_t t = 0; t < ids.size(); ++t) {
      for (int64_t h = 0; h < hidden; ++h) {
        ASSERT_EQ(got[t * hidden + h],
                  LoadAsF32(table.data(), dt, ids[t] * hidden + h));
      }
    }
    float* conv = Upload(std::vector<float>(vocab * hidden));
    ASSERT_TRUE(backend_
                    ->ConvertToF32(UploadBytes(table.data(), table.size()), dt,
                                   conv, vocab * hidden)
                    .ok());
    auto c = Download(conv, vocab * hidden);
    for (int64_t i = 0; i < vocab * hidden; ++i) {
      ASSERT_EQ(c[i], LoadAsF32(table.data(), dt, i));
    }
  }
}

TEST_P(BackendOpsTest, ElementwiseOpsMatchReference) {
  for (int64_t n : {1, 8, 1037}) {
    auto a = RandomVec(n, 18, -6, 6);
    auto b = RandomVec(n, 19, -2, 2);
    std::vector<float> silu(n), add(n), scale(n), sig(n);
    for (int64_t i = 0; i < n; ++i) {
      double g = a[i];
      silu[i] = float(g / (1 + std::exp(-g)) * b[i]);
      add[i] = a[i] + b[i];
      scale[i] = a[i] * 0.375f;
      sig[i] = float(1 / (1 + std::exp(-g)));
    }
    float* da = Upload(a);
    float* db = Upload(b);
    float* out = Upload(std::vector<float>(n));
    ASSERT_TRUE(backend_->SiluMul(da, db, out, n).ok());
    EXPECT_LE(ErrorRatio(Download(out, n), silu, 1e-6, 1e-5), 1.0);
    ASSERT_TRUE(backend_->Add(da, db, out, n).ok());
    EXPECT_LE(ErrorRatio(Download(out, n), add, 0, 1e-7), 1.0);
    ASSERT_TRUE(backend_->Sigmoid(da, out, n).ok());
    EXPECT_LE(ErrorRatio(Download(out, n), sig, 1e-7, 1e-5), 1.0);
    ASSERT_TRUE(backend_->Scale(da, 0.375f, n).ok());
    EXPECT_LE(ErrorRatio(Download(da, n), scale, 0, 1e-7), 1.0);
  }
}

TEST_P(BackendOpsTest, SamplingHelpersMatchReference) {
  for (auto [rows, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1},
                            {3, 1000, 5}, {2, 50257, 20}}) {
    SCOPED_TRACE(testing::Message() << rows << "x" << n << " k" << k);
    auto x = RandomVec(rows * n, 20, -10, 10);
    if (n > 10) x[7] = x[n - 2] = 11.0f;  // a tie for the maximum in row 0
    std::vector<int32_t> want_arg;
    std::vector<int32_t> want_ids;
    std::vector<float> want_vals, want_lsm;
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<double> row(x.begin() + r * n, x.begin() + (r + 1) * n);
      auto top = ref::TopKIds(row, k);
      want_arg.push_back(top[0]);
      for (int32_t id : top) {
        want_ids.push_back(id);
        want_vals.push_back(float(row[id]));
      }
      double mx = *std::max_element(row.begin(), row.end()), sum = 0;
      for (double v : row) sum += std::exp(v - mx);
      for (double v : row) want_lsm.push_back(float(v - mx - std::log(sum)));
    }
    float* dx = Upload(x);
    int32_t* arg = Upload(std::vector<int32_t>(rows, -1));
    ASSERT_TRUE(backend_->Argmax(dx, arg, rows, n).ok());
    EXPECT_EQ(Download(arg, rows), want_arg);
    int32_t* ids = Upload(std::vector<int32_t>(rows * k, -1));
    float* vals = Upload(std::vector<float>(rows * k));
    ASSERT_TRUE(backend_->TopK(dx, ids, vals, rows, n, k).ok());
    EXPECT_EQ(Download(ids, rows * k), want_ids);
    EXPECT_EQ(Download(vals, rows * k), want_vals);
    float* lsm = Upload(std::vector<float>(rows * n));
    ASSERT_TRUE(backend_->LogSoftmax(dx, lsm, rows, n).ok());
    EXPECT_LE(ErrorRatio(Download(lsm, rows * n), want_lsm, 1e-5, 1e-6), 1.0);
  }
}

// The same inputs twice give bit-identical outputs.
TEST_P(BackendOpsTest, RerunIsBitIdentical) {
  const int64_t k = 1100, n = 70;
  auto w = RandomWeights(n * k, DType::kBF16, 21);
  void* dw = UploadBytes(w.data(), w.size());
  for (int64_t m : {1, 12}) {
    float* dx = Upload(RandomVec(m * k, 22));
    float* y1 = Upload(std::vector<float>(m * n));
    float* y2 = Upload(std::vector<float>(m * n));
    ASSERT_TRUE(backend_->MatMul(dx, dw, DType::kBF16, nullptr, y1, m, n, k).ok());
    ASSERT_TRUE(backend_->MatMul(dx, dw, DType::kBF16, nullptr, y2, m, n, k).ok());
    EXPECT_EQ(Download(y1, m * n), Download(y2, m * n));
  }
  AttentionShape s{20, 4, 2, 32, 20, 0};
  float* kc = Upload(RandomVec(20 * 2 * 32, 23));
  float* vc = Upload(RandomVec(20 * 2 * 32, 24));
  float* q = Upload(RandomVec(20 * 4 * 32, 25));
  float* o1 = Upload(std::vector<float>(20 * 4 * 32));
  float* o2 = Upload(std::vector<float>(20 * 4 * 32));
  ASSERT_TRUE(backend_->Attention(q, kc, vc, o1, s, 0.17f).ok());
  ASSERT_TRUE(backend_->Attention(q, kc, vc, o2, s, 0.17f).ok());
  EXPECT_EQ(Download(o1, 20 * 4 * 32), Download(o2, 20 * 4 * 32));
}

TEST_P(BackendOpsTest, BadShapesAreInvalidArgument) {
  float* buf = Upload(std::vector<float>(64));
  int32_t* ids = Upload(std::vector<int32_t>(8));
  EXPECT_EQ(backend_->MatMul(nullptr, buf, DType::kF32, nullptr, buf, 2, 2, 2)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend_->MatMul(buf, buf, DType::kF32, nullptr, buf, -1, 2, 2)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend_->MatMul(buf, buf, static_cast<DType>(7), nullptr, buf, 1,
                             1, 1)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend_->MatMul(buf, buf, DType::kF32, nullptr, buf, 2, 2, 0)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend_->MatMul(buf, buf, DType::kI32, nullptr, buf, 1, 1, 1)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend_->Rope(buf, buf, ids, 1, 1, 1, 3, 1e4f).code(),
            absl::StatusCode::kInvalidArgument);
  AttentionShape gqa{1, 3, 2, 4, 8, 0};
  EXPECT_EQ(backend_->Attention(buf, buf, buf, buf, gqa, 0.5f).code(),
            absl::StatusCode::kInvalidArgument);
  AttentionShape full{2, 2, 2, 4, 8, 7};
  EXPECT_EQ(backend_->KvCacheAppend(buf, buf, buf, buf, full).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(backend_->RouterTopK(buf, ids, buf, 1, 4, 5, true).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend_->TopK(buf, ids, buf, 1, 4, 0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend_->ExpertFfn(buf, ids, buf, buf, buf, buf, DType::kF32, buf,
                                2, 3, 2, 2)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend_->RmsNorm(buf, buf, buf, 1, 4, -1.0f).code(),
            absl::StatusCode::kInvalidArgument);
  // Empty ops are no-ops, even with null pointers.
  EXPECT_TRUE(backend_->MatMul(nullptr, nullptr, DType::kBF16, nullptr,
                               nullptr, 0, 0, 0)
                  .ok());
}

INSTANTIATE_TEST_SUITE_P(AllBackends, BackendOpsTest,
                         ::testing::Values("cpu", "cuda"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace moe
