// A TCP front for the plaintext HTTP API that holds the limits cpp-httplib
// 0.11.4 cannot (http_request_checker.h says which and why): it accepts the
// clients' connections on the public address, runs every byte a client
// sends through an HttpRequestChecker, and relays the bytes, unchanged, to
// the library's server on a loopback port; responses come back unchanged.
//
// A refused request is answered by the guard itself (an OpenAI-shaped JSON
// error with the checker's status, `Connection: close`) and both connections
// are closed, so nothing past the broken limit is read or relayed. A client
// has `request_read_timeout` from the first byte of a request to its last
// (408 after; slowloris). Beyond `max_connections` at once a new client gets
// 503 with Retry-After. Idle keep-alive connections are closed by the
// library (its keep-alive timeout), which the guard passes on.
//
// The price: one thread per client connection and a loopback hop per byte,
// small beside a generation. The library sees every client as 127.0.0.1.
//
// Thread-safe; Stop() may be called from any thread.
#ifndef MOECACHE_SERVICES_MOE_WORKER_HTTP_GUARD_H_
#define MOECACHE_SERVICES_MOE_WORKER_HTTP_GUARD_H_

#include <list>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "services/moe_worker/http_request_checker.h"

namespace moe::worker {

struct HttpGuardOptions {
  HttpLimits limits;
  absl::Duration request_read_timeout = absl::Seconds(30);
  int max_connections = 256;
};

class HttpGuard {
 public:
  // Listens on host:port (0: any free port) and relays to
  // 127.0.0.1:upstream_port. UNAVAILABLE when it cannot listen.
  static absl::StatusOr<std::unique_ptr<HttpGuard>> Start(const std::string& host, int port,
                                                          int upstream_port,
                                                          const HttpGuardOptions& options);
  ~HttpGuard();  // Stop()

  // Stops accepting, closes every connection, joins every thread.
  // Idempotent.
  void Stop();
  int port() const { return port_; }

 private:
  struct Conn {
    int client = -1;
    int upstream = -1;  // -1 until connected and once closed
    std::thread thread;
    bool done = false;  // the thread has finished with the sockets
  };

  HttpGuard() = default;
  void AcceptLoop();
  // Relays one client until either side closes or a limit is broken.
  void Serve(Conn* conn);
  void Relay(int client, int upstream);
  // Joins the threads of finished connections; returns how many remain.
  int Reap() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  HttpGuardOptions options_;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};  // a pipe: Stop() writes to end the accept loop
  int port_ = 0;
  int upstream_port_ = 0;
  std::thread acceptor_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::list<Conn> conns_ ABSL_GUARDED_BY(mu_);
};

}  // namespace moe::worker

#endif  // MOECACHE_SERVICES_MOE_WORKER_HTTP_GUARD_H_
