// The sampler chain beyond temperature and top-p (services/engine/sampler.h):
// top_k, min_p, logit_bias and the penalties, each against a reference
// computed here independently in double precision, plus the properties the
// serving layer relies on (top_k = 1 is greedy, each sampler's state is its
// own).
#include <cmath>
#include <map>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "services/engine/sampler.h"

namespace moe {
namespace {

std::vector<float> Wavy(int n, float scale) {
  std::vector<float> logits(n);
  for (int i = 0; i < n; ++i) logits[i] = scale * std::sin(i * 0.37f) + 0.01f * (i % 7);
  return logits;
}

// Logits that make `token` the only sensible choice.
std::vector<float> Forcing(int n, int token) {
  std::vector<float> logits(n, 0.0f);
  logits[token] = 1000.0f;
  return logits;
}

// The reference for steps 1-3: logit_bias, then repetition_penalty over the
// prompt and the output, then presence/frequency over the output counts.
std::vector<double> Reference(const std::vector<float>& logits, const SamplingParams& p,
                              const std::vector<int32_t>& prompt,
                              const std::vector<int32_t>& output) {
  std::vector<double> x(logits.begin(), logits.end());
  for (const auto& [id, bias] : p.logit_bias) x[id] += static_cast<double>(bias);
  std::set<int32_t> seen(prompt.begin(), prompt.end());
  seen.insert(output.begin(), output.end());
  const double r = p.repetition_penalty;
  for (int32_t id : seen) x[id] = x[id] > 0 ? x[id] / r : x[id] * r;
  std::map<int32_t, int> count;
  for (int32_t id : output) ++count[id];
  for (const auto& [id, c] : count) {
    x[id] -= static_cast<double>(p.presence_penalty) + static_cast<double>(p.frequency_penalty) * c;
  }
  return x;
}

// Feeds `output` through the sampler (as if it had generated it).
void Generate(Sampler& s, int n, const std::vector<int32_t>& output) {
  for (int32_t t : output) ASSERT_EQ(s.Next(Forcing(n, t)).token, t);
}

void ExpectMatchesReference(const SamplingParams& p, const std::vector<int32_t>& prompt,
                            const std::vector<int32_t>& output) {
  const std::vector<float> logits = {2.5f, -1.25f, 0.0f, 3.0f, -0.5f, 1.0f, -2.0f, 0.75f};
  const int n = static_cast<int>(logits.size());
  Sampler s(p, prompt);
  Generate(s, n, output);
  const std::vector<float> got = s.AdjustedLogits(logits);
  const std::vector<double> want = Reference(logits, p, prompt, output);
  ASSERT_EQ(got.size(), want.size());
  for (int i = 0; i < n; ++i) EXPECT_NEAR(got[i], want[i], 1e-5 * (1 + std::abs(want[i]))) << i;
}

TEST(SamplerChainTest, RepetitionPenaltyMatchesTheReference) {
  SamplingParams p;
  p.repetition_penalty = 1.7f;
  ExpectMatchesReference(p, /*prompt=*/{0, 1, 1}, /*output=*/{4, 0});
  // Positive logits shrink, negative ones grow in magnitude.
  Sampler s(p, std::vector<int32_t>{0, 1});
  const std::vector<float> adjusted = s.AdjustedLogits({2.0f, -2.0f, 1.0f});
  EXPECT_FLOAT_EQ(adjusted[0], 2.0f / 1.7f);
  EXPECT_FLOAT_EQ(adjusted[1], -2.0f * 1.7f);
  EXPECT_FLOAT_EQ(adjusted[2], 1.0f);
}

TEST(SamplerChainTest, PresencePenaltyMatchesTheReference) {
  SamplingParams p;
  p.presence_penalty = 0.8f;
  ExpectMatchesReference(p, /*prompt=*/{2, 3}, /*output=*/{5, 5, 5, 1});
}

TEST(SamplerChainTest, FrequencyPenaltyMatchesTheReference) {
  SamplingParams p;
  p.frequency_penalty = -0.6f;  // negative: favours repeats
  ExpectMatchesReference(p, /*prompt=*/{2, 3}, /*output=*/{5, 5, 5, 1, 7});
}

TEST(SamplerChainTest, LogitBiasMatchesTheReference) {
  SamplingParams p;
  p.logit_bias = {{1, 5.0f}, {3, -100.0f}, {6, 0.5f}};
  ExpectMatchesReference(p, {0}, {});
}

TEST(SamplerChainTest, AllStepsTogetherMatchTheReference) {
  SamplingParams p;
  p.logit_bias = {{2, 1.5f}, {4, -3.0f}};
  p.repetition_penalty = 1.3f;
  p.presence_penalty = 0.4f;
  p.frequency_penalty = 0.25f;
  ExpectMatchesReference(p, /*prompt=*/{0, 2, 6}, /*output=*/{3, 4, 3, 3, 7});
}

TEST(SamplerChainTest, PenaltiesCountOnlyThisSamplersTokens) {
  // The prompt is not output: presence/frequency ignore it.
  SamplingParams p;
  p.presence_penalty = 1.0f;
  p.frequency_penalty = 1.0f;
  Sampler s(p, std::vector<int32_t>{0, 0, 0});
  EXPECT_EQ(s.AdjustedLogits({1.0f, 1.0f})[0], 1.0f);
}

TEST(SamplerChainTest, TopKOfOneAtTemperatureOneIsGreedy) {
  const std::vector<float> logits = Wavy(257, 4.0f);
  Sampler greedy({});
  const int32_t want = greedy.Next(logits).token;
  for (uint64_t seed = 0; seed < 50; ++seed) {
    SamplingParams p;
    p.temperature = 1.0f;
    p.top_k = 1;
    p.seed = seed;
    Sampler s(p);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(s.Next(logits).token, want) << seed;
  }
  // Ties: the lower id, as greedy.
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 1;
  Sampler s(p);
  EXPECT_EQ(s.Next({0.5f, 2.0f, 2.0f}).token, 1);
}

TEST(SamplerChainTest, TopKKeepsTheKMostProbable) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 2;  // probs .5 .3 .2: {0, 1}, renormalized .625 .375
  p.seed = 5;
  Sampler s(p);
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  std::map<int, int> seen;
  for (int i = 0; i < 5000; ++i) ++seen[s.Next(logits).token];
  EXPECT_EQ(seen.count(2), 0u);
  EXPECT_NEAR(seen[0] / 5000.0, 0.625, 0.03);
}

TEST(SamplerChainTest, MinPDropsTheUnlikely) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.min_p = 0.35f;  // floor .35 * .5 = .175: {0, 1} of .5 .3 .15 .05
  p.seed = 6;
  Sampler s(p);
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.15f),
                                     std::log(0.05f)};
  std::map<int, int> seen;
  for (int i = 0; i < 5000; ++i) ++seen[s.Next(logits).token];
  EXPECT_EQ(seen.count(2) + seen.count(3), 0u);
  EXPECT_NEAR(seen[0] / 5000.0, 0.625, 0.03);
}

