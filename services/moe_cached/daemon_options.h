// Command-line options of moe-cached and the arithmetic that turns them into
// a cache capacity. Kept apart from main.cc so that both are unit-tested.
#ifndef MOECACHE_SERVICES_MOE_CACHED_DAEMON_OPTIONS_H_
#define MOECACHE_SERVICES_MOE_CACHED_DAEMON_OPTIONS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace moe::cached {

struct ModelSpec {
  std::string name;  // what workers attach to
  std::string dir;   // Hugging Face checkpoint directory
};

// How big the arena of one model is; exactly one way may be given.
struct CapacitySpec {
  int64_t experts = 0;   // --cache-experts N
  uint64_t bytes = 0;    // --cache-bytes B
  double fraction = 0;   // --cache-fraction F (of the model's experts on CPU)
};

struct DaemonOptions {
  std::vector<ModelSpec> models;
  std::string listen;  // "unix:PATH" or a TCP address given explicitly
  std::string metrics_addr = "127.0.0.1:9464";  // empty: no /metrics
  CapacitySpec capacity;
  std::string policy = "moe-infinity";
  bool prefetch = true;
  double link_gbps = 0;  // GB/s (1e9 bytes/s) pacing CPU copies; 0: unpaced
  std::string state_dir;  // EAMC persistence; empty: none
  double persist_interval_seconds = 60;
  // gRPC calls still running get this long to finish; an idle client
  // connection also holds the sync server's Shutdown until then.
  double drain_seconds = 2;
  bool help = false;
};

// The default --listen: unix:$RUNTIME_DIRECTORY/moe-cached.sock when systemd
// gives a runtime directory, else unix:/tmp/moe-cached.sock.
std::string DefaultListenAddress();

// Parses argv[1..] (`--flag value` or `--flag=value`; --model repeatable,
// as DIR or NAME=DIR; the name defaults to the directory's basename).
// INVALID_ARGUMENT naming the flag for anything malformed, unknown or
// missing (at least one --model is required unless --help).
absl::StatusOr<DaemonOptions> ParseDaemonFlags(const std::vector<std::string>& args);

std::string DaemonUsage();

// Slots for a model of `num_layers` x `num_experts` experts of `block_bytes`
// each: from whichever of `spec` is set (default: half the experts), capped
// at all of them. FAILED_PRECONDITION when that is fewer than one layer's
// experts (design invariant 5), naming the model and both numbers.
absl::StatusOr<int> ComputeCapacity(const CapacitySpec& spec, const std::string& model,
                                    int num_layers, int num_experts, uint64_t block_bytes);

}  // namespace moe::cached

#endif  // MOECACHE_SERVICES_MOE_CACHED_DAEMON_OPTIONS_H_
