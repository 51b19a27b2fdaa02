#include "common/unix_socket.h"

#include <errno.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace moe {
namespace {

std::string DirectoryOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// The directory must exist and be writable and searchable, or bind() fails.
absl::Status CheckDirectory(const std::string& path) {
  const std::string dir = DirectoryOf(path);
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("directory ", dir, " does not exist (", std::strerror(errno), ")"));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(dir, " is not a directory"));
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create a socket in ", dir, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace

std::string DescribePid(pid_t pid) {
  std::ifstream comm(absl::StrCat("/proc/", pid, "/comm"));
  std::string name;
  if (comm && std::getline(comm, name) && !name.empty()) {
    return absl::StrCat("pid ", pid, " (", name, ")");
  }
  return absl::StrCat("pid ", pid);
}

absl::Status CheckUnixSocketFree(const std::string& path, int type) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path '", path,
                                                   "' is empty or longer than ",
                                                   sizeof(addr.sun_path) - 1, " bytes"));
  }
  if (absl::Status s = CheckDirectory(path); !s.ok()) return s;
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return absl::OkStatus();  // nothing there
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " exists and is not a socket; remove it or choose another path"));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  const int fd = ::socket(AF_UNIX, type | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  }
  int rc;
  do {
    rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  } while (rc != 0 && errno == EINTR);
  const int err = rc == 0 ? 0 : errno;
  pid_t pid = 0;
  if (rc == 0) {
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) pid = cred.pid;
  }
  ::close(fd);
  // Refused: no listener (a dead process's socket). EPROTOTYPE: a listener of
  // another socket type is bound there, which is still a live process.
  if (rc == 0 || err == EAGAIN || err == EPROTOTYPE) {
    return absl::AlreadyExistsError(absl::StrCat(
        pid > 0 ? DescribePid(pid) : std::string("another process"), " already serves ", path,
        "; stop it first, or choose another path"));
  }
  if (err == EACCES || err == EPERM) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, " belongs to someone else (", std::strerror(err), "); cannot tell whether it is live"));
  }
  return absl::OkStatus();
}

absl::Status ClaimUnixSocketPath(const std::string& path, int type) {
  if (absl::Status s = CheckUnixSocketFree(path, type); !s.ok()) return s;
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot replace the stale socket ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

FileIdentity IdentifyFile(const std::string& path) {
  FileIdentity id;
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0) {
    id.dev = st.st_dev;
    id.ino = st.st_ino;
    id.valid = true;
  }
  return id;
}

void UnlinkIfSameFile(const std::string& path, const FileIdentity& id) {
  if (!id.valid) return;
  const FileIdentity now = IdentifyFile(path);
  if (now.valid && now.dev == id.dev && now.ino == id.ino) ::unlink(path.c_str());
}

}  // namespace moe
