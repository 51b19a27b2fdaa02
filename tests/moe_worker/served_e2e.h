// A test fixture for "a made model served by the real moe-cached +
// moe-worker gives the float64 reference's greedy tokens, bit-identical for
// every cache capacity and policy" (design invariant 4), shared by the
// family end-to-end tests (deepseek_e2e_test.cc, gpt_oss_e2e_test.cc).
//
//   class MyE2eTest : public ServedE2eTest<ModelFamily> {
//     void SetUp() override { ...MakeModel(o, model_dir())... }
//   };
//   TEST_P(MyE2eTest, X) {
//     ExpectEveryCacheGivesTheReference(prompt, 12, {{8, "lru"}, {24, "lfu"}},
//                                       {}, 2e-2, 24, "label", nullptr);
//   }
#ifndef MOECACHE_TESTS_MOE_WORKER_SERVED_E2E_H_
#define MOECACHE_TESTS_MOE_WORKER_SERVED_E2E_H_

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/test_util.h"
#include "tests/moe_worker/worker_process.h"
#include "tests/moe_worker/worker_test_util.h"

namespace moe::worker {

// stdout of `cmd`; a non-zero exit is a test failure.
inline std::string RunCommandForTest(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int rc = ::pclose(p);
  if (rc != 0) ADD_FAILURE() << cmd << " exited with " << rc << "\n" << out;
  return out;
}

// One request's greedy tokens through the services.
struct ServedRun {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  nlohmann::json stats;  // the daemon's, from `moectl stats --json`
};

template <typename Param>
class ServedE2eTest : public ::testing::TestWithParam<Param> {
 protected:
  using Served = ServedRun;

  // A folder, or (overridden) a .gguf file.
  virtual std::string model_dir() { return dir_.Sub("model"); }

  // Greedy tokens and their logprobs through a fresh moe-cached (`experts`
  // slots, `policy`, `daemon_args`) and moe-worker; both are stopped after.
  void Serve(int experts, const std::string& policy,
             const std::vector<std::string>& daemon_args,
             const std::vector<int32_t>& prompt, int new_tokens, Served* out) {
    const std::string cache_sock = "unix:" + dir_.Sub("c.sock");
    const std::string worker_sock = "unix:" + dir_.Sub("w.sock");
    const std::string tag = absl::StrCat(policy, experts);
    std::vector<std::string> args = {"--model",         model_dir(),
                                     "--listen",        cache_sock,
                                     "--metrics-addr",  "",
                                     "--cache-experts", std::to_string(experts),
                                     "--policy",        policy};
    args.insert(args.end(), daemon_args.begin(), daemon_args.end());
    testing::WorkerProcess daemon;
    ASSERT_TRUE(daemon.Spawn(args, dir_.Sub("cached-" + tag + ".log"),
                             testing::CachedBinary()));
    ASSERT_TRUE(daemon.WaitServing(cache_sock)) << daemon.Log();
    testing::WorkerProcess worker;
    ASSERT_TRUE(worker.Spawn(
        {"--model", model_dir(), "--listen", worker_sock, "--backend", "cpu",
         "--metrics-addr", "", "--cache", cache_sock},
        dir_.Sub("worker-" + tag + ".log")));
    ASSERT_TRUE(worker.WaitServing(worker_sock)) << worker.Log();
    auto addr = rpc::ParseListenAddress(worker_sock);
    auto stub = v1::Inference::NewStub(rpc::MakeChannel(*addr));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(60));
    v1::GenerateRequest r;
    for (int32_t id : prompt) r.add_prompt_token_ids(id);
    r.set_max_new_tokens(new_tokens);
    r.set_ignore_eos(true);
    auto reader = stub->Generate(&ctx, r);
    v1::GenerateResponse resp;
    while (reader->Read(&resp)) {
      out->tokens.push_back(resp.token_id());
      out->logprobs.push_back(resp.logprob());
    }
    grpc::Status s = reader->Finish();
    ASSERT_TRUE(s.ok()) << s.error_message() << "\n" << worker.Log();
    const std::string stats =
        RunCommandForTest(std::string(MOE_BINARY_DIR) +
                          "/bin/moectl stats --json --cache " + cache_sock);
    auto j = nlohmann::json::parse(stats, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << stats;
    ASSERT_EQ(j["cache"].size(), 1u) << stats;
    out->stats = j["cache"][0];
    worker.Signal(SIGTERM);
    EXPECT_EQ(worker.Wait(), 0);
    daemon.Signal(SIGTERM);
    EXPECT_EQ(daemon.Wait(), 0) << daemon.Log();
  }

  // For each (capacity, policy) of `caches`: the served tokens equal the
  // float64 reference's, logprobs within `tolerance`, the cache holds at most
  // `moe_experts` (MoE layers x experts) and every run is bit-identical to the
  // first. `check`, when set, looks at each run's daemon stats too.
  void ExpectEveryCacheGivesTheReference(
      const std::vector<int32_t>& prompt, int new_tokens,
      const std::vector<std::pair<int, std::string>>& caches,
      const std::vector<std::string>& daemon_args, double tolerance,
      int moe_experts, const std::string& label,
      const std::function<void(int, const Served&)>& check) {
    // f32 activations in the processes (bf16 weights on AVX512_BF16 would
    // round them: near-tied tokens of these random models flip against the
    // exact reference; tests/common/test_util.h).
    moe::testing::ScopedEnv f32_activations("MOE_BF16_DOT", "0");
    const std::string out = RunCommandForTest(
        absl::StrCat("/usr/bin/python3 ", MOE_SOURCE_DIR,
                     "/tests/reference/moe_reference.py --model ", model_dir(),
                     " --prompt-ids ", absl::StrJoin(prompt, ","),
                     " --max-new-tokens ", new_tokens));
    auto ref = nlohmann::json::parse(out, nullptr, false);
    ASSERT_FALSE(ref.is_discarded()) << out;
    const auto want = ref["tokens"].get<std::vector<int32_t>>();
    const auto want_lp = ref["logprobs"].get<std::vector<double>>();
    ASSERT_EQ(want.size(), static_cast<size_t>(new_tokens));
    std::vector<int32_t> first_tokens;
    std::vector<float> first_logprobs;
    for (const auto& [experts, policy] : caches) {
      SCOPED_TRACE(::testing::Message() << policy << " capacity " << experts);
      Served run;
      ASSERT_NO_FATAL_FAILURE(
          Serve(experts, policy, daemon_args, prompt, new_tokens, &run));
      EXPECT_EQ(run.tokens, want);
      double max_diff = 0;
      for (size_t i = 0; i < run.logprobs.size() && i < want_lp.size(); ++i) {
        max_diff = std::max(max_diff, std::abs(run.logprobs[i] - want_lp[i]));
      }
      std::printf("[%s %s %d] max |logprob - reference| = %.3g\n",
                  label.c_str(), policy.c_str(), experts, max_diff);
      EXPECT_LE(max_diff, tolerance);
      EXPECT_EQ(run.stats["capacity_experts"], experts) << run.stats.dump();
      EXPECT_LE(run.stats["resident_experts"].get<int>(),
                std::min(experts, moe_experts));
      if (check) check(experts, run);
      if (first_tokens.empty()) {
        first_tokens = run.tokens;
        first_logprobs = run.logprobs;
      } else {
        EXPECT_EQ(run.tokens, first_tokens);
        EXPECT_EQ(run.logprobs, first_logprobs);  // bit-identical
      }
    }
  }

  moe::testing::TempDir dir_;
};

}  // namespace moe::worker

#endif  // MOECACHE_TESTS_MOE_WORKER_SERVED_E2E_H_
