// Test helper process: attaches to moe-cached, leases every expert of one
// layer, prints "HELD <n>" and then waits to be killed (the SIGKILL test of
// design invariant 3).
//   moe_cached_lease_holder ADDRESS MODEL LAYER
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "services/client/cache_client.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s ADDRESS MODEL LAYER\n", argv[0]);
    return 2;
  }
  moe::client::CacheClientOptions o;
  o.address = argv[1];
  o.model = argv[2];
  o.worker_id = "lease-holder";
  auto client = moe::client::CacheClient::Connect(o);
  if (!client.ok()) {
    std::fprintf(stderr, "connect: %s\n", client.status().ToString().c_str());
    return 1;
  }
  std::vector<moe::ExpertDemand> all;
  for (int e = 0; e < (*client)->num_experts(); ++e) all.push_back({e, 1});
  auto r = (*client)->Acquire({.layer = std::atoi(argv[3]), .demands = all});
  if (!r.ok()) {
    std::fprintf(stderr, "acquire: %s\n", r.status().ToString().c_str());
    return 1;
  }
  std::printf("HELD %zu\n", r->leases.size());
  std::fflush(stdout);
  while (true) ::pause();
}
