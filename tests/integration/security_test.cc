// Security of the real processes: moe-worker and moe-cached over TCP with
// TLS (throwaway certificates from the openssl CLI), bearer tokens on Unix
// sockets (gRPC clients, moectl, and the worker's own connection to the
// daemon), socket modes and groups, and the flag errors at start.
#include <grp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/rpc/rpc_util.h"
#include "tests/common/test_util.h"
#include "moe/v1/expert_cache.grpc.pb.h"
#include "tests/moe_cached/daemon_process.h"
#include "tests/moe_worker/worker_process.h"
#include "tests/rpc/test_certs.h"

namespace moe {
namespace {

using ::moe::testing::DaemonConfig;
using ::moe::testing::DaemonProcess;
using ::moe::testing::TempDir;
using ::moe::testing::TestCerts;
using ::moe::testing::WriteTokenFile;
using ::moe::worker::testing::PortFromFile;
using ::moe::worker::testing::RunShell;
using ::moe::worker::testing::WorkerProcess;
using ::testing::HasSubstr;

const std::string kMoectl = MOE_BINARY_DIR "/bin/moectl";

std::shared_ptr<grpc::Channel> Dial(const std::string& address,
                                    const rpc::ClientSecurity& security) {
  auto channel = rpc::MakeChannel(*rpc::ParseListenAddress(address), security);
  EXPECT_TRUE(channel.ok()) << channel.status();
  return channel.ok() ? *channel : nullptr;
}

// Three greedy tokens from the worker; the call's status.
grpc::Status Generate(const std::shared_ptr<grpc::Channel>& channel, int* tokens) {
  auto stub = v1::Inference::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::GenerateRequest req;
  for (int id : {5, 6, 7}) req.add_prompt_token_ids(id);
  req.set_max_new_tokens(3);
  req.set_ignore_eos(true);
  auto reader = stub->Generate(&ctx, req);
  v1::GenerateResponse resp;
  *tokens = 0;
  while (reader->Read(&resp)) ++*tokens;
  return reader->Finish();
}

grpc::Status GetStats(const std::shared_ptr<grpc::Channel>& channel) {
  auto stub = v1::ExpertCache::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::GetStatsResponse resp;
  grpc::Status s = stub->GetStats(&ctx, v1::GetStatsRequest(), &resp);
  if (s.ok() && resp.models_size() != 1) {
    return grpc::Status(grpc::StatusCode::INTERNAL, "expected one model");
  }
  return s;
}

mode_t ModeOf(const std::string& path, gid_t* gid) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return 0;
  *gid = st.st_gid;
  return st.st_mode & 0777;
}

class SecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = dir_.Sub("tiny");
    ASSERT_TRUE(moe::testing::MakeTinyModel(model_).ok());
    certs_dir_ = dir_.Sub("certs");
    ASSERT_EQ(::mkdir(certs_dir_.c_str(), 0700), 0);
    ASSERT_TRUE(moe::testing::MakeTestCerts(certs_dir_, &certs_));
    WriteTokenFile(dir_.Sub("right.token"), "the-right-token\n");
    WriteTokenFile(dir_.Sub("wrong.token"), "the-wrong-token\n");
  }

  // A worker on a Unix socket (plus `extra`), waited for over that socket:
  // health needs no token, so this works whatever the security flags.
  void StartWorker(WorkerProcess& w, const std::string& name,
                   std::vector<std::string> extra) {
    std::vector<std::string> args = {
        "--model", model_, "--backend", "cpu", "--metrics-addr", "",
        "--listen", Unix(name), "--port-file", dir_.Sub(name + ".ports")};
    args = moe::testing::WithFlags(std::move(args), extra);
    ASSERT_TRUE(w.Spawn(args, dir_.Sub(name + ".log")));
    ASSERT_TRUE(w.WaitServing(Unix(name))) << w.Log();
  }
  std::string Unix(const std::string& name) const { return "unix:" + dir_.Sub(name + ".sock"); }
  std::string TlsFlags() const {
    return absl::StrCat(" --tls-cert ", certs_.server_cert(), " --tls-key ", certs_.server_key());
  }

  TempDir dir_;
  std::string model_;
  std::string certs_dir_;
  TestCerts certs_;
};

