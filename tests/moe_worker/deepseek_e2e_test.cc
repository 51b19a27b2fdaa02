// DeepSeek-V2 and -V3 tiny models (MLA with a latent cache, grouped and
// bias-corrected routing, shared experts, a dense first layer) served by the
// real moe-cached + moe-worker: the greedy tokens and logprobs of the float64
// reference (tests/reference/moe_reference.py) for several capacities and
// policies, bit-identical across them (design invariant 4), and a cache that
// counts MoE layers only.
#include <signal.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/moe_worker/worker_process.h"
#include "tests/moe_worker/worker_test_util.h"

namespace moe::worker {
namespace {

using testing::CachedBinary;
using testing::WorkerProcess;

const std::vector<int32_t> kPrompt = {11, 22, 33, 44, 55, 66, 77};
constexpr int kNew = 12;

std::string RunCommand(const std::string& cmd) {
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

class DeepseekE2eTest : public ::testing::TestWithParam<ModelFamily> {
 protected:
  void SetUp() override {
    MakeModelOptions o = TinyPreset(GetParam());
    o.seed = 31;
    absl::Status s = MakeModel(o, model_dir());
    ASSERT_TRUE(s.ok()) << s;
    cache_sock_ = "unix:" + dir_.Sub("c.sock");
    worker_sock_ = "unix:" + dir_.Sub("w.sock");
  }
  std::string model_dir() { return dir_.Sub("model"); }

  // Greedy tokens and their logprobs through moe-cached (`experts` slots,
  // `policy`) and moe-worker; both processes are stopped afterwards.
  void Serve(int experts, const std::string& policy,
             std::vector<int32_t>* tokens, std::vector<float>* logprobs,
             nlohmann::json* stats) {
    WorkerProcess daemon;
    const std::string tag = absl::StrCat(policy, experts);
    ASSERT_TRUE(daemon.Spawn(
        {"--model", model_dir(), "--listen", cache_sock_, "--metrics-addr", "",
         "--cache-experts", std::to_string(experts), "--policy", policy},
        dir_.Sub("cached-" + tag + ".log"), CachedBinary()));
    ASSERT_TRUE(daemon.WaitServing(cache_sock_)) << daemon.Log();
    WorkerProcess worker;
    ASSERT_TRUE(worker.Spawn(
        {"--model", model_dir(), "--listen", worker_sock_, "--backend", "cpu",
         "--metrics-addr", "", "--cache", cache_sock_},
        dir_.Sub("worker-" + tag + ".log")));
    ASSERT_TRUE(worker.WaitServing(worker_sock_)) << worker.Log();
    auto addr = rpc::ParseListenAddress(worker_sock_);
    auto stub = v1::Inference::NewStub(rpc::MakeChannel(*addr));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(60));
    v1::GenerateRequest r;
    for (int32_t id : kPrompt) r.add_prompt_token_ids(id);
    r.set_max_new_tokens(kNew);
    r.set_ignore_eos(true);
    auto reader = stub->Generate(&ctx, r);
    v1::GenerateResponse resp;
    while (reader->Read(&resp)) {
      tokens->push_back(resp.token_id());
      logprobs->push_back(resp.logprob());
    }
    grpc::Status s = reader->Finish();
    ASSERT_TRUE(s.ok()) << s.error_message() << "\n" << worker.Log();
    const std::string out =
        RunCommand(std::string(MOE_BINARY_DIR) +
                   "/bin/moectl stats --json --cache " + cache_sock_);
    auto j = nlohmann::json::parse(out, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << out;
    ASSERT_EQ(j["cache"].size(), 1u) << out;
    *stats = j["cache"][0];
    worker.Signal(SIGTERM);
    EXPECT_EQ(worker.Wait(), 0);
    daemon.Signal(SIGTERM);
    EXPECT_EQ(daemon.Wait(), 0) << daemon.Log();
  }

  moe::testing::TempDir dir_;
  std::string cache_sock_, worker_sock_;
};

TEST_P(DeepseekE2eTest, ServedTokensMatchTheFloat64ReferenceForEveryCache) {
  const std::string out = RunCommand(
      absl::StrCat("/usr/bin/python3 ", MOE_SOURCE_DIR,
                   "/tests/reference/moe_reference.py --model ", model_dir(),
                   " --prompt-ids ", absl::StrJoin(kPrompt, ","),
                   " --max-new-tokens ", kNew));
  auto ref = nlohmann::json::parse(out, nullptr, false);
  ASSERT_FALSE(ref.is_discarded()) << out;
  const auto want = ref["tokens"].get<std::vector<int32_t>>();
  const auto want_lp = ref["logprobs"].get<std::vector<double>>();
  ASSERT_EQ(want.size(), static_cast<size_t>(kNew));

  // Tiny deepseek: 4 layers, layer 0 dense, so 3 MoE layers x 8 experts.
  std::vector<int32_t> first_tokens;
  std::vector<float> first_logprobs;
  for (const auto& [experts, policy] : std::vector<std::pair<int, std::string>>{
           {8, "lru"}, {13, "moe-infinity"}, {24, "lfu"}, {8, "expertflow"}}) {
    SCOPED_TRACE(::testing::Message() << policy << " capacity " << experts);
    std::vector<int32_t> tokens;
    std::vector<float> logprobs;
    nlohmann::json stats;
    ASSERT_NO_FATAL_FAILURE(Serve(experts, policy, &tokens, &logprobs, &stats));
    EXPECT_EQ(tokens, want);
    double max_diff = 0;
    for (size_t i = 0; i < logprobs.size() && i < want_lp.size(); ++i) {
      max_diff = std::max(max_diff, std::abs(logprobs[i] - want_lp[i]));
    }
    std::printf("[%s %s %d] max |logprob - reference| = %.3g\n",
                std::string(ModelFamilyName(GetParam())).c_str(),
                policy.c_str(), experts, max_diff);
    EXPECT_LE(max_diff, 2e-2);
    EXPECT_EQ(stats["capacity_experts"], experts) << stats.dump();
    // The cache holds MoE layers only: 3 x 8 experts of gate, up and down
    // [32, 64] bf16 each (12288 bytes); the dense layer 0 and the shared
    // experts stay in the worker.
    EXPECT_LE(stats["resident_experts"].get<int>(), std::min(experts, 24));
    if (experts == 24) {
      EXPECT_LE(stats["misses"].get<int64_t>(), 24) << stats.dump();
    }
    if (stats["host_runs"].get<int64_t>() == 0) {
      EXPECT_EQ(stats["bytes_copied"].get<int64_t>(),
                stats["misses"].get<int64_t>() * 3 * 32 * 64 * 2)
          << stats.dump();
    }
    if (first_tokens.empty()) {
      first_tokens = tokens;
      first_logprobs = logprobs;
    } else {
      EXPECT_EQ(tokens, first_tokens);
      EXPECT_EQ(logprobs, first_logprobs);  // bit-identical
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, DeepseekE2eTest,
                         ::testing::Values(ModelFamily::kDeepseekV2,
                                           ModelFamily::kDeepseekV3),
                         [](const auto& info) {
                           return std::string(ModelFamilyName(info.param));
                         });

}  // namespace
}  // namespace moe::worker
