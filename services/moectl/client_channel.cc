#include "services/moectl/client_channel.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "moe/v1/expert_cache.grpc.pb.h"
#include "moe/v1/inference.grpc.pb.h"
#include "services/rpc/rpc_util.h"
#include "services/rpc/security.h"

namespace moe::moectl {

void DeclareClientSecurityFlags(FlagSet& f) {
  f.String("tls-ca", "", "PEM CA file: connect over TLS (TCP addresses)");
  f.String("tls-cert", "", "PEM client certificate, for servers that want one");
  f.String("tls-key", "", "PEM private key of --tls-cert");
  f.String("tls-server-name", "", "name expected in the server's certificate");
  f.String("auth-token-file", "", "file with the bearer token (mode 0600)");
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> DialFromFlags(
    const FlagSet& f, const std::string& address) {
  ASSIGN_OR_RETURN(rpc::ListenAddress target, rpc::ParseListenAddress(address));
  rpc::ClientSecurity s;
  s.tls_ca = f.GetString("tls-ca");
  s.tls_cert = f.GetString("tls-cert");
  s.tls_key = f.GetString("tls-key");
  s.tls_server_name = f.GetString("tls-server-name");
  s.auth_token_file = f.GetString("auth-token-file");
  return rpc::MakeChannel(target, s);
}

namespace {

// The health service's answer for `service`: OK (SERVING or NOT_SERVING:
// it is served), NOT_FOUND (not served there), or why it did not answer.
grpc::StatusCode HealthOf(grpc::health::v1::Health::Stub& stub, const std::string& service) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(service);
  grpc::health::v1::HealthCheckResponse resp;
  return stub.Check(&ctx, req, &resp).error_code();
}

}  // namespace

absl::Status CheckServes(const std::shared_ptr<grpc::Channel>& channel,
                         const std::string& address, MoeService want,
                         const std::string& flag) {
  const std::string worker = v1::Inference::service_full_name();
  const std::string cache = v1::ExpertCache::service_full_name();
  auto stub = grpc::health::v1::Health::NewStub(channel);
  if (HealthOf(*stub, want == MoeService::kWorker ? worker : cache) != grpc::StatusCode::NOT_FOUND) {
    return absl::OkStatus();
  }
  if (want == MoeService::kWorker && HealthOf(*stub, cache) == grpc::StatusCode::OK) {
    return absl::FailedPreconditionError(absl::StrCat(
        address, " is moe-cached, not a worker (it serves ", cache, "): ", flag,
        " wants moe-worker's address (its --listen, e.g. unix:/run/moecache/moe-worker.sock)"));
  }
  if (want == MoeService::kCache && HealthOf(*stub, worker) == grpc::StatusCode::OK) {
    return absl::FailedPreconditionError(absl::StrCat(
        address, " is moe-worker, not moe-cached (it serves ", worker, "): ", flag,
        " wants moe-cached's address (its --listen, e.g. unix:/run/moecache/moe-cached.sock); "
        "for a worker's figures use --worker ", address));
  }
  return absl::OkStatus();  // names neither: not one of ours, or too old to say
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> DialService(const FlagSet& f,
                                                           const std::string& address,
                                                           MoeService want,
                                                           const std::string& flag) {
  ASSIGN_OR_RETURN(auto channel, DialFromFlags(f, address));
  RETURN_IF_ERROR(CheckServes(channel, address, want, flag));
  return channel;
}

}  // namespace moe::moectl