TEST(SamplerChainTest, RepetitionPenaltyChangesTheGreedyChoice) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.5f};
  Sampler plain({}, std::vector<int32_t>{1});
  EXPECT_EQ(plain.Next(logits).token, 1);
  SamplingParams p;
  p.repetition_penalty = 1.5f;  // 3 / 1.5 = 2 < 2.5
  Sampler penalized(p, std::vector<int32_t>{1});
  EXPECT_EQ(penalized.Next(logits).token, 2);
}

TEST(SamplerChainTest, InterleavedSamplersMatchLoneOnes) {
  // What batching does: several samplers stepped in turn. Each one's tokens
  // depend only on its own seed, parameters and logits.
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_k = 40;
  p.top_p = 0.9f;
  p.min_p = 0.02f;
  p.repetition_penalty = 1.2f;
  p.presence_penalty = 0.3f;
  p.frequency_penalty = 0.1f;
  const std::vector<float> logits = Wavy(300, 3.0f);
  auto alone = [&](uint64_t seed) {
    p.seed = seed;
    Sampler s(p, std::vector<int32_t>{1, 2, 3});
    std::vector<int32_t> out;
    for (int i = 0; i < 40; ++i) out.push_back(s.Next(logits).token);
    return out;
  };
  std::vector<Sampler> batch;
  for (uint64_t seed : {7, 8, 9}) {
    p.seed = seed;
    batch.emplace_back(p, std::vector<int32_t>{1, 2, 3});
  }
  std::vector<std::vector<int32_t>> out(3);
  for (int i = 0; i < 40; ++i) {
    for (int b = 0; b < 3; ++b) out[b].push_back(batch[b].Next(logits).token);
  }
  EXPECT_EQ(out[0], alone(7));
  EXPECT_EQ(out[1], alone(8));
  EXPECT_EQ(out[2], alone(9));
  EXPECT_NE(out[0], out[1]);
}

TEST(SamplerChainTest, RejectsBadParameters) {
  SamplingParams p;
  p.top_k = -1;
  EXPECT_FALSE(ValidateSamplingParams(p).ok());
  p = {};
  p.min_p = 1.5f;
  EXPECT_FALSE(ValidateSamplingParams(p).ok());
  p = {};
  p.repetition_penalty = 0.0f;
  EXPECT_FALSE(ValidateSamplingParams(p).ok());
  p = {};
  p.presence_penalty = INFINITY;
  EXPECT_FALSE(ValidateSamplingParams(p).ok());
  p = {};
  p.logit_bias = {{-1, 1.0f}};
  EXPECT_FALSE(ValidateSamplingParams(p).ok());
  p = {};
  p.logit_bias = {{3, NAN}};
  EXPECT_FALSE(ValidateSamplingParams(p).ok());
  p = {};
  p.top_k = 5;
  p.min_p = 0.1f;
  p.repetition_penalty = 1.1f;
  p.logit_bias = {{3, -100.0f}};
  EXPECT_TRUE(ValidateSamplingParams(p).ok());
}

}  // namespace
}  // namespace moe
