// moe-cached as a real process: the binary is started on a tiny model in a
// temp dir and driven through CacheClient (and, for the SIGKILL case, a
// separate client process).
#include <signal.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/model_desc.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/cache/synth_trace.h"
#include "tests/cache/fake_cuda_module.h"
#include "services/client/cache_client.h"
#include "services/moe_cached/fd_broker.h"
#include "moe/v1/expert_cache.grpc.pb.h"
#include "services/channel/shm_channel.h"
#include "services/rpc/rpc_util.h"
#include "tests/common/test_util.h"
#include "tests/moe_cached/daemon_process.h"
#include "tests/moe_cached/tiny_daemon_test.h"

namespace moe::cached {
namespace {

using ::moe::client::CacheClient;
using ::moe::client::CacheClientOptions;
using ::moe::client::SlotTensor;
using ::moe::client::Transport;
using ::moe::testing::DaemonConfig;
using ::moe::testing::DaemonProcess;
using ::moe::testing::TempDir;
using ::testing::HasSubstr;
using ::moe::AcquireResult;

class MoeCachedTest : public testing::TinyDaemonTest {
 protected:
  // The daemon's gRPC service, without the client library.
  std::unique_ptr<moe::v1::ExpertCache::Stub> RawStub() {
    return moe::v1::ExpertCache::NewStub(
        rpc::MakeChannel(*rpc::ParseListenAddress(daemon_.address())));
  }