TEST_F(SecurityTest, WorkerServesTlsOnTcpOnly) {
  WorkerProcess w;
  StartWorker(w, "w", {"--listen", "127.0.0.1:0", "--tls-cert", certs_.server_cert(),
                       "--tls-key", certs_.server_key()});
  const int port = PortFromFile(dir_.Sub("w.ports"), "grpc_port");
  ASSERT_GT(port, 0);
  const std::string tcp = absl::StrCat("127.0.0.1:", port);
  int tokens = 0;

  rpc::ClientSecurity trusted;
  trusted.tls_ca = certs_.ca();
  grpc::Status s = Generate(Dial(tcp, trusted), &tokens);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(tokens, 3);
  rpc::ClientSecurity other;
  other.tls_ca = certs_.other_ca();
  EXPECT_EQ(Generate(Dial(tcp, other), &tokens).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(tokens, 0);
  EXPECT_EQ(Generate(rpc::MakeChannel(*rpc::ParseListenAddress(tcp)), &tokens).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  // The Unix socket stays plaintext.
  EXPECT_TRUE(Generate(rpc::MakeChannel(*rpc::ParseListenAddress(Unix("w"))), &tokens).ok());

  int code = -1;
  const std::string req = " --prompt-ids 5,6,7 --max-new-tokens 3 --ignore-eos --json";
  std::string out = RunShell(kMoectl + " generate --target " + tcp + req + " --tls-ca " + certs_.ca() +
                            " --tls-server-name localhost",
                        &code);
  EXPECT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr("finish_reason"));
  out = RunShell(kMoectl + " generate --target " + tcp + req + " --tls-ca " + certs_.other_ca(), &code);
  EXPECT_EQ(code, 1) << out;
  out = RunShell(kMoectl + " generate --target " + tcp + req, &code);
  EXPECT_EQ(code, 1) << out;
}

TEST_F(SecurityTest, WorkerRequiresTheBearerTokenButNotForHealth) {
  WorkerProcess w;
  // WaitServing's health probe carries no token.
  StartWorker(w, "t", {"--auth-token-file", dir_.Sub("right.token")});
  int tokens = 0;
  grpc::Status s = Generate(rpc::MakeChannel(*rpc::ParseListenAddress(Unix("t"))), &tokens);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
  rpc::ClientSecurity wrong;
  wrong.auth_token_file = dir_.Sub("wrong.token");
  EXPECT_EQ(Generate(Dial(Unix("t"), wrong), &tokens).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  rpc::ClientSecurity right;
  right.auth_token_file = dir_.Sub("right.token");
  s = Generate(Dial(Unix("t"), right), &tokens);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(tokens, 3);

  int code = -1;
  const std::string gen =
      kMoectl + " generate --target " + Unix("t") + " --prompt-ids 5,6,7 --max-new-tokens 2";
  std::string out = RunShell(gen, &code);
  EXPECT_EQ(code, 1) << out;
  EXPECT_THAT(out, HasSubstr("UNAUTHENTICATED"));
  out = RunShell(gen + " --auth-token-file " + dir_.Sub("right.token"), &code);
  EXPECT_EQ(code, 0) << out;
}

TEST_F(SecurityTest, WorkerTokenOverTlsOnTcp) {
  WorkerProcess w;
  StartWorker(w, "x", {"--listen", "127.0.0.1:0", "--tls-cert", certs_.server_cert(),
                       "--tls-key", certs_.server_key(), "--auth-token-file",
                       dir_.Sub("right.token")});
  const std::string tcp =
      absl::StrCat("127.0.0.1:", PortFromFile(dir_.Sub("x.ports"), "grpc_port"));
  rpc::ClientSecurity c;
  c.tls_ca = certs_.ca();
  int tokens = 0;
  EXPECT_EQ(Generate(Dial(tcp, c), &tokens).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  c.auth_token_file = dir_.Sub("right.token");
  grpc::Status s = Generate(Dial(tcp, c), &tokens);
  EXPECT_TRUE(s.ok()) << s.error_message();
}

TEST_F(SecurityTest, SocketModeIs0600UnlessAGroupIsGiven) {
  gid_t gid = 0;
  {
    WorkerProcess w;
    StartWorker(w, "d", {});
    EXPECT_EQ(ModeOf(dir_.Sub("d.sock"), &gid), 0600u);
  }
  group* primary = ::getgrgid(::getegid());
  ASSERT_NE(primary, nullptr);
  const std::string group_name = primary->gr_name;
  WorkerProcess w;
  StartWorker(w, "g", {"--socket-group", group_name});
  EXPECT_EQ(ModeOf(dir_.Sub("g.sock"), &gid), 0660u);
  EXPECT_EQ(gid, ::getegid());

  DaemonProcess daemon(dir_);
  DaemonConfig c;
  c.models = {model_};
  c.extra_args = {"--socket-group", group_name};
  absl::Status started = daemon.Start(c);
  ASSERT_TRUE(started.ok()) << started;
  EXPECT_EQ(ModeOf(daemon.socket_path(), &gid), 0660u);
  EXPECT_EQ(gid, ::getegid());
}

TEST_F(SecurityTest, BadSecurityFlagsStopTheProcessesAtStart) {
  struct Case {
    std::vector<std::string> flags;
    std::string message;
  };
  WriteTokenFile(dir_.Sub("open.token"), "tok", 0644);
  WriteTokenFile(dir_.Sub("empty.token"), "", 0600);
  const std::vector<Case> cases = {
      {{"--socket-group", "no-such-group-moecache"}, "no group named 'no-such-group-moecache'"},
      {{"--tls-cert", certs_.server_cert()}, "--tls-cert needs --tls-key"},
      {{"--auth-token-file", dir_.Sub("open.token")}, "mode 0644"},
      {{"--auth-token-file", dir_.Sub("empty.token")}, "is empty"},
  };
  for (const Case& c : cases) {
    WorkerProcess w;
    std::vector<std::string> args = {"--model", model_, "--listen", Unix("bad")};
    args.insert(args.end(), c.flags.begin(), c.flags.end());
    ASSERT_TRUE(w.Spawn(args, dir_.Sub("bad.log")));
    EXPECT_EQ(w.Wait(), 2) << c.message;
    EXPECT_THAT(w.Log(), HasSubstr(c.message));

    WorkerProcess d;  // moe-cached, same parser rules
    args = {"--model", model_, "--listen", Unix("badd"), "--metrics-addr", ""};
    args.insert(args.end(), c.flags.begin(), c.flags.end());
    ASSERT_TRUE(d.Spawn(args, dir_.Sub("badd.log"), moe::worker::testing::CachedBinary()));
    EXPECT_EQ(d.Wait(), 2) << c.message;
    EXPECT_THAT(d.Log(), HasSubstr(c.message));
  }
  // A token needs TLS on TCP listeners: refused when the server starts.
  WorkerProcess w;
  ASSERT_TRUE(w.Spawn({"--model", model_, "--backend", "cpu", "--metrics-addr", "", "--listen",
                       "127.0.0.1:0", "--auth-token-file", dir_.Sub("right.token")},
                      dir_.Sub("tcp.log")));
  EXPECT_EQ(w.Wait(), rpc::kExitConfig);  // a configuration error: no restart
  EXPECT_THAT(w.Log(), HasSubstr("needs --tls-cert and --tls-key"));
}

TEST_F(SecurityTest, DaemonTokenForMoectlAndTheWorker) {
  DaemonProcess daemon(dir_);
  DaemonConfig c;
  c.models = {model_};
  c.extra_args = {"--auth-token-file", dir_.Sub("right.token")};
  absl::Status started = daemon.Start(c);  // health probe, no token
  ASSERT_TRUE(started.ok()) << started;

  EXPECT_EQ(GetStats(rpc::MakeChannel(*rpc::ParseListenAddress(daemon.address()))).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  int code = -1;
  std::string out = RunShell(kMoectl + " stats --json --cache " + daemon.address(), &code);
  EXPECT_EQ(code, 1) << out;
  EXPECT_THAT(out, HasSubstr("UNAUTHENTICATED"));
  out = RunShell(kMoectl + " stats --json --cache " + daemon.address() + " --auth-token-file " +
                dir_.Sub("wrong.token"),
            &code);
  EXPECT_EQ(code, 1) << out;
  out = RunShell(kMoectl + " stats --json --cache " + daemon.address() + " --auth-token-file " +
                dir_.Sub("right.token"),
            &code);
  EXPECT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr("\"model\":\"tiny\""));

  // A worker without the token cannot attach; with it, it serves.
  WorkerProcess refused;
  ASSERT_TRUE(refused.Spawn({"--model", model_, "--backend", "cpu", "--metrics-addr", "",
                             "--listen", Unix("r"), "--cache", daemon.address()},
                            dir_.Sub("r.log")));
  EXPECT_EQ(refused.Wait(), 1);
  EXPECT_THAT(refused.Log(), HasSubstr("UNAUTHENTICATED"));
  WorkerProcess w;
  StartWorker(w, "c", {"--cache", daemon.address(), "--cache-auth-token-file",
                       dir_.Sub("right.token")});
  int tokens = 0;
  grpc::Status s = Generate(rpc::MakeChannel(*rpc::ParseListenAddress(Unix("c"))), &tokens);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(tokens, 3);
}

// A free TCP port for the daemon (which does not report port 0 back before
// serving): held with SO_REUSEPORT, which gRPC's listener also sets, so the
// daemon can bind it while no one else takes it.
class HeldPort {
 public:
  HeldPort() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
      port_ = ntohs(a.sin_port);
    }
  }
  ~HeldPort() { ::close(fd_); }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

TEST_F(SecurityTest, DaemonServesTlsOnTcp) {
  HeldPort held;
  ASSERT_GT(held.port(), 0);
  const std::string tcp = absl::StrCat("127.0.0.1:", held.port());
  moe::testing::ChildProcess daemon;
  ASSERT_TRUE(daemon
                  .Spawn(moe::testing::MoeCachedBinary(),
                         {"--model", model_, "--listen", tcp, "--metrics-addr", "", "--tls-cert",
                          certs_.server_cert(), "--tls-key", certs_.server_key()},
                         dir_.Sub("tls-daemon.log"))
                  .ok());
  rpc::ClientSecurity trusted;
  trusted.tls_ca = certs_.ca();
  auto channel = Dial(tcp, trusted);
  ASSERT_TRUE(channel->WaitForConnected(std::chrono::system_clock::now() +
                                        std::chrono::seconds(30)))
      << moe::testing::ReadText(dir_.Sub("tls-daemon.log"));
  grpc::Status s = GetStats(channel);
  EXPECT_TRUE(s.ok()) << s.error_message();
  rpc::ClientSecurity other;
  other.tls_ca = certs_.other_ca();
  EXPECT_EQ(GetStats(Dial(tcp, other)).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(GetStats(rpc::MakeChannel(*rpc::ParseListenAddress(tcp))).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  int code = -1;
  std::string out =
      RunShell(kMoectl + " stats --json --cache " + tcp + " --tls-ca " + certs_.ca(), &code);
  EXPECT_EQ(code, 0) << out;
  ASSERT_TRUE(daemon.Signal(SIGTERM).ok());
  absl::StatusOr<int> status = daemon.Wait(absl::Seconds(30));
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0);
}

}  // namespace
}  // namespace moe
