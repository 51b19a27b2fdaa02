// The system under test of the service fuzz tests: one moe-cached and one
// moe-worker attached to it (--cache), as child processes on the tiny model,
// plus the known-good checks that must keep passing whatever was sent before:
// both processes alive, a greedy Generate that equals the in-process tokens,
// and an Acquire/Release round on a separate cache session (shm and gRPC).
#ifndef MOECACHE_TESTS_FUZZ_SERVICE_FUZZ_ENV_H_
#define MOECACHE_TESTS_FUZZ_SERVICE_FUZZ_ENV_H_

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "moe/v1/expert_cache.grpc.pb.h"
#include "moe/v1/inference.grpc.pb.h"
#include "services/client/cache_client.h"
#include "services/rpc/rpc_util.h"
#include "tests/moe_cached/daemon_process.h"
#include "tests/moe_worker/worker_process.h"
#include "tests/moe_worker/worker_test_util.h"

namespace moe::fuzz {

inline bool LongRun() {
  const char* e = std::getenv("MOE_LONG_TESTS");
  return e != nullptr && std::string(e) == "1";
}
// `n` inputs by default, ten times as many with MOE_LONG_TESTS=1.
inline int Scaled(int n) { return LongRun() ? 10 * n : n; }

// What the fuzzers know about the running system.
struct World {
  uint64_t session_id = 0;  // the fuzzer's own cache session
  int pid = 0;
  std::string model = "tiny";
  int num_layers = 0;
  int num_experts = 0;
  uint32_t slot_count = 0;
  int64_t vocab = 0;
  int64_t context = 0;
};

class ServiceFuzzTest : public ::testing::Test {
 protected:
  // 16 slots: the worker (at most one layer's 8 experts at a time) and the
  // fuzzer (at most 8, released at once) never starve each other.
  static constexpr int kCacheExperts = 16;
  static constexpr int kGoodTokens = 6;

  void SetUp() override {
    model_dir_ = dir_.Sub("tiny");
    ASSERT_TRUE(moe::testing::MakeTinyModel(model_dir_).ok());
    moe::testing::DaemonConfig c;
    c.models = {model_dir_};
    c.extra_args = {"--cache-experts", std::to_string(kCacheExperts)};
    absl::Status started = daemon_.Start(c);
    ASSERT_TRUE(started.ok()) << started;
    const std::string worker_addr = "unix:" + dir_.Sub("w.sock");
    ASSERT_TRUE(worker_.Spawn({"--model", model_dir_, "--listen", worker_addr, "--backend",
                               "cpu", "--metrics-addr", "", "--cache", daemon_.address()},
                              dir_.Sub("worker.log")));
    ASSERT_TRUE(worker_.WaitServing(worker_addr)) << worker_.Log();
    daemon_channel_ = rpc::MakeChannel(*rpc::ParseListenAddress(daemon_.address()));
    worker_channel_ = rpc::MakeChannel(*rpc::ParseListenAddress(worker_addr));
    cache_stub_ = moe::v1::ExpertCache::NewStub(daemon_channel_);
    infer_stub_ = moe::v1::Inference::NewStub(worker_channel_);

    auto backend = CreateBackend("cpu");
    ASSERT_TRUE(backend.ok());
    auto model = MoeModel::Load(model_dir_, backend->get());
    ASSERT_TRUE(model.ok()) << model.status();
    GenerateOptions o;
    o.prompt = GoodPrompt();
    o.max_new_tokens = kGoodTokens;
    o.stop_at_eos = false;
    expected_tokens_ = worker::testing::ReferenceTokens(**model, o);
    ASSERT_EQ(expected_tokens_.size(), static_cast<size_t>(kGoodTokens));
    world_.vocab = (*model)->config().vocab_size;
    world_.context = (*model)->max_context();

    client::CacheClientOptions co;
    co.address = daemon_.address();
    co.model = world_.model;
    co.worker_id = "known-good";
    co.timeout = absl::Seconds(20);
    auto connected = client::CacheClient::Connect(co);
    ASSERT_TRUE(connected.ok()) << connected.status();
    good_client_ = std::move(*connected);
    world_.num_layers = good_client_->num_layers();
    world_.num_experts = good_client_->num_experts();
    world_.slot_count = good_client_->slot_count();
    world_.pid = static_cast<int>(::getpid());
    AttachFuzzSession();
  }

