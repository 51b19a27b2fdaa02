// moe-worker serving through the real moe-cached (--cache unix:PATH): the
// same tokens as with every expert in memory for any cache capacity
// (design invariant 4), misses reported in usage, UNAVAILABLE while the
// daemon is gone and service again once it is back.
#include <signal.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <thread>
#include <vector>

#include "common/fp8.h"
#include "common/quant.h"
#include "common/row_interleave.h"
#include "gtest/gtest.h"
#include "kernels/cpu_gguf_quant.h"
#include "kernels/cpu_matmul.h"
#include "tests/common/test_util.h"
#include "tests/moe_worker/worker_process.h"
#include "tests/moe_worker/worker_test_util.h"

namespace moe::worker {
namespace {

using testing::CachedBinary;
using testing::WorkerProcess;

class DaemonE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(moe::testing::MakeTinyModel(dir_.Sub("tiny")).ok());
    cache_sock_ = "unix:" + dir_.Sub("c.sock");
    worker_sock_ = "unix:" + dir_.Sub("w.sock");
  }

  void StartDaemon(WorkerProcess& p, int experts, const std::string& policy,
                   const std::string& log, const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {"--model", dir_.Sub("tiny"), "--listen", cache_sock_,
                                     "--metrics-addr", "", "--cache-experts",
                                     std::to_string(experts), "--policy", policy};
    args = moe::testing::WithFlags(std::move(args), extra, {"--model"});  // moe-cached
    ASSERT_TRUE(p.Spawn(args, dir_.Sub(log), CachedBinary()));
    ASSERT_TRUE(p.WaitServing(cache_sock_)) << p.Log();
  }

  void StartWorker(const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {
        "--model", dir_.Sub("tiny"), "--listen", worker_sock_, "--backend",
        "cpu", "--metrics-addr", "", "--cache", cache_sock_};
    args = moe::testing::WithFlags(std::move(args), extra);
    ASSERT_TRUE(worker_.Spawn(args, dir_.Sub("worker.log")));
    ASSERT_TRUE(worker_.WaitServing(worker_sock_)) << worker_.Log();
    auto a = rpc::ParseListenAddress(worker_sock_);
    stub_ = v1::Inference::NewStub(rpc::MakeChannel(*a));
  }

  grpc::Status Call(std::vector<v1::GenerateResponse>* out, int n = 12) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(60));
    v1::GenerateRequest r;
    for (int32_t id : {11, 22, 33, 44, 55}) r.add_prompt_token_ids(id);
    r.set_max_new_tokens(n);
    r.set_ignore_eos(true);
    auto reader = stub_->Generate(&ctx, r);
    v1::GenerateResponse resp;
    while (reader->Read(&resp)) out->push_back(resp);
    return reader->Finish();
  }

  std::vector<int32_t> Reference(int n = 12, std::optional<DType> format = std::nullopt) {
    auto backend = CreateBackend("cpu");
    auto model = MoeModel::Load(dir_.Sub("tiny"), backend->get());
    EXPECT_TRUE(model.ok());
    GenerateOptions o;
    o.prompt = {11, 22, 33, 44, 55};
    o.max_new_tokens = n;
    o.stop_at_eos = false;
    return testing::ReferenceTokens(**model, o, format);
  }

  // Starts a worker on the running `daemon`, checks that 16 greedy tokens
  // are `expected`, then stops both cleanly.
  void ExpectTokensThenStop(WorkerProcess& daemon, const std::vector<int32_t>& expected) {
    StartWorker();
    std::vector<v1::GenerateResponse> rs;
    grpc::Status s = Call(&rs, 16);
    ASSERT_TRUE(s.ok()) << s.error_message() << "\n" << worker_.Log();
    std::vector<int32_t> tokens;
    for (const auto& r : rs) tokens.push_back(r.token_id());
    EXPECT_EQ(tokens, expected);
    worker_.Signal(SIGTERM);
    EXPECT_EQ(worker_.Wait(), 0);
    daemon.Signal(SIGTERM);
    EXPECT_EQ(daemon.Wait(), 0) << daemon.Log();
  }

  // The daemon's statistics of its one model, as `moectl stats --json
  // --cache` prints them.
  // `requests` concurrent Generate calls to the worker, each streaming
  // `want`.
  void ExpectConcurrentTokens(int requests, const std::vector<int32_t>& want) {
    std::vector<std::vector<v1::GenerateResponse>> rs(requests);
    std::vector<grpc::Status> st(requests);
    std::vector<std::thread> clients;
    for (int i = 0; i < requests; ++i) {
      clients.emplace_back([&, i] { st[i] = Call(&rs[i]); });
    }
    for (std::thread& t : clients) t.join();
    for (int i = 0; i < requests; ++i) {
      ASSERT_TRUE(st[i].ok()) << st[i].error_message() << "\n" << worker_.Log();
      std::vector<int32_t> tokens;
      for (const auto& r : rs[i]) tokens.push_back(r.token_id());
      EXPECT_EQ(tokens, want) << "request " << i;
    }
  }

  void CacheStats(nlohmann::json* model) {
    const std::string cmd = std::string(MOE_BINARY_DIR) +
                            "/bin/moectl stats --json --cache " + cache_sock_;
    std::string out;
    FILE* p = ::popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
    ASSERT_EQ(::pclose(p), 0) << out;
    auto j = nlohmann::json::parse(out, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << out;
    ASSERT_EQ(j["cache"].size(), 1u) << out;
    *model = j["cache"][0];
  }

  moe::testing::TempDir dir_;
  std::string cache_sock_, worker_sock_;
  WorkerProcess worker_;
  std::unique_ptr<v1::Inference::Stub> stub_;
};

