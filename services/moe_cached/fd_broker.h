// FdBroker: hands file descriptors (the memfd arena and channel of a
// session) to one local process over a Unix socket with SCM_RIGHTS.
//
// Why: a memfd has no name in /dev/shm, so no process can open an arena by
// guessing or listing names; a worker gets the descriptors of exactly the
// model it attached to, and only the process whose pid Attach named can
// collect them (checked with SO_PEERCRED), once, before the grant expires.
//
// Protocol (SOCK_SEQPACKET, one exchange per connection):
//   client -> broker: the grant token (32 lowercase hex digits)
//   broker -> client: "OK <n>" with n descriptors attached, or
//                     "ERR <reason>" with none; then the broker closes.
//
// The broker socket gets the same mode as the gRPC socket (0600, or 0660
// with a group) and is unlinked when the broker stops.
//
// Thread-safety: Grant/Revoke/pending_grants may be called from any thread;
// one thread serves connections.
#ifndef MOECACHE_SERVICES_MOE_CACHED_FD_BROKER_H_
#define MOECACHE_SERVICES_MOE_CACHED_FD_BROKER_H_

#include <sys/types.h>

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/unix_socket.h"

namespace moe::cached {

// An owned descriptor (closed on destruction).
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd();
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  int get() const { return fd_; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }

 private:
  int fd_ = -1;
};

class FdBroker {
 public:
  static constexpr int kMaxFds = 8;

  // Binds `path` (an absolute filesystem path, not abstract), chmods it to
  // `mode` and, when group >= 0, chowns it to that group; starts serving.
  // ALREADY_EXISTS naming the pid if a live socket is there (left as it
  // is); a stale one is replaced.
  static absl::StatusOr<std::unique_ptr<FdBroker>> Start(const std::string& path,
                                                          mode_t mode = 0600,
                                                          gid_t group = static_cast<gid_t>(-1));
  ~FdBroker();  // stops serving, closes held descriptors, unlinks the socket

  // Offers dups of `fds` (at most kMaxFds) to process `pid` for `ttl`;
  // returns the token to present. The grant is used up by one successful
  // fetch.
  absl::StatusOr<std::string> Grant(pid_t pid, const std::vector<int>& fds, absl::Duration ttl);
  void Revoke(const std::string& token);
  int pending_grants() const;
  const std::string& path() const { return path_; }

 private:
  struct GrantEntry {
    pid_t pid = 0;
    absl::Time expires;
    std::vector<UniqueFd> fds;
  };

  FdBroker() = default;
  void Serve();
  void HandleConnection(int conn);
  void DropExpiredLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::string path_;  // set once bound: what the destructor removes
  FileIdentity path_id_;
  UniqueFd listen_fd_;
  UniqueFd stop_fd_;  // eventfd
  std::thread thread_;
  mutable absl::Mutex mu_;
  std::map<std::string, GrantEntry> grants_ ABSL_GUARDED_BY(mu_);
};

// Connects to the broker at `path`, presents `token` and returns the
// descriptors it receives (CLOEXEC). PERMISSION_DENIED / NOT_FOUND with the
// broker's reason when it refuses; UNAVAILABLE when it cannot be reached;
// DEADLINE_EXCEEDED after `timeout`.
absl::StatusOr<std::vector<UniqueFd>> FetchFds(const std::string& path, const std::string& token,
                                               absl::Duration timeout = absl::Seconds(5));

}  // namespace moe::cached

#endif  // MOECACHE_SERVICES_MOE_CACHED_FD_BROKER_H_
