#include "services/rpc/rpc_util.h"

#include <grp.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace moe::rpc {
namespace {

using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

TEST(ListenAddressTest, ParsesUnixAndTcp) {
  auto u = ParseListenAddress("unix:/tmp/x.sock");
  ASSERT_TRUE(u.ok());
  EXPECT_TRUE(u->is_unix);
  EXPECT_EQ(u->unix_path, "/tmp/x.sock");
  EXPECT_EQ(u->Uri(), "unix:/tmp/x.sock");
  auto u2 = ParseListenAddress("unix:///run/moe/c.sock");
  ASSERT_TRUE(u2.ok());
  EXPECT_EQ(u2->unix_path, "/run/moe/c.sock");
  auto t = ParseListenAddress("127.0.0.1:0");
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE(t->is_unix);
  auto t2 = ParseListenAddress("tcp://[::1]:8080");
  ASSERT_TRUE(t2.ok());
  EXPECT_EQ(t2->host_port, "[::1]:8080");
  EXPECT_FALSE(ParseListenAddress("nonsense").ok());
  EXPECT_FALSE(ParseListenAddress("host:99999").ok());
  EXPECT_FALSE(ParseListenAddress("unix:").ok());
}

TEST(StatusConvertTest, RoundTripsCodeAndMessage) {
  absl::Status s = absl::ResourceExhaustedError("queue full");
  grpc::Status g = ToGrpcStatus(s);
  EXPECT_EQ(g.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(FromGrpcStatus(g), s);
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
}

HealthCheckResponse::ServingStatus Check(const ListenAddress& a) {
  auto stub = Health::NewStub(MakeChannel(a));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  HealthCheckRequest req;
  HealthCheckResponse resp;
  grpc::Status s = stub->Check(&ctx, req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return resp.status();
}

TEST(ServerTest, UnixSocketIsPrivateAndHealthFollowsState) {
  std::string path = absl::StrCat(::testing::TempDir(), "/rpc_test_",
                                  ::getpid(), ".sock");
  ServerOptions options;
  options.listen.push_back(*ParseListenAddress("unix:" + path));
  auto server = Server::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ListenAddress a = options.listen[0];
  (*server)->SetServing(true);
  EXPECT_EQ(Check(a), HealthCheckResponse::SERVING);
  (*server)->SetServing(false);
  EXPECT_EQ(Check(a), HealthCheckResponse::NOT_SERVING);
  (*server)->Shutdown(absl::Seconds(1));
  EXPECT_NE(::access(path.c_str(), F_OK), 0);
}

TEST(ServerTest, GroupModeAndTcpPortZero) {
  std::string path = absl::StrCat(::testing::TempDir(), "/rpc_test_g_",
                                  ::getpid(), ".sock");
  ServerOptions options;
  options.listen.push_back(*ParseListenAddress("unix:" + path));
  options.listen.push_back(*ParseListenAddress("127.0.0.1:0"));
  options.socket_mode = 0660;
  auto server = Server::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  EXPECT_GT((*server)->bound_port(), 0);
  ListenAddress tcp;
  tcp.is_unix = false;
  tcp.host_port = absl::StrCat("127.0.0.1:", (*server)->bound_port());
  (*server)->SetServing(true);
  EXPECT_EQ(Check(tcp), HealthCheckResponse::SERVING);
}

}  // namespace
}  // namespace moe::rpc

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "prometheus/counter.h"
#include "services/rpc/metrics_server.h"

namespace moe::rpc {
namespace {

std::string HttpGet(int port, const std::string& path) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return "";
  }
  std::string req = "GET " + path + " HTTP/1.0\r\nHost: x\r\n\r\n";
  ::send(fd, req.data(), req.size(), 0);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) out.append(buf, n);
  ::close(fd);
  return out;
}

TEST(MetricsServerTest, ServesRegistryAndRefusesBusyPort) {
  auto registry = std::make_shared<prometheus::Registry>();
  auto& family = prometheus::BuildCounter()
                     .Name("moe_test_events_total")
                     .Help("test")
                     .Register(*registry);
  family.Add({{"model", "tiny"}}).Increment(3);
  auto server = MetricsServer::Start("127.0.0.1:0", registry);
  ASSERT_TRUE(server.ok()) << server.status();
  int port = (*server)->port();
  ASSERT_GT(port, 0);
  std::string body = HttpGet(port, "/metrics");
  EXPECT_NE(body.find("moe_test_events_total{model=\"tiny\"} 3"),
            std::string::npos)
      << body;
  auto clash = MetricsServer::Start(absl::StrCat("127.0.0.1:", port), registry);
  EXPECT_EQ(clash.status().code(), absl::StatusCode::kUnavailable);
}

// CheckServerOptions refuses what Server::Start would, without binding.
TEST(CheckServerOptionsTest, RefusesLiveListenersAndBadPlaces) {
  ServerOptions o;
  o.listen.push_back(*ParseListenAddress("unix:/nonexistent/dir/s.sock"));
  absl::Status missing = CheckServerOptions(o);
  EXPECT_EQ(missing.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(missing.message().find("--listen unix:/nonexistent/dir/s.sock"), std::string::npos);

  // A live TCP listener (a gRPC server on port 0).
  ServerOptions live;
  live.listen.push_back(*ParseListenAddress("127.0.0.1:0"));
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(live);
  ASSERT_TRUE(server.ok()) << server.status();
  ServerOptions second;
  const std::string taken = "127.0.0.1:" + std::to_string((*server)->bound_port());
  second.listen.push_back(*ParseListenAddress(taken));
  absl::Status busy = CheckServerOptions(second);
  EXPECT_EQ(busy.code(), absl::StatusCode::kAlreadyExists) << busy;
  EXPECT_NE(busy.message().find("--listen " + taken), std::string::npos);
  EXPECT_EQ(Server::Start(second).status().code(), absl::StatusCode::kAlreadyExists);
  (*server)->Shutdown(absl::ZeroDuration());
}

// --socket-group of a group the service user is not in: chown would fail
// after loading, so the check says it first. Needs root to become nobody.
TEST(CheckServerOptionsTest, SocketGroupTheUserIsNotInIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to switch to user nobody";
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (::setgroups(0, nullptr) != 0 || ::setgid(65534) != 0 || ::setuid(65534) != 0) _exit(3);
    ServerOptions o;
    o.listen.push_back(*ParseListenAddress("unix:/tmp/moe-check-group.sock"));
    o.security.socket_group = "root";
    const absl::Status s = CheckServerOptions(o);
    _exit(s.code() == absl::StatusCode::kFailedPrecondition &&
                  s.message().find("--socket-group root") != absl::string_view::npos
              ? 0
              : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace moe::rpc
