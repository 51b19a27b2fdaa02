#include "services/rpc/tcp_probe.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace moe::rpc {
namespace {

// The host of "HOST:PORT" or "[V6]:PORT", without brackets; "" for "PORT".
std::string HostOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  std::string host = colon == std::string::npos ? "" : address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return host;
}

}  // namespace

std::string ReachableHost(const std::string& address) {
  const std::string host = HostOf(address);
  if (host.empty() || host == "0.0.0.0" || host == "+") return "127.0.0.1";
  if (host == "::") return "::1";
  return host;
}

bool ConnectOnce(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return false;
  bool connected = false;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    connected = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0;
    ::close(fd);
    if (connected) break;
  }
  ::freeaddrinfo(found);
  return connected;
}

std::string BindError(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return "";
  const std::string host = HostOf(address);
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

}  // namespace moe::rpc
