// The DeepSeek ops (RouterSelect, RopeInterleaved, MlaAttention) on every
// available backend against double-precision references written here from
// the published math; MlaAttention against attention over the expanded keys
// and values (what the absorbed path must equal). The CUDA instance skips,
// with the reason, when there is no usable device.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "tests/kernels/backend_test_fixture.h"

namespace moe {
namespace {

// Indices of the k largest values, descending, ties to the lower index.
std::vector<int32_t> TopIndices(const std::vector<double>& x, int64_t k) {
  std::vector<int32_t> idx(x.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(),
                   [&](int32_t a, int32_t b) { return x[a] > x[b]; });
  idx.resize(k);
  return idx;
}

// DeepSeek's MoEGate in double (see RouterSpec in kernels/backend.h).
void RefRouter(const std::vector<float>& logits, const std::vector<float>& bias,
               int64_t tokens, int64_t experts, int64_t k, const RouterSpec& s,
               std::vector<int32_t>* ids, std::vector<double>* weights) {
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<double> scores(experts), choice(experts);
    const float* l = logits.data() + t * experts;
    if (s.scoring == RouterScoring::kSoftmax) {
      double mx = *std::max_element(l, l + experts), sum = 0;
      for (int64_t j = 0; j < experts; ++j) sum += std::exp(l[j] - mx);
      for (int64_t j = 0; j < experts; ++j)
        scores[j] = std::exp(l[j] - mx) / sum;
    } else {
      for (int64_t j = 0; j < experts; ++j)
        scores[j] = 1.0 / (1.0 + std::exp(-double(l[j])));
    }
    const bool biased = s.selection == RouterSelection::kBiasedGroupLimited;
    for (int64_t j = 0; j < experts; ++j)
      choice[j] = scores[j] + (biased ? bias[j] : 0.0);
    if (s.selection != RouterSelection::kGreedy) {
      const int64_t per = experts / s.n_group;
      std::vector<double> group(s.n_group);
      for (int64_t g = 0; g < s.n_group; ++g) {
        std::vector<double> members(choice.begin() + g * per,
                                    choice.begin() + (g + 1) * per);
        std::sort(members.rbegin(), members.rend());
        group[g] = biased ? members[0] + members[1] : members[0];
      }
      std::vector<int32_t> keep = TopIndices(group, s.topk_group);
      for (int64_t j = 0; j < experts; ++j) {
        if (std::find(keep.begin(), keep.end(), j / per) == keep.end())
          choice[j] = 0.0;
      }
    }
    std::vector<int32_t> top = TopIndices(choice, k);
    std::vector<double> w;
    for (int32_t e : top) w.push_back(scores[e]);
    if (s.renormalize && k > 1) {
      const double sum = std::accumulate(w.begin(), w.end(), 0.0);
      for (double& x : w) x /= sum + 1e-20;
    }
    for (double& x : w) x *= s.scale;
    ids->insert(ids->end(), top.begin(), top.end());
    weights->insert(weights->end(), w.begin(), w.end());
  }
}

class DeepseekOpsTest : public BackendParamTest {};

struct RouterCase {
  const char* name;
  int64_t tokens, experts, k;
  RouterSpec spec;
};

TEST_P(DeepseekOpsTest, RouterSelectMatchesReference) {
  using S = RouterSelection;
  const RouterSpec greedy{
      RouterScoring::kSoftmax, S::kGreedy, 1, 1, false, 16.0f};
  const RouterSpec limited{
      RouterScoring::kSoftmax, S::kGroupLimited, 8, 3, false, 1.0f};
  const RouterSpec limited_norm{
      RouterScoring::kSoftmax, S::kGroupLimited, 4, 2, true, 1.0f};
  const RouterSpec noaux{
      RouterScoring::kSigmoid, S::kBiasedGroupLimited, 8, 4, true, 2.5f};
  const RouterSpec noaux_raw{
      RouterScoring::kSigmoid, S::kBiasedGroupLimited, 4, 1, false, 1.0f};
  for (const RouterCase& c :
       {RouterCase{"greedy", 7, 64, 6, greedy},
        RouterCase{"group_limited", 5, 160, 6, limited},
        RouterCase{"group_limited_norm", 9, 8, 2, limited_norm},
        RouterCase{"noaux_tc", 6, 256, 8, noaux},
        RouterCase{"noaux_tc_one_group", 3, 16, 4, noaux_raw},
        RouterCase{"top1_no_renorm", 4, 16, 1, limited_norm}}) {
    SCOPED_TRACE(c.name);
    auto logits = RandomVec(c.tokens * c.experts, 21, -4, 4);
    logits[3] = logits[9] = 3.5f;  // a tie
    auto bias = RandomVec(c.experts, 22, -0.3f, 0.3f);
    std::vector<int32_t> want_ids;
    std::vector<double> want_w;
    RefRouter(logits, bias, c.tokens, c.experts, c.k, c.spec, &want_ids,
              &want_w);
    int32_t* ids = Upload(std::vector<int32_t>(c.tokens * c.k, -1));
    float* w = Upload(std::vector<float>(c.tokens * c.k, NAN));
    absl::Status st = backend_->RouterSelect(
        Upload(logits), Upload(bias), ids, w, c.tokens, c.experts, c.k, c.spec);
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_EQ(Download(ids, want_ids.size()), want_ids);
    EXPECT_LE(MaxAbsDiff(Download(w, want_w.size()), want_w),
              1e-5 * c.spec.scale);
  }
}

// noaux_tc chooses by biased scores but weights by the unbiased ones, and
// experts of the groups not kept count as 0 when choosing (the published
// masked_fill(..., 0.0)): with every biased score negative, the first
// top_k experts of a dropped group win.
TEST_P(DeepseekOpsTest, RouterSelectBiasChoosesButDoesNotWeight) {
  const int64_t experts = 8, k = 2;
  std::vector<float> logits = {0, 0, 0, 0, 2, 1, 0, 0};
  std::vector<float> bias(experts, -5.0f);
  RouterSpec s{RouterScoring::kSigmoid,
               RouterSelection::kBiasedGroupLimited,
               2,
               1,
               false,
               1.0f};
  int32_t* ids = Upload(std::vector<int32_t>(k, -1));
  float* w = Upload(std::vector<float>(k, NAN));
  ASSERT_TRUE(
      backend_
          ->RouterSelect(Upload(logits), Upload(bias), ids, w, 1, experts, k, s)
          .ok());
  // Group 1 (experts 4..7) is kept; group 0 is masked to 0 > -5 + sigmoid.
  EXPECT_EQ(Download(ids, k), (std::vector<int32_t>{0, 1}));
  auto got = Download(w, k);
  EXPECT_NEAR(got[0], 0.5, 1e-6);
  EXPECT_NEAR(got[1], 0.5, 1e-6);
  // A neutral bias selects the two best sigmoid scores, weighted unbiased.
  std::vector<float> zero(experts, 0.0f);
  ASSERT_TRUE(
      backend_
          ->RouterSelect(Upload(logits), Upload(zero), ids, w, 1, experts, k, s)
          .ok());
  EXPECT_EQ(Download(ids, k), (std::vector<int32_t>{4, 5}));
  got = Download(w, k);
  EXPECT_NEAR(got[0], 1.0 / (1.0 + std::exp(-2.0)), 1e-6);
}

TEST_P(DeepseekOpsTest, RopeInterleavedMatchesReference) {
  const int64_t tokens = 5, heads = 3, stride = 24, offset = 16, rot = 8;
  auto x = RandomVec(tokens * heads * stride, 31);
  std::vector<int32_t> pos = {0, 1, 7, 300, 4095};
  std::vector<float> inv_freq = {1.0f, 0.1f, 0.01f, 0.00025f};
  const float mscale = 1.25f;
  float* dx = Upload(x);
  ASSERT_TRUE(backend_
                  ->RopeInterleaved(dx, Upload(pos), Upload(inv_freq), tokens,
                                    heads, stride, offset, rot, mscale)
                  .ok());
  std::vector<double> want(x.begin(), x.end());
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      double* v = want.data() + (t * heads + h) * stride + offset;
      for (int64_t i = 0; i < rot / 2; ++i) {
        const double a = double(pos[t]) * inv_freq[i];
        const double c = std::cos(a) * mscale, s = std::sin(a) * mscale;
        const double x0 = v[2 * i], x1 = v[2 * i + 1];
        v[2 * i] = x0 * c - x1 * s;
        v[2 * i + 1] = x1 * c + x0 * s;
      }
    }
  }
  EXPECT_LE(MaxAbsDiff(Download(dx, x.size()), want), 2e-6);
}