  // Attaches to model "tiny" as this process; false (a test failure) if
  // refused.
  bool RawAttach(moe::v1::ExpertCache::Stub& stub, moe::v1::AttachResponse* aresp) {
    moe::v1::AttachRequest areq;
    areq.set_model("tiny");
    areq.set_pid(::getpid());
    grpc::ClientContext ctx;
    const grpc::Status s = stub.Attach(&ctx, areq, aresp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return s.ok();
  }

  int ExitCode(absl::Duration timeout = absl::Seconds(20)) {
    auto st = daemon_.process().Wait(timeout);
    if (!st.ok()) return -1000;
    return WIFEXITED(*st) ? WEXITSTATUS(*st) : -WTERMSIG(*st);
  }

};

// Follows a synthetic trace; every leased slot matches the checkpoint when
// leased and still matches after later layers evicted other experts while
// it stayed leased (invariants 1 and 2).
void FollowTrace(CacheClient& client, Transport transport,
                 const std::function<void(int, const SlotLease&)>& check, uint64_t* demanded) {
  trace::SynthOptions so;
  so.num_layers = client.num_layers();
  so.num_experts = client.num_experts();
  so.top_k = client.top_k();
  so.requests = 3;
  so.prefill_tokens = 6;
  so.decode_tokens = 8;
  so.seed = 5;
  auto tr = trace::GenerateSyntheticTrace(so);
  ASSERT_TRUE(tr.ok()) << tr.status();
  for (size_t i = 0; i < tr->requests.size(); ++i) {
    const trace::TraceRequest& req = tr->requests[i];
    const uint64_t request = i + 1;
    ASSERT_TRUE(client.BeginRequest(request, transport).ok());
    // Iterations: all prefill tokens together, then one per decode token.
    for (const trace::Iteration& it : trace::SplitIterations(req, client.num_layers())) {
      const bool is_prefill = it.phase == trace::Phase::kPrefill;
      std::vector<SlotLease> held;  // layer 0's leases, kept over the iteration
      for (int layer = 0; layer < client.num_layers(); ++layer) {
        const std::vector<ExpertDemand>& demands = it.layers[layer];
        *demanded += demands.size();
        auto r = client.Acquire(
            {.layer = layer, .demands = demands, .prefill = is_prefill},
            transport);
        ASSERT_TRUE(r.ok()) << r.status();
        ASSERT_EQ(r->leases.size(), demands.size());
        EXPECT_EQ(r->usage.hits + r->usage.misses, static_cast<int>(demands.size()));
        for (size_t i = 0; i < demands.size(); ++i) {
          EXPECT_EQ(r->leases[i].key.expert, demands[i].expert);
          check(layer, r->leases[i]);
        }
        if (layer == 0 && !is_prefill) {
          held = r->leases;
        } else {
          ASSERT_TRUE(client.Release(r->leases, transport).ok());
        }
      }
      for (const SlotLease& l : held) check(0, l);
      ASSERT_TRUE(client.Release(held, transport).ok());
    }
    ASSERT_TRUE(client.EndRequest(request, transport).ok());
  }
}

class TraceTest : public MoeCachedTest, public ::testing::WithParamInterface<Transport> {};

TEST_P(TraceTest, SlotsMatchCheckpointByteForByte) {
  StartDaemon({"--cache-experts", "12", "--policy", "lru", "--prefetch", "on"});
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(client->num_layers(), 4);
  EXPECT_EQ(client->num_experts(), 8);
  EXPECT_EQ(client->slot_count(), 12u);
  EXPECT_TRUE(client->shm_enabled());
  uint64_t demanded = 0;
  FollowTrace(
      *client, GetParam(),
      [&](int layer, const SlotLease& l) { ExpectSlotMatches(*client, layer, l); }, &demanded);
  auto stats = client->GetStats("tiny");
  ASSERT_TRUE(stats.ok()) << stats.status();
  ASSERT_EQ(stats->models_size(), 1);
  const auto& m = stats->models(0);
  EXPECT_EQ(m.hits() + m.misses(), demanded);
  EXPECT_GT(m.misses(), 0u);
  EXPECT_GT(m.hits(), 0u);
  EXPECT_EQ(m.leases_held(), 0u);
  EXPECT_EQ(m.sessions(), 1u);
  EXPECT_LE(m.resident_experts(), 12u);
  EXPECT_EQ(m.capacity_experts(), 12u);
}

INSTANTIATE_TEST_SUITE_P(Transports, TraceTest,
                         ::testing::Values(Transport::kShm, Transport::kGrpc));

TEST_F(MoeCachedTest, BadInputFromTheWireIsInvalidArgument) {
  StartDaemon({"--cache-experts", "8"});
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  for (Transport t : {Transport::kShm, Transport::kGrpc}) {
    using V = std::vector<ExpertDemand>;
    std::vector<std::pair<int, V>> bad = {
        {-1, V{{0, 1}}}, {4, V{{0, 1}}},          {0, V{{8, 1}}}, {0, V{{-1, 1}}},
        {0, V{{1, 1}, {1, 2}}}, {0, V{{0, 0}}}, {0, V{}}};
    for (const auto& [layer, demands] : bad) {
      auto r = client->Acquire({.layer = layer, .demands = demands}, t);
      EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument)
          << "layer " << layer << ": " << r.status();
    }
    auto hint = client->Acquire(
        {.layer = 0, .demands = V{{0, 1}}, .hints = {{9, 0, 0.5f}}}, t);
    EXPECT_EQ(hint.status().code(), absl::StatusCode::kInvalidArgument);
  }
  // A lease that was never granted.
  SlotLease bogus{{0, 0}, 1000, 1};
  EXPECT_EQ(client->Release({bogus}, Transport::kGrpc).code(),
            absl::StatusCode::kInvalidArgument);
  // Still serving, and good calls work on both transports.
  for (Transport t : {Transport::kShm, Transport::kGrpc}) {
    auto r = client->Acquire(
        {.layer = 2, .demands = std::vector<ExpertDemand>{{3, 2}}}, t);
    ASSERT_TRUE(r.ok()) << r.status();
    ExpectSlotMatches(*client, 2, r->leases[0]);
    EXPECT_TRUE(client->Release(r->leases, t).ok());
  }
  CacheClientOptions o;
  o.address = daemon_.address();
  o.model = "no-such-model";
  auto other = CacheClient::Connect(o);
  EXPECT_EQ(other.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(other.status().message(), HasSubstr("tiny"));
}

// A batched acquire names its members (each request's own row): good ones
// are served on both transports, with as many members as a session may have
// requests (over shm that is more member messages than the ring has slots);
// bad ones are refused with the rule they break, and the session serves on.
TEST_F(MoeCachedTest, BatchedAcquireMembersAreCheckedOnBothTransports) {
  StartDaemon({"--cache-experts", "16"});
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  for (uint64_t q = 1; q <= static_cast<uint64_t>(kMaxRequestsPerSession); ++q) {
    ASSERT_TRUE(client->BeginRequest(q).ok());
  }
  using V = std::vector<ExpertDemand>;
  using M = std::vector<MemberDemands>;
  const V uni = {{1, 3}, {4, 1}};
  const M good = {{1, false, {{1, 2}}}, {2, true, {{1, 1}, {4, 1}}}};
  M all;
  for (uint64_t q = 1; q <= static_cast<uint64_t>(kMaxRequestsPerSession); ++q) {
    all.push_back({q, false, {{2, 1}}});
  }
  for (Transport t : {Transport::kShm, Transport::kGrpc}) {
    SCOPED_TRACE(t == Transport::kShm ? "shm" : "grpc");
    client->SetCurrentRequest(1);
    auto r = client->Acquire(
        {.layer = 1, .demands = uni, .prefill = true, .members = good}, t);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->leases.size(), 2u);
    EXPECT_TRUE(client->Release(r->leases, t).ok());
    auto many = client->Acquire(
        {.layer = 2, .demands = V{{2, kMaxRequestsPerSession}}, .members = all},
        t);
    ASSERT_TRUE(many.ok()) << many.status();
    EXPECT_TRUE(client->Release(many->leases, t).ok());
    struct Case {
      M members;
      absl::StatusCode code;
      const char* message;
    };
    const Case bad[] = {
        {M{{1, false, {{1, 3}}}}, absl::StatusCode::kInvalidArgument, "expert 4: the members'"},
        {M{{1, false, {{1, 3}, {4, 1}, {5, 1}}}}, absl::StatusCode::kInvalidArgument,
         "outside the acquire"},
        {M{{2, false, uni}}, absl::StatusCode::kInvalidArgument, "is not one of its members"},
        {M{{1, false, {{1, 2}}}, {99, false, {{1, 1}, {4, 1}}}},
         absl::StatusCode::kFailedPrecondition, "request 99 was not begun"},
    };
    for (const Case& c : bad) {
      auto b = client->Acquire(
          {.layer = 1, .demands = uni, .members = c.members}, t);
      EXPECT_EQ(b.status().code(), c.code) << b.status();
      EXPECT_THAT(b.status().message(), HasSubstr(c.message));
    }
    // Nothing of a refused batch is left over for the next acquire.
    auto after = client->Acquire({.layer = 3, .demands = V{{0, 1}}}, t);
    ASSERT_TRUE(after.ok()) << after.status();
    EXPECT_TRUE(client->Release(after->leases, t).ok());
  }
}

TEST_F(MoeCachedTest, KilledWorkersLeasesAreReclaimed) {
  // Exactly one layer's experts: while the holder leases all 8 slots, no
  // other expert can be loaded.
  StartDaemon({"--cache-experts", "8"});
  moe::testing::ChildProcess holder;
  ASSERT_NO_FATAL_FAILURE(SpawnLeaseHolder(holder, 0, 8));

  auto client = Connect();
  ASSERT_NE(client, nullptr);
  std::vector<ExpertDemand> layer1;
  for (int e = 0; e < 8; ++e) layer1.push_back({e, 1});
  auto blocked = client->Acquire({.layer = 1, .demands = layer1});
  EXPECT_EQ(blocked.status().code(), absl::StatusCode::kResourceExhausted) << blocked.status();
  auto stats = client->GetStats("tiny");
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->models(0).sessions(), 2u);
  EXPECT_EQ(stats->models(0).leases_held(), 8u);

