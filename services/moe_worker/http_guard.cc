#include "services/moe_worker/http_guard.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "services/openai/openai_api.h"

namespace moe::worker {
namespace {

// A client that stops reading a response holds a relay thread this long.
constexpr int kSendTimeoutSeconds = 60;
// After a refusal: how long and how much of the client's rest is dropped.
constexpr absl::Duration kLingerTime = absl::Seconds(1);
constexpr size_t kLingerBytes = 4 << 20;

bool SendAll(int fd, const char* data, size_t n) {
  while (n > 0) {
    const ssize_t w = send(fd, data, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    data += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

const char* Reason(int status) {
  switch (status) {
    case 400: return "Bad Request";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Payload Too Large";
    case 414: return "URI Too Long";
    case 431: return "Request Header Fields Too Large";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Error";
  }
}

// The guard's own answer. The caller closes the connection after it; what
// the client still sends is read and dropped for a moment first, so that
// closing with unread bytes does not reset the connection before the client
// has read the answer.
void SendRefusal(int fd, const HttpRefusal& refusal) {
  openai::ApiError e;
  e.http_status = refusal.status;
  e.message = refusal.message;
  if (refusal.status >= 500) e.type = "server_error";
  const std::string body = openai::Dump(openai::ErrorBody(e));
  const std::string head = absl::StrCat(
      "HTTP/1.1 ", refusal.status, " ", Reason(refusal.status),
      "\r\nContent-Type: application/json\r\nConnection: close\r\n",
      refusal.status == 503 ? "Retry-After: 1\r\n" : "", "Content-Length: ", body.size(),
      "\r\n\r\n");
  const std::string all = head + body;
  if (!SendAll(fd, all.data(), all.size())) return;
  shutdown(fd, SHUT_WR);
  const absl::Time end = absl::Now() + kLingerTime;
  char drop[16384];
  size_t dropped = 0;
  while (dropped < kLingerBytes) {
    const int left_ms = static_cast<int>(absl::ToInt64Milliseconds(end - absl::Now()));
    pollfd p = {fd, POLLIN, 0};
    if (left_ms <= 0 || poll(&p, 1, left_ms) <= 0) break;
    const ssize_t n = recv(fd, drop, sizeof(drop), 0);
    if (n <= 0) break;
    dropped += static_cast<size_t>(n);
  }
}

void SetSendTimeout(int fd) {
  timeval tv{};
  tv.tv_sec = kSendTimeoutSeconds;
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

int ConnectLoopback(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

absl::StatusOr<int> Listen(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &res); rc != 0) {
    return absl::UnavailableError(absl::StrCat("cannot resolve ", host, ": ", gai_strerror(rc)));
  }
  std::string error = "no address";
  int fd = -1;
  for (addrinfo* ai = res; ai != nullptr && fd < 0; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 128) != 0) {
      error = std::strerror(errno);
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("cannot listen on ", host, ":", port,
                                                         ": ", error));
  return fd;
}

int BoundPort(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return -1;
  if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&a)->sin6_port);
  return ntohs(reinterpret_cast<sockaddr_in*>(&a)->sin_port);
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpGuard>> HttpGuard::Start(const std::string& host, int port,
                                                            int upstream_port,
                                                            const HttpGuardOptions& options) {
  absl::StatusOr<int> fd = Listen(host, port);
  if (!fd.ok()) return fd.status();
  std::unique_ptr<HttpGuard> g(new HttpGuard());
  g->listen_fd_ = *fd;
  g->options_ = options;
  g->upstream_port_ = upstream_port;
  g->port_ = BoundPort(*fd);
  if (pipe2(g->wake_, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  HttpGuard* raw = g.get();
  g->acceptor_ = std::thread([raw] { raw->AcceptLoop(); });
  return g;
}

HttpGuard::~HttpGuard() {
  Stop();
  if (listen_fd_ >= 0) close(listen_fd_);
  for (int fd : wake_) {
    if (fd >= 0) close(fd);
  }
}

void HttpGuard::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
    for (Conn& c : conns_) {
      shutdown(c.client, SHUT_RDWR);
      if (c.upstream >= 0) shutdown(c.upstream, SHUT_RDWR);
    }
  }
  const char byte = 0;
  (void)!write(wake_[1], &byte, 1);
  if (acceptor_.joinable()) acceptor_.join();
  std::list<Conn> conns;
  {
    absl::MutexLock lock(&mu_);
    conns.swap(conns_);  // no thread adds to it once the acceptor is gone
  }
  for (Conn& c : conns) {
    if (c.thread.joinable()) c.thread.join();
    close(c.client);
  }
}

int HttpGuard::Reap() {
  int live = 0;
  for (auto it = conns_.begin(); it != conns_.end();) {
    if (!it->done) {
      ++live;
      ++it;
      continue;
    }
    it->thread.join();
    close(it->client);
    it = conns_.erase(it);
  }
  return live;
}

void HttpGuard::AcceptLoop() {
  while (true) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    if (poll(fds, 2, -1) < 0 && errno != EINTR) break;
    if (fds[1].revents != 0) break;
    if ((fds[0].revents & POLLIN) == 0) continue;
    const int client = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) continue;
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      close(client);
      break;
    }
    if (Reap() >= options_.max_connections) {
      SendRefusal(client, {503, absl::StrCat("over ", options_.max_connections,
                                             " HTTP connections at once; retry")});
      close(client);
      continue;
    }
    Conn& c = conns_.emplace_back();
    c.client = client;
    Conn* conn = &c;
    c.thread = std::thread([this, conn] { Serve(conn); });
  }
}

