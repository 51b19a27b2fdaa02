#include "common/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace moe {

absl::Status ErrnoToStatus(int err, absl::string_view what,
                           absl::string_view path) {
  std::string msg = absl::StrCat(std::string(path), ": ", std::string(what),
                                 ": ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(msg);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
  return absl::InternalError(msg);
}

OpenedFile::~OpenedFile() {
  if (fd_ >= 0) ::close(fd_);
}

absl::StatusOr<OpenedFile> OpenRegularFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, "cannot open", path);
  OpenedFile file(fd, 0);
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoToStatus(errno, "cannot stat", path);
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a regular file"));
  }
  return OpenedFile(file.Release(), static_cast<uint64_t>(st.st_size));
}

absl::StatusOr<std::string> ReadFileToString(const std::string& path,
                                             uint64_t max_bytes) {
  ASSIGN_OR_RETURN(OpenedFile file, OpenRegularFile(path));
  if (file.size() > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": file is ", file.size(),
                     " bytes, more than the limit of ", max_bytes));
  }
  std::string out;
  char buf[1 << 16];
  while (true) {
    ssize_t r = ::read(file.fd(), buf, sizeof(buf));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return ErrnoToStatus(errno, "read failed", path);
    if (r == 0) break;
    out.append(buf, static_cast<size_t>(r));
    if (out.size() > max_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": file grew past the limit"));
    }
  }
  return out;
}

absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view contents) {
  static std::atomic<uint64_t> counter{0};
  std::string tmp =
      absl::StrCat(path, ".tmp.", ::getpid(), ".", counter.fetch_add(1));
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoToStatus(errno, "cannot create", tmp);
  size_t done = 0;
  while (done < contents.size()) {
    ssize_t w = ::write(fd, contents.data() + done, contents.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      absl::Status s = ErrnoToStatus(w < 0 ? errno : EIO, "write failed", tmp);
      ::close(fd);
      ::unlink(tmp.c_str());
      return s;
    }
    done += static_cast<size_t>(w);
  }
  bool synced = ::fsync(fd) == 0;
  int sync_errno = errno;
  bool closed = ::close(fd) == 0;
  if (!synced || !closed) {
    absl::Status s =
        ErrnoToStatus(synced ? errno : sync_errno, "fsync/close failed", tmp);
    ::unlink(tmp.c_str());
    return s;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    absl::Status s = ErrnoToStatus(errno, "cannot rename into place", path);
    ::unlink(tmp.c_str());
    return s;
  }
  return absl::OkStatus();
}

bool IsRegularFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string JoinPath(absl::string_view dir, absl::string_view name) {
  if (dir.empty()) return std::string(name);
  std::string out(dir);
  if (out.back() != '/') out += '/';
  out.append(name.data(), name.size());
  return out;
}

}  // namespace moe