  ASSERT_TRUE(holder.Signal(SIGKILL).ok());
  ASSERT_TRUE(holder.Wait(absl::Seconds(10)).ok());
  // The daemon notices within its peer poll interval; wait for it.
  uint32_t sessions = 2;
  moe::testing::WaitFor(absl::Seconds(10), [&] {
    auto s = client->GetStats("tiny");
    if (s.ok()) sessions = s->models(0).sessions();
    return sessions == 1;
  });
  ASSERT_EQ(sessions, 1u);
  auto r = client->Acquire({.layer = 1, .demands = layer1});
  ASSERT_TRUE(r.ok()) << r.status();
  for (const SlotLease& l : r->leases) ExpectSlotMatches(*client, 1, l);
  EXPECT_THAT(daemon_.stderr_text(), HasSubstr("reclaimed 8 leases"));
}

TEST_F(MoeCachedTest, TooSmallCapacityIsRefused) {
  for (std::vector<std::string> flags :
       {std::vector<std::string>{"--cache-experts", "7"},
        std::vector<std::string>{"--cache-fraction", "0.1"}}) {
    DaemonProcess d(dir_);
    DaemonConfig c;
    c.models = {"tiny=" + model_dir_};
    c.extra_args = flags;
    absl::Status s = d.Start(c);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    auto st = d.process().Wait(absl::Seconds(10));
    ASSERT_TRUE(st.ok());
    EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) != 0);
    EXPECT_THAT(d.stderr_text(), HasSubstr("fewer than one layer's 8 experts")) << flags[0];
    // What would allow it is named: misses run on the host.
    EXPECT_THAT(d.stderr_text(), HasSubstr("--miss-mode host or auto")) << flags[0];
  }
}

// A cache smaller than a layer (issue 28): allowed down to 0 slots when
// misses may run on the host, and then it serves only workers that run
// them: an attach without host execution is refused (naming the slots and
// what to change); a host worker gets every expert that finds no slot as a
// host answer, and at most 3 leases.
TEST_F(MoeCachedTest, CacheSmallerThanALayerServesOnlyHostWorkers) {
  StartDaemon({"--cache-experts", "3", "--miss-mode", "auto", "--link-gbps", "1",
               "--host-gbps", "10"});
  moe::v1::AttachRequest areq;
  areq.set_model("tiny");
  areq.set_pid(::getpid());
  moe::v1::AttachResponse aresp;
  grpc::ClientContext ctx;
  const grpc::Status refused = RawStub()->Attach(&ctx, areq, &aresp);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(refused.error_message(),
              HasSubstr("has 3 expert slots, fewer than one layer's 8"));
  EXPECT_THAT(refused.error_message(), HasSubstr("did not offer host execution"));

  CacheClientOptions o;
  o.address = daemon_.address();
  o.model = "tiny";
  o.worker_id = "host-worker";
  o.host_execution = true;
  o.timeout = absl::Seconds(20);
  auto client = CacheClient::Connect(o);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ((*client)->slot_count(), 3u);
  std::vector<ExpertDemand> all;
  for (int e = 0; e < 8; ++e) all.push_back({e, 1});
  for (int layer = 0; layer < 4; ++layer) {
    auto r = (*client)->Acquire({.layer = layer, .demands = all});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_LE(r->leases.size(), 3u);
    EXPECT_EQ(r->leases.size() + r->host.size(), 8u);
    for (const SlotLease& l : r->leases) ExpectSlotMatches(**client, layer, l);
    ASSERT_TRUE((*client)->Release(r->leases).ok());
  }
}

