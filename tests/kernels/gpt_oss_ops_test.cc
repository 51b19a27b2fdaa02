// The GPT-OSS ops (SinkAttention, BiasedExpertFfn, and the router rule the
// engine builds from MatMul + RouterTopK) on every available backend against
// double-precision references written here from modeling_gpt_oss.py. The
// sliding window is checked to hold exactly `window` positions: the kernel
// matches the reference at that window and differs from it at window +- 1.
// The CUDA instance skips, with the reason, when there is no usable device.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/checkpoint.h"
#include "common/fp8.h"
#include "common/mxfp4.h"
#include "common/quant.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cpu_quant_matmul.h"
#include "tests/kernels/backend_test_fixture.h"

namespace moe {
namespace {

// eager_attention_forward of modeling_gpt_oss.py in double: scores with the
// causal and sliding_window_overlay masks (kv > q - window), the sink column
// in the softmax, dropped.
std::vector<double> RefSinkAttention(const std::vector<float>& q,
                                     const std::vector<float>& k,
                                     const std::vector<float>& v,
                                     const std::vector<float>& sinks,
                                     const AttentionShape& s, double scale,
                                     int64_t window) {
  const int64_t d = s.head_dim, group = s.heads / s.kv_heads;
  std::vector<double> out(s.tokens * s.heads * d, 0.0);
  for (int64_t t = 0; t < s.tokens; ++t) {
    const int64_t p = s.start_pos + t;
    for (int64_t h = 0; h < s.heads; ++h) {
      std::vector<double> logit;
      std::vector<int64_t> pos;
      for (int64_t j = 0; j <= p; ++j) {
        if (window > 0 && !(j > p - window)) continue;
        double dot = 0;
        for (int64_t i = 0; i < d; ++i) {
          dot += double(q[(t * s.heads + h) * d + i]) *
                 double(k[(j * s.kv_heads + h / group) * d + i]);
        }
        logit.push_back(dot * scale);
        pos.push_back(j);
      }
      double mx = sinks[h];
      for (double l : logit) mx = std::max(mx, l);
      double sum = std::exp(double(sinks[h]) - mx);
      for (double l : logit) sum += std::exp(l - mx);
      for (size_t n = 0; n < logit.size(); ++n) {
        const double w = std::exp(logit[n] - mx) / sum;
        for (int64_t i = 0; i < d; ++i) {
          out[(t * s.heads + h) * d + i] +=
              w * v[(pos[n] * s.kv_heads + h / group) * d + i];
        }
      }
    }
  }
  return out;
}

// GptOssExperts for one expert in double, weights in Linear layout.
std::vector<double> RefExpert(
    const std::vector<float>& x, const std::vector<float>& gate,
    const std::vector<float>& up, const std::vector<float>& down,
    const std::vector<float>& gb, const std::vector<float>& ub,
    const std::vector<float>& db, int64_t rows, int64_t hidden, int64_t inter,
    double limit, double alpha) {
  std::vector<double> out(rows * hidden, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<double> act(inter);
    for (int64_t i = 0; i < inter; ++i) {
      double g = gb[i], u = ub[i];
      for (int64_t c = 0; c < hidden; ++c) {
        g += double(x[r * hidden + c]) * gate[i * hidden + c];
        u += double(x[r * hidden + c]) * up[i * hidden + c];
      }
      g = std::min(g, limit);
      u = std::clamp(u, -limit, limit);
      act[i] = (u + 1.0) * g / (1.0 + std::exp(-alpha * g));
    }
    for (int64_t o = 0; o < hidden; ++o) {
      double y = db[o];
      for (int64_t i = 0; i < inter; ++i) y += act[i] * down[o * inter + i];
      out[r * hidden + o] = y;
    }
  }
  return out;
}

class GptOssOpsTest : public BackendParamTest {};

TEST_P(GptOssOpsTest, SinkAttentionMatchesReferenceFullAndWindowed) {
  struct Case {
    int64_t tokens, start, window;
  };
  // Prefill past the window, decode steps before and after it fills.
  for (const Case& c : {Case{12, 0, 0}, Case{12, 0, 5}, Case{1, 3, 5},
                        Case{1, 11, 5}, Case{3, 9, 4}, Case{6, 0, 1}}) {
    AttentionShape s{c.tokens, 4, 2, 16, 16, c.start};
    auto q = RandomVec(s.tokens * s.heads * s.head_dim, 1 + c.start);
    auto k = RandomVec(s.max_seq * s.kv_heads * s.head_dim, 2, -2.0f, 2.0f);
    auto v = RandomVec(s.max_seq * s.kv_heads * s.head_dim, 3);
    auto sinks = RandomVec(s.heads, 4, -2.0f, 2.0f);
    float* out = Upload(std::vector<float>(q.size(), NAN));
    const float scale = 0.25f;
    ASSERT_TRUE(backend_
                    ->SinkAttention(Upload(q), Upload(k), Upload(v),
                                    Upload(sinks), out, s, scale, c.window)
                    .ok());
    auto got = Download(out, q.size());
    auto want = RefSinkAttention(q, k, v, sinks, s, scale, c.window);
    EXPECT_LE(MaxAbsDiff(got, want), 2e-5) << "tokens " << c.tokens << " start "
                                           << c.start << " window " << c.window;
    if (c.window > 1 && c.start + c.tokens > c.window) {
      // One position more or less attended gives visibly different rows.
      EXPECT_GT(MaxAbsDiff(got, RefSinkAttention(q, k, v, sinks, s, scale,
                                                 c.window + 1)),
                1e-3);
      EXPECT_GT(MaxAbsDiff(got, RefSinkAttention(q, k, v, sinks, s, scale,
                                                 c.window - 1)),
                1e-3);
    }
  }
}

TEST_P(GptOssOpsTest, SinksTakeTheirShareOfTheSoftmax) {
  // One key: without a sink the output is v; a sink of logit equal to the
  // score halves it, a very negative one leaves v.
  AttentionShape s{1, 1, 1, 4, 1, 0};
  std::vector<float> q = {0, 0, 0, 0}, k = {1, 1, 1, 1}, v = {2, -4, 6, 8};
  for (float sink : {0.0f, -100.0f, std::log(3.0f)}) {
    float* out = Upload(std::vector<float>(4, NAN));
    ASSERT_TRUE(backend_
                    ->SinkAttention(Upload(q), Upload(k), Upload(v),
                                    Upload(std::vector<float>{sink}), out, s,
                                    1.0f, 0)
                    .ok());
    const double share = 1.0 / (1.0 + std::exp(double(sink)));
    auto got = Download(out, 4);
    for (int i = 0; i < 4; ++i)
      EXPECT_NEAR(got[i], v[i] * share, 1e-6) << "sink " << sink;
  }
}

TEST_P(GptOssOpsTest, BiasedExpertFfnMatchesReferenceThroughTheClamp) {
  const int64_t tokens = 6, hidden = 64, inter = 32, count = 4;
  // Large inputs so that many gate and up values pass the limit both ways.
  auto x = RandomVec(tokens * hidden, 11, -3.0f, 3.0f);
  auto gate = RandomVec(inter * hidden, 12, -0.5f, 0.5f);
  auto up = RandomVec(inter * hidden, 13, -0.5f, 0.5f);
  auto down = RandomVec(hidden * inter, 14, -0.3f, 0.3f);
  auto gb = RandomVec(inter, 15), ub = RandomVec(inter, 16),
       db = RandomVec(hidden, 17);
  const std::vector<int32_t> rows = {4, 0, 5, 2};
  const std::vector<float> weights = {0.5f, 0.25f, 1.0f, 0.125f};
  const ClampedSwiglu act{3.0f, 1.702f};
  std::vector<float> base = RandomVec(tokens * hidden, 18);
  float* out = Upload(base);
  ASSERT_TRUE(backend_
                  ->BiasedExpertFfn(Upload(x), Upload(rows), Upload(weights),
                                    Upload(gate), Upload(up), Upload(down),
                                    DType::kF32, Upload(gb), Upload(ub),
                                    Upload(db), act, out, tokens, count, hidden,
                                    inter)
                  .ok());
  std::vector<float> xr;
  for (int32_t r : rows)
    xr.insert(xr.end(), x.begin() + r * hidden, x.begin() + (r + 1) * hidden);
  auto ffn = RefExpert(xr, gate, up, down, gb, ub, db, count, hidden, inter,
                       3.0, 1.702);
  std::vector<double> want(base.begin(), base.end());
  for (int64_t i = 0; i < count; ++i) {
    for (int64_t h = 0; h < hidden; ++h)
      want[rows[i] * hidden + h] += weights[i] * ffn[i * hidden + h];
  }
  EXPECT_LE(MaxAbsDiff(Download(out, want.size()), want), 2e-4);
  // Without the clamp the result differs: the test exercises it.
  auto loose = RefExpert(xr, gate, up, down, gb, ub, db, count, hidden, inter,
                         1e9, 1.702);
  double moved = 0;
  for (size_t i = 0; i < ffn.size(); ++i)
    moved = std::max(moved, std::fabs(ffn[i] - loose[i]));
  EXPECT_GT(moved, 1e-2);
}

TEST_P(GptOssOpsTest, BiasedRouterIsSoftmaxOverTheTopKLogits) {
  // GptOssTopKRouter: logits = x W^T + b; top-k of the logits; softmax over
  // those k. The engine runs MatMul with the bias, then RouterTopK with
  // renormalization (softmax over all, renormalized over the k: equal).
  const int64_t tokens = 5, hidden = 32, experts = 16, k = 4;
  auto x = RandomVec(tokens * hidden, 21);
  auto w = RandomVec(experts * hidden, 22, -0.5f, 0.5f);
  auto b = RandomVec(experts, 23, -1.0f, 1.0f);
  float* logits = Upload(std::vector<float>(tokens * experts));
  ASSERT_TRUE(backend_
                  ->MatMul(Upload(x), Upload(w), DType::kF32, Upload(b), logits,
                           tokens, experts, hidden)
                  .ok());
  int32_t* ids = Upload(std::vector<int32_t>(tokens * k, -1));
  float* wts = Upload(std::vector<float>(tokens * k, NAN));
  ASSERT_TRUE(
      backend_->RouterTopK(logits, ids, wts, tokens, experts, k, true).ok());
  std::vector<int32_t> want_ids;
  std::vector<double> want_w;
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<double> l(experts);
    for (int64_t e = 0; e < experts; ++e) {
      l[e] = b[e];
      for (int64_t c = 0; c < hidden; ++c)
        l[e] += double(x[t * hidden + c]) * w[e * hidden + c];
    }
    std::vector<int32_t> idx(experts);
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(),
                     [&](int32_t a, int32_t c) { return l[a] > l[c]; });
    double mx = l[idx[0]], sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += std::exp(l[idx[j]] - mx);
    for (int64_t j = 0; j < k; ++j) {
      want_ids.push_back(idx[j]);
      want_w.push_back(std::exp(l[idx[j]] - mx) / sum);
    }
  }
  EXPECT_EQ(Download(ids, want_ids.size()), want_ids);
  EXPECT_LE(MaxAbsDiff(Download(wts, want_w.size()), want_w), 1e-6);
}

