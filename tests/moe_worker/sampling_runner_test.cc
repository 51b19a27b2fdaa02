// The sampler chain through the serving path every transport shares
// (GenerationRunner, as gRPC Generate and the HTTP API submit): top_k = 1 at
// temperature 1 is greedy, no seed is a random one, repetition_penalty
// changes greedy text, ignore_eos generates exactly max_new_tokens, and
// sampled requests with every sampler on are the same batched or alone
// (issue 27).
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "services/engine/in_memory_provider.h"
#include "services/engine/tokenizer.h"
#include "services/moe_worker/generation_runner.h"
#include "services/moe_worker/worker_metrics.h"
#include "tests/common/test_util.h"
#include "tests/common/tiny_model.h"
#include "tests/moe_worker/worker_test_util.h"

namespace moe::worker {
namespace {

using testing::RecordingSink;

class SamplingRunnerTest : public testing::TinyRunnerTest {
 protected:
  static v1::GenerateRequest Request(int n) {
    v1::GenerateRequest r;
    for (int32_t id : {5, 17, 300, 42, 5, 17}) r.add_prompt_token_ids(id);
    r.set_max_new_tokens(n);
    r.set_ignore_eos(true);
    return r;
  }

  std::vector<int32_t> Tokens(const v1::GenerateRequest& r, int max_batch = 1) {
    auto runner = MakeRunner(max_batch);
    return Run(*runner, {r})[0]->tokens();
  }
};

TEST_F(SamplingRunnerTest, TopKOfOneAtTemperatureOneIsGreedy) {
  const std::vector<int32_t> greedy = Tokens(Request(16));
  ASSERT_EQ(greedy.size(), 16u);
  for (int max_batch : {1, 4}) {
    v1::GenerateRequest r = Request(16);
    r.set_temperature(1.0f);
    r.set_top_k(1);
    r.set_seed(123);
    EXPECT_EQ(Tokens(r, max_batch), greedy) << "max_batch " << max_batch;
  }
}

TEST_F(SamplingRunnerTest, NoSeedIsRandomAndASeedRepeats) {
  v1::GenerateRequest r = Request(24);
  r.set_temperature(1.0f);
  EXPECT_NE(Tokens(r), Tokens(r));  // absent seed: random each time
  r.set_seed(99);
  EXPECT_EQ(Tokens(r), Tokens(r));
}

TEST_F(SamplingRunnerTest, RepetitionPenaltyChangesGreedyText) {
  const std::vector<int32_t> greedy = Tokens(Request(24));
  v1::GenerateRequest r = Request(24);
  r.set_repetition_penalty(3.0f);
  const std::vector<int32_t> penalized = Tokens(r);
  EXPECT_NE(penalized, greedy);
  // And, as asked, repeats less: no token of the prompt or the output twice
  // in a row.
  for (size_t i = 1; i < penalized.size(); ++i) EXPECT_NE(penalized[i], penalized[i - 1]) << i;
}

TEST_F(SamplingRunnerTest, IgnoreEosGeneratesExactlyMaxTokens) {
  ASSERT_FALSE(model_->config().eos_token_ids.empty());
  const int32_t eos = static_cast<int32_t>(model_->config().eos_token_ids[0]);
  v1::GenerateRequest r = Request(12);
  (*r.mutable_logit_bias())[eos] = 100.0f;  // eos every time
  r.set_ignore_eos(false);
  auto runner = MakeRunner();
  auto stopped = Run(*runner, {r})[0]->responses();
  ASSERT_EQ(stopped.size(), 1u);
  EXPECT_EQ(stopped[0].token_id(), eos);
  EXPECT_EQ(stopped[0].finish_reason(), "stop");
  r.set_ignore_eos(true);
  auto all = Run(*runner, {r})[0]->responses();
  ASSERT_EQ(all.size(), 12u);
  for (const auto& t : all) EXPECT_EQ(t.token_id(), eos);
  EXPECT_EQ(all.back().finish_reason(), "length");
  EXPECT_EQ(all.back().usage().generated_tokens(), 12);
}

TEST_F(SamplingRunnerTest, EverySamplerBatchedEqualsAlone) {
  std::vector<v1::GenerateRequest> rs;
  for (int i = 0; i < 4; ++i) {
    v1::GenerateRequest r = Request(10 + i);
    r.set_temperature(0.9f);
    r.set_top_k(50 + i);
    r.set_top_p(0.95f);
    r.set_min_p(0.01f);
    r.set_repetition_penalty(1.3f);
    r.set_presence_penalty(0.5f);
    r.set_frequency_penalty(0.25f);
    (*r.mutable_logit_bias())[7] = 2.0f;
    r.set_seed(1000 + i);
    rs.push_back(r);
  }
  std::vector<std::vector<int32_t>> alone;
  for (const auto& r : rs) alone.push_back(Tokens(r));
  auto runner = MakeRunner(/*max_batch=*/4);
  auto batched = Run(*runner, rs);
  for (size_t i = 0; i < rs.size(); ++i) EXPECT_EQ(batched[i]->tokens(), alone[i]) << i;
  EXPECT_NE(alone[0], alone[1]);
}

TEST_F(SamplingRunnerTest, OutOfRangeParametersNameTheirField) {
  auto runner = MakeRunner();
  v1::GenerateRequest r = Request(4);
  r.set_min_p(2.0f);
  auto sink = std::make_shared<RecordingSink>();
  absl::Status s = runner->Submit(r, absl::InfiniteFuture(), sink);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(serving::FieldOf(s), "min_p");
  r = Request(4);
  (*r.mutable_logit_bias())[model_->config().vocab_size] = 1.0f;
  s = runner->Submit(r, absl::InfiniteFuture(), sink);
  EXPECT_EQ(serving::FieldOf(s), "logit_bias");
}

}  // namespace
}  // namespace moe::worker