TEST_F(MoeCachedTest, ZeroSlotsAnswerEveryExpertOnTheHost) {
  StartDaemon({"--cache-experts", "0", "--miss-mode", "host"});
  CacheClientOptions o;
  o.address = daemon_.address();
  o.model = "tiny";
  o.worker_id = "host-worker";
  o.host_execution = true;
  o.timeout = absl::Seconds(20);
  auto client = CacheClient::Connect(o);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ((*client)->slot_count(), 0u);
  auto r = (*client)->Acquire(
      {.layer = 2, .demands = std::vector<ExpertDemand>{{1, 1}, {6, 3}}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->leases.empty());
  ASSERT_EQ(r->host.size(), 2u);
  EXPECT_EQ(r->usage.misses, 2);
}

TEST_F(MoeCachedTest, MetricsSeenThroughARealScrape) {
  StartDaemon({"--cache-experts", "16", "--prefetch", "off"}, /*metrics=*/true);
  auto port = daemon_.MetricsPort();
  ASSERT_TRUE(port.ok()) << port.status();
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  std::vector<ExpertDemand> two = {{0, 3}, {5, 1}};
  for (int round = 0; round < 2; ++round) {  // two misses, then two hits
    auto r = client->Acquire({.layer = 0, .demands = two});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->usage.misses, round == 0 ? 2 : 0);
    EXPECT_EQ(r->usage.hits, round == 0 ? 0 : 2);
    ASSERT_TRUE(client->Release(r->leases).ok());
  }
  // GetStats syncs the counters (a release over shm is posted, not awaited).
  ASSERT_TRUE(client->GetStats().ok());
  auto body = moe::testing::HttpGet(*port, "/metrics");
  ASSERT_TRUE(body.ok()) << body.status();
  const std::string l = "{model=\"tiny\"}";
  EXPECT_EQ(moe::testing::MetricValue(*body, "moe_cache_hits_total" + l).value_or(-1), 2);
  EXPECT_EQ(moe::testing::MetricValue(*body, "moe_cache_misses_total" + l).value_or(-1), 2);
  EXPECT_EQ(moe::testing::MetricValue(*body, "moe_cache_capacity_experts" + l).value_or(-1), 16);
  EXPECT_EQ(moe::testing::MetricValue(*body, "moe_cache_resident_experts" + l).value_or(-1), 2);
  EXPECT_EQ(moe::testing::MetricValue(*body, "moe_cache_bytes_copied_total" + l).value_or(-1),
            2.0 * client->slot_bytes());
  EXPECT_EQ(moe::testing::MetricValue(*body, "moe_cache_acquire_seconds_count" + l).value_or(-1),
            2);
  for (const char* name : {"moe_cache_prefetch_issued_total", "moe_cache_prefetch_used_total",
                           "moe_cache_prefetch_wasted_total", "moe_cache_stall_seconds_total",
                           "moe_eamc_entries"}) {
    EXPECT_TRUE(moe::testing::MetricValue(*body, name + l).ok()) << name;
  }
  // Prefetch is off: the stride gauge says so.
  EXPECT_EQ(moe::testing::MetricValue(*body, "moe_prefetch_stride" + l).value_or(-1), 0);
  // Per-layer series: everything happened in layer 0; layer 1 exists, empty.
  for (int layer : {0, 1}) {
    const std::string ll = absl::StrCat("{layer=\"", layer, "\",model=\"tiny\"}");
    EXPECT_EQ(moe::testing::MetricValue(*body, "moe_cache_layer_hits_total" + ll).value_or(-1),
              layer == 0 ? 2 : 0)
        << ll;
    EXPECT_EQ(moe::testing::MetricValue(*body, "moe_cache_layer_misses_total" + ll).value_or(-1),
              layer == 0 ? 2 : 0)
        << ll;
    EXPECT_EQ(
        moe::testing::MetricValue(*body, "moe_cache_layer_resident_experts" + ll).value_or(-1),
        layer == 0 ? 2 : 0)
        << ll;
  }
  // Beside the cache's series (issue 18.6): the build and the process.
  EXPECT_THAT(*body, ::testing::HasSubstr("moe_build_info{program=\"moe-cached\",revision=\""));
  EXPECT_GT(moe::testing::MetricValue(*body, "process_resident_memory_bytes").value_or(-1), 1e6);
  EXPECT_GT(moe::testing::MetricValue(*body, "process_open_fds").value_or(-1), 3);
}

