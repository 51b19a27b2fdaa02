// The /metrics HTTP endpoint (prometheus-cpp's Exposer) behind a Status API:
// the Exposer throws when it cannot bind; that never escapes this class.
#ifndef MOECACHE_SERVICES_RPC_METRICS_SERVER_H_
#define MOECACHE_SERVICES_RPC_METRICS_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "prometheus/collectable.h"
#include "prometheus/exposer.h"
#include "prometheus/registry.h"

namespace moe::rpc {

class MetricsServer {
 public:
  // `address` is "HOST:PORT" (port 0 picks a free one). Serves `metrics`
  // (a registry, or a ProcessMetrics that refreshes before collecting) at
  // /metrics. UNAVAILABLE naming --metrics-addr and the reason (e.g.
  // "Address already in use") when it cannot listen.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const std::string& address,
      std::shared_ptr<prometheus::Collectable> metrics);

  // Stops serving; a scrape being answered finishes first. Takes
  // milliseconds, not civetweb's poll period of up to 2 s (see the .cc).
  ~MetricsServer();

  int port() const;

 private:
  MetricsServer(std::unique_ptr<prometheus::Exposer> exposer, std::string host)
      : exposer_(std::move(exposer)), host_(std::move(host)) {}
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::string host_;  // where the listening socket can be reached
};

}  // namespace moe::rpc

#endif  // MOECACHE_SERVICES_RPC_METRICS_SERVER_H_
