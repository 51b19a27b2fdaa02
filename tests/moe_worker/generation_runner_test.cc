#include "services/moe_worker/generation_runner.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/engine/tokenizer.h"
#include "tests/moe_worker/worker_process.h"
#include "tests/moe_worker/worker_test_util.h"

namespace moe::worker {
namespace {

using testing::RecordingSink;
using testing::ReferenceTokens;

// Blocks every Acquire until Open(); lets a test hold a request inside the
// engine deterministically.
class GatedProvider : public ExpertProvider {
 public:
  explicit GatedProvider(ExpertProvider* inner) : inner_(inner) {}
  absl::StatusOr<AcquiredExperts> Acquire(int layer,
                                      absl::Span<const ExpertDemand> demands,
                                      bool prefill) override {
    std::unique_lock<std::mutex> lock(mu_);
    entered_ = true;
    cv_.notify_all();
    cv_.wait(lock, [this] { return open_; });
    lock.unlock();
    return inner_->Acquire(layer, demands, prefill);
  }
  void Release(AcquiredExperts& lease) override { inner_->Release(lease); }
  void WaitEntered() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return entered_; });
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }

 private:
  ExpertProvider* inner_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool entered_ = false;
  bool open_ = false;
};

// The daemon went away.
class GoneProvider : public ExpertProvider {
 public:
  absl::StatusOr<AcquiredExperts> Acquire(int, absl::Span<const ExpertDemand>,
                                      bool) override {
    return absl::UnavailableError("moe-cached went away");
  }
  void Release(AcquiredExperts&) override {}
};

class GenerationRunnerTest : public testing::TinyRunnerTest {
 protected:
  std::unique_ptr<GenerationRunner> MakeRunner(ExpertProvider* provider,
                                               RunnerOptions options = {}) {
    auto runner = std::make_unique<GenerationRunner>(
        *model_, provider, tokenizer_.get(), &metrics_, options);
    EXPECT_TRUE(runner->Start().ok());
    return runner;
  }

  static v1::GenerateRequest IdsRequest(std::vector<int32_t> ids, int n) {
    v1::GenerateRequest r;
    for (int32_t id : ids) r.add_prompt_token_ids(id);
    r.set_max_new_tokens(n);
    r.set_ignore_eos(true);
    return r;
  }
};

TEST_F(GenerationRunnerTest, GreedyTokensEqualInProcessGenerate) {
  auto runner = MakeRunner(provider_.get());
  v1::GenerateRequest request = IdsRequest({5, 17, 300, 42}, 12);
  request.set_top_logprobs(3);
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(runner->Submit(request, absl::InfiniteFuture(), sink).ok());
  ASSERT_TRUE(sink->Wait().ok());

  GenerateOptions ref;
  ref.prompt = {5, 17, 300, 42};
  ref.max_new_tokens = 12;
  ref.stop_at_eos = false;
  EXPECT_EQ(sink->tokens(), ReferenceTokens(*model_, ref));
  std::vector<v1::GenerateResponse> rs = sink->responses();
  ASSERT_EQ(rs.size(), 12u);
  for (size_t i = 0; i + 1 < rs.size(); ++i) {
    EXPECT_EQ(rs[i].finish_reason(), "");
    EXPECT_FALSE(rs[i].has_usage());
    EXPECT_EQ(rs[i].top_logprobs_size(), 3);
    // Greedy: the chosen token is the most likely one.
    EXPECT_EQ(rs[i].top_logprobs(0).token_id(), rs[i].token_id());
  }
  const v1::GenerateResponse& last = rs.back();
  EXPECT_EQ(last.finish_reason(), "length");
  EXPECT_EQ(last.usage().prompt_tokens(), 4);
  EXPECT_EQ(last.usage().generated_tokens(), 12);
  EXPECT_GT(last.usage().time_to_first_token_seconds(), 0);
  EXPECT_GT(last.usage().time_per_output_token_seconds(), 0);
  // Every MoE layer of every iteration acquired top_k experts or fewer.
  EXPECT_GT(last.usage().expert_hits(), 0);
  EXPECT_EQ(last.usage().expert_misses(), 0);
}

TEST_F(GenerationRunnerTest, TextPromptStreamsValidTextMatchingDecode) {
  auto runner = MakeRunner(provider_.get());
  v1::GenerateRequest request;
  request.set_prompt("hello world");
  request.set_max_new_tokens(10);
  request.set_ignore_eos(true);
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(runner->Submit(request, absl::InfiniteFuture(), sink).ok());
  ASSERT_TRUE(sink->Wait().ok());
  std::string streamed;
  for (const auto& r : sink->responses()) streamed += r.text();
  StreamDecoder whole(*tokenizer_, /*skip_special=*/true);
  std::string expected;
  for (int32_t id : sink->tokens()) expected += whole.Push(id);
  expected += whole.Flush();
  EXPECT_EQ(streamed, expected);
  EXPECT_EQ(sink->responses().back().usage().prompt_tokens(),
            static_cast<int>(tokenizer_->Encode("hello world", true).size()));
}

