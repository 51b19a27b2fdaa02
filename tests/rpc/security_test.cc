// Security options and credentials of rpc::Server / rpc::MakeChannel, in
// process: flag parsing and validation, socket group and mode, bearer token
// on Unix sockets and over TLS, TLS and mTLS with throwaway certificates.
#include "services/rpc/security.h"

#include <grp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "moe/v1/expert_cache.grpc.pb.h"
#include "services/rpc/rpc_util.h"
#include "tests/common/test_util.h"
#include "tests/rpc/test_certs.h"

namespace moe::rpc {
namespace {

using moe::testing::TempDir;
using moe::testing::WriteTokenFile;

// GetStats answers one model named "fake" and records whether the handler
// saw the authorization metadata (it must not: the processor consumes it).
class FakeCache : public v1::ExpertCache::Service {
 public:
  grpc::Status GetStats(grpc::ServerContext* ctx, const v1::GetStatsRequest*,
                        v1::GetStatsResponse* resp) override {
    saw_authorization = ctx->client_metadata().count("authorization") > 0;
    resp->add_models()->set_model("fake");
    return grpc::Status::OK;
  }
  bool saw_authorization = false;
};

grpc::Status CallGetStats(const std::shared_ptr<grpc::Channel>& channel) {
  auto stub = v1::ExpertCache::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::GetStatsResponse resp;
  grpc::Status s = stub->GetStats(&ctx, v1::GetStatsRequest(), &resp);
  if (s.ok() && (resp.models_size() != 1 || resp.models(0).model() != "fake")) {
    return grpc::Status(grpc::StatusCode::INTERNAL, "unexpected reply");
  }
  return s;
}

grpc::Status CallHealth(const std::shared_ptr<grpc::Channel>& channel) {
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::health::v1::HealthCheckResponse resp;
  grpc::Status s = stub->Check(&ctx, grpc::health::v1::HealthCheckRequest(), &resp);
  if (s.ok() && resp.status() != grpc::health::v1::HealthCheckResponse::SERVING) {
    return grpc::Status(grpc::StatusCode::INTERNAL, "not serving");
  }
  return s;
}

std::shared_ptr<grpc::Channel> Dial(const std::string& address, const ClientSecurity& sec) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> ch =
      MakeChannel(*ParseListenAddress(address), sec);
  EXPECT_TRUE(ch.ok()) << ch.status();
  return ch.ok() ? *ch : nullptr;
}

TEST(SecurityFlagsTest, ParsesTheFiveFlagsAndOnlyThem) {
  SecurityOptions o;
  absl::Status st;
  EXPECT_TRUE(ParseSecurityFlag("socket-group", "video", &o, &st));
  EXPECT_TRUE(st.ok());
  EXPECT_TRUE(ParseSecurityFlag("tls-cert", "c.pem", &o, &st));
  EXPECT_TRUE(ParseSecurityFlag("tls-key", "k.pem", &o, &st));
  EXPECT_TRUE(ParseSecurityFlag("tls-client-ca", "ca.pem", &o, &st));
  EXPECT_TRUE(ParseSecurityFlag("auth-token-file", "t", &o, &st));
  EXPECT_EQ(o.socket_group, "video");
  EXPECT_EQ(o.tls_cert, "c.pem");
  EXPECT_EQ(o.tls_key, "k.pem");
  EXPECT_EQ(o.tls_client_ca, "ca.pem");
  EXPECT_EQ(o.auth_token_file, "t");
  st = absl::OkStatus();
  EXPECT_FALSE(ParseSecurityFlag("listen", "x", &o, &st));
  EXPECT_TRUE(st.ok());
  EXPECT_TRUE(ParseSecurityFlag("tls-cert", "", &o, &st));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(SecurityFlagsUsage().find("--auth-token-file"), std::string::npos);
}

TEST(SecurityFlagsTest, ValidationNamesWhatIsWrong) {
  TempDir dir;
  SecurityOptions o;
  EXPECT_TRUE(ValidateSecurityOptions(o).ok());
  o.tls_cert = "c.pem";
  absl::Status s = ValidateSecurityOptions(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--tls-key"), std::string::npos) << s;
  o = {};
  o.tls_key = "k.pem";
  EXPECT_EQ(ValidateSecurityOptions(o).code(), absl::StatusCode::kInvalidArgument);
  o = {};
  o.tls_client_ca = "ca.pem";
  EXPECT_EQ(ValidateSecurityOptions(o).code(), absl::StatusCode::kInvalidArgument);
  o = {};
  o.socket_group = "no-such-group-moecache";
  s = ValidateSecurityOptions(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("no-such-group-moecache"), std::string::npos) << s;

  o = {};
  o.auth_token_file = dir.Sub("open.token");
  WriteTokenFile(o.auth_token_file, "secret", 0644);
  s = ValidateSecurityOptions(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("0644"), std::string::npos) << s;
  EXPECT_NE(s.message().find("--auth-token-file"), std::string::npos) << s;
  o.auth_token_file = dir.Sub("empty.token");
  WriteTokenFile(o.auth_token_file, " \n", 0600);
  s = ValidateSecurityOptions(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("empty"), std::string::npos) << s;
  o.auth_token_file = dir.Sub("missing.token");
  EXPECT_EQ(ValidateSecurityOptions(o).code(), absl::StatusCode::kNotFound);
  o.auth_token_file = dir.Sub("good.token");
  WriteTokenFile(o.auth_token_file, "s3cret-token\n", 0600);
  EXPECT_TRUE(ValidateSecurityOptions(o).ok());
  EXPECT_EQ(*ReadAuthTokenFile(o.auth_token_file), "s3cret-token");
  WriteTokenFile(o.auth_token_file, "two words", 0600);
  EXPECT_EQ(ReadAuthTokenFile(o.auth_token_file).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SecurityFlagsTest, ConstantTimeEquals) {
  EXPECT_TRUE(ConstantTimeEquals("Bearer abc", "Bearer abc"));
  EXPECT_FALSE(ConstantTimeEquals("Bearer abc", "Bearer abd"));
  EXPECT_FALSE(ConstantTimeEquals("Bearer abc", "Bearer abcd"));
  EXPECT_FALSE(ConstantTimeEquals("", "x"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
}

TEST(SecurityFlagsTest, ClientRefusesTokenOverPlaintextTcpAndTlsOnUnix) {
  TempDir dir;
  ClientSecurity c;
  c.auth_token_file = dir.Sub("t");
  WriteTokenFile(c.auth_token_file, "tok");
  EXPECT_EQ(LoadClientCredentials(c, /*is_unix=*/false).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(LoadClientCredentials(c, /*is_unix=*/true).ok());
  c = {};
  c.tls_ca = dir.Sub("ca.pem");
  EXPECT_EQ(LoadClientCredentials(c, /*is_unix=*/true).status().code(),
            absl::StatusCode::kInvalidArgument);
  c = {};
  c.tls_cert = dir.Sub("c.pem");
  EXPECT_EQ(LoadClientCredentials(c, /*is_unix=*/false).status().code(),
            absl::StatusCode::kInvalidArgument);
}

class SecureServerTest : public ::testing::Test {
 protected:
  std::unique_ptr<Server> Start(const std::vector<std::string>& addresses,
                                const SecurityOptions& security) {
    ServerOptions o;
    for (const std::string& a : addresses) o.listen.push_back(*ParseListenAddress(a));
    o.security = security;
    o.services.push_back(&service_);
    absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(o);
    EXPECT_TRUE(server.ok()) << server.status();
    if (!server.ok()) return nullptr;
    (*server)->SetServing(true);
    return *std::move(server);
  }
  std::string Sock(const std::string& name) const { return "unix:" + dir_.Sub(name); }
  std::string Tcp(const Server& s) const { return absl::StrCat("127.0.0.1:", s.bound_port()); }

  TempDir dir_;
  FakeCache service_;
};

mode_t SocketStat(const std::string& path, gid_t* gid) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return 0;
  *gid = st.st_gid;
  return st.st_mode & 0777;
}

TEST_F(SecureServerTest, SocketIs0600ByDefaultAnd0660WithAGroup) {
  gid_t gid = 12345;
  {
    auto server = Start({Sock("a.sock")}, {});
    ASSERT_NE(server, nullptr);
    EXPECT_EQ(SocketStat(dir_.Sub("a.sock"), &gid), 0600u);
  }
  // The primary group always works; as root also a group that is not ours
  // by default, so the gid check can tell chown from no chown.
  std::vector<gid_t> groups = {::getegid()};
  if (::geteuid() == 0 && ::getgrnam("daemon") != nullptr) {
    groups.push_back(::getgrnam("daemon")->gr_gid);
  }
  for (gid_t want : groups) {
    SecurityOptions s;
    s.socket_group = ::getgrgid(want)->gr_name;
    auto server = Start({Sock("g.sock")}, s);
    ASSERT_NE(server, nullptr);
    EXPECT_EQ(SocketStat(dir_.Sub("g.sock"), &gid), 0660u);
    EXPECT_EQ(gid, want) << s.socket_group;
    EXPECT_TRUE(CallGetStats(MakeChannel(*ParseListenAddress(Sock("g.sock")))).ok());
  }
  SecurityOptions bad;
  bad.socket_group = "no-such-group-moecache";
  ServerOptions o;
  o.listen.push_back(*ParseListenAddress(Sock("b.sock")));
  o.security = bad;
  EXPECT_EQ(Server::Start(o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(SecureServerTest, BearerTokenOnUnixSocket) {
  SecurityOptions s;
  s.auth_token_file = dir_.Sub("server.token");
  WriteTokenFile(s.auth_token_file, "right-token");
  auto server = Start({Sock("t.sock")}, s);
  ASSERT_NE(server, nullptr);
  auto plain = MakeChannel(*ParseListenAddress(Sock("t.sock")));
  EXPECT_EQ(CallGetStats(plain).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(CallHealth(plain).ok());  // probes need no token

  ClientSecurity wrong;
  wrong.auth_token_file = dir_.Sub("wrong.token");
  WriteTokenFile(wrong.auth_token_file, "wrong-token");
  EXPECT_EQ(CallGetStats(Dial(Sock("t.sock"), wrong)).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  ClientSecurity prefix;  // a prefix of the right token is still wrong
  prefix.auth_token_file = dir_.Sub("prefix.token");
  WriteTokenFile(prefix.auth_token_file, "right");
  EXPECT_EQ(CallGetStats(Dial(Sock("t.sock"), prefix)).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);

  ClientSecurity right;
  right.auth_token_file = dir_.Sub("client.token");
  WriteTokenFile(right.auth_token_file, "right-token\n");
  grpc::Status ok = CallGetStats(Dial(Sock("t.sock"), right));
  EXPECT_TRUE(ok.ok()) << ok.error_message();
  EXPECT_FALSE(service_.saw_authorization);
  EXPECT_TRUE(CallHealth(Dial(Sock("t.sock"), right)).ok());

  // Any client may send the metadata itself (what Python clients do).
  auto stub = v1::ExpertCache::NewStub(plain);
  for (const char* value : {"Bearer right-token", "Bearer right-token2", "right-token"}) {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", value);
    v1::GetStatsResponse resp;
    grpc::Status s = stub->GetStats(&ctx, v1::GetStatsRequest(), &resp);
    EXPECT_EQ(s.ok(), std::string(value) == "Bearer right-token") << value;
  }
}

TEST_F(SecureServerTest, TokenClientTalksToAServerWithoutToken) {
  auto server = Start({Sock("n.sock")}, {});
  ASSERT_NE(server, nullptr);
  ClientSecurity c;
  c.auth_token_file = dir_.Sub("c.token");
  WriteTokenFile(c.auth_token_file, "tok");
  EXPECT_TRUE(CallGetStats(Dial(Sock("n.sock"), c)).ok());
}

TEST_F(SecureServerTest, TokenWithPlaintextTcpIsRefusedAtStart) {
  SecurityOptions s;
  s.auth_token_file = dir_.Sub("server.token");
  WriteTokenFile(s.auth_token_file, "tok");
  ServerOptions o;
  o.listen.push_back(*ParseListenAddress("127.0.0.1:0"));
  o.security = s;
  absl::Status st = Server::Start(o).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("--tls-cert"), std::string::npos) << st;
}

class TlsServerTest : public SecureServerTest {
 protected:
  void SetUp() override { ASSERT_TRUE(moe::testing::MakeTestCerts(dir_.path(), &certs_)); }
  moe::testing::TestCerts certs_;
};

TEST_F(TlsServerTest, TlsOnTcpWhileTheUnixSocketStaysPlaintext) {
  SecurityOptions s;
  s.tls_cert = certs_.server_cert();
  s.tls_key = certs_.server_key();
  auto server = Start({Sock("u.sock"), "127.0.0.1:0"}, s);
  ASSERT_NE(server, nullptr);
  ASSERT_GT(server->bound_port(), 0);
  const std::string tcp = Tcp(*server);

  ClientSecurity trusted;
  trusted.tls_ca = certs_.ca();
  grpc::Status ok = CallGetStats(Dial(tcp, trusted));
  EXPECT_TRUE(ok.ok()) << ok.error_message();
  ClientSecurity by_name = trusted;  // the DNS SAN, via the name override
  by_name.tls_server_name = "localhost";
  EXPECT_TRUE(CallGetStats(Dial(tcp, by_name)).ok());
  ClientSecurity wrong_name = trusted;
  wrong_name.tls_server_name = "example.com";
  EXPECT_FALSE(CallGetStats(Dial(tcp, wrong_name)).ok());
  ClientSecurity other;
  other.tls_ca = certs_.other_ca();
  EXPECT_EQ(CallGetStats(Dial(tcp, other)).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(CallGetStats(MakeChannel(*ParseListenAddress(tcp))).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  EXPECT_TRUE(CallGetStats(MakeChannel(*ParseListenAddress(Sock("u.sock")))).ok());
}

TEST_F(TlsServerTest, ClientCertificatesWhenAClientCaIsGiven) {
  SecurityOptions s;
  s.tls_cert = certs_.server_cert();
  s.tls_key = certs_.server_key();
  s.tls_client_ca = certs_.ca();
  auto server = Start({"127.0.0.1:0"}, s);
  ASSERT_NE(server, nullptr);
  const std::string tcp = Tcp(*server);
  ClientSecurity no_cert;
  no_cert.tls_ca = certs_.ca();
  EXPECT_FALSE(CallGetStats(Dial(tcp, no_cert)).ok());
  ClientSecurity rogue = no_cert;
  rogue.tls_cert = certs_.rogue_cert();
  rogue.tls_key = certs_.rogue_key();
  EXPECT_FALSE(CallGetStats(Dial(tcp, rogue)).ok());
  ClientSecurity good = no_cert;
  good.tls_cert = certs_.client_cert();
  good.tls_key = certs_.client_key();
  grpc::Status ok = CallGetStats(Dial(tcp, good));
  EXPECT_TRUE(ok.ok()) << ok.error_message();
}

TEST_F(TlsServerTest, BearerTokenOverTls) {
  SecurityOptions s;
  s.tls_cert = certs_.server_cert();
  s.tls_key = certs_.server_key();
  s.auth_token_file = dir_.Sub("server.token");
  WriteTokenFile(s.auth_token_file, "tls-token");
  auto server = Start({"127.0.0.1:0"}, s);
  ASSERT_NE(server, nullptr);
  const std::string tcp = Tcp(*server);
  ClientSecurity c;
  c.tls_ca = certs_.ca();
  EXPECT_EQ(CallGetStats(Dial(tcp, c)).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(CallHealth(Dial(tcp, c)).ok());
  c.auth_token_file = dir_.Sub("client.token");
  WriteTokenFile(c.auth_token_file, "wrong");
  EXPECT_EQ(CallGetStats(Dial(tcp, c)).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  WriteTokenFile(c.auth_token_file, "tls-token");
  grpc::Status ok = CallGetStats(Dial(tcp, c));
  EXPECT_TRUE(ok.ok()) << ok.error_message();
}

}  // namespace
}  // namespace moe::rpc