// A worker that runs experts on its CPU reports what they took; the daemon's
// miss cost model moves its host figures towards that (an EWMA, weight 0.2)
// and counts the host-answered share as host seconds. Reports are checked
// (the client refuses a bad one; a session without host execution may not
// report).
TEST_F(MoeCachedTest, HostRunReportsMoveTheCostModelsHostFigures) {
  StartDaemon({"--cache-experts", "16", "--miss-mode", "auto", "--link-gbps", "1",
               "--host-gbps", "10", "--host-gflops", "100"},
              /*metrics=*/true);
  auto port = daemon_.MetricsPort();
  ASSERT_TRUE(port.ok()) << port.status();
  CacheClientOptions o;
  o.address = daemon_.address();
  o.model = "tiny";
  o.worker_id = "cpu-worker";
  o.host_execution = true;
  o.timeout = absl::Seconds(20);
  auto client = CacheClient::Connect(o);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->host_execution());
  const std::string l = "{model=\"tiny\"}";
  auto metric = [&](const std::string& name) {
    auto body = moe::testing::HttpGet(*port, "/metrics");
    return body.ok() ? moe::testing::MetricValue(*body, name + l).value_or(-1) : -1;
  };
  ASSERT_TRUE((*client)->GetStats().ok());
  EXPECT_NEAR(metric("moe_cache_host_read_gbps"), 10, 1e-9);
  // One expert on one token (read-bound here) at 1 GB/s: slot_bytes ns.
  const int64_t ns = static_cast<int64_t>((*client)->slot_bytes());
  ASSERT_TRUE((*client)->ReportHostRuns({4, 2, 4, 4 * ns}).ok());
  double gbps = -1;
  EXPECT_TRUE(moe::testing::WaitFor(absl::Seconds(10), [&] {
    if (!(*client)->GetStats().ok()) return false;
    gbps = metric("moe_cache_host_read_gbps");
    return gbps != 10;
  }));
  EXPECT_NEAR(gbps, 0.8 * 10 + 0.2 * 1, 1e-6);
  EXPECT_NEAR(metric("moe_cache_host_seconds_total"), 2 * ns * 1e-9, 1e-12);
  EXPECT_NEAR(metric("moe_cache_host_gflops"), 100, 1e-9);  // not compute-bound: kept

  EXPECT_EQ((*client)->ReportHostRuns({0, 0, 1, 1}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*client)->ReportHostRuns({2, 3, 2, 1}).code(), absl::StatusCode::kInvalidArgument);
  auto plain = Connect();
  ASSERT_NE(plain, nullptr);
  EXPECT_EQ(plain->ReportHostRuns({1, 0, 1, 1}).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(MoeCachedTest, SigtermDrainsPersistsAndExitsZero) {
  const std::string state = dir_.Sub("state");
  StartDaemon({"--cache-experts", "8", "--state-dir", state, "--policy", "moe-infinity"});
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->BeginRequest(1).ok());
  for (int layer = 0; layer < 4; ++layer) {
    auto r = client->Acquire(
        {.layer = layer,
         .demands = std::vector<ExpertDemand>{{layer, 1}, {7, 2}}});
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(client->Release(r->leases).ok());
  }
  ASSERT_TRUE(client->EndRequest(1).ok());
  ASSERT_TRUE(std::filesystem::exists(daemon_.socket_path()));
  ASSERT_TRUE(daemon_.process().Signal(SIGTERM).ok());
  EXPECT_EQ(ExitCode(), 0) << daemon_.stderr_text();
  EXPECT_FALSE(std::filesystem::exists(daemon_.socket_path()));
  EXPECT_TRUE(std::filesystem::exists(state + "/tiny.eamc")) << daemon_.stderr_text();
  // The client's channel was closed: UNAVAILABLE, not a hang.
  auto after = client->Acquire(
      {.layer = 0, .demands = std::vector<ExpertDemand>{{0, 1}}});
  EXPECT_EQ(after.status().code(), absl::StatusCode::kUnavailable) << after.status();

  // A restart loads the persisted state.
  DaemonProcess again(dir_);
  DaemonConfig c;
  c.models = {model_dir_};
  c.extra_args = {"--cache-experts", "8", "--state-dir", state, "--policy", "moe-infinity"};
  ASSERT_TRUE(again.Start(c).ok()) << again.stderr_text();
  EXPECT_THAT(again.stderr_text(), HasSubstr("EAMC entries from"));
  ASSERT_TRUE(again.process().Signal(SIGTERM).ok());
  auto st = again.process().Wait(absl::Seconds(20));
  ASSERT_TRUE(st.ok());
  EXPECT_TRUE(WIFEXITED(*st) && WEXITSTATUS(*st) == 0);
}

TEST_F(MoeCachedTest, DaemonDeathIsUnavailableNotAHang) {
  StartDaemon({"--cache-experts", "8"});
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(
      client
          ->Acquire({.layer = 0, .demands = std::vector<ExpertDemand>{{1, 1}}})
          .ok());
  ASSERT_TRUE(daemon_.process().Signal(SIGKILL).ok());
  ASSERT_TRUE(daemon_.process().Wait(absl::Seconds(10)).ok());
  absl::Time start = absl::Now();
  auto r = client->Acquire(
      {.layer = 1, .demands = std::vector<ExpertDemand>{{1, 1}}});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}