TEST_F(GenerationRunnerTest, StopTokenEndsWithStopReason) {
  auto runner = MakeRunner(provider_.get());
  GenerateOptions ref;
  ref.prompt = {1, 2, 3};
  ref.max_new_tokens = 8;
  ref.stop_at_eos = false;
  std::vector<int32_t> expected = ReferenceTokens(*model_, ref);
  v1::GenerateRequest request = IdsRequest({1, 2, 3}, 8);
  request.add_stop_token_ids(expected[2]);
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(runner->Submit(request, absl::InfiniteFuture(), sink).ok());
  ASSERT_TRUE(sink->Wait().ok());
  std::vector<int32_t> got = sink->tokens();
  const size_t first_stop =
      std::find(expected.begin(), expected.end(), expected[2]) -
      expected.begin();
  EXPECT_EQ(got, std::vector<int32_t>(expected.begin(),
                                      expected.begin() + first_stop + 1));
  EXPECT_EQ(sink->responses().back().finish_reason(), "stop");
  EXPECT_EQ(sink->responses().back().usage().generated_tokens(),
            static_cast<int>(got.size()));
}

TEST_F(GenerationRunnerTest, StopStringCutsTheTextAndEndsWithStop) {
  auto runner = MakeRunner(provider_.get());
  auto full = std::make_shared<RecordingSink>();
  ASSERT_TRUE(runner->Submit(IdsRequest({1, 2, 3}, 16), absl::InfiniteFuture(), full).ok());
  ASSERT_TRUE(full->Wait().ok());
  std::string text;
  for (const auto& r : full->responses()) text += r.text();
  ASSERT_GE(text.size(), 6u);
  const std::string stop = text.substr(text.size() / 2, 3);
  v1::GenerateRequest request = IdsRequest({1, 2, 3}, 16);
  request.add_stop(stop);
  request.add_stop("never-in-this-text-\x01");
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(runner->Submit(request, absl::InfiniteFuture(), sink).ok());
  ASSERT_TRUE(sink->Wait().ok());
  std::string cut;
  for (const auto& r : sink->responses()) cut += r.text();
  EXPECT_EQ(cut, text.substr(0, text.find(stop)));
  EXPECT_EQ(sink->responses().back().finish_reason(), "stop");
  EXPECT_LT(sink->responses().size(), full->responses().size());
  // Up to 4, none empty.
  v1::GenerateRequest bad = IdsRequest({1}, 4);
  bad.add_stop("");
  EXPECT_EQ(runner->Submit(bad, absl::InfiniteFuture(), std::make_shared<RecordingSink>()).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(GenerationRunnerTest, BadRequestsAreInvalidArgument) {
  RunnerOptions options;
  options.max_prompt_tokens = 8;
  auto runner = MakeRunner(provider_.get(), options);
  const int64_t vocab = model_->config().vocab_size;
  std::vector<std::pair<std::string, v1::GenerateRequest>> cases;
  cases.push_back({"empty", IdsRequest({}, 4)});
  cases.push_back({"id too big", IdsRequest({1, static_cast<int32_t>(vocab)}, 4)});
  cases.push_back({"negative id", IdsRequest({-1}, 4)});
  cases.push_back({"zero tokens", IdsRequest({1}, 0)});
  cases.push_back({"negative tokens", IdsRequest({1}, -3)});
  cases.push_back({"absurd tokens", IdsRequest({1}, 1 << 30)});
  cases.push_back({"over context", IdsRequest({1}, 4096)});
  cases.push_back({"over max prompt", IdsRequest({1, 2, 3, 4, 5, 6, 7, 8, 9}, 4)});
  v1::GenerateRequest r = IdsRequest({1}, 4);
  r.set_temperature(-1);
  cases.push_back({"temperature", r});
  r = IdsRequest({1}, 4);
  r.set_top_p(1.5);
  cases.push_back({"top_p", r});
  r = IdsRequest({1}, 4);
  r.set_top_logprobs(21);
  cases.push_back({"top_logprobs", r});
  r = IdsRequest({1}, 4);
  r.add_stop_token_ids(-2);
  cases.push_back({"stop id", r});
  for (const auto& [name, request] : cases) {
    auto sink = std::make_shared<RecordingSink>();
    absl::Status s = runner->Submit(request, absl::InfiniteFuture(), sink);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << name << ": " << s;
    EXPECT_EQ(sink->finishes(), 0) << name;
  }
}

TEST_F(GenerationRunnerTest, QueueOverflowIsResourceExhausted) {
  GatedProvider gated(provider_.get());
  RunnerOptions options;
  options.max_queue = 1;
  auto runner = MakeRunner(&gated, options);
  auto running = std::make_shared<RecordingSink>();
  auto queued = std::make_shared<RecordingSink>();
  auto refused = std::make_shared<RecordingSink>();
  ASSERT_TRUE(runner->Submit(IdsRequest({1, 2}, 3), absl::InfiniteFuture(),
                             running).ok());
  gated.WaitEntered();  // the first request holds the engine
  ASSERT_TRUE(runner->Submit(IdsRequest({3, 4}, 3), absl::InfiniteFuture(),
                             queued).ok());
  EXPECT_EQ(runner->queued(), 1);
  absl::Status s =
      runner->Submit(IdsRequest({5}, 3), absl::InfiniteFuture(), refused);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  gated.Open();
  EXPECT_TRUE(running->Wait().ok());
  EXPECT_TRUE(queued->Wait().ok());
  EXPECT_EQ(running->tokens().size(), 3u);
  EXPECT_EQ(queued->tokens().size(), 3u);
  EXPECT_EQ(refused->finishes(), 0);
}

// Issue 18.6: requests running and waiting, the running request's KV cache
// and the prompt tokens, as /metrics shows them.
TEST_F(GenerationRunnerTest, RunningWaitingKvAndPromptMetrics) {
  GatedProvider gated(provider_.get());
  constexpr int64_t kRunningKv = 2 * 4 * 4 * 5 * 2 * 16;
  metrics_.SetKvCacheCapacity(4 * kRunningKv);
  auto runner = MakeRunner(&gated);
  auto first = std::make_shared<RecordingSink>();
  auto second = std::make_shared<RecordingSink>();
  ASSERT_TRUE(runner->Submit(IdsRequest({1, 2}, 3), absl::InfiniteFuture(), first).ok());
  gated.WaitEntered();
  ASSERT_TRUE(runner->Submit(IdsRequest({3, 4, 5}, 4), absl::InfiniteFuture(), second).ok());
  std::string m = metrics_.exposed()->Text();
  EXPECT_EQ(testing::MetricValue(m, "moe_worker_requests_running"), 1) << m;
  EXPECT_EQ(testing::MetricValue(m, "moe_worker_requests_waiting"), 1);
  // tiny mixtral: 4 layers, 2 KV heads of 16, f32 keys and values, for the
  // 2 prompt + 3 new positions.
  EXPECT_EQ(testing::MetricValue(m, "moe_worker_kv_cache_bytes"), kRunningKv);
  // Its share of the capacity, what a cluster router reads.
  EXPECT_DOUBLE_EQ(testing::MetricValue(m, "moe_worker_kv_cache_usage_ratio"), 0.25) << m;
  EXPECT_EQ(testing::MetricValue(m, "moe_worker_prompt_tokens_total"), 2);
  gated.Open();
  EXPECT_TRUE(first->Wait().ok());
  EXPECT_TRUE(second->Wait().ok());
  // The runner's thread sets the gauges after the sink's Finish.
  EXPECT_TRUE(testing::WaitFor([&] {
    return testing::MetricValue(metrics_.exposed()->Text(), "moe_worker_requests_running") == 0;
  }));
  m = metrics_.exposed()->Text();
  EXPECT_EQ(testing::MetricValue(m, "moe_worker_requests_waiting"), 0);
  EXPECT_EQ(testing::MetricValue(m, "moe_worker_kv_cache_bytes"), 0);
  EXPECT_EQ(testing::MetricValue(m, "moe_worker_kv_cache_usage_ratio"), 0);
  EXPECT_EQ(testing::MetricValue(m, "moe_worker_prompt_tokens_total"), 5);
}

// The prefix cache (issue 27): a conversation's second turn (the first
// turn's prompt and reply, then more) and a repeated prompt load their
// shared whole blocks instead of running them, report them as
// cached_prompt_tokens, and give bit-identical tokens and logprobs to a
// runner without the cache, one at a time and batched.
TEST_F(GenerationRunnerTest, PrefixCacheReusesAConversationWithTheSameTokens) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(model_->config().vocab_size) - 1);
  std::vector<int32_t> p1(20);
  for (int32_t& t : p1) t = tok(rng);
  double cached_total = 0;
  for (int batch : {1, 4}) {
    SCOPED_TRACE(absl::StrCat("max_batch ", batch));
    RunnerOptions with;
    with.max_batch = batch;
    with.kv_block_tokens = 8;
    with.prefix_cache_bytes = 64 << 20;
    with.prefix_block_tokens = 4;
    RunnerOptions without = with;
    without.prefix_cache_bytes = 0;
    auto cached = MakeRunner(provider_.get(), with);
    auto plain = MakeRunner(provider_.get(), without);
    auto run = [&](GenerationRunner& r, const std::vector<int32_t>& prompt) {
      v1::GenerateRequest q = IdsRequest(prompt, 6);
      q.set_top_logprobs(2);
      auto sink = std::make_shared<RecordingSink>();
      EXPECT_TRUE(r.Submit(q, absl::InfiniteFuture(), sink).ok());
      EXPECT_TRUE(sink->Wait().ok());
      return sink->responses();
    };
    auto same = [](const std::vector<v1::GenerateResponse>& a,
                   const std::vector<v1::GenerateResponse>& b) {
      ASSERT_EQ(a.size(), b.size());
      for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_EQ(a[i].token_id(), b[i].token_id()) << i;
        EXPECT_EQ(a[i].logprob(), b[i].logprob()) << i;  // bit for bit
        ASSERT_EQ(a[i].top_logprobs_size(), b[i].top_logprobs_size());
        for (int j = 0; j < a[i].top_logprobs_size(); ++j) {
          EXPECT_EQ(a[i].top_logprobs(j).logprob(), b[i].top_logprobs(j).logprob());
        }
      }
    };
    const std::vector<v1::GenerateResponse> first = run(*cached, p1);
    same(first, run(*plain, p1));
    EXPECT_EQ(first.back().usage().cached_prompt_tokens(), 0);
    // Turn 2: turn 1's prompt and reply, then 5 more tokens. Turn 1 ran
    // 20 + 6 - 1 positions: 24 in whole blocks of 4.
    std::vector<int32_t> p2 = p1;
    for (const v1::GenerateResponse& r : first) p2.push_back(r.token_id());
    for (int i = 0; i < 5; ++i) p2.push_back(tok(rng));
    const std::vector<v1::GenerateResponse> second = run(*cached, p2);
    same(second, run(*plain, p2));
    EXPECT_EQ(second.back().usage().cached_prompt_tokens(), 24);
    EXPECT_EQ(second.back().usage().prompt_tokens(), 31);
    // The same prompt again: all whole blocks that leave a token to run
    // (28 of 31, 90%).
    const std::vector<v1::GenerateResponse> again = run(*cached, p2);
    same(again, second);
    EXPECT_EQ(again.back().usage().cached_prompt_tokens(), 28);
    // Turn 2's entry holds turn 1's blocks too, so turn 1's went.
    EXPECT_EQ(cached->prefix_cache().entries(), 1);
    EXPECT_EQ(cached->prefix_cache().bytes(), Session::KvCacheBytes(*model_, 36));
    cached_total += 24 + 28;
    // The runner's thread counts a request after its sink's Finish.
    EXPECT_TRUE(testing::WaitFor([&] {
      return testing::MetricValue(metrics_.exposed()->Text(),
                                  "moe_worker_prompt_tokens_cached_total") == cached_total;
    })) << metrics_.exposed()->Text();
  }
}