TEST_F(DaemonE2eTest, MinimumCapacityGivesTheInMemoryTokens) {
  WorkerProcess daemon;
  StartDaemon(daemon, /*experts=*/8, "lru", "cached.log");  // one layer
  StartWorker();
  std::vector<v1::GenerateResponse> rs;
  grpc::Status s = Call(&rs);
  ASSERT_TRUE(s.ok()) << s.error_message() << "\n" << worker_.Log();
  std::vector<int32_t> tokens;
  for (const auto& r : rs) tokens.push_back(r.token_id());
  EXPECT_EQ(tokens, Reference());
  ASSERT_FALSE(rs.empty());
  const v1::Usage& usage = rs.back().usage();
  EXPECT_GT(usage.expert_misses(), 0);

  // moectl stats sees the daemon's side of the same request.
  nlohmann::json m;
  ASSERT_NO_FATAL_FAILURE(CacheStats(&m));
  EXPECT_EQ(m["policy"], "lru");
  EXPECT_EQ(m["capacity_experts"], 8);
  EXPECT_EQ(m["hits"].get<int64_t>() + m["misses"].get<int64_t>(),
            usage.expert_hits() + usage.expert_misses());
}

// Misses served where the daemon chooses (design invariant 4 extended to
// the miss mode): on the CPU backend the tokens stay the in-memory ones for
// every mode, capacity and policy, because a host-run expert is the same
// kernel on the same bytes. host and auto (1 GB/s link: a 48 KB copy costs
// more than reading it) answer misses on the host; fetch never does.
TEST_F(DaemonE2eTest, TokensDoNotDependOnWhereMissesRun) {
  const std::vector<int32_t> want = Reference();
  for (const std::string mode : {"fetch", "host", "auto"}) {
    for (const auto& [experts, policy] :
         std::vector<std::pair<int, std::string>>{{8, "lru"}, {16, "moe-infinity"}}) {
      SCOPED_TRACE(mode + " " + std::to_string(experts) + " " + policy);
      WorkerProcess daemon;
      StartDaemon(daemon, experts, policy, "cached-" + mode + ".log",
                  {"--miss-mode", mode, "--link-gbps", "1", "--host-gbps", "10"});
      StartWorker();
      std::vector<v1::GenerateResponse> rs;
      grpc::Status s = Call(&rs);
      ASSERT_TRUE(s.ok()) << s.error_message() << "\n" << worker_.Log();
      std::vector<int32_t> tokens;
      for (const auto& r : rs) tokens.push_back(r.token_id());
      EXPECT_EQ(tokens, want);
      nlohmann::json m;
      ASSERT_NO_FATAL_FAILURE(CacheStats(&m));
      const std::string out = m.dump();
      EXPECT_EQ(m["miss_mode"], mode);
      if (mode == "fetch") {
        EXPECT_EQ(m["host_runs"].get<int64_t>(), 0);
      } else {
        EXPECT_GT(m["host_runs"].get<int64_t>(), 0) << out;
      }
      if (mode == "host") {
        EXPECT_EQ(m["host_runs"].get<int64_t>(), m["misses"].get<int64_t>());
      }
      worker_.Signal(SIGTERM);
      EXPECT_EQ(worker_.Wait(), 0) << worker_.Log();
      daemon.Signal(SIGTERM);
      EXPECT_EQ(daemon.Wait(), 0) << daemon.Log();
    }
  }
}

