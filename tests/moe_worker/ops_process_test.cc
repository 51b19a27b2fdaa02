// Operating the real binaries (issue 18): a second service on a live socket
// leaves the first working, configuration errors come before anything is
// loaded, and the worker's health follows its daemon.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/rpc/rpc_util.h"
#include "tests/common/test_util.h"
#include "tests/moe_worker/worker_process.h"
#include "tests/moe_worker/worker_test_util.h"

namespace moe::worker {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using moe::rpc::kExitConfig;
using testing::CachedBinary;
using testing::RunShell;
using testing::WaitFor;
using testing::WorkerProcess;
using HealthStatus = grpc::health::v1::HealthCheckResponse::ServingStatus;
using Clock = std::chrono::steady_clock;

// The health of the server at `address` (a fresh channel each time, so no
// reconnect backoff is carried over); UNKNOWN when it does not answer.
HealthStatus Health(const std::string& address) {
  auto parsed = rpc::ParseListenAddress(address);
  if (!parsed.ok()) return grpc::health::v1::HealthCheckResponse::UNKNOWN;
  auto stub = grpc::health::v1::Health::NewStub(rpc::MakeChannel(*parsed));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
  grpc::health::v1::HealthCheckRequest req;
  grpc::health::v1::HealthCheckResponse resp;
  if (!stub->Check(&ctx, req, &resp).ok()) return grpc::health::v1::HealthCheckResponse::UNKNOWN;
  return resp.status();
}

ino_t Inode(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0 ? st.st_ino : 0;
}

class OpsProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(moe::testing::MakeTinyModel(dir_.Sub("tiny")).ok());
    cache_ = "unix:" + dir_.Sub("c.sock");
    worker_sock_ = "unix:" + dir_.Sub("w.sock");
  }

  std::vector<std::string> DaemonArgs(const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {"--model", dir_.Sub("tiny"), "--listen", cache_,
                                     "--metrics-addr", "", "--cache-experts", "16",
                                     "--policy", "lru"};
    args = moe::testing::WithFlags(std::move(args), extra, {"--model"});  // moe-cached
    return args;
  }

  void StartDaemon(WorkerProcess& p, const std::string& log) {
    ASSERT_TRUE(p.Spawn(DaemonArgs(), dir_.Sub(log), CachedBinary()));
    ASSERT_TRUE(p.WaitServing(cache_)) << p.Log();
  }

  std::vector<std::string> WorkerArgs(const std::string& listen,
                                      const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {"--model", dir_.Sub("tiny"), "--listen", listen,
                                     "--backend", "cpu", "--metrics-addr", ""};
    args = moe::testing::WithFlags(std::move(args), extra);
    return args;
  }

  static grpc::Status Generate(const std::string& address, int n = 4) {
    auto stub = v1::Inference::NewStub(rpc::MakeChannel(*rpc::ParseListenAddress(address)));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    v1::GenerateRequest r;
    for (int32_t id : {11, 22, 33}) r.add_prompt_token_ids(id);
    r.set_max_new_tokens(n);
    r.set_ignore_eos(true);
    auto reader = stub->Generate(&ctx, r);
    v1::GenerateResponse resp;
    int got = 0;
    while (reader->Read(&resp)) ++got;
    grpc::Status s = reader->Finish();
    if (s.ok() && got != n) return grpc::Status(grpc::StatusCode::INTERNAL, "short stream");
    return s;
  }

  // Exit code of a process expected to fail at start (-2 when it is still
  // running after 20 s: it started), and its log.
  int ExpectStartFailure(const std::string& binary, const std::vector<std::string>& args,
                         const std::string& log, std::string* text) {
    WorkerProcess p;
    EXPECT_TRUE(p.Spawn(args, dir_.Sub(log), binary));
    const bool exited = WaitFor([&] { return p.Exited(); });
    *text = p.Log();
    return exited ? p.Wait() : -2;
  }

  moe::testing::TempDir dir_;
  std::string cache_, worker_sock_;
};