// A hostile or buggy worker writing the channel directly: malformed messages
// get error replies, a corrupt ring ends the session (leases reclaimed), and
// the shared-memory objects are private to the user (mode 0600).
// Security item 5: a worker maps only the arena of the model it attached to.
// Requests from the wire: 0 is the session's default; any other id must be
// begun first, at most kMaxRequestsPerSession at once, and ended once. The
// checks hold over both transports.
TEST_F(MoeCachedTest, RequestsMustBeBegunAndAreBounded) {
  StartDaemon({"--cache-experts", "8"});
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  for (Transport t : {Transport::kShm, Transport::kGrpc}) {
    SCOPED_TRACE(t == Transport::kShm ? "shm" : "grpc");
    EXPECT_EQ(client->BeginRequest(0, t).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(client->EndRequest(42, t).code(), absl::StatusCode::kFailedPrecondition);
    for (uint64_t r = 1; r <= static_cast<uint64_t>(kMaxRequestsPerSession); ++r) {
      ASSERT_TRUE(client->BeginRequest(r, t).ok()) << r;
    }
    absl::Status over = client->BeginRequest(kMaxRequestsPerSession + 1, t);
    EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted) << over;
    EXPECT_TRUE(client->BeginRequest(3, t).ok());  // a live one restarts
    ASSERT_TRUE(client->EndRequest(3, t).ok());
    EXPECT_TRUE(client->BeginRequest(kMaxRequestsPerSession + 1, t).ok());  // room again
    auto r = client->Acquire(
        {.layer = 1, .demands = std::vector<ExpertDemand>{{2, 1}}}, t);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(client->Release(r->leases, t).ok());
    for (uint64_t id = 1; id <= static_cast<uint64_t>(kMaxRequestsPerSession) + 1; ++id) {
      if (id != 3) {
        ASSERT_TRUE(client->EndRequest(id, t).ok()) << id;
      }
    }
  }
  // An acquire for a request that was never begun.
  auto stub = RawStub();
  moe::v1::AttachResponse aresp;
  ASSERT_TRUE(RawAttach(*stub, &aresp));
  moe::v1::AcquireRequest acq;
  acq.set_session_id(aresp.session_id());
  acq.set_layer(0);
  acq.set_request(99);
  auto* d = acq.add_experts();
  d->set_expert(1);
  d->set_tokens(1);
  moe::v1::AcquireResponse resp;
  grpc::ClientContext ctx;
  grpc::Status s = stub->Acquire(&ctx, acq, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("request 99 was not begun"));
}

// Arenas and channels are unnamed memfds (nothing in /dev/shm to list or
// guess); the descriptors go to the pid named in Attach, once; the daemon is
// not dumpable, so its /proc/PID/fd is closed to other non-root processes.
// SetCurrentRequest (a batched worker's per-acquire owner) sends its id
// with the next acquire, over both transports: one ended is refused.
TEST_F(MoeCachedTest, SetCurrentRequestPointsAcquiresAtThatRequest) {
  StartDaemon({"--cache-experts", "8"});
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  const std::vector<ExpertDemand> one = {{1, 1}};
  for (Transport t : {Transport::kShm, Transport::kGrpc}) {
    SCOPED_TRACE(t == Transport::kShm ? "shm" : "grpc");
    ASSERT_TRUE(client->BeginRequest(1, t).ok());
    ASSERT_TRUE(client->BeginRequest(2, t).ok());
    client->SetCurrentRequest(1);
    auto r = client->Acquire({.layer = 0, .demands = one}, t);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(client->Release(r->leases, t).ok());
    ASSERT_TRUE(client->EndRequest(1, t).ok());
    client->SetCurrentRequest(1);
    auto ended = client->Acquire({.layer = 0, .demands = one}, t);
    EXPECT_EQ(ended.status().code(), absl::StatusCode::kFailedPrecondition) << ended.status();
    client->SetCurrentRequest(2);
    r = client->Acquire({.layer = 0, .demands = one}, t);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(client->Release(r->leases, t).ok());
    ASSERT_TRUE(client->EndRequest(2, t).ok());
  }
}

TEST_F(MoeCachedTest, WorkerCannotMapAnArenaItDidNotAttachTo) {
  DaemonConfig c;
  c.models = {"a=" + model_dir_, "b=" + model_dir_};
  ASSERT_TRUE(daemon_.Start(c).ok()) << daemon_.stderr_text();
  const int daemon_pid = daemon_.process().pid();
  auto stub = moe::v1::ExpertCache::NewStub(
      rpc::MakeChannel(*rpc::ParseListenAddress(daemon_.address())));
  auto attach = [&](const std::string& model, int pid) {
    moe::v1::AttachRequest areq;
    areq.set_model(model);
    areq.set_pid(pid);
    moe::v1::AttachResponse aresp;
    grpc::ClientContext ctx;
    EXPECT_TRUE(stub->Attach(&ctx, areq, &aresp).ok()) << model;
    return aresp;
  };
  // The lease holder (a child) attaches to "a"; its grant is for its pid.
  moe::testing::ChildProcess holder;  // any live process of ours will do
  ASSERT_TRUE(holder.Spawn("/bin/sleep", {"60"}, dir_.Sub("sleep.err")).ok());
  moe::v1::AttachResponse for_child = attach("a", holder.pid());
  ASSERT_FALSE(for_child.fd_token().empty());
  auto stolen = cached::FetchFds(for_child.fd_socket(), for_child.fd_token());
  EXPECT_EQ(stolen.status().code(), absl::StatusCode::kPermissionDenied) << stolen.status();
  EXPECT_THAT(stolen.status().message(), HasSubstr("another process"));
  // Our own attach to "b" maps b's arena, which differs from a's.
  moe::v1::AttachResponse mine = attach("b", ::getpid());
  auto fds = cached::FetchFds(mine.fd_socket(), mine.fd_token());
  ASSERT_TRUE(fds.ok()) << fds.status();
  struct stat arena_b;
  ASSERT_EQ(::fstat((*fds)[0].get(), &arena_b), 0);
  EXPECT_EQ(static_cast<uint64_t>(arena_b.st_size), mine.arena_bytes());
  // No arena or channel of this daemon has a name another process could open.
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string name = e.path().filename().string();
    EXPECT_EQ(name.find(absl::StrCat("-", daemon_pid, "-")), std::string::npos)
        << "daemon object visible in /dev/shm: " << name;
  }
  if (::geteuid() != 0) {  // root may read any /proc/PID/fd
    EXPECT_EQ(::opendir(absl::StrCat("/proc/", daemon_pid, "/fd").c_str()), nullptr);
  }
}