// Caches smaller than a layer (issue 28): with misses on the host, 0 and 3
// slots (tiny mixtral has 8 experts per layer) serve the in-memory tokens;
// with 0 slots every expert ran on the host.
TEST_F(DaemonE2eTest, CachesSmallerThanALayerGiveTheInMemoryTokens) {
  const std::vector<int32_t> want = Reference();
  for (const auto& [experts, mode] :
       std::vector<std::pair<int, std::string>>{{0, "host"}, {3, "auto"}, {3, "host"}}) {
    SCOPED_TRACE(mode + " " + std::to_string(experts));
    WorkerProcess daemon;
    StartDaemon(daemon, experts, "moe-infinity", "cached-small.log",
                {"--miss-mode", mode, "--link-gbps", "1", "--host-gbps", "10"});
    StartWorker();
    std::vector<v1::GenerateResponse> rs;
    grpc::Status s = Call(&rs);
    ASSERT_TRUE(s.ok()) << s.error_message() << "\n" << worker_.Log();
    std::vector<int32_t> tokens;
    for (const auto& r : rs) tokens.push_back(r.token_id());
    EXPECT_EQ(tokens, want);
    nlohmann::json m;
    ASSERT_NO_FATAL_FAILURE(CacheStats(&m));
    EXPECT_EQ(m["capacity_experts"], experts);
    EXPECT_GT(m["host_runs"].get<int64_t>(), 0) << m.dump();
    if (experts == 0) {
      EXPECT_EQ(m["hits"].get<int64_t>(), 0);
      EXPECT_EQ(m["host_runs"].get<int64_t>(), m["misses"].get<int64_t>());
    }
    worker_.Signal(SIGTERM);
    EXPECT_EQ(worker_.Wait(), 0) << worker_.Log();
    daemon.Signal(SIGTERM);
    EXPECT_EQ(daemon.Wait(), 0) << daemon.Log();
  }
}

// The trained model (96 experts) through a daemon of 0 slots, every expert
// run on the host, gives the tokens of a daemon that holds all 96.
TEST_F(DaemonE2eTest, ZeroSlotsServeTheTrainedModelAsAFullCache) {
  const std::string kjv = std::string(MOE_SOURCE_DIR) + "/deploy/models/kjv-moe";
  std::vector<std::vector<int32_t>> got;
  for (const std::string experts : {"0", "96"}) {
    SCOPED_TRACE(experts);
    WorkerProcess daemon;
    ASSERT_TRUE(daemon.Spawn({"--model", "kjv=" + kjv, "--listen", cache_sock_,
                              "--metrics-addr", "", "--cache-experts", experts,
                              "--miss-mode", "host"},
                             dir_.Sub("cached-kjv-" + experts + ".log"), CachedBinary()));
    ASSERT_TRUE(daemon.WaitServing(cache_sock_)) << daemon.Log();
    ASSERT_TRUE(worker_.Spawn({"--model", kjv, "--listen", worker_sock_, "--device", "cpu",
                               "--metrics-addr", "", "--cache", cache_sock_,
                               "--cache-model", "kjv"},
                              dir_.Sub("worker-kjv.log")));
    ASSERT_TRUE(worker_.WaitServing(worker_sock_)) << worker_.Log();
    stub_ = v1::Inference::NewStub(rpc::MakeChannel(*rpc::ParseListenAddress(worker_sock_)));
    std::vector<v1::GenerateResponse> rs;
    grpc::Status s = Call(&rs, 24);
    ASSERT_TRUE(s.ok()) << s.error_message() << "\n" << worker_.Log();
    got.emplace_back();
    for (const auto& r : rs) got.back().push_back(r.token_id());
    EXPECT_EQ(got.back().size(), 24u);
    worker_.Signal(SIGTERM);
    EXPECT_EQ(worker_.Wait(), 0) << worker_.Log();
    daemon.Signal(SIGTERM);
    EXPECT_EQ(daemon.Wait(), 0) << daemon.Log();
  }
  EXPECT_EQ(got[0], got[1]);
}

