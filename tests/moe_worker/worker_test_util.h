// Helpers for the moe-worker tests: a tiny model on disk, the in-process
// reference generation, and a ResponseSink that records what it gets.
#ifndef MOECACHE_TESTS_MOE_WORKER_WORKER_TEST_UTIL_H_
#define MOECACHE_TESTS_MOE_WORKER_WORKER_TEST_UTIL_H_

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/model_maker.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "services/engine/generator.h"
#include "services/engine/in_memory_provider.h"
#include "services/engine/moe_model.h"
#include "services/engine/tokenizer.h"
#include "services/moe_worker/generation_runner.h"
#include "services/moe_worker/worker_metrics.h"
#include "tests/common/test_util.h"
#include "tests/common/tiny_model.h"

namespace moe::worker::testing {


// Tokens Generate() gives in-process with every expert in memory (held as
// `format`, as moe-cached --expert-format holds them; nullopt: as stored).
inline std::vector<int32_t> ReferenceTokens(const MoeModel& model,
                                            const GenerateOptions& options,
                                            std::optional<DType> format = std::nullopt) {
  auto provider = InMemoryExpertProvider::Create(model, format);
  EXPECT_TRUE(provider.ok());
  std::vector<int32_t> tokens;
  auto summary = Generate(model, provider->get(), options,
                          [&](const SampledToken& t) {
                            tokens.push_back(t.token);
                            return true;
                          });
  EXPECT_TRUE(summary.ok()) << summary.status();
  return tokens;
}

// Greedy tokens for `prompt` (no stop at eos), computed in-process on the CPU
// from the checkpoint in `model_dir` with every expert in memory.
inline std::vector<int32_t> ReferenceTokensFromDir(const std::string& model_dir,
                                                   const std::vector<int32_t>& prompt,
                                                   int new_tokens) {
  auto backend = CreateBackend("cpu");
  EXPECT_TRUE(backend.ok()) << backend.status();
  if (!backend.ok()) return {};
  auto model = MoeModel::Load(model_dir, backend->get());
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return {};
  GenerateOptions o;
  o.prompt = prompt;
  o.max_new_tokens = new_tokens;
  o.stop_at_eos = false;
  return ReferenceTokens(**model, o);
}

// Records responses; Wait() blocks until Finish. Can cancel itself after
// `cancel_after` responses.
class RecordingSink : public ResponseSink {
 public:
  explicit RecordingSink(int cancel_after = -1) : cancel_after_(cancel_after) {}

  void Write(v1::GenerateResponse response) override {
    std::lock_guard<std::mutex> lock(mu_);
    responses_.push_back(std::move(response));
    if (cancel_after_ >= 0 &&
        static_cast<int>(responses_.size()) >= cancel_after_) {
      cancelled_ = true;
    }
  }
  void Finish(const absl::Status& status) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++finishes_;
    status_ = status;
    cv_.notify_all();
  }
  bool Cancelled() const override { return cancelled_.load(); }

  absl::Status Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return finishes_ > 0; });
    return status_;
  }
  std::vector<v1::GenerateResponse> responses() {
    std::lock_guard<std::mutex> lock(mu_);
    return responses_;
  }
  std::vector<int32_t> tokens() {
    std::vector<int32_t> out;
    for (const auto& r : responses()) out.push_back(r.token_id());
    return out;
  }
  int finishes() {
    std::lock_guard<std::mutex> lock(mu_);
    return finishes_;
  }

 private:
  const int cancel_after_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<v1::GenerateResponse> responses_;
  int finishes_ = 0;
  absl::Status status_;
  std::atomic<bool> cancelled_{false};
};

// The runner tests' fixture: a tiny model on the CPU with its tokenizer and
// every expert in memory, GenerationRunners over it, and a way to run
// requests submitted together to their end.
class TinyRunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(moe::testing::MakeTinyModel(dir_.path()).ok());
    auto backend = CreateBackend("cpu");
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = std::move(*backend);
    auto model = MoeModel::Load(dir_.path(), backend_.get());
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(*model);
    auto tok = Tokenizer::FromFile(dir_.path() + "/tokenizer.json");
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = std::move(*tok);
    auto provider = InMemoryExpertProvider::Create(*model_);
    ASSERT_TRUE(provider.ok());
    provider_ = std::move(*provider);
  }

  std::unique_ptr<GenerationRunner> MakeRunner(int max_batch = 1) {
    RunnerOptions options;
    options.max_batch = max_batch;
    auto runner = std::make_unique<GenerationRunner>(*model_, provider_.get(), tokenizer_.get(),
                                                     &metrics_, options);
    EXPECT_TRUE(runner->Start().ok());
    return runner;
  }

  // Runs each of `rs` (submitted together) to the end.
  std::vector<std::shared_ptr<RecordingSink>> Run(GenerationRunner& runner,
                                                  const std::vector<v1::GenerateRequest>& rs) {
    std::vector<std::shared_ptr<RecordingSink>> sinks;
    for (const v1::GenerateRequest& r : rs) {
      sinks.push_back(std::make_shared<RecordingSink>());
      EXPECT_TRUE(runner.Submit(r, absl::InfiniteFuture(), sinks.back()).ok());
    }
    for (auto& s : sinks) EXPECT_TRUE(s->Wait().ok());
    return sinks;
  }

  moe::testing::TempDir dir_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<MoeModel> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<InMemoryExpertProvider> provider_;
  WorkerMetrics metrics_;
};

}  // namespace moe::worker::testing

#endif  // MOECACHE_TESTS_MOE_WORKER_WORKER_TEST_UTIL_H_