// Native mxfp4 weights on every backend (CUDA: the decode GEMV for m <= 8,
// the tiled GEMM above): the product of the dequantized weights and the
// 8-bit activations of RoundActivations, and an expert on them.
TEST_P(GptOssOpsTest, Mxfp4MatMulMatchesTheDequantizedProduct) {
  const int64_t n = 70, k = 96;
  std::vector<float> w = RandomVec(n * k, 51, -1.0f, 1.0f);
  for (int64_t i = 0; i < n * k; i += 5) w[i] *= 8.0f;
  std::vector<uint8_t> mx(
      static_cast<size_t>(WeightBytes(DType::kMxfp4, n, k)));
  const int64_t rb = WeightBytes(DType::kMxfp4, 1, k);
  for (int64_t r = 0; r < n; ++r) {
    ASSERT_TRUE(
        QuantizeRow(w.data() + r * k, k, DType::kMxfp4, mx.data() + r * rb)
            .ok());
  }
  std::vector<float> deq(n * k);
  for (int64_t i = 0; i < n * k; ++i)
    deq[i] = DequantizeElement(mx.data(), DType::kMxfp4, i);
  const uint8_t* dw = Upload(mx);
  for (int64_t m : {3, 20}) {
    std::vector<float> x = RandomVec(m * k, 52 + m), bias = RandomVec(n, 53);
    float* y = Upload(std::vector<float>(m * n, NAN));
    ASSERT_TRUE(
        backend_->MatMul(Upload(x), dw, DType::kMxfp4, Upload(bias), y, m, n, k)
            .ok());
    std::vector<float> xr = RoundActivations(x.data(), m, k);
    std::vector<double> want(m * n);
    double scale = 1.0;
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double acc = bias[j];
        for (int64_t c = 0; c < k; ++c)
          acc += double(xr[i * k + c]) * deq[j * k + c];
        want[i * n + j] = acc;
        scale = std::max(scale, std::fabs(acc));
      }
    }
    EXPECT_LE(MaxAbsDiff(Download(y, m * n), want), 2e-6 * scale) << "m " << m;
  }
  // An expert of square mxfp4 weights (hidden = inter = 96, rows n' = 96).
  const int64_t h = 96;
  std::vector<uint8_t> sq(
      static_cast<size_t>(WeightBytes(DType::kMxfp4, h, h)));
  std::vector<float> ws = RandomVec(h * h, 54, -0.3f, 0.3f);
  for (int64_t r = 0; r < h; ++r) {
    ASSERT_TRUE(
        QuantizeRow(ws.data() + r * h, h, DType::kMxfp4, sq.data() + r * rb)
            .ok());
  }
  const uint8_t* dsq = Upload(sq);
  auto x = RandomVec(2 * h, 55), gb = RandomVec(h, 56), ub = RandomVec(h, 57),
       db = RandomVec(h, 58);
  float* out = Upload(std::vector<float>(2 * h, 0.0f));
  ASSERT_TRUE(backend_
                  ->BiasedExpertFfn(Upload(x), nullptr, nullptr, dsq, dsq, dsq,
                                    DType::kMxfp4, Upload(gb), Upload(ub),
                                    Upload(db), ClampedSwiglu{}, out, 2, 2, h,
                                    h)
                  .ok());
  std::vector<float> got = Download(out, 2 * h);
  for (float v : got) ASSERT_TRUE(std::isfinite(v));
  if (GetParam() == "cuda") {  // the CPU's numbers, up to the order of sums
    auto cpu = CreateBackend("cpu");
    ASSERT_TRUE(cpu.ok());
    std::vector<float> ref(2 * h, 0.0f);
    ASSERT_TRUE((*cpu)
                    ->BiasedExpertFfn(x.data(), nullptr, nullptr, sq.data(),
                                      sq.data(), sq.data(), DType::kMxfp4,
                                      gb.data(), ub.data(), db.data(),
                                      ClampedSwiglu{}, ref.data(), 2, 2, h, h)
                    .ok());
    std::vector<double> refd(ref.begin(), ref.end());
    EXPECT_LE(MaxAbsDiff(got, refd), 1e-3);
  }
}