// A batched worker's acquires carry each request's own row over the shm
// channel: with moe-infinity every one of the concurrent requests ends with
// an activation matrix of its own in the daemon's EAMC (were the batch's
// acquires the leading request's alone, the others would learn nothing),
// and every request still gets the in-memory tokens.
TEST_F(DaemonE2eTest, BatchedRequestsEachTeachTheDaemonTheirOwnMatrix) {
  const std::vector<int32_t> want = Reference();
  WorkerProcess daemon;
  StartDaemon(daemon, 16, "moe-infinity", "cached-members.log");
  StartWorker({"--max-batch", "4", "--prefill-chunk", "2"});
  constexpr int kRequests = 4;
  ASSERT_NO_FATAL_FAILURE(ExpectConcurrentTokens(kRequests, want));
  nlohmann::json m;
  ASSERT_NO_FATAL_FAILURE(CacheStats(&m));
  EXPECT_EQ(m["eamc_entries"].get<int>(), kRequests) << m.dump();
  worker_.Signal(SIGTERM);
  EXPECT_EQ(worker_.Wait(), 0) << worker_.Log();
  daemon.Signal(SIGTERM);
  EXPECT_EQ(daemon.Wait(), 0) << daemon.Log();
}

// A batched worker leasing each layer in parts (--lease-part 1 and 2)
// through a cache of one layer's experts, fetch and auto: every concurrent
// request gets the in-memory tokens.
TEST_F(DaemonE2eTest, LayersLeasedInPartsGiveTheInMemoryTokens) {
  const std::vector<int32_t> want = Reference();
  for (const auto& [part, mode] :
       std::vector<std::pair<std::string, std::string>>{{"1", "fetch"}, {"2", "auto"}}) {
    SCOPED_TRACE(part + " " + mode);
    WorkerProcess daemon;
    StartDaemon(daemon, 8, "moe-infinity", "cached-parts-" + part + ".log",
                {"--miss-mode", mode, "--link-gbps", "1"});
    StartWorker({"--max-batch", "4", "--prefill-chunk", "2", "--lease-part", part});
    ASSERT_NO_FATAL_FAILURE(ExpectConcurrentTokens(4, want));
    nlohmann::json m;
    ASSERT_NO_FATAL_FAILURE(CacheStats(&m));
    EXPECT_GT(m["misses"].get<int64_t>(), 0) << m.dump();
    worker_.Signal(SIGTERM);
    EXPECT_EQ(worker_.Wait(), 0) << worker_.Log();
    daemon.Signal(SIGTERM);
    EXPECT_EQ(daemon.Wait(), 0) << daemon.Log();
  }
}

// Pre-gating two layers ahead, hints posted to the daemon (prefetch on, half
// the experts cached): the worker streams the in-memory tokens.
TEST_F(DaemonE2eTest, PregateDistanceTwoKeepsTheTokens) {
  WorkerProcess daemon;
  StartDaemon(daemon, 16, "lru", "cached-pregate.log");
  StartWorker({"--pregate-hints", "on", "--pregate-distance", "2"});
  std::vector<v1::GenerateResponse> rs;
  grpc::Status s = Call(&rs, 16);
  ASSERT_TRUE(s.ok()) << s.error_message() << "\n" << worker_.Log();
  std::vector<int32_t> tokens;
  for (const auto& r : rs) tokens.push_back(r.token_id());
  EXPECT_EQ(tokens, Reference(16));
}