// A client that computes on CUDA needs the daemon's CUDA arena: a host
// arena is refused with what to change (no device call is made on this path,
// so the CUDA device memory over the fake table stands in for a GPU).
TEST_F(MoeCachedTest, DeviceClientAgainstAHostArenaIsToldWhatToChange) {
  StartDaemon({"--cache-experts", "8"});
  CacheClientOptions o;
  o.address = daemon_.address();
  o.model = "tiny";
  o.worker_id = "device-worker";
  o.cuda = moe::testing::FakeCuda::Memory();
  auto c = CacheClient::Connect(o);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition) << c.status();
  EXPECT_THAT(c.status().message(), HasSubstr("--device cuda"));
  // The refused client left no session behind.
  auto ok = Connect();
  ASSERT_NE(ok, nullptr);
  auto stats = ok->GetStats("tiny");
  ASSERT_TRUE(stats.ok()) << stats.status();
  ASSERT_EQ(stats->models_size(), 1);
  EXPECT_EQ(stats->models(0).sessions(), 1u);
}

TEST_F(MoeCachedTest, ChannelGarbageIsRejectedAndEndsTheSession) {
  StartDaemon({"--cache-experts", "8"});
  auto stub = RawStub();
  moe::v1::AttachResponse aresp;
  ASSERT_TRUE(RawAttach(*stub, &aresp));
  // Arena and channel are unnamed memfds collected from the broker socket
  // (mode 0600) with a one-shot token.
  EXPECT_TRUE(aresp.shm_name().empty());
  EXPECT_TRUE(aresp.channel_name().empty());
  struct stat st;
  ASSERT_EQ(::stat(aresp.fd_socket().c_str(), &st), 0) << aresp.fd_socket();
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto fds = cached::FetchFds(aresp.fd_socket(), aresp.fd_token());
  ASSERT_TRUE(fds.ok()) << fds.status();
  ASSERT_EQ(fds->size(), 2u);
  EXPECT_EQ(cached::FetchFds(aresp.fd_socket(), aresp.fd_token()).status().code(),
            absl::StatusCode::kPermissionDenied);  // used up
  const size_t bytes = channel::ChannelBytes();
  void* mem = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, (*fds)[1].get(), 0);
  ASSERT_NE(mem, MAP_FAILED);
  channel::ChannelClient ch(mem);
  auto req = std::make_unique<channel::RequestMsg>();
  auto reply = std::make_unique<channel::ResponseMsg>();
  std::memset(req.get(), 0, sizeof(*req));
  req->type = static_cast<uint32_t>(channel::MsgType::kAcquire);
  req->layer = 9;
  req->count = 1;
  EXPECT_EQ(ch.Call(*req, reply.get(), absl::Seconds(10)).code(),
            absl::StatusCode::kInvalidArgument);
  req->layer = 0;
  req->count = 2;
  req->demands[0] = {3, 1};
  req->demands[1] = {3, 1};  // duplicate
  EXPECT_EQ(ch.Call(*req, reply.get(), absl::Seconds(10)).code(),
            absl::StatusCode::kInvalidArgument);
  req->type = 77;  // unknown
  EXPECT_EQ(ch.Call(*req, reply.get(), absl::Seconds(10)).code(),
            absl::StatusCode::kInvalidArgument);
  req->type = static_cast<uint32_t>(channel::MsgType::kAcquire);
  req->count = 1;
  ASSERT_TRUE(ch.Call(*req, reply.get(), absl::Seconds(10)).ok());  // holds one lease
  // Scribble over the cache lines after the header (the request ring's
  // head, tail and wait flags) with values far apart.
  auto* words = static_cast<uint32_t*>(mem);
  for (uint32_t i = 16; i < 64; ++i) words[i] = 0x9e3779b9u * i;
  auto stats = [&]() {
    moe::v1::GetStatsRequest r;
    moe::v1::GetStatsResponse out;
    grpc::ClientContext ctx;
    EXPECT_TRUE(stub->GetStats(&ctx, r, &out).ok());
    return out.models(0);
  };
  moe::testing::WaitFor(absl::Seconds(10), [&] { return stats().sessions() == 0; });
  EXPECT_EQ(stats().sessions(), 0u);
  EXPECT_THAT(daemon_.stderr_text(), HasSubstr("reclaimed 1 leases"));
  ::munmap(mem, bytes);
  // The daemon still serves others.
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  EXPECT_TRUE(
      client
          ->Acquire({.layer = 0, .demands = std::vector<ExpertDemand>{{3, 1}}})
          .ok());
}

