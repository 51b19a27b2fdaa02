// Small file helpers with absl::Status errors that name the path.
#ifndef MOECACHE_COMMON_FILE_UTIL_H_
#define MOECACHE_COMMON_FILE_UTIL_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace moe {

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
