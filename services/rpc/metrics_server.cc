#include "services/rpc/metrics_server.h"

#include <chrono>
#include <exception>
#include <future>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "services/rpc/tcp_probe.h"

namespace moe::rpc {

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& address,
    std::shared_ptr<prometheus::Collectable> metrics) {
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    exposer = std::make_unique<prometheus::Exposer>(address, 2);
  } catch (const std::exception& e) {
    const std::string why = BindError(address);
    return absl::UnavailableError(absl::StrCat(
        "--metrics-addr ", address, ": cannot serve /metrics: ", why.empty() ? e.what() : why,
        "; choose another HOST:PORT, or \"\" to disable /metrics"));
  }
  exposer->RegisterCollectable(metrics);
  return std::unique_ptr<MetricsServer>(
      new MetricsServer(std::move(exposer), ReachableHost(address)));
}

// civetweb's accept thread polls its listening socket in slices of 2 s
// (SOCKET_TIMEOUT_QUANTUM) and looks at the stop flag only between them, so
// mg_stop (the Exposer's destructor) took 0 to 2 s (measured on moe-worker:
// median 0.8 s, up to 1.6 s of 5 SIGTERMs). A connection ends the poll at
// once: while the Exposer stops on another thread, knock on its port until it
// is done. A knock that arrives before the stop flag is an empty connection,
// which civetweb drops.
MetricsServer::~MetricsServer() {
  if (exposer_ == nullptr) return;
  const std::vector<int> ports = exposer_->GetListeningPorts();
  std::promise<void> done;
  std::future<void> stopped = done.get_future();
  std::thread stopper([this, &done] {
    exposer_.reset();
    done.set_value();
  });
  while (stopped.wait_for(std::chrono::milliseconds(5)) != std::future_status::ready) {
    for (int port : ports) ConnectOnce(host_, port);
  }
  stopper.join();
}

int MetricsServer::port() const {
  auto ports = exposer_->GetListeningPorts();
  return ports.empty() ? 0 : ports.front();
}

}  // namespace moe::rpc
