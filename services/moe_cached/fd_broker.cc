#include "services/moe_cached/fd_broker.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/logging.h"
#include "common/unix_socket.h"

namespace moe::cached {
namespace {

constexpr size_t kTokenChars = 32;
constexpr int kConnectionTimeoutMs = 1000;

absl::Status Errno(absl::string_view what, int err) {
  std::string msg = absl::StrCat(what, ": ", std::strerror(err));
  switch (err) {
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(msg);
    case ENOENT:
    case ECONNREFUSED:
      return absl::UnavailableError(msg);
    case EAGAIN:
    case ETIMEDOUT:
      return absl::DeadlineExceededError(msg);
    default:
      return absl::InternalError(msg);
  }
}

absl::StatusOr<sockaddr_un> UnixAddress(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path[0] != '/' || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("fd broker socket path must be absolute and shorter than ",
                     sizeof(addr.sun_path), " bytes: '", path, "'"));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  return addr;
}

bool IsToken(absl::string_view s) {
  if (s.size() != kTokenChars) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

absl::StatusOr<std::string> NewToken() {
  unsigned char bytes[kTokenChars / 2];
  size_t got = 0;
  while (got < sizeof(bytes)) {
    ssize_t n = getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno("getrandom", errno);
    }
    got += static_cast<size_t>(n);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string token;
  for (unsigned char b : bytes) {
    token.push_back(kHex[b >> 4]);
    token.push_back(kHex[b & 15]);
  }
  return token;
}

// Sends `text` with `fds` attached (none when empty). Best effort: the peer
// may have gone.
void SendReply(int conn, const std::string& text, const std::vector<int>& fds) {
  iovec iov{const_cast<char*>(text.data()), text.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * FdBroker::kMaxFds)];
  if (!fds.empty()) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  while (sendmsg(conn, &msg, MSG_NOSIGNAL) < 0 && errno == EINTR) {
  }
}

}  // namespace

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) close(fd_);
}

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) close(fd_);
    fd_ = o.release();
  }
  return *this;
}

absl::StatusOr<std::unique_ptr<FdBroker>> FdBroker::Start(const std::string& path, mode_t mode,
                                                          gid_t group) {
  absl::StatusOr<sockaddr_un> addr = UnixAddress(path);
  if (!addr.ok()) return addr.status();
  std::unique_ptr<FdBroker> b(new FdBroker());
  b->listen_fd_ = UniqueFd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (b->listen_fd_.get() < 0) return Errno("fd broker: socket", errno);
  // A live broker's socket is never touched; a dead daemon's is replaced.
  if (absl::Status s = ClaimUnixSocketPath(path, SOCK_SEQPACKET); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("fd broker: ", s.message()));
  }
  if (bind(b->listen_fd_.get(), reinterpret_cast<const sockaddr*>(&*addr), sizeof(*addr)) != 0) {
    return Errno(absl::StrCat("fd broker: bind '", path, "'"), errno);
  }
  // From here on the socket is ours: the destructor removes it (and only it).
  b->path_ = path;
  b->path_id_ = IdentifyFile(path);
  if (chmod(path.c_str(), mode) != 0 ||
      (group != static_cast<gid_t>(-1) && chown(path.c_str(), static_cast<uid_t>(-1), group) != 0)) {
    return Errno(absl::StrCat("fd broker: set mode/group of '", path, "'"), errno);
  }
  if (listen(b->listen_fd_.get(), 64) != 0) {
    return Errno("fd broker: listen", errno);
  }
  b->stop_fd_ = UniqueFd(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (b->stop_fd_.get() < 0) {
    return Errno("fd broker: eventfd", errno);
  }
  FdBroker* raw = b.get();
  b->thread_ = std::thread([raw] { raw->Serve(); });
  return b;
}

FdBroker::~FdBroker() {
  if (thread_.joinable()) {
    uint64_t one = 1;
    ssize_t n = write(stop_fd_.get(), &one, sizeof(one));
    (void)n;
    thread_.join();
  }
  if (!path_.empty()) UnlinkIfSameFile(path_, path_id_);
}

absl::StatusOr<std::string> FdBroker::Grant(pid_t pid, const std::vector<int>& fds,
                                            absl::Duration ttl) {
  if (pid <= 0) return absl::InvalidArgumentError(absl::StrCat("fd broker: bad pid ", pid));
  if (fds.empty() || fds.size() > static_cast<size_t>(kMaxFds)) {
    return absl::InvalidArgumentError(
        absl::StrCat("fd broker: a grant holds 1..", kMaxFds, " descriptors, not ", fds.size()));
  }
  GrantEntry entry;
  entry.pid = pid;
  entry.expires = absl::Now() + ttl;
  for (int fd : fds) {
    int d = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (d < 0) return Errno("fd broker: dup", errno);
    entry.fds.emplace_back(d);
  }
  absl::StatusOr<std::string> token = NewToken();
  if (!token.ok()) return token.status();
  absl::MutexLock lock(&mu_);
  DropExpiredLocked();
  grants_[*token] = std::move(entry);
  return *token;
}