TEST_F(DaemonE2eTest, DaemonGoneIsUnavailableAndWorkerReattaches) {
  auto daemon = std::make_unique<WorkerProcess>();
  StartDaemon(*daemon, 32, "lru", "cached1.log");
  StartWorker();
  std::vector<v1::GenerateResponse> rs;
  ASSERT_TRUE(Call(&rs, 4).ok()) << worker_.Log();
  daemon->Signal(SIGKILL);
  daemon->Wait();
  rs.clear();
  grpc::Status gone = Call(&rs, 4);
  EXPECT_EQ(gone.error_code(), grpc::StatusCode::UNAVAILABLE)
      << gone.error_message();
  daemon = std::make_unique<WorkerProcess>();
  StartDaemon(*daemon, 32, "lru", "cached2.log");
  rs.clear();
  grpc::Status back = Call(&rs, 12);
  ASSERT_TRUE(back.ok()) << back.error_message() << "\n" << worker_.Log();
  std::vector<int32_t> tokens;
  for (const auto& r : rs) tokens.push_back(r.token_id());
  EXPECT_EQ(tokens, Reference());
}

}  // namespace
}  // namespace moe::worker

namespace moe::worker {
namespace {

// Design invariant 4 end to end: for every policy and a minimum, a middle
// and an everything-fits capacity, the worker streams the in-memory tokens.
class PolicyCapacityTest : public DaemonE2eTest,
                           public ::testing::WithParamInterface<const char*> {};

TEST_P(PolicyCapacityTest, TokensDoNotDependOnTheCache) {
  const std::vector<int32_t> expected = Reference(16);
  for (int experts : {8, 20, 32}) {  // tiny mixtral: 4 layers x 8 experts
    SCOPED_TRACE(::testing::Message() << GetParam() << " capacity " << experts);
    WorkerProcess daemon;
    StartDaemon(daemon, experts, GetParam(),
                std::string("cached-") + std::to_string(experts) + ".log");
    ASSERT_NO_FATAL_FAILURE(ExpectTokensThenStop(daemon, expected));
  }
}

INSTANTIATE_TEST_SUITE_P(AllPolicies, PolicyCapacityTest,
                         ::testing::Values("lru", "lfu", "lru-layer",
                                           "minvisit", "expertflow",
                                           "moe-infinity",
                                           "moe-infinity-paper"));

}  // namespace
}  // namespace moe::worker