// Point 1: a second worker on a live socket is refused, naming the pid, and
// the first keeps its socket (same inode) and keeps serving.
TEST_F(OpsProcessTest, SecondWorkerOnALiveSocketLeavesTheFirstWorking) {
  WorkerProcess first;
  ASSERT_TRUE(first.Spawn(WorkerArgs(worker_sock_), dir_.Sub("w1.log")));
  ASSERT_TRUE(first.WaitServing(worker_sock_)) << first.Log();
  const ino_t inode = Inode(dir_.Sub("w.sock"));
  ASSERT_NE(inode, 0u);

  std::string log;
  EXPECT_EQ(ExpectStartFailure(testing::WorkerBinary(), WorkerArgs(worker_sock_), "w2.log", &log),
            1);
  EXPECT_THAT(log, HasSubstr("--listen " + worker_sock_));
  EXPECT_THAT(log, HasSubstr("(moe-worker) already serves"));
  EXPECT_EQ(Inode(dir_.Sub("w.sock")), inode);
  EXPECT_EQ(Health(worker_sock_), grpc::health::v1::HealthCheckResponse::SERVING);
  grpc::Status s = Generate(worker_sock_);
  EXPECT_TRUE(s.ok()) << s.error_message();
}

// Point 1, on TCP: gRPC listens with SO_REUSEPORT, so a second worker would
// have shared the port (and taken half of the connections).
TEST_F(OpsProcessTest, SecondWorkerOnALiveTcpPortIsRefused) {
  WorkerProcess first;
  ASSERT_TRUE(first.Spawn(WorkerArgs(worker_sock_, {"--listen", "127.0.0.1:0", "--port-file",
                                                    dir_.Sub("ports.json")}),
                          dir_.Sub("w1.log")));
  ASSERT_TRUE(first.WaitServing(worker_sock_)) << first.Log();
  const int port = testing::PortFromFile(dir_.Sub("ports.json"), "grpc_port");
  ASSERT_GT(port, 0);
  const std::string tcp = "127.0.0.1:" + std::to_string(port);
  std::string log;
  EXPECT_EQ(ExpectStartFailure(testing::WorkerBinary(),
                               WorkerArgs("unix:" + dir_.Sub("w2.sock"), {"--listen", tcp}),
                               "w2.log", &log),
            1);
  EXPECT_THAT(log, HasSubstr("--listen " + tcp + ": another process already listens on port"));
  grpc::Status s = Generate(tcp);
  EXPECT_TRUE(s.ok()) << s.error_message();
}

// Point 1: a socket left by a killed worker is still replaced.
TEST_F(OpsProcessTest, StaleSocketOfAKilledWorkerIsReplaced) {
  WorkerProcess first;
  ASSERT_TRUE(first.Spawn(WorkerArgs(worker_sock_), dir_.Sub("w1.log")));
  ASSERT_TRUE(first.WaitServing(worker_sock_)) << first.Log();
  first.Signal(SIGKILL);
  first.Wait();
  ASSERT_NE(Inode(dir_.Sub("w.sock")), 0u);  // left behind
  WorkerProcess second;
  ASSERT_TRUE(second.Spawn(WorkerArgs(worker_sock_), dir_.Sub("w2.log")));
  ASSERT_TRUE(second.WaitServing(worker_sock_)) << second.Log();
  grpc::Status s = Generate(worker_sock_);
  EXPECT_TRUE(s.ok()) << s.error_message();
}

// Point 1: a second moe-cached on a live socket is refused and leaves the
// first daemon's sockets (gRPC and .fds) alone: a worker attaches after.
TEST_F(OpsProcessTest, SecondDaemonOnALiveSocketLeavesTheFirstWorking) {
  WorkerProcess daemon;
  StartDaemon(daemon, "c1.log");
  const ino_t grpc_inode = Inode(dir_.Sub("c.sock"));
  const ino_t fds_inode = Inode(dir_.Sub("c.sock.fds"));
  ASSERT_NE(fds_inode, 0u);

  std::string log;
  EXPECT_EQ(ExpectStartFailure(CachedBinary(), DaemonArgs(), "c2.log", &log), 1);
  EXPECT_THAT(log, HasSubstr("--listen " + cache_));
  EXPECT_THAT(log, HasSubstr("(moe-cached) already serves"));
  EXPECT_THAT(log, Not(HasSubstr("loaded experts")));  // refused before loading
  EXPECT_EQ(Inode(dir_.Sub("c.sock")), grpc_inode);
  EXPECT_EQ(Inode(dir_.Sub("c.sock.fds")), fds_inode);

  WorkerProcess worker;
  ASSERT_TRUE(worker.Spawn(WorkerArgs(worker_sock_, {"--cache", cache_, "--cache-wait", "0"}),
                           dir_.Sub("w.log")));
  ASSERT_TRUE(worker.WaitServing(worker_sock_)) << worker.Log();
  grpc::Status s = Generate(worker_sock_);
  EXPECT_TRUE(s.ok()) << s.error_message() << "\n" << worker.Log();
}