void FdBroker::Revoke(const std::string& token) {
  absl::MutexLock lock(&mu_);
  grants_.erase(token);
}

int FdBroker::pending_grants() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(grants_.size());
}

void FdBroker::DropExpiredLocked() {
  const absl::Time now = absl::Now();
  for (auto it = grants_.begin(); it != grants_.end();) {
    it = it->second.expires < now ? grants_.erase(it) : std::next(it);
  }
}

void FdBroker::Serve() {
  pollfd fds[2] = {{listen_fd_.get(), POLLIN, 0}, {stop_fd_.get(), POLLIN, 0}};
  for (;;) {
    int n = poll(fds, 2, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      MOE_LOG(ERROR) << "fd broker: poll: " << std::strerror(errno);
      return;
    }
    if (fds[1].revents != 0) return;
    if (fds[0].revents & POLLIN) {
      int conn = accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC);
      if (conn < 0) continue;
      UniqueFd owned(conn);
      HandleConnection(conn);
    }
  }
}

void FdBroker::HandleConnection(int conn) {
  // A silent peer gets a bounded wait, never the broker thread forever.
  pollfd p{conn, POLLIN, 0};
  if (poll(&p, 1, kConnectionTimeoutMs) <= 0) {
    SendReply(conn, "ERR no token within 1 s", {});
    return;
  }
  char buf[64];
  ssize_t n = recv(conn, buf, sizeof(buf), MSG_DONTWAIT);
  if (n <= 0) return;
  const std::string token(buf, static_cast<size_t>(n));
  if (!IsToken(token)) {
    SendReply(conn, "ERR malformed token", {});
    return;
  }
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    SendReply(conn, "ERR cannot read peer credentials", {});
    return;
  }
  GrantEntry entry;
  {
    absl::MutexLock lock(&mu_);
    DropExpiredLocked();
    auto it = grants_.find(token);
    if (it == grants_.end()) {
      SendReply(conn, "ERR unknown or expired grant", {});
      return;
    }
    if (it->second.pid != cred.pid) {
      MOE_LOG(WARNING) << "fd broker: pid " << cred.pid << " presented the grant of pid "
                       << it->second.pid << "; refused";
      SendReply(conn, absl::StrCat("ERR grant belongs to another process"), {});
      return;
    }
    entry = std::move(it->second);
    grants_.erase(it);
  }
  std::vector<int> raw;
  for (const UniqueFd& f : entry.fds) raw.push_back(f.get());
  SendReply(conn, absl::StrCat("OK ", raw.size()), raw);
}

absl::StatusOr<std::vector<UniqueFd>> FetchFds(const std::string& path, const std::string& token,
                                               absl::Duration timeout) {
  absl::StatusOr<sockaddr_un> addr = UnixAddress(path);
  if (!addr.ok()) return addr.status();
  UniqueFd s(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (s.get() < 0) return Errno("fd broker: socket", errno);
  timeval tv = absl::ToTimeval(timeout);
  setsockopt(s.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(s.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  if (connect(s.get(), reinterpret_cast<const sockaddr*>(&*addr), sizeof(*addr)) != 0) {
    return Errno(absl::StrCat("fd broker: connect '", path, "'"), errno);
  }
  if (send(s.get(), token.data(), token.size(), MSG_NOSIGNAL) < 0) {
    return Errno("fd broker: send", errno);
  }
  char buf[256];
  iovec iov{buf, sizeof(buf)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * FdBroker::kMaxFds)];
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  do {
    n = recvmsg(s.get(), &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return Errno("fd broker: receive", errno);
  std::vector<UniqueFd> fds;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      fds.emplace_back(fd);
    }
  }
  const absl::string_view reply(buf, static_cast<size_t>(n));
  if (msg.msg_flags & MSG_CTRUNC) return absl::InternalError("fd broker: descriptors truncated");
  if (absl::StartsWith(reply, "ERR ")) {
    return absl::PermissionDeniedError(
        absl::StrCat("fd broker '", path, "' refused: ", reply.substr(4)));
  }
  size_t expected = 0;
  if (!absl::StartsWith(reply, "OK ") || !absl::SimpleAtoi(reply.substr(3), &expected) ||
      expected != fds.size()) {
    return absl::InternalError(absl::StrCat("fd broker: malformed reply '", reply, "' with ",
                                            fds.size(), " descriptors"));
  }
  return fds;
}

}  // namespace moe::cached