struct MlaCase {
  int64_t first, more, heads, nope, rope, v, rank, max_seq;
  DType dtype;
};

TEST_P(DeepseekOpsTest, MlaAttentionEqualsAttentionOverExpandedKeys) {
  for (const MlaCase& c :
       {MlaCase{0, 7, 4, 16, 8, 16, 32, 8, DType::kF32},
        MlaCase{12, 1, 2, 8, 4, 12, 24, 16, DType::kF32},
        MlaCase{40, 3, 4, 32, 16, 32, 64, 64, DType::kBF16},
        MlaCase{200, 1, 16, 128, 64, 128, 512, 256, DType::kBF16}}) {
    SCOPED_TRACE(::testing::Message() << c.first << "+" << c.more << " h"
                                      << c.heads << " r" << c.rank);
    const int64_t total = c.first + c.more, qk = c.nope + c.rope;
    const int64_t rows = c.heads * (c.nope + c.v);
    auto ckv = RandomVec(c.max_seq * c.rank, 41);
    auto kpe = RandomVec(c.max_seq * c.rope, 42);
    auto q = RandomVec(c.more * c.heads * qk, 43, -2, 2);
    auto wf = RandomVec(rows * c.rank, 44, -0.3f, 0.3f);
    std::vector<uint16_t> wb(wf.size());
    const void* w = nullptr;
    if (c.dtype == DType::kBF16) {
      for (size_t i = 0; i < wf.size(); ++i) {
        wb[i] = FloatToBF16(wf[i]);
        wf[i] = BF16ToFloat(wb[i]);
      }
      w = Upload(wb);
    } else {
      w = Upload(wf);
    }
    float* out = Upload(std::vector<float>(c.more * c.heads * c.v, NAN));
    MlaShape s{c.more, c.heads, c.nope,    c.rope,
               c.v,    c.rank,  c.max_seq, c.first};
    const float scale = 1.0f / std::sqrt(float(qk));
    absl::Status st = backend_->MlaAttention(Upload(q), w, c.dtype, Upload(ckv),
                                             Upload(kpe), out, s, scale);
    ASSERT_TRUE(st.ok()) << st;
    // Expanded: k = [c_kv W_UK^T, k_pe], v = c_kv W_UV^T, per head.
    std::vector<double> want(c.more * c.heads * c.v);
    for (int64_t h = 0; h < c.heads; ++h) {
      const float* wk = wf.data() + h * (c.nope + c.v) * c.rank;
      const float* wv = wk + c.nope * c.rank;
      std::vector<double> keys(total * qk), vals(total * c.v);
      for (int64_t j = 0; j < total; ++j) {
        for (int64_t i = 0; i < c.nope; ++i) {
          double acc = 0;
          for (int64_t r = 0; r < c.rank; ++r)
            acc += double(wk[i * c.rank + r]) * ckv[j * c.rank + r];
          keys[j * qk + i] = acc;
        }
        for (int64_t i = 0; i < c.rope; ++i)
          keys[j * qk + c.nope + i] = kpe[j * c.rope + i];
        for (int64_t i = 0; i < c.v; ++i) {
          double acc = 0;
          for (int64_t r = 0; r < c.rank; ++r)
            acc += double(wv[i * c.rank + r]) * ckv[j * c.rank + r];
          vals[j * c.v + i] = acc;
        }
      }
      for (int64_t t = 0; t < c.more; ++t) {
        const float* qv = q.data() + (t * c.heads + h) * qk;
        const int64_t len = c.first + t + 1;
        std::vector<double> p(len);
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < len; ++j) {
          double d = 0;
          for (int64_t i = 0; i < qk; ++i)
            d += double(qv[i]) * keys[j * qk + i];
          p[j] = d * scale;
          mx = std::max(mx, p[j]);
        }
        for (double& x : p) sum += (x = std::exp(x - mx));
        for (int64_t i = 0; i < c.v; ++i) {
          double acc = 0;
          for (int64_t j = 0; j < len; ++j) acc += p[j] * vals[j * c.v + i];
          want[(t * c.heads + h) * c.v + i] = acc / sum;
        }
      }
    }
    EXPECT_LE(MaxAbsDiff(Download(out, want.size()), want), 2e-4);
  }
}

