// Where a miss is served ("Where a miss is served" in docs/architecture.md):
// the cost model as plain functions and one small per-acquire planner, used
// by ExpertCache (daemon and simulator alike) and tested on their own.
//
// Thread-safety: pure functions; a MissPlanner belongs to one acquire.
#ifndef MOECACHE_SERVICES_CACHE_MISS_PLANNER_H_
#define MOECACHE_SERVICES_CACHE_MISS_PLANNER_H_

#include <cstdint>
#include <functional>

#include "services/exchange/expert_exchange.h"

namespace moe::cache {

// Seconds to run one expert of `bytes` (2 x params = `flops_per_token`) on
// `tokens` tokens from host memory: the weights are read once, the FLOPs
// grow with the tokens. 0 for unknown figures.
double HostRunSeconds(const HostFigures& host, double bytes,
                      double flops_per_token, int tokens);

// `current` moved towards what a worker measured (`report`, validated) with
// weight `weight` in (0, 1]: the per-expert time updates the read bandwidth
// when `current` says the runs were read-bound, the FLOP rate when it says
// compute-bound. A zero bandwidth takes the measurement as it is.
HostFigures TrackHostFigures(const HostFigures& current,
                             const HostRunReport& report, double expert_bytes,
                             double flops_per_token, double weight);

// One acquire's decisions, in marginal terms: the worker waits for the
// acquire's copies and then runs its host answers, so a copy costs the stall
// it adds beyond what the acquire already waits for, and a host run its own
// time. kHost always runs on the host; kFetch never (MayHost is false).
class MissPlanner {
 public:
  struct Figures {
    MissMode mode = MissMode::kFetch;
    double link_bytes_per_sec = 0;  // 0: no link model (never host in kAuto)
    double expert_bytes = 0;
    double flops_per_token = 0;
    HostFigures host;
  };
  // `link_backlog` gives the seconds of copies queued on the link; it is
  // called at most once, at the first miss that compares.
  MissPlanner(const Figures& figures, bool host_ok,
              std::function<double()> link_backlog);

  // Whether any miss of this acquire may be answered on the host.
  bool may_host() const { return may_host_; }
  // One expert's copy over the link (0 without a link model).
  double copy_seconds() const { return copy_seconds_; }
  // Whether the miss of an expert routed `tokens` tokens, whose copy would
  // still take `fetch_seconds` on the link, runs on the host. When it does
  // not, its copy joins what this acquire waits for.
  // REQUIRES: may_host().
  bool RunOnHost(int tokens, double fetch_seconds);

 private:
  const Figures figures_;
  const bool may_host_;
  const double copy_seconds_;
  std::function<double()> link_backlog_;
  double link_queue_ = -1;  // computed at the first comparison
  double waited_ = 0;       // when the copies waited for are done
};

}  // namespace moe::cache

#endif  // MOECACHE_SERVICES_CACHE_MISS_PLANNER_H_
