#include "services/cache/miss_planner.h"

#include <algorithm>
#include <utility>

#include "common/logging.h"

namespace moe::cache {

double HostRunSeconds(const HostFigures& host, double bytes,
                      double flops_per_token, int tokens) {
  const double read =
      host.read_bytes_per_sec > 0 ? bytes / host.read_bytes_per_sec : 0;
  const double compute = host.flops_per_sec > 0
                             ? flops_per_token * std::max(1, tokens) /
                                   host.flops_per_sec
                             : 0;
  return std::max(read, compute);
}

HostFigures TrackHostFigures(const HostFigures& current,
                             const HostRunReport& report, double expert_bytes,
                             double flops_per_token, double weight) {
  HostFigures h = current;
  const double w = weight;
  const double per_expert =
      static_cast<double>(report.nanoseconds) * 1e-9 / report.experts;
  const double tokens_each =
      static_cast<double>(report.tokens) / report.experts;
  const double read =
      h.read_bytes_per_sec > 0 ? expert_bytes / h.read_bytes_per_sec : 0;
  const double compute =
      h.flops_per_sec > 0 ? flops_per_token * tokens_each / h.flops_per_sec
                          : 0;
  if (compute > read && flops_per_token > 0) {
    const double measured = flops_per_token * tokens_each / per_expert;
    h.flops_per_sec = (1 - w) * h.flops_per_sec + w * measured;
  } else {
    const double measured = expert_bytes / per_expert;
    h.read_bytes_per_sec = h.read_bytes_per_sec > 0
                               ? (1 - w) * h.read_bytes_per_sec + w * measured
                               : measured;
  }
  return h;
}

MissPlanner::MissPlanner(const Figures& figures, bool host_ok,
                         std::function<double()> link_backlog)
    : figures_(figures),
      may_host_(host_ok && figures.mode != MissMode::kFetch),
      copy_seconds_(figures.link_bytes_per_sec > 0
                        ? figures.expert_bytes / figures.link_bytes_per_sec
                        : 0),
      link_backlog_(std::move(link_backlog)) {}

bool MissPlanner::RunOnHost(int tokens, double fetch_seconds) {
  MOE_CHECK(may_host_) << "RunOnHost on an acquire that cannot host";
  if (figures_.mode == MissMode::kHost) return true;
  if (!(figures_.link_bytes_per_sec > 0)) return false;  // nothing to compare
  if (link_queue_ < 0) link_queue_ = link_backlog_();
  const double host = HostRunSeconds(figures_.host, figures_.expert_bytes,
                                     figures_.flops_per_token, tokens);
  // A copy already on the link as a demand adds nothing (fetch_seconds 0):
  // its wait is at most the backlog, which holds it.
  const double done = link_queue_ + fetch_seconds;
  if (host < done - waited_) return true;
  link_queue_ = done;
  waited_ = std::max(waited_, done);
  return false;
}

}  // namespace moe::cache