TEST_P(GptOssOpsTest, RerunIsBitIdentical) {
  AttentionShape s{7, 4, 2, 16, 8, 1};
  auto q = Upload(RandomVec(7 * 4 * 16, 31));
  auto k = Upload(RandomVec(8 * 2 * 16, 32));
  auto v = Upload(RandomVec(8 * 2 * 16, 33));
  auto sinks = Upload(RandomVec(4, 34));
  float* a = Upload(std::vector<float>(7 * 4 * 16));
  float* b = Upload(std::vector<float>(7 * 4 * 16));
  ASSERT_TRUE(backend_->SinkAttention(q, k, v, sinks, a, s, 0.25f, 3).ok());
  ASSERT_TRUE(backend_->SinkAttention(q, k, v, sinks, b, s, 0.25f, 3).ok());
  EXPECT_EQ(Download(a, 7 * 4 * 16), Download(b, 7 * 4 * 16));
}

TEST_P(GptOssOpsTest, BadShapesAreInvalidArgument) {
  float* f = Upload(std::vector<float>(64, 0.0f));
  AttentionShape s{2, 4, 3, 4, 4, 0};  // heads not a multiple of kv_heads
  EXPECT_EQ(backend_->SinkAttention(f, f, f, f, f, s, 1.0f, 0).code(),
            absl::StatusCode::kInvalidArgument);
  s.kv_heads = 2;
  EXPECT_EQ(backend_->SinkAttention(f, f, f, nullptr, f, s, 1.0f, 0).code(),
            absl::StatusCode::kInvalidArgument);  // no sinks
  EXPECT_EQ(backend_->SinkAttention(f, f, f, f, f, s, 1.0f, -1).code(),
            absl::StatusCode::kInvalidArgument);  // negative window
  const ClampedSwiglu act;
  EXPECT_EQ(backend_
                ->BiasedExpertFfn(f, nullptr, nullptr, f, f, f, DType::kF32,
                                  nullptr, f, f, act, f, 2, 2, 4, 4)
                .code(),
            absl::StatusCode::kInvalidArgument);  // no gate bias
  EXPECT_EQ(
      backend_
          ->BiasedExpertFfn(f, nullptr, nullptr, f, f, f, DType::kF32, f, f, f,
                            ClampedSwiglu{0.0f, 1.0f}, f, 2, 2, 4, 4)
          .code(),
      absl::StatusCode::kInvalidArgument);  // limit 0
}

