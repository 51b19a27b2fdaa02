// 8 concurrent clients x 20 Generate requests each against the real
// moe-worker attached to the real moe-cached (a cache smaller than the
// model): no request fails, every output equals the in-process reference
// for its prompt, and the daemon holds no leases afterwards. Then two
// workers on one daemon: per-request usage adds up to the daemon's totals.
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "moe/v1/expert_cache.grpc.pb.h"
#include "tests/moe_worker/worker_process.h"
#include "tests/moe_worker/worker_test_util.h"

namespace moe::worker {
namespace {

using testing::CachedBinary;
using testing::WorkerProcess;

constexpr int kClients = 8;
constexpr int kRequestsPerClient = 20;
constexpr int kNewTokens = 8;

// Client c's prompt; every client has its own.
std::vector<int32_t> PromptFor(int c) {
  return {11 + c, 22, 33 + 2 * c, 44, 55 + 3 * c};
}

struct ClientResult {
  int ok = 0;
  std::vector<std::string> errors;
  std::vector<std::vector<int32_t>> outputs;
};

// The daemon's statistics of model "tiny"; false (with a test failure) if
// they cannot be had.
bool TinyStats(const std::string& cache_sock, v1::ModelStats* out) {
  auto caddr = rpc::ParseListenAddress(cache_sock);
  EXPECT_TRUE(caddr.ok());
  if (!caddr.ok()) return false;
  auto cache_stub = v1::ExpertCache::NewStub(rpc::MakeChannel(*caddr));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::GetStatsRequest req;
  req.set_model("tiny");
  v1::GetStatsResponse stats;
  grpc::Status s = cache_stub->GetStats(&ctx, req, &stats);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(stats.models_size(), 1);
  if (!s.ok() || stats.models_size() != 1) return false;
  *out = stats.models(0);
  return true;
}

void RunClient(v1::Inference::Stub* stub, int c, ClientResult* out) {
  for (int i = 0; i < kRequestsPerClient; ++i) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(60));
    v1::GenerateRequest r;
    for (int32_t id : PromptFor(c)) r.add_prompt_token_ids(id);
    r.set_max_new_tokens(kNewTokens);
    r.set_ignore_eos(true);  // greedy: temperature left at its default 0
    auto reader = stub->Generate(&ctx, r);
    v1::GenerateResponse resp;
    std::vector<int32_t> tokens;
    while (reader->Read(&resp)) tokens.push_back(resp.token_id());
    grpc::Status s = reader->Finish();
    if (s.ok()) {
      ++out->ok;
    } else {
      out->errors.push_back(std::to_string(s.error_code()) + ": " +
                            s.error_message());
    }
    out->outputs.push_back(std::move(tokens));
  }
}

