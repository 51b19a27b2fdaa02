// gpt_oss tiny models (sinks, sliding and full layers, YaRN, biased router,
// biased clamped-SwiGLU experts whose biases travel in the daemon's slots),
// bf16 and MXFP4 checkpoints, served by the real moe-cached + moe-worker:
// the greedy tokens and logprobs of the float64 reference
// (tests/reference/moe_reference.py) for several capacities and policies,
// bit-identical across them (design invariant 4). The prompt and the
// generated tokens run past the sliding window (8).
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

const std::vector<int32_t> kPrompt = {11, 22, 33, 44, 55, 66, 77, 88, 99, 5};
constexpr int kNew = 10;

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

// "bf16"; "mxfp4": MXFP4 experts held as q8 by the daemon (exactly, the
// default); "mxfp4_native": held as MXFP4 (--expert-format mxfp4).
class GptOssE2eTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    MakeModelOptions o = TinyPreset(ModelFamily::kGptOss);
    o.seed = 33;
    o.mxfp4 = GetParam() != "bf16";
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
    std::vector<std::string> args = {"--model",         model_dir(),
                                     "--listen",        cache_sock_,
                                     "--metrics-addr",  "",
                                     "--cache-experts", std::to_string(experts),
                                     "--policy",        policy};
    if (GetParam() == "mxfp4_native") {
      args.push_back("--expert-format");
      args.push_back("mxfp4");
    }
    ASSERT_TRUE(
        daemon.Spawn(args, dir_.Sub("cached-" + tag + ".log"), CachedBinary()));
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

TEST_P(GptOssE2eTest, ServedTokensMatchTheFloat64ReferenceForEveryCache) {
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
  // q8 rounds the activations of each product (forward_reference_test's
  // kQ8Tolerance); bf16 experts are exact.
  const double tolerance = GetParam() != "bf16" ? 8e-2 : 2e-2;

  // 4 MoE layers x 8 experts.
  std::vector<int32_t> first_tokens;
  std::vector<float> first_logprobs;
  for (const auto& [experts, policy] : std::vector<std::pair<int, std::string>>{
           {8, "lru"}, {13, "moe-infinity"}, {32, "lfu"}, {8, "expertflow"}}) {
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
    std::printf("[gpt_oss %s %s %d] max |logprob - reference| = %.3g\n",
                GetParam().c_str(), policy.c_str(), experts, max_diff);
    EXPECT_LE(max_diff, tolerance);
    EXPECT_EQ(stats["capacity_experts"], experts) << stats.dump();
    EXPECT_LE(stats["resident_experts"].get<int>(), std::min(experts, 32));
    if (first_tokens.empty()) {
      first_tokens = tokens;
      first_logprobs = logprobs;
    } else {
      EXPECT_EQ(tokens, first_tokens);
      EXPECT_EQ(logprobs, first_logprobs);  // bit-identical
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, GptOssE2eTest,
                         ::testing::Values("bf16", "mxfp4", "mxfp4_native"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace moe::worker
