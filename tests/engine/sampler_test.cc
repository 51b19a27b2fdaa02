#include "services/engine/sampler.h"

#include <cmath>
#include <map>

#include "gtest/gtest.h"

namespace moe {
namespace {

TEST(SamplerTest, GreedyPicksArgmaxWithLowerIdOnTies) {
  Sampler s({});
  std::vector<float> logits = {0.5f, 2.0f, 2.0f, -1.0f};
  SampledToken t = s.Next(logits);
  EXPECT_EQ(t.token, 1);
  double lse = std::log(std::exp(0.5) + 2 * std::exp(2.0) + std::exp(-1.0));
  EXPECT_NEAR(t.logprob, 2.0 - lse, 1e-6);
}

TEST(SamplerTest, TopLogprobsAreSortedModelLogprobs) {
  SamplingParams p;
  p.temperature = 0.7f;
  p.top_logprobs = 3;
  Sampler s(p);
  std::vector<float> logits = {1.0f, 3.0f, -2.0f, 2.0f, 0.0f};
  SampledToken t = s.Next(logits);
  ASSERT_EQ(t.top_logprobs.size(), 3u);
  EXPECT_EQ(t.top_logprobs[0].first, 1);
  EXPECT_EQ(t.top_logprobs[1].first, 3);
  EXPECT_EQ(t.top_logprobs[2].first, 0);
  double sum = 0;
  for (float l : logits) sum += std::exp(l);
  EXPECT_NEAR(t.top_logprobs[0].second, 3.0 - std::log(sum), 1e-6);
  EXPECT_NEAR(t.logprob, logits[t.token] - std::log(sum), 1e-6);
}

TEST(SamplerTest, SameSeedSameTokensDifferentSeedDiffers) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 42;
  std::vector<float> logits(50);
  for (int i = 0; i < 50; ++i) logits[i] = std::sin(i * 0.7f);
  auto run = [&](uint64_t seed) {
    p.seed = seed;
    Sampler s(p);
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(s.Next(logits).token);
    return out;
  };
  EXPECT_EQ(run(42), run(42));
  EXPECT_NE(run(42), run(43));
}

TEST(SamplerTest, TemperatureSamplingFollowsTheDistribution) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 1;
  Sampler s(p);
  std::vector<float> logits = {0.0f, std::log(3.0f)};  // p = 0.25, 0.75
  int ones = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) ones += s.Next(logits).token;
  EXPECT_NEAR(ones / double(n), 0.75, 0.015);
}

TEST(SamplerTest, TopPKeepsOnlyTheNucleus) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_p = 0.6f;  // probs .5 .3 .2: nucleus {0, 1}
  p.seed = 9;
  Sampler s(p);
  std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  std::map<int, int> seen;
  for (int i = 0; i < 5000; ++i) ++seen[s.Next(logits).token];
  EXPECT_EQ(seen.count(2), 0u);
  EXPECT_NEAR(seen[0] / 5000.0, 0.625, 0.03);
}

TEST(SamplerTest, RejectsBadParameters) {
  SamplingParams p;
  p.temperature = -1;
  EXPECT_FALSE(ValidateSamplingParams(p).ok());
  p = {};
  p.temperature = NAN;
  EXPECT_FALSE(ValidateSamplingParams(p).ok());
  p = {};
  p.top_p = 1.5f;
  EXPECT_FALSE(ValidateSamplingParams(p).ok());
  p = {};
  p.top_logprobs = 21;
  EXPECT_FALSE(ValidateSamplingParams(p).ok());
  p = {};
  p.top_logprobs = 20;
  EXPECT_TRUE(ValidateSamplingParams(p).ok());
}

}  // namespace
}  // namespace moe