// --max-sessions: attaches past the limit are RESOURCE_EXHAUSTED naming it;
// a detached session and a dead worker's session free their places.
TEST_F(MoeCachedTest, SessionLimitRefusesAttachUntilAPlaceFrees) {
  StartDaemon({"--cache-experts", "8", "--max-sessions", "2"});
  auto stub = moe::v1::ExpertCache::NewStub(
      rpc::MakeChannel(*rpc::ParseListenAddress(daemon_.address())));
  auto attach = [&](int pid, moe::v1::AttachResponse* resp) {
    moe::v1::AttachRequest req;
    req.set_model("tiny");
    req.set_worker_id(absl::StrCat("w", pid));
    req.set_pid(pid);
    grpc::ClientContext ctx;
    return stub->Attach(&ctx, req, resp);
  };
  auto live_sessions = [&]() -> uint32_t {
    moe::v1::GetStatsRequest r;
    moe::v1::GetStatsResponse out;
    grpc::ClientContext ctx;
    EXPECT_TRUE(stub->GetStats(&ctx, r, &out).ok());
    return out.models_size() > 0 ? out.models(0).sessions() : 0;
  };
  // Two live workers (any live process of ours will do) fill the limit.
  moe::testing::ChildProcess w1, w2;
  ASSERT_TRUE(w1.Spawn("/bin/sleep", {"60"}, dir_.Sub("w1.err")).ok());
  ASSERT_TRUE(w2.Spawn("/bin/sleep", {"60"}, dir_.Sub("w2.err")).ok());
  moe::v1::AttachResponse a1, a2, mine;
  ASSERT_TRUE(attach(w1.pid(), &a1).ok());
  ASSERT_TRUE(attach(w2.pid(), &a2).ok());
  grpc::Status refused = attach(::getpid(), &mine);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << refused.error_message();
  EXPECT_THAT(refused.error_message(), HasSubstr("--max-sessions 2"));
  EXPECT_EQ(live_sessions(), 2u);

  // A detach frees a place at once.
  {
    moe::v1::DetachRequest d;
    d.set_session_id(a1.session_id());
    moe::v1::DetachResponse out;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->Detach(&ctx, d, &out).ok());
  }
  ASSERT_TRUE(attach(::getpid(), &mine).ok());
  EXPECT_EQ(attach(::getpid(), &mine).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);

  // A dead worker's session frees its place once the daemon notices.
  ASSERT_TRUE(w2.Signal(SIGKILL).ok());
  ASSERT_TRUE(w2.Wait(absl::Seconds(10)).ok());
  moe::testing::WaitFor(absl::Seconds(10), [&] { return live_sessions() == 1; });
  ASSERT_EQ(live_sessions(), 1u);
  moe::v1::AttachResponse again;
  grpc::Status s = attach(w1.pid(), &again);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(live_sessions(), 2u);
}

// SIGTERM to exit, with /metrics on and a client idling on its gRPC
// connection: once no call is in flight, neither the idle connection (which
// held gRPC's shutdown for --drain-seconds) nor civetweb's 2 s accept poll
// (restarted by the scrape just before) delays the exit. Both took ~2 s.
TEST_F(MoeCachedTest, SigtermWithMetricsAndAnIdleClientExitsPromptly) {
  StartDaemon({"--cache-experts", "8", "--drain-seconds", "10"}, /*metrics=*/true);
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  auto r = client->Acquire(
      {.layer = 0, .demands = std::vector<ExpertDemand>{{1, 1}}});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(client->Release(r->leases).ok());
  auto stats = client->GetStats("tiny");  // over gRPC: the connection is up
  ASSERT_TRUE(stats.ok()) << stats.status();
  auto port = daemon_.MetricsPort();
  ASSERT_TRUE(port.ok()) << port.status();
  ASSERT_TRUE(moe::testing::HttpGet(*port, "/metrics").ok());
  const absl::Time start = absl::Now();
  ASSERT_TRUE(daemon_.process().Signal(SIGTERM).ok());
  EXPECT_EQ(ExitCode(), 0) << daemon_.stderr_text();
  const absl::Duration exit_time = absl::Now() - start;
  // Measured 55-212 ms plain, 127-280 ms under ASan, beside a busy loop per
  // core on a loaded 2-core machine; the bound separates that from the ~2 s
  // of the bugs named above.
  std::printf("exit %.1f ms after SIGTERM\n", absl::ToDoubleMilliseconds(exit_time));
  EXPECT_LT(exit_time, absl::Milliseconds(1500)) << daemon_.stderr_text();
}

}  // namespace
}  // namespace moe::cached