void HttpGuard::Serve(Conn* conn) {
  const int client = conn->client;
  const int up = ConnectLoopback(upstream_port_);
  {
    absl::MutexLock lock(&mu_);
    conn->upstream = up;
    if (stopping_ && up >= 0) shutdown(up, SHUT_RDWR);
  }
  if (up < 0) {
    SendRefusal(client, {503, "the HTTP server is not accepting connections"});
  } else {
    SetSendTimeout(client);
    SetSendTimeout(up);
    Relay(client, up);
  }
  absl::MutexLock lock(&mu_);
  if (up >= 0) close(up);
  conn->upstream = -1;
  conn->done = true;
}

void HttpGuard::Relay(int client, int up) {
  HttpRequestChecker checker(options_.limits);
  absl::Time request_start = absl::InfiniteFuture();
  bool client_open = true;
  char buf[16384];
  while (true) {
    int timeout_ms = -1;
    if (checker.MidRequest() && options_.request_read_timeout > absl::ZeroDuration()) {
      const absl::Duration left = request_start + options_.request_read_timeout - absl::Now();
      if (left <= absl::ZeroDuration()) {
        SendRefusal(client, {408, absl::StrCat("the request did not arrive within ",
                                               absl::FormatDuration(options_.request_read_timeout))});
        return;
      }
      timeout_ms = static_cast<int>(std::ceil(absl::ToDoubleMilliseconds(left)));
    }
    pollfd fds[2] = {{client, static_cast<short>(client_open ? POLLIN : 0), 0}, {up, POLLIN, 0}};
    const int r = poll(fds, 2, timeout_ms);
    if (r < 0 && errno != EINTR) return;
    if (r <= 0) continue;  // the deadline is checked above
    if (fds[1].revents != 0) {
      const ssize_t n = recv(up, buf, sizeof(buf), 0);
      if (n <= 0 || !SendAll(client, buf, static_cast<size_t>(n))) return;
    }
    if (client_open && fds[0].revents != 0) {
      const ssize_t n = recv(client, buf, sizeof(buf), 0);
      if (n < 0) return;
      if (n == 0) {
        // A request cut short can never be served. Otherwise answers may
        // still come: the half-close is not passed on (the library drops
        // the answers of a peer that has half-closed), and the library's
        // keep-alive timeout ends the connection.
        if (checker.MidRequest()) return;
        client_open = false;
        continue;
      }
      const bool was_mid = checker.MidRequest();
      const int64_t done_before = checker.requests();
      const HttpRefusal refusal = checker.Feed(absl::string_view(buf, static_cast<size_t>(n)));
      if (refusal.status != 0) {
        SendRefusal(client, refusal);
        return;
      }
      if (!was_mid || checker.requests() != done_before) request_start = absl::Now();
      if (!SendAll(up, buf, static_cast<size_t>(n))) return;
    }
  }
}

}  // namespace moe::worker
