// Listening Unix sockets that a service owns by path: whether a live process
// already serves a path, removing only stale socket files, and removing at
// exit only the socket this process bound (not one a later process put there).
//
// Why: bind() on an existing socket file fails, so services unlink the path
// first; without a probe that replaced the socket of a running service (it
// kept running, unreachable). A path is "live" when a connect() to it
// succeeds: a listener accepts there. A socket file nobody listens on was left
// by a dead process and may be replaced.
//
// Thread-safety: free functions, no shared state.
#ifndef MOECACHE_COMMON_UNIX_SOCKET_H_
#define MOECACHE_COMMON_UNIX_SOCKET_H_

#include <sys/types.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace moe {

// `type` is the socket type the service will listen with (SOCK_STREAM for
// gRPC, SOCK_SEQPACKET for the fd broker).
//
// OK when `path` is free for this process to bind: nothing there, or a stale
// socket file. ALREADY_EXISTS naming the serving pid (and its program name)
// when a live process listens there; FAILED_PRECONDITION when something other
// than a socket is there, or when the directory is missing or not writable
// (those would make bind() fail later). Removes nothing.
absl::Status CheckUnixSocketFree(const std::string& path, int type);

// CheckUnixSocketFree, then removes a stale socket file at `path`.
absl::Status ClaimUnixSocketPath(const std::string& path, int type);

// The identity of the file at a path, to tell "the socket I bound" from a
// socket another process put at the same path later.
struct FileIdentity {
  dev_t dev = 0;
  ino_t ino = 0;
  bool valid = false;
};
FileIdentity IdentifyFile(const std::string& path);

// Unlinks `path` only when it still is the file `id` (best effort).
void UnlinkIfSameFile(const std::string& path, const FileIdentity& id);

// "pid 1234 (moe-worker)", or "pid 1234" when the name cannot be read.
std::string DescribePid(pid_t pid);

}  // namespace moe

#endif  // MOECACHE_COMMON_UNIX_SOCKET_H_