TEST_P(DeepseekOpsTest, RerunIsBitIdentical) {
  MlaShape s{5, 4, 16, 8, 16, 32, 8, 0};
  auto q = Upload(RandomVec(5 * 4 * 24, 51));
  auto w = Upload(RandomVec(4 * 32 * 32, 52));
  auto ckv = Upload(RandomVec(8 * 32, 53));
  auto kpe = Upload(RandomVec(8 * 8, 54));
  float* a = Upload(std::vector<float>(5 * 4 * 16));
  float* b = Upload(std::vector<float>(5 * 4 * 16));
  ASSERT_TRUE(
      backend_->MlaAttention(q, w, DType::kF32, ckv, kpe, a, s, 0.2f).ok());
  ASSERT_TRUE(
      backend_->MlaAttention(q, w, DType::kF32, ckv, kpe, b, s, 0.2f).ok());
  EXPECT_EQ(Download(a, 80), Download(b, 80));
}

TEST_P(DeepseekOpsTest, BadShapesAreInvalidArgument) {
  float* f = Upload(std::vector<float>(4096));
  int32_t* ids = Upload(std::vector<int32_t>(64));
  RouterSpec s{RouterScoring::kSoftmax,
               RouterSelection::kGroupLimited,
               3,
               1,
               false,
               1.0f};
  // 8 experts in 3 groups.
  EXPECT_EQ(backend_->RouterSelect(f, nullptr, ids, f, 1, 8, 2, s).code(),
            absl::StatusCode::kInvalidArgument);
  s.n_group = 4;
  s.topk_group = 1;  // 2 experts kept < top_k 3
  EXPECT_EQ(backend_->RouterSelect(f, nullptr, ids, f, 1, 8, 3, s).code(),
            absl::StatusCode::kInvalidArgument);
  s.selection = RouterSelection::kBiasedGroupLimited;  // needs a bias
  EXPECT_EQ(backend_->RouterSelect(f, nullptr, ids, f, 1, 8, 2, s).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend_->RopeInterleaved(f, ids, f, 1, 1, 8, 4, 6, 1.0f).code(),
            absl::StatusCode::kInvalidArgument);  // offset + rot_dim > stride
  EXPECT_EQ(backend_->RopeInterleaved(f, ids, f, 1, 1, 8, 0, 3, 1.0f).code(),
            absl::StatusCode::kInvalidArgument);  // odd
  MlaShape m{2, 1, 4, 4, 4, 8, 4, 3};  // positions up to 5 > max_seq 4
  EXPECT_EQ(backend_->MlaAttention(f, f, DType::kF32, f, f, f, m, 1.0f).code(),
            absl::StatusCode::kOutOfRange);
  m.start_pos = 0;
  EXPECT_EQ(backend_->MlaAttention(f, f, DType::kQ8, f, f, f, m, 1.0f).code(),
            absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(AllBackends, DeepseekOpsTest,
                         ::testing::Values("cpu", "cuda"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace moe
