// Command-line options of moe-cached and the arithmetic that turns them into
// a cache capacity. Kept apart from main.cc so that both are unit-tested.
#ifndef MOECACHE_SERVICES_MOE_CACHED_DAEMON_OPTIONS_H_
#define MOECACHE_SERVICES_MOE_CACHED_DAEMON_OPTIONS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "common/logging.h"
#include "services/exchange/expert_exchange.h"
#include "services/rpc/security.h"

namespace moe::cached {

struct ModelSpec {
  std::string name;  // what workers attach to
  std::string dir;   // Hugging Face checkpoint directory
};

// How big the arena of one model is; exactly one way may be given.
struct CapacitySpec {
  int64_t experts = -1;  // --cache-experts N (>= 0; -1: not given)
  uint64_t bytes = 0;    // --cache-bytes SIZE (24G, 512MiB, or bytes)
  double fraction = 0;   // --cache-fraction F: of the model's experts, on
                         // every device
};

struct DaemonOptions {
  std::vector<ModelSpec> models;
  std::string listen;  // "unix:PATH" or a TCP address given explicitly
  std::string metrics_addr = "127.0.0.1:9464";  // empty: no /metrics
  CapacitySpec capacity;
  std::string policy = "moe-infinity";
  // --device auto|cpu|cuda: where the arena lives (see ResolveDevice in
  // cuda_arena.h). auto, as moe-worker's default: both pick CUDA when a GPU
  // is usable, and a mismatch is refused at attach (sessions.h).
  std::string device = "auto";
  bool prefetch = true;
  double link_gbps = 0;  // GB/s (1e9 bytes/s) pacing CPU copies; 0: unpaced
  // --miss-mode fetch|host|auto: where misses of workers that can run
  // experts on the host are served (auto needs a link figure: --link-gbps).
  MissMode miss_mode = MissMode::kFetch;
  double host_gbps = 0;     // --host-gbps: host read bandwidth; 0: measured at start
  // --host-gflops: the host expert kernel's FLOP rate; 0: bandwidth only
  // (the cost model charges a host run its weight read alone).
  double host_gflops = 100;
  // --expert-format bf16|q8|q4: what the host store and the arena hold
  // (converted at load); unset: the checkpoint's own dtype.
  std::optional<DType> expert_format;
  std::string state_dir;  // EAMC persistence; empty: none
  double persist_interval_seconds = 60;
  // gRPC calls still running get this long to finish (then they are
  // cancelled); idle client connections are closed as soon as none runs.
  double drain_seconds = 2;
  // --max-sessions N: attached workers at once (each costs a thread and a
  // ~135 KB channel); Attach past it gets RESOURCE_EXHAUSTED.
  int max_sessions = 64;
  rpc::SecurityOptions security;  // --socket-group, --tls-*, --auth-token-file
  std::optional<LogLevel> log_level;  // --log-level; unset: MOE_LOG_LEVEL or INFO
  bool help = false;
  bool version = false;  // --version
  bool dry_run = false;  // --dry-run: Daemon::DryRun, then exit
};

// The default --listen: unix:$RUNTIME_DIRECTORY/moe-cached.sock when systemd
// gives a runtime directory, else unix:/tmp/moe-cached.sock.
std::string DefaultListenAddress();

// Parses argv[1..] with the common parser (common/flags.h: `--flag value`
// or `--flag=value`, every flag once); --model is repeatable, as DIR or
// NAME=DIR (the name defaults to the directory's basename). The flags
// shared with moe-worker and moectl come from services/flags/flag_groups.h.
// INVALID_ARGUMENT naming the flag for anything malformed, unknown,
// repeated or missing (at least one --model is required unless --help or
// --version).
absl::StatusOr<DaemonOptions> ParseDaemonFlags(const std::vector<std::string>& args);

// The --help text, generated from the declarations.
std::string DaemonUsage();

// Slots for a model of `num_layers` x `num_experts` experts of `block_bytes`
// each: from whichever of `spec` is set (default: half the experts), capped
// at all of them. FAILED_PRECONDITION when that is fewer than one layer's
// experts and `miss_mode` is fetch (design invariant 5), naming the model,
// both numbers and --miss-mode; with host or auto misses any count down to 0
// is allowed (a miss that finds no slot runs on the host).
// `device_free_bytes` > 0 (a CUDA arena): with nothing given the default is
// what half of that free memory holds (not half the experts); a count,
// size or fraction that needs more than the free memory is
// FAILED_PRECONDITION naming both. --cache-fraction is a fraction of the
// model's experts whatever the device.
absl::StatusOr<int> ComputeCapacity(const CapacitySpec& spec, const std::string& model,
                                    int num_layers, int num_experts, uint64_t block_bytes,
                                    uint64_t device_free_bytes = 0,
                                    MissMode miss_mode = MissMode::kFetch);

}  // namespace moe::cached

#endif  // MOECACHE_SERVICES_MOE_CACHED_DAEMON_OPTIONS_H_