  static std::vector<int32_t> GoodPrompt() { return {11, 22, 33, 44, 55}; }

  // A fresh session of this process (no shared-memory mapping: the channel
  // is only used by the ring test, by hand).
  absl::StatusOr<moe::v1::AttachResponse> Attach() {
    moe::v1::AttachRequest req;
    req.set_model(world_.model);
    req.set_worker_id("fuzz");
    req.set_pid(world_.pid);
    moe::v1::AttachResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    grpc::Status s = cache_stub_->Attach(&ctx, req, &resp);
    if (!s.ok()) return rpc::FromGrpcStatus(s);
    return resp;
  }

  // Detaches `id`; NOT_FOUND (already ended) is fine.
  void Detach(uint64_t id) {
    moe::v1::DetachRequest req;
    req.set_session_id(id);
    moe::v1::DetachResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    grpc::Status s = cache_stub_->Detach(&ctx, req, &resp);
    EXPECT_TRUE(s.ok() || s.error_code() == grpc::StatusCode::NOT_FOUND)
        << "detach: " << s.error_code() << " " << s.error_message();
  }

  void AttachFuzzSession() {
    auto a = Attach();
    ASSERT_TRUE(a.ok()) << a.status();
    world_.session_id = a->session_id();
  }

  // Both processes alive; a greedy Generate gives the expected tokens; an
  // Acquire/Release round works on another session over both transports.
  void ExpectStillServing(const std::string& after) {
    ASSERT_FALSE(daemon_.process().Exited())
        << "moe-cached died after " << after << "\n" << daemon_.stderr_text();
    ASSERT_FALSE(worker_.Exited()) << "moe-worker died after " << after << "\n" << worker_.Log();
    moe::v1::GenerateRequest r;
    for (int32_t id : GoodPrompt()) r.add_prompt_token_ids(id);
    r.set_max_new_tokens(kGoodTokens);
    r.set_ignore_eos(true);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    auto reader = infer_stub_->Generate(&ctx, r);
    std::vector<int32_t> tokens;
    moe::v1::GenerateResponse resp;
    while (reader->Read(&resp)) tokens.push_back(resp.token_id());
    grpc::Status s = reader->Finish();
    ASSERT_TRUE(s.ok()) << "known-good Generate after " << after << ": " << s.error_code() << " "
                        << s.error_message();
    ASSERT_EQ(tokens, expected_tokens_) << "after " << after;
    for (auto t : {client::Transport::kShm, client::Transport::kGrpc}) {
      std::vector<ExpertDemand> want = {{4, 1}, {6, 2}};
      auto a = good_client_->Acquire(
          {.layer = world_.num_layers - 1, .demands = want}, t);
      ASSERT_TRUE(a.ok()) << "known-good Acquire after " << after << ": " << a.status();
      ASSERT_EQ(a->leases.size(), 2u);
      ASSERT_TRUE(good_client_->Release(a->leases, t).ok()) << "after " << after;
    }
    ++known_good_checks_;
  }

  moe::testing::TempDir dir_;
  std::string model_dir_;
  moe::testing::DaemonProcess daemon_{dir_};
  worker::testing::WorkerProcess worker_;
  std::shared_ptr<grpc::Channel> daemon_channel_, worker_channel_;
  std::unique_ptr<moe::v1::ExpertCache::Stub> cache_stub_;
  std::unique_ptr<moe::v1::Inference::Stub> infer_stub_;
  std::unique_ptr<client::CacheClient> good_client_;
  std::vector<int32_t> expected_tokens_;
  World world_;
  int known_good_checks_ = 0;
};

}  // namespace moe::fuzz

#endif  // MOECACHE_TESTS_FUZZ_SERVICE_FUZZ_ENV_H_