TEST(ConcurrencyTest, EightClientsTwentyRequestsEachThroughTheDaemon) {
  moe::testing::TempDir dir;
  const std::string model_dir = dir.Sub("tiny");
  ASSERT_TRUE(moe::testing::MakeTinyModel(model_dir).ok());
  const std::string cache_sock = "unix:" + dir.Sub("c.sock");
  const std::string worker_sock = "unix:" + dir.Sub("w.sock");

  // Tiny mixtral: 4 layers x 8 experts = 32; the cache holds 12.
  WorkerProcess daemon;
  ASSERT_TRUE(daemon.Spawn({"--model", "tiny=" + model_dir, "--listen",
                            cache_sock, "--metrics-addr", "",
                            "--cache-experts", "12", "--policy", "lru",
                            "--link-gbps", "0", "--state-dir",
                            dir.Sub("state")},
                           dir.Sub("cached.log"), CachedBinary()));
  ASSERT_TRUE(daemon.WaitServing(cache_sock)) << daemon.Log();
  WorkerProcess worker;
  ASSERT_TRUE(worker.Spawn({"--model", model_dir, "--listen", worker_sock,
                            "--cache", cache_sock, "--cache-model", "tiny",
                            "--backend", "cpu", "--metrics-addr", "",
                            "--max-queue", "16"},
                           dir.Sub("worker.log")));
  ASSERT_TRUE(worker.WaitServing(worker_sock)) << worker.Log();

  // In-process references, once per distinct prompt.
  std::map<int, std::vector<int32_t>> expected;
  for (int c = 0; c < kClients; ++c) {
    expected[c] = testing::ReferenceTokensFromDir(model_dir, PromptFor(c), kNewTokens);
    ASSERT_EQ(expected[c].size(), static_cast<size_t>(kNewTokens));
  }
  // Distinct prompts must not all collapse to one output, or the check
  // below could not tell clients apart.
  bool some_differ = false;
  for (int c = 1; c < kClients; ++c) some_differ |= expected[c] != expected[0];
  ASSERT_TRUE(some_differ);

  auto addr = rpc::ParseListenAddress(worker_sock);
  ASSERT_TRUE(addr.ok());
  auto channel = rpc::MakeChannel(*addr);
  std::vector<ClientResult> results(kClients);
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    // One stub per client over one shared channel, as gRPC clients do.
    threads.emplace_back([&, c] {
      auto stub = v1::Inference::NewStub(channel);
      RunClient(stub.get(), c, &results[c]);
    });
  }
  for (auto& t : threads) t.join();

  for (int c = 0; c < kClients; ++c) {
    SCOPED_TRACE(::testing::Message() << "client " << c);
    EXPECT_EQ(results[c].ok, kRequestsPerClient);
    for (const std::string& e : results[c].errors) ADD_FAILURE() << e;
    ASSERT_EQ(results[c].outputs.size(),
              static_cast<size_t>(kRequestsPerClient));
    for (int i = 0; i < kRequestsPerClient; ++i) {
      EXPECT_EQ(results[c].outputs[i], expected[c]) << "request " << i;
    }
  }

  // Every lease the worker took has been given back.
  v1::ModelStats m;
  ASSERT_TRUE(TinyStats(cache_sock, &m));
  EXPECT_EQ(m.leases_held(), 0u);
  EXPECT_EQ(m.sessions(), 1u);
  EXPECT_GT(m.misses(), 0u);  // the cache was smaller than the model
  EXPECT_EQ(m.capacity_experts(), 12u);

  worker.Signal(SIGTERM);
  EXPECT_EQ(worker.Wait(), 0) << worker.Log();
  daemon.Signal(SIGTERM);
  EXPECT_EQ(daemon.Wait(), 0) << daemon.Log();
}

