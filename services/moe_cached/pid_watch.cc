#include "services/moe_cached/pid_watch.h"

#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace moe::cached {

absl::StatusOr<PidWatch> PidWatch::Open(int pid) {
  if (pid <= 0) return absl::InvalidArgumentError(absl::StrCat("bad pid ", pid));
  int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) {
    int err = errno;
    std::string msg = absl::StrCat("pidfd_open(", pid, "): ", std::strerror(err));
    if (err == ESRCH) return absl::NotFoundError(msg);
    if (err == EPERM || err == EACCES) return absl::PermissionDeniedError(msg);
    return absl::InternalError(msg);
  }
  PidWatch w;
  w.fd_ = fd;
  w.pid_ = pid;
  return w;
}

PidWatch::~PidWatch() {
  if (fd_ >= 0) ::close(fd_);
}

PidWatch::PidWatch(PidWatch&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), pid_(other.pid_) {}

PidWatch& PidWatch::operator=(PidWatch&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    pid_ = other.pid_;
  }
  return *this;
}

bool PidWatch::Exited() const {
  if (fd_ < 0) return false;
  pollfd p{fd_, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR)) != 0;
}

}  // namespace moe::cached