// Point 2: configuration errors exit non-zero before any expert is read,
// naming the flag and the value given.
TEST_F(OpsProcessTest, DaemonConfigurationErrorsComeBeforeLoading) {
  // A TCP port in use, for --metrics-addr.
  const moe::testing::BusyLoopbackPort busy;
  ASSERT_GT(busy.port(), 0);
  const std::string busy_addr = "127.0.0.1:" + std::to_string(busy.port());

  // A wrong flag exits 78 (EX_CONFIG: systemd stops restarting); a port
  // somebody else holds may free up, so that one exits 1 (restart).
  struct Case {
    std::vector<std::string> flags;
    std::vector<std::string> expect;
    int code;
  };
  const std::vector<Case> cases = {
      {{"--policy", "lfru"}, {"--policy lfru", "unknown policy"}, kExitConfig},
      {{"--policy", "LRU"}, {"--policy LRU", "unknown policy"}, kExitConfig},
      {{"--listen", "unix:/nonexistent/dir/c.sock"},
       {"--listen unix:/nonexistent/dir/c.sock", "/nonexistent/dir does not exist"},
       kExitConfig},
      {{"--metrics-addr", busy_addr}, {"--metrics-addr " + busy_addr, "Address already in use"}, 1},
      {{"--state-dir", "/proc/moecache-state"}, {"--state-dir /proc/moecache-state"}, kExitConfig},
  };
  int i = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.flags[0] + " " + c.flags[1]);
    std::string log;
    EXPECT_EQ(ExpectStartFailure(CachedBinary(), DaemonArgs(c.flags),
                                 "bad" + std::to_string(i++) + ".log", &log),
              c.code);
    for (const std::string& e : c.expect) EXPECT_THAT(log, HasSubstr(e));
    EXPECT_THAT(log, Not(HasSubstr("loaded experts")));
    EXPECT_THAT(log, Not(HasSubstr("loading experts")));
    EXPECT_THAT(log, Not(HasSubstr(".fds")));
  }
}

TEST_F(OpsProcessTest, WorkerConfigurationErrorsNameTheFlag) {
  std::string log;
  EXPECT_EQ(ExpectStartFailure(testing::WorkerBinary(),
                               WorkerArgs("unix:/nonexistent/dir/w.sock"), "w1.log", &log),
            kExitConfig);
  EXPECT_THAT(log, HasSubstr("--listen unix:/nonexistent/dir/w.sock"));
  EXPECT_THAT(log, HasSubstr("does not exist"));
  EXPECT_EQ(ExpectStartFailure(testing::WorkerBinary(),
                               WorkerArgs(worker_sock_, {"--cache", "tcp://127.0.0.1:1"}),
                               "w2.log", &log),
            kExitConfig);
  EXPECT_THAT(log, HasSubstr("--cache"));
}

// Point 3: the worker's health goes NOT_SERVING within 1 s of its daemon
// dying, and SERVING again once the daemon is back; requests work again.
TEST_F(OpsProcessTest, WorkerHealthFollowsItsDaemon) {
  auto daemon = std::make_unique<WorkerProcess>();
  StartDaemon(*daemon, "c1.log");
  WorkerProcess worker;
  ASSERT_TRUE(worker.Spawn(WorkerArgs(worker_sock_, {"--cache", cache_}), dir_.Sub("w.log")));
  ASSERT_TRUE(worker.WaitServing(worker_sock_)) << worker.Log();
  ASSERT_TRUE(Generate(worker_sock_).ok());

  daemon->Signal(SIGKILL);
  daemon->Wait();
  const auto killed = Clock::now();
  ASSERT_TRUE(WaitFor([&] {
    return Health(worker_sock_) == grpc::health::v1::HealthCheckResponse::NOT_SERVING;
  })) << worker.Log();
  EXPECT_LT(Clock::now() - killed, std::chrono::seconds(1));
  EXPECT_THAT(worker.Log(), HasSubstr("health NOT_SERVING"));

  daemon = std::make_unique<WorkerProcess>();
  StartDaemon(*daemon, "c2.log");
  ASSERT_TRUE(WaitFor([&] {
    return Health(worker_sock_) == grpc::health::v1::HealthCheckResponse::SERVING;
  })) << worker.Log();
  EXPECT_THAT(worker.Log(), HasSubstr("health SERVING"));
  grpc::Status s = Generate(worker_sock_);
  EXPECT_TRUE(s.ok()) << s.error_message() << "\n" << worker.Log();
}