// Several workers on one daemon: each acquire's hits and misses are its own
// (the cache counts them per ticket), so the usage of every request, summed
// over both workers' concurrent requests, equals the daemon's counters
// exactly. Computing usage by diffing the daemon's global counters around a
// call (as before the cache knew owners) over-counts as soon as two workers
// acquire at the same time, and this test catches that.
TEST(ConcurrencyTest, TwoWorkersUsageAddsUpToTheDaemonsCounters) {
  moe::testing::TempDir dir;
  const std::string model_dir = dir.Sub("tiny");
  ASSERT_TRUE(moe::testing::MakeTinyModel(model_dir).ok());
  const std::string cache_sock = "unix:" + dir.Sub("c.sock");
  WorkerProcess daemon;
  ASSERT_TRUE(daemon.Spawn({"--model", "tiny=" + model_dir, "--listen", cache_sock,
                            "--metrics-addr", "", "--cache-experts", "16", "--policy",
                            "moe-infinity", "--link-gbps", "2", "--state-dir", dir.Sub("state")},
                           dir.Sub("cached.log"), CachedBinary()));
  ASSERT_TRUE(daemon.WaitServing(cache_sock)) << daemon.Log();
  // 16 of 32 slots: a prefill may lease a whole layer (8), and both workers
  // may prefill at once; a smaller cache makes one of them RESOURCE_EXHAUSTED.
  constexpr int kWorkers = 2;
  constexpr int kClientsPerWorker = 2;
  constexpr int kRequests = 6;
  std::vector<std::unique_ptr<WorkerProcess>> workers;
  std::vector<std::string> socks;
  for (int w = 0; w < kWorkers; ++w) {
    socks.push_back("unix:" + dir.Sub("w" + std::to_string(w) + ".sock"));
    workers.push_back(std::make_unique<WorkerProcess>());
    ASSERT_TRUE(workers[w]->Spawn({"--model", model_dir, "--listen", socks[w], "--cache",
                                   cache_sock, "--cache-model", "tiny", "--backend", "cpu",
                                   "--metrics-addr", "", "--max-queue", "16"},
                                  dir.Sub("worker" + std::to_string(w) + ".log")));
    ASSERT_TRUE(workers[w]->WaitServing(socks[w])) << workers[w]->Log();
  }

  struct Totals {
    int64_t hits = 0, misses = 0;
    int ok = 0;
    std::vector<std::string> errors;
  };
  std::vector<Totals> totals(kWorkers * kClientsPerWorker);
  std::vector<std::thread> threads;
  for (int w = 0; w < kWorkers; ++w) {
    auto addr = rpc::ParseListenAddress(socks[w]);
    ASSERT_TRUE(addr.ok());
    auto channel = rpc::MakeChannel(*addr);
    for (int c = 0; c < kClientsPerWorker; ++c) {
      Totals* out = &totals[w * kClientsPerWorker + c];
      threads.emplace_back([channel, w, c, out] {
        auto stub = v1::Inference::NewStub(channel);
        for (int i = 0; i < kRequests; ++i) {
          grpc::ClientContext ctx;
          ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
          v1::GenerateRequest r;
          for (int32_t id : PromptFor(w * kClientsPerWorker + c + i)) r.add_prompt_token_ids(id);
          r.set_max_new_tokens(kNewTokens);
          r.set_ignore_eos(true);
          auto reader = stub->Generate(&ctx, r);
          v1::GenerateResponse resp;
          v1::Usage usage;
          while (reader->Read(&resp)) {
            if (resp.has_usage()) usage = resp.usage();
          }
          grpc::Status s = reader->Finish();
          if (!s.ok()) {
            out->errors.push_back(s.error_message());
            continue;
          }
          ++out->ok;
          out->hits += usage.expert_hits();
          out->misses += usage.expert_misses();
        }
      });
    }
  }
  for (auto& t : threads) t.join();
  Totals sum;
  for (const Totals& t : totals) {
    for (const std::string& e : t.errors) ADD_FAILURE() << e;
    sum.ok += t.ok;
    sum.hits += t.hits;
    sum.misses += t.misses;
  }
  ASSERT_EQ(sum.ok, kWorkers * kClientsPerWorker * kRequests);

  v1::ModelStats m;
  ASSERT_TRUE(TinyStats(cache_sock, &m));
  std::printf("requests: hits %lld misses %lld; daemon: hits %llu misses %llu\n",
              static_cast<long long>(sum.hits), static_cast<long long>(sum.misses),
              static_cast<unsigned long long>(m.hits()),
              static_cast<unsigned long long>(m.misses()));
  EXPECT_EQ(m.sessions(), static_cast<uint32_t>(kWorkers));
  EXPECT_GT(m.misses(), 0u);
  EXPECT_GT(m.hits(), 0u);
  EXPECT_EQ(static_cast<uint64_t>(sum.hits), m.hits());
  EXPECT_EQ(static_cast<uint64_t>(sum.misses), m.misses());
  EXPECT_EQ(m.leases_held(), 0u);

  for (auto& w : workers) {
    w->Signal(SIGTERM);
    EXPECT_EQ(w->Wait(), 0) << w->Log();
  }
  daemon.Signal(SIGTERM);
  EXPECT_EQ(daemon.Wait(), 0) << daemon.Log();
}

}  // namespace
}  // namespace moe::worker
