// The series every service exports beside its own, on its own registry:
//
//   moe_build_info{program,version,revision} 1
//   process_resident_memory_bytes, process_virtual_memory_bytes,
//   process_open_fds, process_start_time_seconds
//
// (the process_* names are those of Prometheus' own client libraries, so
// existing dashboards and alerts apply). The process gauges are read from
// /proc/self whenever the registry is collected: expose the ProcessMetrics
// object (a Collectable that refreshes, then collects the registry) instead
// of the bare registry.
//
// Thread-safe.
#ifndef MOECACHE_SERVICES_RPC_PROCESS_METRICS_H_
#define MOECACHE_SERVICES_RPC_PROCESS_METRICS_H_

#include <memory>
#include <string>
#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"

namespace moe::rpc {

class ProcessMetrics : public prometheus::Collectable {
 public:
  // Registers the series on `registry` for `program` ("moe-worker").
  ProcessMetrics(std::shared_ptr<prometheus::Registry> registry,
                 const std::string& program);

  // Refresh(), then everything in the registry.
  std::vector<prometheus::MetricFamily> Collect() const override;
  // The registry's series in Prometheus' text format (what /metrics serves).
  std::string Text() const;
  // Reads /proc/self into the process gauges.
  void Refresh() const;

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Gauge& resident_;
  prometheus::Gauge& virtual_;
  prometheus::Gauge& open_fds_;
  prometheus::Gauge& start_time_;
};

}  // namespace moe::rpc

#endif  // MOECACHE_SERVICES_RPC_PROCESS_METRICS_H_