TEST_F(GenerationRunnerTest, ZeroQueueRunsOneAndRefusesTheNext) {
  GatedProvider gated(provider_.get());
  RunnerOptions options;
  options.max_queue = 0;
  auto runner = MakeRunner(&gated, options);
  auto running = std::make_shared<RecordingSink>();
  ASSERT_TRUE(runner->Submit(IdsRequest({1, 2}, 2), absl::InfiniteFuture(),
                             running).ok());
  gated.WaitEntered();
  auto refused = std::make_shared<RecordingSink>();
  EXPECT_EQ(runner->Submit(IdsRequest({3}, 2), absl::InfiniteFuture(), refused)
                .code(),
            absl::StatusCode::kResourceExhausted);
  gated.Open();
  EXPECT_TRUE(running->Wait().ok());
}

TEST_F(GenerationRunnerTest, CancelledClientStopsGeneration) {
  auto runner = MakeRunner(provider_.get());
  auto sink = std::make_shared<RecordingSink>(/*cancel_after=*/2);
  ASSERT_TRUE(runner->Submit(IdsRequest({1, 2}, 50), absl::InfiniteFuture(),
                             sink).ok());
  EXPECT_EQ(sink->Wait().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(sink->tokens().size(), 2u);
  // The engine is free again.
  auto next = std::make_shared<RecordingSink>();
  ASSERT_TRUE(runner->Submit(IdsRequest({1, 2}, 2), absl::InfiniteFuture(),
                             next).ok());
  EXPECT_TRUE(next->Wait().ok());
}

TEST_F(GenerationRunnerTest, PassedDeadlineIsDeadlineExceeded) {
  auto runner = MakeRunner(provider_.get());
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(runner->Submit(IdsRequest({1, 2}, 5),
                             absl::Now() - absl::Seconds(1), sink).ok());
  EXPECT_EQ(sink->Wait().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(sink->tokens().empty());
}

TEST_F(GenerationRunnerTest, ProviderGoneIsUnavailable) {
  GoneProvider gone;
  auto runner = MakeRunner(&gone);
  auto sink = std::make_shared<RecordingSink>();
  ASSERT_TRUE(runner->Submit(IdsRequest({1, 2}, 5), absl::InfiniteFuture(),
                             sink).ok());
  absl::Status s = sink->Wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("went away"));
}

TEST_F(GenerationRunnerTest, StopFailsQueuedAndCancelsRunning) {
  GatedProvider gated(provider_.get());
  auto runner = MakeRunner(&gated);
  auto running = std::make_shared<RecordingSink>();
  auto queued = std::make_shared<RecordingSink>();
  ASSERT_TRUE(runner->Submit(IdsRequest({1, 2}, 40), absl::InfiniteFuture(),
                             running).ok());
  gated.WaitEntered();
  ASSERT_TRUE(runner->Submit(IdsRequest({3}, 3), absl::InfiniteFuture(),
                             queued).ok());
  std::thread stopper([&] { runner->Stop(absl::ZeroDuration()); });
  EXPECT_EQ(queued->Wait().code(), absl::StatusCode::kUnavailable);
  gated.Open();
  stopper.join();
  // Zero grace: cancelled after its first token.
  EXPECT_EQ(running->Wait().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(running->tokens().size(), 1u);
  auto late = std::make_shared<RecordingSink>();
  EXPECT_EQ(runner->Submit(IdsRequest({1}, 1), absl::InfiniteFuture(), late)
                .code(),
            absl::StatusCode::kUnavailable);
}

// Counts what every acquire reported, to check that the requests' usage
// adds up to it exactly.
class TotalsProvider : public ExpertProvider {
 public:
  explicit TotalsProvider(ExpertProvider* inner) : inner_(inner) {}
  absl::StatusOr<AcquiredExperts> Acquire(int layer, absl::Span<const ExpertDemand> demands,
                                          bool prefill) override {
    absl::StatusOr<AcquiredExperts> a = inner_->Acquire(layer, demands, prefill);
    if (a.ok()) {
      a->usage.misses = 1;  // something to split besides the hits
      a->usage.stall_ns = 1000;
      std::lock_guard<std::mutex> lock(mu_);
      total_ += a->usage;
      ++acquires_;
    }
    return a;
  }
  void Release(AcquiredExperts& lease) override { inner_->Release(lease); }
  AcquireUsage total() {
    std::lock_guard<std::mutex> lock(mu_);
    return total_;
  }

 private:
  ExpertProvider* inner_;
  std::mutex mu_;
  AcquireUsage total_;
  int64_t acquires_ = 0;
};

std::vector<v1::GenerateRequest> MixedRequests() {
  std::vector<v1::GenerateRequest> rs;
  const std::vector<std::vector<int32_t>> prompts = {
      {5, 17, 300, 42}, {1}, {9, 8, 7, 6, 5, 4, 3, 2, 1}, {77, 78}, {400, 3, 12}, {2, 4, 6, 8, 10}};
  for (size_t i = 0; i < prompts.size(); ++i) {
    v1::GenerateRequest r;
    for (int32_t id : prompts[i]) r.add_prompt_token_ids(id);
    r.set_max_new_tokens(4 + 3 * static_cast<int>(i % 3));
    r.set_ignore_eos(true);
    r.set_top_logprobs(2);
    if (i % 2 == 1) {  // sampled, seeded
      r.set_temperature(0.8f);
      r.set_seed(100 + i);
    }
    rs.push_back(r);
  }
  return rs;
}

std::vector<std::shared_ptr<RecordingSink>> SubmitAll(GenerationRunner& runner,
                                                      const std::vector<v1::GenerateRequest>& rs) {
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  for (const v1::GenerateRequest& r : rs) {
    sinks.push_back(std::make_shared<RecordingSink>());
    EXPECT_TRUE(runner.Submit(r, absl::InfiniteFuture(), sinks.back()).ok());
  }
  return sinks;
}

// Submits `rs` with the first step held until all are queued, so that they
// start together.
std::vector<std::shared_ptr<RecordingSink>> SubmitTogether(
    GenerationRunner& runner, GatedProvider& gated, const std::vector<v1::GenerateRequest>& rs) {
  auto first = std::make_shared<RecordingSink>();
  EXPECT_TRUE(runner.Submit(rs[0], absl::InfiniteFuture(), first).ok());
  gated.WaitEntered();
  std::vector<v1::GenerateRequest> rest(rs.begin() + 1, rs.end());
  std::vector<std::shared_ptr<RecordingSink>> sinks = SubmitAll(runner, rest);
  sinks.insert(sinks.begin(), first);
  gated.Open();
  return sinks;
}

// Issue 14: a request's tokens and logprobs are bit-identical whether it ran
// alone (the one-at-a-time runner) or beside others in a batch with chunked
// prefill; its usage is its own share, and the shares add up exactly.
TEST_F(GenerationRunnerTest, BatchedRequestsEqualOneAtATime) {
  const std::vector<v1::GenerateRequest> rs = MixedRequests();
  std::vector<std::vector<v1::GenerateResponse>> alone;
  {
    auto runner = MakeRunner(provider_.get());
    for (auto& sink : SubmitAll(*runner, rs)) {
      ASSERT_TRUE(sink->Wait().ok());
      alone.push_back(sink->responses());
    }
  }
  for (int chunk : {0, 2}) {
    GatedProvider gated(provider_.get());
    TotalsProvider totals(&gated);
    RunnerOptions options;
    options.max_batch = 4;
    options.prefill_chunk = chunk;
    auto runner = MakeRunner(&totals, options);
    std::vector<std::shared_ptr<RecordingSink>> sinks = SubmitTogether(*runner, gated, rs);
    AcquireUsage sum;
    for (size_t i = 0; i < rs.size(); ++i) {
      ASSERT_TRUE(sinks[i]->Wait().ok()) << i;
      std::vector<v1::GenerateResponse> got = sinks[i]->responses();
      ASSERT_EQ(got.size(), alone[i].size()) << "request " << i;
      for (size_t t = 0; t < got.size(); ++t) {
        EXPECT_EQ(got[t].token_id(), alone[i][t].token_id()) << i << "/" << t;
        EXPECT_EQ(got[t].logprob(), alone[i][t].logprob()) << i << "/" << t;
        ASSERT_EQ(got[t].top_logprobs_size(), alone[i][t].top_logprobs_size());
        for (int j = 0; j < got[t].top_logprobs_size(); ++j) {
          EXPECT_EQ(got[t].top_logprobs(j).logprob(), alone[i][t].top_logprobs(j).logprob());
        }
        EXPECT_EQ(got[t].text(), alone[i][t].text());
      }
      const v1::Usage& u = got.back().usage();
      EXPECT_EQ(u.generated_tokens(), rs[i].max_new_tokens());
      EXPECT_EQ(u.prompt_tokens(), rs[i].prompt_token_ids_size());
      EXPECT_GT(u.expert_hits(), 0);
      sum.hits += u.expert_hits();
      sum.misses += u.expert_misses();
      sum.stall_ns += static_cast<int64_t>(std::llround(u.expert_stall_seconds() * 1e9));
    }
    const AcquireUsage total = totals.total();
    EXPECT_EQ(sum.hits, total.hits) << "chunk " << chunk;
    EXPECT_EQ(sum.misses, total.misses);
    EXPECT_NEAR(static_cast<double>(sum.stall_ns), static_cast<double>(total.stall_ns),
                static_cast<double>(rs.size()));
    runner->Stop(absl::Seconds(5));
    const std::string m = metrics_.exposed()->Text();
    const double steps = testing::MetricValue(m, "moe_worker_batch_steps_total");
    const double seqs = testing::MetricValue(m, "moe_worker_batch_sequences_total");
    EXPECT_GT(steps, 0);
    EXPECT_GT(seqs / steps, 1.5) << "sequences did not share steps";
    // Decode steps (every sequence decoding) are some of them: not the
    // steps that ran prompt chunks, and each one timed.
    const double decode_steps = testing::MetricValue(m, "moe_worker_decode_step_seconds_count");
    const double decode_seqs = testing::MetricValue(m, "moe_worker_decode_step_sequences_total");
    EXPECT_GT(decode_steps, 0);
    EXPECT_LT(decode_steps, steps) << "prompt steps counted as decode steps";
    EXPECT_LT(decode_seqs, seqs);
    EXPECT_GE(decode_seqs, decode_steps);
    EXPECT_GT(testing::MetricValue(m, "moe_worker_decode_step_seconds_sum"), 0);
  }
}

// A request whose KV cache can never fit the budget is refused at once;
// others wait for room and then run.
TEST_F(GenerationRunnerTest, KvBudgetRefusesTooLargeAndQueuesTheRest) {
  RunnerOptions options;
  options.max_batch = 8;
  const int64_t one = Session::KvCacheBytes(*model_, 2 + 6);
  options.kv_budget_bytes = one + one / 2;  // room for one such request at a time
  auto runner = MakeRunner(provider_.get(), options);
  auto big = std::make_shared<RecordingSink>();
  absl::Status s = runner->Submit(IdsRequest({1, 2}, 60), absl::InfiniteFuture(), big);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("kv-budget-mb"));
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  for (int i = 0; i < 3; ++i) {
    sinks.push_back(std::make_shared<RecordingSink>());
    ASSERT_TRUE(runner->Submit(IdsRequest({1, 2}, 6), absl::InfiniteFuture(), sinks.back()).ok());
  }
  GenerateOptions ref;
  ref.prompt = {1, 2};
  ref.max_new_tokens = 6;
  ref.stop_at_eos = false;
  const std::vector<int32_t> expected = ReferenceTokens(*model_, ref);
  for (auto& sink : sinks) {
    ASSERT_TRUE(sink->Wait().ok());
    EXPECT_EQ(sink->tokens(), expected);
  }
  runner->Stop(absl::Seconds(5));
  // Never more than one at a time: every step held one sequence.
  const std::string m = metrics_.exposed()->Text();
  EXPECT_EQ(testing::MetricValue(m, "moe_worker_batch_sequences_total"),
            testing::MetricValue(m, "moe_worker_batch_steps_total"));
}

// KV caches grow in blocks; when the budget cannot hold the next step's
// blocks the youngest sequences give theirs up and later resume by
// recomputing their positions: every token, logprob, usage figure and
// recorded trace line is what each request gets alone, including the
// seeded sampled ones (their samplers carry on).
TEST_F(GenerationRunnerTest, KvBlocksPreemptTheYoungestAndResumeWithTheSameTokens) {
  const std::vector<v1::GenerateRequest> rs = MixedRequests();
  std::vector<std::vector<v1::GenerateResponse>> alone;
  std::vector<std::string> lines[2];
  for (int batched = 0; batched < 2; ++batched) {
    std::ostringstream out;
    auto recorder = TraceRecorder::ToStream(&out, TraceHeaderFor(*model_, "tiny"));
    ASSERT_TRUE(recorder.ok()) << recorder.status();
    RunnerOptions options;
    options.recorder = recorder->get();
    int64_t largest = 0;
    for (const auto& r : rs) {
      largest = std::max<int64_t>(largest, r.prompt_token_ids_size() + r.max_new_tokens());
    }
    if (batched == 1) {
      options.max_batch = 6;
      options.prefill_chunk = 3;
      options.kv_block_tokens = 2;
      // The largest request fits alone, with a little room beside it.
      options.kv_budget_bytes = Session::KvCacheBytes(*model_, largest + 4);
    }
    GatedProvider gated(provider_.get());
    auto runner = MakeRunner(&gated, options);
    std::vector<std::shared_ptr<RecordingSink>> sinks = SubmitTogether(*runner, gated, rs);
    for (size_t i = 0; i < rs.size(); ++i) {
      ASSERT_TRUE(sinks[i]->Wait().ok()) << i;
      std::vector<v1::GenerateResponse> got = sinks[i]->responses();
      const v1::Usage& u = got.back().usage();
      EXPECT_EQ(u.generated_tokens(), rs[i].max_new_tokens());
      EXPECT_EQ(u.prompt_tokens(), rs[i].prompt_token_ids_size());
      EXPECT_GT(u.expert_hits() + u.expert_misses(), 0);
      if (batched == 0) {
        alone.push_back(got);
        continue;
      }
      ASSERT_EQ(got.size(), alone[i].size()) << "request " << i;
      for (size_t t = 0; t < got.size(); ++t) {
        EXPECT_EQ(got[t].token_id(), alone[i][t].token_id()) << i << "/" << t;
        EXPECT_EQ(got[t].logprob(), alone[i][t].logprob()) << i << "/" << t;
        EXPECT_EQ(got[t].text(), alone[i][t].text());
      }
    }
    runner->Stop(absl::Seconds(5));
    std::istringstream in(out.str());
    for (std::string line; std::getline(in, line);) lines[batched].push_back(line);
    std::sort(lines[batched].begin(), lines[batched].end());
  }
  const std::string m = metrics_.exposed()->Text();
  EXPECT_GT(testing::MetricValue(m, "moe_worker_kv_preemptions_total"), 0)
      << "the budget never ran out: the test does not exercise preemption";
  EXPECT_GT(testing::MetricValue(m, "moe_worker_batch_sequences_total") /
                testing::MetricValue(m, "moe_worker_batch_steps_total"),
            1.2)
      << "sequences did not share steps";
  ASSERT_EQ(lines[0].size(), rs.size() + 1);  // header + one line per request
  EXPECT_EQ(lines[1], lines[0]);
}

// One client cancelling or expiring leaves the batch at once; the others
// are not disturbed.
TEST_F(GenerationRunnerTest, BatchedCancelAndDeadlineLeaveAlone) {
  RunnerOptions options;
  options.max_batch = 4;
  options.prefill_chunk = 1;
  auto runner = MakeRunner(provider_.get(), options);
  auto cancelled = std::make_shared<RecordingSink>(/*cancel_after=*/2);
  auto expired = std::make_shared<RecordingSink>();
  auto normal = std::make_shared<RecordingSink>();
  ASSERT_TRUE(runner->Submit(IdsRequest({1, 2}, 30), absl::InfiniteFuture(), cancelled).ok());
  ASSERT_TRUE(runner->Submit(IdsRequest({1, 2}, 5), absl::Now() - absl::Seconds(1), expired).ok());
  ASSERT_TRUE(runner->Submit(IdsRequest({3, 4, 5}, 9), absl::InfiniteFuture(), normal).ok());
  EXPECT_EQ(cancelled->Wait().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(cancelled->tokens().size(), 2u);
  EXPECT_EQ(expired->Wait().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(expired->tokens().empty());
  ASSERT_TRUE(normal->Wait().ok());
  GenerateOptions ref;
  ref.prompt = {3, 4, 5};
  ref.max_new_tokens = 9;
  ref.stop_at_eos = false;
  EXPECT_EQ(normal->tokens(), ReferenceTokens(*model_, ref));
}

TEST_F(GenerationRunnerTest, BatchedProviderGoneFailsTheBatchAndStopCancels) {
  GoneProvider gone;
  RunnerOptions options;
  options.max_batch = 4;
  auto runner = MakeRunner(&gone, options);
  auto a = std::make_shared<RecordingSink>();
  ASSERT_TRUE(runner->Submit(IdsRequest({1, 2}, 5), absl::InfiniteFuture(), a).ok());
  EXPECT_EQ(a->Wait().code(), absl::StatusCode::kUnavailable);

  GatedProvider gated(provider_.get());
  auto runner2 = MakeRunner(&gated, options);
  auto running = std::make_shared<RecordingSink>();
  ASSERT_TRUE(runner2->Submit(IdsRequest({1, 2}, 40), absl::InfiniteFuture(), running).ok());
  gated.WaitEntered();
  auto queued = std::make_shared<RecordingSink>();  // waits: the step is held
  ASSERT_TRUE(runner2->Submit(IdsRequest({3}, 3), absl::InfiniteFuture(), queued).ok());
  std::thread stopper([&] { runner2->Stop(absl::ZeroDuration()); });
  EXPECT_EQ(queued->Wait().code(), absl::StatusCode::kUnavailable);
  gated.Open();
  stopper.join();
  EXPECT_EQ(running->Wait().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(running->tokens().size(), 1u);
}

// A batched worker with chunked prefill records the same trace as one at a
// time: the chunks form the one prefill iteration, and routing is the same.
TEST_F(GenerationRunnerTest, BatchedRecordingEqualsOneAtATime) {
  std::vector<std::string> lines[2];
  for (int batched = 0; batched < 2; ++batched) {
    std::ostringstream out;
    auto recorder = TraceRecorder::ToStream(&out, TraceHeaderFor(*model_, "tiny"));
    ASSERT_TRUE(recorder.ok()) << recorder.status();
    RunnerOptions options;
    options.recorder = recorder->get();
    if (batched == 1) {
      options.max_batch = 4;
      options.prefill_chunk = 2;
    }
    auto runner = MakeRunner(provider_.get(), options);
    auto sink = std::make_shared<RecordingSink>();
    ASSERT_TRUE(runner->Submit(IdsRequest({9, 8, 7, 6, 5}, 4), absl::InfiniteFuture(), sink).ok());
    ASSERT_TRUE(sink->Wait().ok());
    runner->Stop(absl::Seconds(5));
    std::istringstream in(out.str());
    for (std::string line; std::getline(in, line);) lines[batched].push_back(line);
  }
  ASSERT_EQ(lines[0].size(), 2u);  // header + the request
  EXPECT_EQ(lines[1], lines[0]);
}

}  // namespace
}  // namespace moe::worker