// The datagrams a service sends to $NOTIFY_SOCKET (as under systemd).
class NotifySocket {
 public:
  explicit NotifySocket(const std::string& path) : path_(path) {
    fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    timeval tv{0, 100 * 1000};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  }
  ~NotifySocket() { ::close(fd_); }
  // Everything received so far (reads what is waiting, 100 ms at most).
  const std::string& Received() {
    char buf[4096];
    ssize_t n;
    while ((n = ::recv(fd_, buf, sizeof(buf), 0)) > 0) received_.append(buf, n).append("\n");
    return received_;
  }

 private:
  std::string path_;
  int fd_ = -1;
  std::string received_;
};

// Point 3: a worker started 3 s before its daemon waits for it (logging what
// it waits for, and telling systemd) and serves once the daemon is up.
TEST_F(OpsProcessTest, WorkerStartedBeforeItsDaemonServesOnceItIsUp) {
  NotifySocket notify(dir_.Sub("notify.sock"));
  ::setenv("NOTIFY_SOCKET", dir_.Sub("notify.sock").c_str(), 1);
  WorkerProcess worker;
  const auto spawned = Clock::now();
  ASSERT_TRUE(worker.Spawn(WorkerArgs(worker_sock_, {"--cache", cache_, "--cache-wait", "60"}),
                           dir_.Sub("w.log")));
  ::unsetenv("NOTIFY_SOCKET");
  ASSERT_TRUE(WaitFor([&] { return worker.Log().find("waiting for moe-cached") !=
                                   std::string::npos; }))
      << worker.Log();
  // The scenario, not a synchronisation: the daemon comes up 3 s later.
  std::this_thread::sleep_until(spawned + std::chrono::seconds(3));
  ASSERT_FALSE(worker.Exited()) << worker.Log();
  WorkerProcess daemon;
  StartDaemon(daemon, "c.log");
  ASSERT_TRUE(worker.WaitServing(worker_sock_, std::chrono::seconds(20))) << worker.Log();
  grpc::Status s = Generate(worker_sock_);
  EXPECT_TRUE(s.ok()) << s.error_message();
  ASSERT_TRUE(WaitFor([&] { return notify.Received().find("READY=1") != std::string::npos; }));
  EXPECT_THAT(notify.Received(), HasSubstr("STATUS=waiting for moe-cached at " + cache_));
}

// Point 3: the wait is bounded.
TEST_F(OpsProcessTest, WorkerGivesUpAfterCacheWait) {
  std::string log;
  EXPECT_EQ(ExpectStartFailure(testing::WorkerBinary(),
                               WorkerArgs(worker_sock_, {"--cache", cache_, "--cache-wait", "1"}),
                               "w.log", &log),
            1);
  EXPECT_THAT(log, HasSubstr("waiting for moe-cached at " + cache_));
  EXPECT_THAT(log, HasSubstr("gave up after --cache-wait 1 s: start moe-cached first"));
}

// Point 5: --version on all three binaries names the revision and the CUDA
// module's state.
TEST_F(OpsProcessTest, VersionNamesRevisionAndCuda) {
  for (const std::string name : {"moe-cached", "moe-worker", "moectl"}) {
    SCOPED_TRACE(name);
    int code = -1;
    const std::string out = RunShell(std::string(MOE_BINARY_DIR) + "/bin/" + name + " --version", &code);
    EXPECT_EQ(code, 0) << out;
    EXPECT_THAT(out, HasSubstr(name + " 0.1.0 (git "));
    EXPECT_THAT(out, Not(HasSubstr("(git unknown)")));
    EXPECT_THAT(out, HasSubstr("cuda module: "));
  }
}

