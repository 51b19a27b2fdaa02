// The trace simulator: replays a `moe-trace/1` trace through the cache
// library itself (ExpertCache + policy + prefetcher) on a virtual clock with
// one modelled link (FakeCopyEngine).
//
// Model: all prefill tokens of a request are one iteration (each layer needs
// the union of their experts), each decode token is one iteration. At each MoE
// layer the needed experts must be ready before that layer's compute (T ms)
// starts; the link keeps working (prefetches) during compute. A "token" in the
// prefill figures is one prefill iteration.
//
// floor_tpot_ms = max(L x T, Belady misses per token x S / B), Belady being
// the offline optimum (demand fetch only) at the same capacity: the floor of
// fetch-only caches (host execution can go below it).
#ifndef MOECACHE_SERVICES_CACHE_SIMULATOR_H_
#define MOECACHE_SERVICES_CACHE_SIMULATOR_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "services/cache/slot_table.h"
#include "services/cache/trace.h"

namespace moe::cache {

struct LinkModel {
  double expert_mb = 17;   // bytes per expert / 1e6
  double link_gbps = 25;   // GB/s (1e9 bytes per second)
  double layer_ms = 0.3;   // compute per MoE layer per iteration
  double chunk_mb = 1;     // transfer chunk (preemption granularity)

  uint64_t expert_bytes() const { return static_cast<uint64_t>(expert_mb * 1e6); }
  // Transfer time of one expert.
  double transfer_ms() const { return expert_mb / link_gbps; }
};

struct SimOptions {
  int capacity = 0;  // slots
  bool prefetch = false;
  LinkModel link;
  int passes = 1;  // replay the trace this many times; report the last pass
  // Continuous batching (moe-worker --max-batch): up to `batch` requests run
  // together, joining in arrival order as places free up; each step runs
  // every member's next iteration (a whole prefill, or one decode token),
  // and each layer makes ONE acquire for the union of their experts (token
  // counts summed). A step with any prefill member counts as prefill. The
  // shared acquire is made for the oldest member and carries every member's
  // own row (ExpertCache::StartAcquire's members, as moe-worker sends them),
  // so each request's activation matrix sees its own experts; hints are not
  // replayed. 1: one request at a time, as before. In [1, kMaxSimBatch].
  int batch = 1;
  // false: the shared acquire carries no members, so the oldest member's
  // per-request state sees the batch's union (how moe-worker batched before
  // members existed), for comparison.
  bool batch_members = true;
  // A layer leased in parts of at most this many misses (moe-worker
  // --lease-part; AcquireCall::part), each part computed for its share of
  // the layer's time (by tokens) before the next is asked for; 0: whole
  // layers. In [0, experts per layer].
  int lease_part = 0;
  // Where misses are served (the daemon's --miss-mode) and the host's
  // figures. A layer's time is its stall (copies waited for) plus
  // max(T, the host runs of its misses answered on the host): the device
  // computes the resident experts while the host runs the others.
  MissMode miss_mode = MissMode::kFetch;
  double host_gbps = 60;     // host memory read bandwidth, GB/s
  double host_gflops = 500;  // the expert kernel on the host; 0: bandwidth alone
  HostFigures host() const { return {host_gbps * 1e9, host_gflops * 1e9}; }
  // Called after each request replayed with the fraction of the run done
  // (0, 1]; for progress displays. May be empty.
  std::function<void(double done)> progress;
};

inline constexpr int kMaxSimBatch = 64;

struct PhaseResult {
  uint64_t iterations = 0;  // forward steps
  uint64_t tokens = 0;      // tokens they ran (batch > 1: several per step); 0: iterations
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t prefetches_issued = 0;
  uint64_t prefetches_used = 0;
  uint64_t bytes_moved = 0;
  uint64_t host_runs = 0;  // misses run on the host
  double host_ms = 0;      // total host run time (overlapping T)
  double stall_ms = 0;  // total
  double time_ms = 0;   // total (compute + stall)
};

struct SimResult {
  std::string policy;
  int capacity = 0;
  bool prefetch = false;
  PhaseResult decode;
  PhaseResult prefill;
};

// Rounds frac x L x E; INVALID_ARGUMENT unless in (0, 1].
absl::StatusOr<int> CapacityFromFraction(const trace::TraceHeader& header, double frac);

// The sequence of per-layer expert sets the simulator serves, in order
// (passes x requests x iterations x layers); each set sorted by expert.
// With batch > 1, the groups of the batched replay (SimOptions::batch).
std::vector<std::vector<ExpertKey>> FlattenAccessGroups(const trace::Trace& trace, int passes,
                                                        int batch = 1);

// What Simulate(trace, policy, options) would refuse before running:
// capacity below one layer, a bad link model or pass count, an unknown
// policy or option. INVALID_ARGUMENT with the reason.
absl::Status ValidateSimulation(const trace::TraceHeader& header, const std::string& policy,
                                const SimOptions& options);

// Runs one policy ("belady" or any MakePolicy spec).
absl::StatusOr<SimResult> Simulate(const trace::Trace& trace, const std::string& policy,
                                   const SimOptions& options);

// The report of issue 4: decode figures at top level, prefill under
// "prefill", plus policy and capacity. `belady` is the Belady run at the same
// capacity (for the floor).
nlohmann::json ReportJson(const trace::TraceHeader& header, const SimOptions& options,
                          const SimResult& result, const SimResult& belady);

}  // namespace moe::cache

#endif  // MOECACHE_SERVICES_CACHE_SIMULATOR_H_
