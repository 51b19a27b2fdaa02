#include "services/engine/sampler.h"

#include <cmath>
#include <map>
#include <memory>
#include <set>

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

// A constraint for the tests: a fixed sequence of allowed sets; done after
// `done_after` accepted tokens. Records what it was given.
class ScriptedConstraint : public TokenConstraint {
 public:
  ScriptedConstraint(std::vector<std::set<int32_t>> steps, int done_after,
                     std::vector<int32_t>* accepted)
      : steps_(std::move(steps)), done_after_(done_after), accepted_(accepted) {}
  void Allowed(std::vector<uint8_t>* allowed) const override {
    allowed->assign(kVocab, 0);
    const std::set<int32_t>& now = steps_[std::min(accepted_->size(), steps_.size() - 1)];
    for (int32_t id : now) (*allowed)[id] = 1;
  }
  void Accept(int32_t token) override { accepted_->push_back(token); }
  bool Done() const override { return static_cast<int>(accepted_->size()) >= done_after_; }
  static constexpr int kVocab = 6;  // shorter than the logits below: the rest never allowed

 private:
  std::vector<std::set<int32_t>> steps_;
  int done_after_;
  std::vector<int32_t>* accepted_;
};

class ScriptedFactory : public TokenConstraintFactory {
 public:
  ScriptedFactory(std::vector<std::set<int32_t>> steps, int done_after)
      : steps_(std::move(steps)), done_after_(done_after) {}
  std::unique_ptr<TokenConstraint> Start() const override {
    return std::make_unique<ScriptedConstraint>(steps_, done_after_, &accepted);
  }
  mutable std::vector<int32_t> accepted;

 private:
  std::vector<std::set<int32_t>> steps_;
  int done_after_;
};

TEST(SamplerConstraintTest, OnlyAllowedTokensAreDrawnAndTheLastEnds) {
  // Token 7 (past the constraint's vocabulary) and 1 have the highest logits.
  const std::vector<float> logits = {0.1f, 5.0f, 0.3f, -2.0f, 0.2f, 1.0f, 0.0f, 9.0f};
  auto factory = std::make_shared<ScriptedFactory>(
      std::vector<std::set<int32_t>>{{2, 3}, {0, 4, 5}, {3}}, 3);
  for (float temperature : {0.0f, 1.0f}) {
    factory->accepted.clear();
    SamplingParams p;
    p.temperature = temperature;
    p.seed = 5;
    p.constraint = factory;
    Sampler s(p);
    SampledToken a = s.Next(logits), b = s.Next(logits), c = s.Next(logits);
    if (temperature == 0.0f) {
      EXPECT_EQ(a.token, 2);  // the best allowed, not the best
      EXPECT_EQ(b.token, 5);
    }
    EXPECT_TRUE(a.token == 2 || a.token == 3) << a.token;
    EXPECT_TRUE(b.token == 0 || b.token == 4 || b.token == 5) << b.token;
    EXPECT_EQ(c.token, 3);
    EXPECT_FALSE(a.ends);
    EXPECT_FALSE(b.ends);
    EXPECT_TRUE(c.ends);
    EXPECT_EQ(factory->accepted, (std::vector<int32_t>{a.token, b.token, c.token}));
    // Log-probabilities stay the model's.
    double lse = 0;
    for (float l : logits) lse += std::exp(static_cast<double>(l));
    EXPECT_NEAR(c.logprob, logits[3] - std::log(lse), 1e-5);
  }
}

TEST(SamplerConstraintTest, TruncationAndBiasNeverBringBackADisallowedToken) {
  // top_k larger than the allowed set, a huge bias on a disallowed token,
  // many seeded draws: never outside {1, 4}.
  const std::vector<float> logits = {3.0f, -1.0f, 2.0f, 4.0f, -3.0f, 0.0f};
  auto factory = std::make_shared<ScriptedFactory>(std::vector<std::set<int32_t>>{{1, 4}}, 1 << 30);
  SamplingParams p;
  p.temperature = 2.0f;
  p.top_k = 5;
  p.top_p = 0.99f;
  p.min_p = 0.0f;
  p.logit_bias = {{3, 100.0f}};
  p.constraint = factory;
  std::map<int32_t, int> seen;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    p.seed = seed;
    Sampler s(p);
    ++seen[s.Next(logits).token];
  }
  for (const auto& [id, n] : seen) EXPECT_TRUE(id == 1 || id == 4) << id;
  EXPECT_EQ(seen.size(), 2u);  // both drawn: the mask does not collapse to greedy
}

TEST(SamplerConstraintTest, NothingAllowedEndsTheSequence) {
  auto factory = std::make_shared<ScriptedFactory>(std::vector<std::set<int32_t>>{{}}, 1 << 30);
  SamplingParams p;
  p.constraint = factory;
  Sampler s(p);
  SampledToken t = s.Next(std::vector<float>{0.0f, 1.0f, 0.5f});
  EXPECT_TRUE(t.ends);
  EXPECT_TRUE(factory->accepted.empty());  // the token was not the constraint's
}

}  // namespace
}  // namespace moe