// Point 5: --log-level (any case) and MOE_LOG_LEVEL; a bad value names the
// flag.
TEST_F(OpsProcessTest, LogLevelFlagAndVariable) {
  const std::string worker = testing::WorkerBinary();
  int code = -1;
  std::string out = RunShell(worker + " --model " + dir_.Sub("tiny") + " --log-level loud", &code);
  EXPECT_EQ(code, 2);
  EXPECT_THAT(out, HasSubstr("--log-level: want debug, info, warning or error, got 'loud'"));
  out = RunShell(CachedBinary() + " --model " + dir_.Sub("tiny") + " --log-level loud", &code);
  EXPECT_EQ(code, 2);  // one flag, one message in every binary (common/flags.h)
  EXPECT_THAT(out, HasSubstr("--log-level: want debug, info, warning or error, got 'loud'"));
  out = RunShell(std::string(MOE_BINARY_DIR) + "/bin/moectl --log-level loud info", &code);
  EXPECT_EQ(code, 2);
  EXPECT_THAT(out, HasSubstr("--log-level"));

  // A configuration error is an ERROR line: it survives WARNING, while the
  // INFO start-up line does not; with debug (lower case, from the
  // environment) the start-up line is there.
  const std::string bad = " --model " + dir_.Sub("tiny") + " --metrics-addr '' --policy nope";
  out = RunShell(CachedBinary() + bad + " --log-level WARNING", &code);
  EXPECT_EQ(code, kExitConfig);
  EXPECT_THAT(out, HasSubstr("--policy nope"));
  EXPECT_THAT(out, Not(HasSubstr("starting")));
  out = RunShell("MOE_LOG_LEVEL=debug " + CachedBinary() + bad, &code);
  EXPECT_EQ(code, kExitConfig);
  EXPECT_THAT(out, HasSubstr("moe-cached 0.1.0"));
}

// Point 5: one info line per finished request with its numbers.
TEST_F(OpsProcessTest, OneLogLinePerFinishedRequest) {
  WorkerProcess worker;
  ASSERT_TRUE(worker.Spawn(WorkerArgs(worker_sock_), dir_.Sub("w.log")));
  ASSERT_TRUE(worker.WaitServing(worker_sock_)) << worker.Log();
  ASSERT_TRUE(Generate(worker_sock_, 5).ok());
  ASSERT_TRUE(WaitFor([&] { return worker.Log().find("finished:") != std::string::npos; }));
  const std::string log = worker.Log();
  EXPECT_THAT(log, HasSubstr("request 1 finished: prompt_tokens=3 generated_tokens=5 ttft_ms="));
  EXPECT_THAT(log, HasSubstr(" tpot_ms="));
  EXPECT_THAT(log, HasSubstr(" expert_hits="));
  EXPECT_THAT(log, HasSubstr(" expert_misses="));
  EXPECT_THAT(log, HasSubstr(" stall_ms="));
  EXPECT_THAT(log, HasSubstr(" finish=length"));
}

// Issue 29 item 4: a throwaway prompt warms the engine (and moe-cached's
// cost model) before the worker serves; no client sees it: no request log
// line, and the first client request is request 1.
TEST_F(OpsProcessTest, WarmUpRunsBeforeServingUnseen) {
  WorkerProcess daemon;
  StartDaemon(daemon, "c.log");
  WorkerProcess worker;
  ASSERT_TRUE(worker.Spawn(WorkerArgs(worker_sock_, {"--cache", cache_}), dir_.Sub("w.log")));
  ASSERT_TRUE(worker.WaitServing(worker_sock_)) << worker.Log();
  std::string log = worker.Log();
  EXPECT_THAT(log, HasSubstr("warm-up: "));
  EXPECT_THAT(log, HasSubstr(" prompt tokens in "));
  EXPECT_THAT(log, Not(HasSubstr("finished:")));
  ASSERT_TRUE(Generate(worker_sock_, 3).ok());
  ASSERT_TRUE(WaitFor([&] { return worker.Log().find("finished:") != std::string::npos; }));
  log = worker.Log();
  EXPECT_THAT(log, HasSubstr("request 1 finished: prompt_tokens=3 generated_tokens=3"));
  EXPECT_EQ(log.find("finished:"), log.rfind("finished:")) << log;

  WorkerProcess cold;
  const std::string cold_sock = "unix:" + dir_.Sub("w2.sock");
  ASSERT_TRUE(cold.Spawn(WorkerArgs(cold_sock, {"--cache", cache_, "--warmup-tokens", "0"}),
                         dir_.Sub("w2.log")));
  ASSERT_TRUE(cold.WaitServing(cold_sock)) << cold.Log();
  EXPECT_THAT(cold.Log(), Not(HasSubstr("warm-up")));
}

}  // namespace
}  // namespace moe::worker
