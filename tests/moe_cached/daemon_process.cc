#include "tests/moe_cached/daemon_process.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/model_maker.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "services/rpc/rpc_util.h"
#include "tests/common/test_util.h"

extern char** environ;

namespace moe::testing {

ChildProcess::~ChildProcess() {
  if (pid_ > 0 && !reaped_) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  if (stdout_fd_ >= 0) ::close(stdout_fd_);
}

absl::Status ChildProcess::Spawn(const std::string& binary, const std::vector<std::string>& args,
                                 const std::string& stderr_path) {
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) return absl::InternalError("pipe2 failed");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, stderr_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0600);
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(binary.c_str()));
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  int rc = ::posix_spawn(&pid_, binary.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(pipe_fds[1]);
  stdout_fd_ = pipe_fds[0];
  if (rc != 0) {
    pid_ = -1;
    return absl::InternalError(absl::StrCat("posix_spawn ", binary, ": ", std::strerror(rc)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ChildProcess::ReadLine(absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  while (true) {
    size_t nl = buffer_.find('\n');
    if (nl != std::string::npos) {
      std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      return line;
    }
    int ms = static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()));
    if (ms <= 0) return absl::DeadlineExceededError("no line from child");
    pollfd p{stdout_fd_, POLLIN, 0};
    if (::poll(&p, 1, ms) <= 0) continue;
    char buf[256];
    ssize_t n = ::read(stdout_fd_, buf, sizeof(buf));
    if (n <= 0) return absl::UnavailableError("child closed stdout");
    buffer_.append(buf, static_cast<size_t>(n));
  }
}

absl::Status ChildProcess::Signal(int sig) {
  if (pid_ <= 0 || reaped_) return absl::FailedPreconditionError("no running child");
  if (::kill(pid_, sig) != 0) return absl::InternalError(std::strerror(errno));
  return absl::OkStatus();
}

bool ChildProcess::Exited() {
  if (reaped_) return true;
  if (pid_ <= 0) return true;
  int status = 0;
  if (::waitpid(pid_, &status, WNOHANG) == pid_) {
    reaped_ = true;
    wait_status_ = status;
  }
  return reaped_;
}

absl::StatusOr<int> ChildProcess::Wait(absl::Duration timeout) {
  if (pid_ <= 0) return absl::FailedPreconditionError("no child");
  if (reaped_) return wait_status_;
  int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
  if (pidfd < 0) return absl::InternalError("pidfd_open failed");
  absl::Time deadline = absl::Now() + timeout;
  while (!Exited()) {
    int ms = static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()));
    if (ms <= 0) {
      ::close(pidfd);
      return absl::DeadlineExceededError("child did not exit");
    }
    pollfd p{pidfd, POLLIN, 0};
    ::poll(&p, 1, ms);  // readable once the child exits
  }
  ::close(pidfd);
  return wait_status_;
}

std::string MoeCachedBinary() { return std::string(MOE_BINARY_DIR) + "/bin/moe-cached"; }
std::string LeaseHolderBinary() {
  return std::string(MOE_BINARY_DIR) + "/bin/moe_cached_lease_holder";
}

absl::Status DaemonProcess::Start(const DaemonConfig& config, absl::Duration timeout) {
  std::vector<std::string> args;
  for (const std::string& m : config.models) args.insert(args.end(), {"--model", m});
  args.insert(args.end(), {"--listen", address()});
  args.insert(args.end(), {"--metrics-addr", config.metrics ? "127.0.0.1:0" : ""});
  args = WithFlags(std::move(args), config.extra_args, {"--model"});
  absl::Status spawned = process_.Spawn(MoeCachedBinary(), args, dir_.Sub("moe-cached.stderr"));
  if (!spawned.ok()) return spawned;
  auto channel = rpc::MakeChannel(*rpc::ParseListenAddress(address()));
  auto stub = grpc::health::v1::Health::NewStub(channel);
  absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (process_.Exited()) {
      return absl::FailedPreconditionError("moe-cached exited during start: " + stderr_text());
    }
    grpc::ClientContext ctx;
    ctx.set_wait_for_ready(true);  // waits (up to the deadline) for the socket
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Milliseconds(200)));
    grpc::health::v1::HealthCheckRequest req;
    grpc::health::v1::HealthCheckResponse resp;
    if (stub->Check(&ctx, req, &resp).ok() &&
        resp.status() == grpc::health::v1::HealthCheckResponse::SERVING) {
      return absl::OkStatus();
    }
  }
  return absl::DeadlineExceededError("moe-cached not serving: " + stderr_text());
}

DaemonProcess::~DaemonProcess() {
  if (process_.pid() > 0 && !process_.Exited() && process_.Signal(SIGTERM).ok()) {
    (void)process_.Wait(absl::Seconds(10));
  }
}

std::string DaemonProcess::stderr_text() const {
  std::ifstream in(dir_.Sub("moe-cached.stderr"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::StatusOr<int> DaemonProcess::MetricsPort() const {
  std::string text = stderr_text();
  const std::string key = "metrics on port ";
  size_t at = text.find(key);
  if (at == std::string::npos) return absl::NotFoundError("no metrics port in the log");
  size_t end = text.find('\n', at);
  int port = 0;
  if (!absl::SimpleAtoi(text.substr(at + key.size(), end - at - key.size()), &port)) {
    return absl::InternalError("bad metrics port line");
  }
  return port;
}

absl::StatusOr<std::string> HttpGet(int port, const std::string& path) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError("socket failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return absl::UnavailableError(absl::StrCat("connect to port ", port, " failed"));
  }
  std::string req = absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
  if (::write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
    ::close(fd);
    return absl::InternalError("write failed");
  }
  std::string response;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof(buf))) > 0) response.append(buf, static_cast<size_t>(n));
  ::close(fd);
  size_t body = response.find("\r\n\r\n");
  if (!absl::StartsWith(response, "HTTP/1.") || body == std::string::npos ||
      response.find(" 200 ") == std::string::npos) {
    return absl::InternalError("bad HTTP response: " + response.substr(0, 200));
  }
  return response.substr(body + 4);
}

absl::StatusOr<double> MetricValue(const std::string& exposition, const std::string& sample) {
  std::optional<double> v = MetricSample(exposition, sample);
  if (!v.has_value()) return absl::NotFoundError("no sample " + sample);
  return *v;
}

}  // namespace moe::testing
