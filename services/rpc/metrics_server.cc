#include "services/rpc/metrics_server.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <future>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace moe::rpc {
namespace {

// The host to connect to for a civetweb listening spec ("HOST:PORT",
// "[V6]:PORT", "PORT", "+PORT"): the wildcard addresses mean loopback.
std::string ReachableHost(const std::string& address) {
  const size_t colon = address.rfind(':');
  std::string host = colon == std::string::npos ? "" : address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host.empty() || host == "0.0.0.0" || host == "+") return "127.0.0.1";
  if (host == "::") return "::1";
  return host;
}

// Opens and at once closes a TCP connection to host:port (best effort).
void Knock(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const bool connected = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0;
    ::close(fd);
    if (connected) break;
  }
  ::freeaddrinfo(found);
}

// Why civetweb could not listen on `address`: it throws only "null context
// when constructing CivetServer". Binding the address ourselves gives the
// errno ("Address already in use", "Cannot assign requested address").
std::string BindError(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return "";
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const int gai = ::getaddrinfo(host.empty() ? nullptr : host.c_str(),
                                address.substr(colon + 1).c_str(), &hints, &found);
  if (gai != 0) return absl::StrCat("bad address (", ::gai_strerror(gai), ")");
  std::string error;
  for (addrinfo* a = found; a != nullptr && error.empty(); a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));  // as civetweb does
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0) error = std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return error;
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& address,
    std::shared_ptr<prometheus::Registry> registry) {
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    exposer = std::make_unique<prometheus::Exposer>(address, 2);
  } catch (const std::exception& e) {
    const std::string why = BindError(address);
    return absl::UnavailableError(absl::StrCat(
        "--metrics-addr ", address, ": cannot serve /metrics: ", why.empty() ? e.what() : why,
        "; choose another HOST:PORT, or \"\" to disable /metrics"));
  }
  exposer->RegisterCollectable(registry);
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
    for (int port : ports) Knock(host_, port);
  }
  stopper.join();
}

int MetricsServer::port() const {
  auto ports = exposer_->GetListeningPorts();
  return ports.empty() ? 0 : ports.front();
}

}  // namespace moe::rpc
