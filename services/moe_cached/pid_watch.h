// PidWatch: notices, without signals or polling /proc, that a process on this
// host has exited (a pidfd, Linux >= 5.3). Used by the daemon to reclaim a
// dead worker's leases and by the worker to notice the daemon's death.
//
// Thread-safety: const methods may be called from any thread.
#ifndef MOECACHE_SERVICES_MOE_CACHED_PID_WATCH_H_
#define MOECACHE_SERVICES_MOE_CACHED_PID_WATCH_H_

#include "absl/status/statusor.h"

namespace moe::cached {

class PidWatch {
 public:
  PidWatch() = default;
  // INVALID_ARGUMENT for pid <= 0; NOT_FOUND if no such process (already
  // gone); PERMISSION_DENIED / INTERNAL for other pidfd_open failures.
  static absl::StatusOr<PidWatch> Open(int pid);

  ~PidWatch();
  PidWatch(PidWatch&& other) noexcept;
  PidWatch& operator=(PidWatch&& other) noexcept;
  PidWatch(const PidWatch&) = delete;
  PidWatch& operator=(const PidWatch&) = delete;

  bool valid() const { return fd_ >= 0; }
  int pid() const { return pid_; }
  // True once the process has exited (zombie or reaped). False for an
  // invalid watch.
  bool Exited() const;

 private:
  int fd_ = -1;
  int pid_ = 0;
};

}  // namespace moe::cached

#endif  // MOECACHE_SERVICES_MOE_CACHED_PID_WATCH_H_
