// Acquire round trip on a hit, over the shared-memory channel and over gRPC,
// against a real moe-cached process (tiny model, every expert resident).
// Prints p50/p99 side by side and their ratio. Goal: p50 <= 5 us over shm.
//
//   moe_cached_bench [--iterations N] [--experts K]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/threads.h"
#include "services/client/cache_client.h"
#include "tests/moe_cached/daemon_process.h"

namespace {

using moe::client::CacheClient;
using moe::ExpertDemand;
using moe::client::Transport;

struct Percentiles {
  double p50_us = 0, p99_us = 0;
};

Percentiles Measure(CacheClient& client, Transport t, int iterations, int experts) {
  std::vector<ExpertDemand> demands;
  for (int e = 0; e < experts; ++e) demands.push_back({e, 1});
  std::vector<double> us;
  us.reserve(iterations);
  for (int i = -iterations / 10; i < iterations; ++i) {  // first 10%: warm-up
    absl::Time start = absl::Now();
    auto r = client.Acquire({.layer = i & 3, .demands = demands}, t);
    double elapsed = absl::ToDoubleMicroseconds(absl::Now() - start);
    if (!r.ok() || (r->usage.misses != 0 && i >= 0)) {
      std::fprintf(stderr, "acquire failed or missed: %s\n", r.status().ToString().c_str());
      std::exit(1);
    }
    if (!client.Release(r->leases, t).ok()) std::exit(1);
    if (i >= 0) us.push_back(elapsed);
  }
  std::sort(us.begin(), us.end());
  return {us[us.size() / 2], us[us.size() * 99 / 100]};
}

}  // namespace

int main(int argc, char** argv) {
  moe::SkipLockOrderChecks();  // before any lock: they all pay for the checks
  int iterations = 20000, experts = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--iterations") == 0) iterations = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--experts") == 0) experts = std::atoi(argv[i + 1]);
  }
  moe::testing::TempDir dir;
  if (!moe::testing::MakeTinyModel(dir.Sub("tiny")).ok()) return 1;
  moe::testing::DaemonProcess daemon(dir);
  moe::testing::DaemonConfig config;
  config.models = {dir.Sub("tiny")};
  config.extra_args = {"--cache-experts", "32", "--policy", "lru", "--prefetch", "off"};
  if (absl::Status s = daemon.Start(config); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  moe::client::CacheClientOptions o;
  o.address = daemon.address();
  o.model = "tiny";
  o.worker_id = "bench";
  auto client = CacheClient::Connect(o);
  if (!client.ok()) return 1;
  // Load every expert the loop touches (layers 0-3), so all timed calls hit.
  for (int layer = 0; layer < 4; ++layer) {
    std::vector<ExpertDemand> d;
    for (int e = 0; e < experts; ++e) d.push_back({e, 1});
    auto r = (*client)->Acquire({.layer = layer, .demands = d});
    if (!r.ok() || !(*client)->Release(r->leases).ok()) return 1;
  }
  Percentiles shm = Measure(**client, Transport::kShm, iterations, experts);
  Percentiles grpc = Measure(**client, Transport::kGrpc, iterations / 4, experts);
  std::printf("acquire round trip on a hit (%d experts), moe-cached over a unix socket\n",
              experts);
  std::printf("%-10s %10s %10s %12s\n", "transport", "p50_us", "p99_us", "iterations");
  std::printf("%-10s %10.2f %10.2f %12d\n", "shm", shm.p50_us, shm.p99_us, iterations);
  std::printf("%-10s %10.2f %10.2f %12d\n", "grpc", grpc.p50_us, grpc.p99_us, iterations / 4);
  std::printf("grpc/shm p50 ratio %.1fx, p99 ratio %.1fx; goal shm p50 <= 5 us: %s\n",
              grpc.p50_us / shm.p50_us, grpc.p99_us / shm.p99_us,
              shm.p50_us <= 5.0 ? "met" : "NOT met");
  return 0;
}