namespace moe::worker {
namespace {

// Design invariant 4 per expert format: with moe-cached --expert-format the
// worker learns the format from Attach and streams, for a minimum and an
// everything-fits capacity, exactly the tokens of the in-process run over
// the same quantized experts.
class FormatCapacityTest : public DaemonE2eTest,
                           public ::testing::WithParamInterface<const char*> {};

TEST_P(FormatCapacityTest, TokensDoNotDependOnTheCache) {
  const DType format = *ParseExpertFormat(GetParam());
  const std::vector<int32_t> expected = Reference(16, format);
  for (int experts : {8, 32}) {
    SCOPED_TRACE(::testing::Message() << GetParam() << " capacity " << experts);
    WorkerProcess daemon;
    StartDaemon(daemon, experts, "lru",
                std::string("cached-") + GetParam() + std::to_string(experts) + ".log",
                {"--expert-format", GetParam()});
    ASSERT_NO_FATAL_FAILURE(ExpectTokensThenStop(daemon, expected));
    // The tiny checkpoint is bf16: only q8/q4 are converted (with progress);
    // q4 and q8 to Q4x16 and Q8x16 where this CPU prefers the interleaved
    // layouts.
    const DType held =
        CpuPrefersRows16(DetectSimdLevel()) ? InterleavedOf(format) : format;
    const std::string converted = "(to " + ExpertFormatName(held) + ")";
    EXPECT_EQ(daemon.Log().find(converted) != std::string::npos, format != DType::kBF16)
        << daemon.Log();
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, FormatCapacityTest, ::testing::Values("bf16", "q8", "q4"));

// A worker without moe-cached (--cache none, as `moectl serve` starts one
// without a GPU) holds the experts in its --expert-format: the tokens of
// the in-process run over the same quantized experts, and its start line
// says the format. With --cache unix:PATH the flag is moe-cached's: refused.
TEST_F(DaemonE2eTest, WorkerAloneHoldsItsExpertFormat) {
  StartWorker({"--cache", "none", "--expert-format", "q4"});
  std::vector<v1::GenerateResponse> rs;
  grpc::Status s = Call(&rs, 16);
  ASSERT_TRUE(s.ok()) << s.error_message() << "\n" << worker_.Log();
  std::vector<int32_t> tokens;
  for (const auto& r : rs) tokens.push_back(r.token_id());
  EXPECT_EQ(tokens, Reference(16, DType::kQ4));
  EXPECT_NE(worker_.Log().find("experts q4 (stored bf16)"), std::string::npos) << worker_.Log();
  worker_.Signal(SIGTERM);
  EXPECT_EQ(worker_.Wait(), 0);

  WorkerProcess refused;
  ASSERT_TRUE(refused.Spawn({"--model", dir_.Sub("tiny"), "--listen", worker_sock_, "--backend",
                             "cpu", "--metrics-addr", "", "--cache", cache_sock_,
                             "--expert-format", "q4"},
                            dir_.Sub("refused.log")));
  EXPECT_NE(refused.Wait(), 0);
  EXPECT_NE(refused.Log().find("--expert-format is for a worker that holds the experts"),
            std::string::npos)
      << refused.Log();
}

// An FP8 block-scaled checkpoint (DeepSeek-V3 / Qwen3 FP8 layout) served by
// moe-cached (experts converted at load: q8 with no flag, or bf16) and
// moe-worker (dense weights dequantized to bf16): the greedy tokens are the
// in-process run's over the same experts and the float64 reference's, which
// dequantizes the checkpoint exactly; the logprobs are within 2e-2 of it
// with bf16 experts, and within the q8 format's own bound (as in
// forward_reference_test) with q8.
TEST_F(DaemonE2eTest, Fp8CheckpointMatchesTheFloat64Reference) {
  MakeModelOptions o = TinyPreset(ModelFamily::kMixtral);
  o.seed = 11;
  o.fp8 = Fp8BlockScheme{32, 32};
  ASSERT_TRUE(MakeModel(o, dir_.Sub("tiny")).ok());
  const std::string cmd = std::string("/usr/bin/python3 ") + MOE_SOURCE_DIR +
                          "/tests/reference/moe_reference.py --model " + dir_.Sub("tiny") +
                          " --prompt-ids 11,22,33,44,55 --max-new-tokens 12";
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  ASSERT_EQ(::pclose(p), 0) << out;
  auto ref = nlohmann::json::parse(out, nullptr, false);
  ASSERT_FALSE(ref.is_discarded()) << out;

  for (const char* format : {"", "bf16"}) {
    SCOPED_TRACE(::testing::Message() << "--expert-format '" << format << "'");
    const bool q8 = *format == '\0';
    const std::vector<int32_t> in_process =
        Reference(12, q8 ? DType::kQ8 : DType::kBF16);
    WorkerProcess daemon;
    std::vector<std::string> extra;
    if (!q8) extra = {"--expert-format", format};
    StartDaemon(daemon, 8, "lru", std::string("cached-fp8-") + format + ".log", extra);
    // q8 as Q8x16 where this CPU prefers the interleaved layout.
    const std::string held =
        !q8 ? "bf16"
            : ExpertFormatName(CpuPrefersRows16(DetectSimdLevel()) ? DType::kQ8R16 : DType::kQ8);
    EXPECT_NE(daemon.Log().find("(to " + held + ")"), std::string::npos) << daemon.Log();
    StartWorker();
    std::vector<v1::GenerateResponse> rs;
    grpc::Status s = Call(&rs, 12);
    ASSERT_TRUE(s.ok()) << s.error_message() << "\n" << worker_.Log();
    ASSERT_EQ(rs.size(), 12u);
    std::vector<int32_t> tokens;
    for (const auto& r : rs) tokens.push_back(r.token_id());
    EXPECT_EQ(tokens, in_process);
    double max_diff = 0;
    for (size_t i = 0; i < rs.size(); ++i) {
      EXPECT_EQ(rs[i].token_id(), ref["tokens"][i].get<int>()) << "token " << i;
      max_diff = std::max(max_diff, std::abs(rs[i].logprob() - ref["logprobs"][i].get<double>()));
    }
    std::printf("fp8 checkpoint, experts as %s, through moe-cached + moe-worker: "
                "max |logprob - reference| = %.3g\n",
                q8 ? "q8" : "bf16", max_diff);
    EXPECT_LE(max_diff, q8 ? 8e-2 : 2e-2);
    worker_.Signal(SIGTERM);
    EXPECT_EQ(worker_.Wait(), 0);
    daemon.Signal(SIGTERM);
    EXPECT_EQ(daemon.Wait(), 0) << daemon.Log();
  }
}

}  // namespace
}  // namespace moe::worker
