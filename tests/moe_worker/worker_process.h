// Runs the real moe-worker binary for tests: spawn with flags, wait until
// health says SERVING (polling the health service, no fixed sleeps), talk
// to it, signal it, reap it.
#ifndef MOECACHE_TESTS_MOE_WORKER_WORKER_PROCESS_H_
#define MOECACHE_TESTS_MOE_WORKER_WORKER_PROCESS_H_

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "moe/v1/inference.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "services/rpc/rpc_util.h"
#include "tests/common/test_util.h"

extern char** environ;

namespace moe::worker::testing {

inline std::string WorkerBinary() { return MOE_BINARY_DIR "/bin/moe-worker"; }
inline std::string CachedBinary() { return MOE_BINARY_DIR "/bin/moe-cached"; }

class WorkerProcess {
 public:
  ~WorkerProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      int status = 0;
      ::waitpid(pid_, &status, 0);
    }
  }

  // Spawns `binary` (moe-worker by default) with `args`; its stdout+stderr
  // go to `log_path`.
  bool Spawn(const std::vector<std::string>& args, const std::string& log_path,
             const std::string& binary = WorkerBinary()) {
    log_path_ = log_path;
    std::vector<std::string> argv_s = {binary};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, log_path.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    int rc = posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(),
                         environ);
    posix_spawn_file_actions_destroy(&actions);
    return rc == 0;
  }

  // Polls the health service on `address` until SERVING, or until the
  // process exits or `timeout` passes.
  bool WaitServing(const std::string& address,
                   std::chrono::seconds timeout = std::chrono::seconds(60)) {
    auto parsed = rpc::ParseListenAddress(address);
    if (!parsed.ok()) return false;
    auto channel = rpc::MakeChannel(*parsed);
    auto stub = grpc::health::v1::Health::NewStub(channel);
    const auto end = std::chrono::system_clock::now() + timeout;
    while (std::chrono::system_clock::now() < end) {
      if (Exited()) return false;
      channel->WaitForConnected(std::chrono::system_clock::now() +
                                std::chrono::milliseconds(200));
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(2));
      grpc::health::v1::HealthCheckRequest req;
      grpc::health::v1::HealthCheckResponse resp;
      if (stub->Check(&ctx, req, &resp).ok() &&
          resp.status() == grpc::health::v1::HealthCheckResponse::SERVING) {
        return true;
      }
    }
    return false;
  }

  bool Exited() {
    if (pid_ <= 0) return true;
    int status = 0;
    pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      pid_ = -1;
      exit_status_ = status;
      return true;
    }
    return false;
  }

  void Signal(int sig) { ::kill(pid_, sig); }
  pid_t pid() const { return pid_; }  // -1 once reaped

  // Waits for exit; returns the exit code (-1 when killed by a signal).
  int Wait() {
    if (pid_ > 0) {
      ::waitpid(pid_, &exit_status_, 0);
      pid_ = -1;
    }
    return WIFEXITED(exit_status_) ? WEXITSTATUS(exit_status_) : -1;
  }

  std::string Log() const { return moe::testing::ReadText(log_path_); }

 private:
  pid_t pid_ = -1;
  int exit_status_ = 0;
  std::string log_path_;
};

// Polls `done` every 10 ms until it holds or `timeout` passes.
inline bool WaitFor(const std::function<bool()>& done,
                    std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

// Runs a shell command; its stdout (and stderr, when `with_stderr`), and its
// exit code in `*code` (-1 when killed by a signal).
inline std::string RunShell(const std::string& cmd, int* code, bool with_stderr = true) {
  std::string out;
  FILE* p = ::popen((with_stderr ? cmd + " 2>&1" : cmd).c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = ::pclose(p);
  *code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

// Ports the worker wrote to its --port-file.
inline int PortFromFile(const std::string& path, const std::string& key) {
  auto j = nlohmann::json::parse(moe::testing::ReadText(path), nullptr,
                                 /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.contains(key)) return 0;
  return j[key].get<int>();
}

// GET http://127.0.0.1:port/metrics; the body, or "" on failure.
inline std::string ScrapeMetrics(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string req =
        "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (::write(fd, req.data(), req.size()) ==
        static_cast<ssize_t>(req.size())) {
      char buf[4096];
      ssize_t n;
      while ((n = ::read(fd, buf, sizeof(buf))) > 0) out.append(buf, n);
    }
  }
  ::close(fd);
  const size_t body = out.find("\r\n\r\n");
  return body == std::string::npos ? "" : out.substr(body + 4);
}

// The value of the sample `series` (name plus labels exactly as exposed,
// e.g. `moe_worker_requests_total{status="ok"}`); -1 when absent.
inline double MetricValue(const std::string& text, const std::string& series) {
  return moe::testing::MetricSample(text, series).value_or(-1);
}

}  // namespace moe::worker::testing

#endif  // MOECACHE_TESTS_MOE_WORKER_WORKER_PROCESS_H_
