// Test helpers: a tiny model in a temp dir, the real moe-cached binary as a
// child process (posix_spawn, stderr to a file), readiness by polling the
// gRPC health service with deadlines, and a minimal HTTP GET for /metrics.
#ifndef MOECACHE_TESTS_MOE_CACHED_DAEMON_PROCESS_H_
#define MOECACHE_TESTS_MOE_CACHED_DAEMON_PROCESS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tests/common/test_util.h"
#include "tests/common/tiny_model.h"

namespace moe::testing {


// A spawned process with stdout on a pipe and stderr in a file.
class ChildProcess {
 public:
  ChildProcess() = default;
  ~ChildProcess();  // SIGKILL + reap if still running
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  absl::Status Spawn(const std::string& binary, const std::vector<std::string>& args,
                     const std::string& stderr_path);
  int pid() const { return pid_; }
  // Reads one line from the child's stdout (blocks up to `timeout`).
  absl::StatusOr<std::string> ReadLine(absl::Duration timeout);
  absl::Status Signal(int sig);
  // Waits for exit; returns the raw wait status. DEADLINE_EXCEEDED on timeout.
  absl::StatusOr<int> Wait(absl::Duration timeout);
  // True if the child has exited (reaps it).
  bool Exited();

 private:
  int pid_ = -1;
  int stdout_fd_ = -1;
  bool reaped_ = false;
  int wait_status_ = 0;
  std::string buffer_;
};

// moe-cached on a temp unix socket.
struct DaemonConfig {
  std::vector<std::string> models;  // --model values
  std::vector<std::string> extra_args;
  bool metrics = false;  // --metrics-addr 127.0.0.1:0 (else disabled)
};

class DaemonProcess {
 public:
  explicit DaemonProcess(const TempDir& dir) : dir_(dir) {}
  // SIGTERM and a wait (so the daemon removes its shared memory), then
  // SIGKILL if it does not exit in time.
  ~DaemonProcess();
  // Starts the daemon and waits until its health service says SERVING.
  // FAILED_PRECONDITION with its stderr if it exits first.
  absl::Status Start(const DaemonConfig& config, absl::Duration timeout = absl::Seconds(30));
  std::string address() const { return "unix:" + socket_path(); }
  std::string socket_path() const { return dir_.Sub("moe-cached.sock"); }
  std::string stderr_text() const;
  // Port from the daemon's "metrics on port N" log line.
  absl::StatusOr<int> MetricsPort() const;
  ChildProcess& process() { return process_; }

 private:
  const TempDir& dir_;
  ChildProcess process_;
};

std::string MoeCachedBinary();
std::string LeaseHolderBinary();

// GET http://127.0.0.1:port/path; returns the body.
absl::StatusOr<std::string> HttpGet(int port, const std::string& path);
// The value of the sample `name{labels}` (labels as written, e.g.
// `model="tiny"`) in a Prometheus text exposition; NOT_FOUND if absent.
absl::StatusOr<double> MetricValue(const std::string& exposition, const std::string& sample);

}  // namespace moe::testing

#endif  // MOECACHE_TESTS_MOE_CACHED_DAEMON_PROCESS_H_
