// Small file helpers with absl::Status errors that name the path.
#ifndef MOECACHE_COMMON_FILE_UTIL_H_
#define MOECACHE_COMMON_FILE_UTIL_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace moe {

// A read-only descriptor of a regular file, closed on destruction.
class OpenedFile {
 public:
  OpenedFile(int fd, uint64_t size) : fd_(fd), size_(size) {}
  OpenedFile(OpenedFile&& other) noexcept : fd_(other.fd_), size_(other.size_) {
    other.fd_ = -1;
  }
  OpenedFile& operator=(OpenedFile&&) = delete;
  OpenedFile(const OpenedFile&) = delete;
  ~OpenedFile();
  int fd() const { return fd_; }
  uint64_t size() const { return size_; }  // at open time
  // Gives up ownership of the descriptor.
  int Release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_;
  uint64_t size_;
};

// Opens `path` for reading. NOT_FOUND when it does not exist,
// INVALID_ARGUMENT when it is not a regular file.
absl::StatusOr<OpenedFile> OpenRegularFile(const std::string& path);

// Reads a whole regular file. NOT_FOUND when it does not exist;
// INVALID_ARGUMENT when it is not a regular file or exceeds `max_bytes`.
absl::StatusOr<std::string> ReadFileToString(const std::string& path,
                                             uint64_t max_bytes = 64ull << 20);

// Writes `contents` to `path` atomically: a temporary file in the same
// directory, fsync, then rename over `path`. Readers never see a partial file.
absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view contents);

// True when `path` names an existing regular file (following symlinks).
bool IsRegularFile(const std::string& path);

// "dir" + "/" + "name" (no doubled slash).
std::string JoinPath(absl::string_view dir, absl::string_view name);

// Status for a failed system call: NOT_FOUND for ENOENT, PERMISSION_DENIED
// for EACCES/EPERM, else INTERNAL; the message is "path: what: strerror".
absl::Status ErrnoToStatus(int err, absl::string_view what,
                           absl::string_view path);

}  // namespace moe

#endif  // MOECACHE_COMMON_FILE_UTIL_H_