// The native MXFP4 held format on the CPU: the product of the dequantized
// weights and the 8-bit activations (RoundActivations), and the same numbers
// as the weights held as q8 with their exact codes.
TEST(Mxfp4MatMulTest, NativeMatchesTheExactQ8AndTheReference) {
  auto cpu = CreateBackend("cpu");
  ASSERT_TRUE(cpu.ok());
  const int64_t m = 3, n = 40, k = 96;
  std::vector<float> w = RandomVec(n * k, 41, -2.0f, 2.0f);
  for (int64_t i = 0; i < n * k; i += 7) w[i] *= 16.0f;  // spread the scales
  // The checkpoint layout (codes and scales apart), as ModelDescription
  // views it; held as mxfp4 (repacked) and as q8 (exact codes).
  std::vector<uint8_t> codes(n * k / 2), scales(n * k / 32);
  for (int64_t r = 0; r < n; ++r) {
    QuantizeMxfp4Row(w.data() + r * k, k, codes.data() + r * k / 2,
                     scales.data() + r * k / 32);
  }
  TensorView view;
  view.dtype = DType::kMxfp4;
  view.shape = {n, k};
  view.data = codes.data();
  view.nbytes = codes.size();
  view.scales = {DType::kU8, scales.data(), n, k / 32, 1, 32, scales.size()};
  std::vector<uint8_t> mx(
      static_cast<size_t>(WeightBytes(DType::kMxfp4, n, k)));
  std::vector<uint8_t> q8(static_cast<size_t>(WeightBytes(DType::kQ8, n, k)));
  ASSERT_TRUE(ConvertWeightView(view, DType::kMxfp4, mx.data()).ok());
  ASSERT_TRUE(ConvertWeightView(view, DType::kQ8, q8.data()).ok());
  std::vector<float> deq(n * k);
  for (int64_t i = 0; i < n * k; ++i) {
    deq[i] = DequantizeElement(mx.data(), DType::kMxfp4, i);
    ASSERT_EQ(DequantizeElement(q8.data(), DType::kQ8, i), deq[i]) << i;
  }
  // QuantizeRow to mxfp4 from floats packs the same codes.
  std::vector<uint8_t> packed(mx.size());
  for (int64_t r = 0; r < n; ++r) {
    const int64_t rb = WeightBytes(DType::kMxfp4, 1, k);
    ASSERT_TRUE(
        QuantizeRow(w.data() + r * k, k, DType::kMxfp4, packed.data() + r * rb)
            .ok());
  }
  EXPECT_EQ(packed, mx);
  std::vector<float> x = RandomVec(m * k, 42), bias = RandomVec(n, 43);
  std::vector<float> y_mx(m * n), y_q8(m * n);
  ASSERT_TRUE((*cpu)
                  ->MatMul(x.data(), mx.data(), DType::kMxfp4, bias.data(),
                           y_mx.data(), m, n, k)
                  .ok());
  ASSERT_TRUE((*cpu)
                  ->MatMul(x.data(), q8.data(), DType::kQ8, bias.data(),
                           y_q8.data(), m, n, k)
                  .ok());
  std::vector<float> xr = RoundActivations(x.data(), m, k);
  std::vector<double> want(m * n);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = bias[j];
      for (int64_t c = 0; c < k; ++c)
        s += double(xr[i * k + c]) * deq[j * k + c];
      want[i * n + j] = s;
    }
  }
  EXPECT_LE(MaxAbsDiff(y_mx, want), 1e-4);
  double worst = 0;
  for (int64_t i = 0; i < m * n; ++i)
    worst = std::max(worst, double(std::fabs(y_mx[i] - y_q8[i])));
  // The same integer products; only the f32 order of the per-block terms
  // may differ (q8 runs the VNNI kernel where the CPU has it).
  double scale = 1.0;
  for (float v : y_q8) scale = std::max(scale, double(std::fabs(v)));
  EXPECT_LE(worst, 1e-6 * scale);
  std::printf("mxfp4 vs q8 of the same codes: max |diff| %.3g\n", worst);
  // Rows must be whole 32-weight blocks.
  EXPECT_EQ((*cpu)
                ->MatMul(x.data(), mx.data(), DType::kMxfp4, nullptr,
                         y_mx.data(), 1, 1, 48)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(AllBackends, GptOssOpsTest,
                         ::testing::Values("cpu", "cuda"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace moe
