#include "services/moectl/client_channel.h"

#include "common/status_macros.h"
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

}  // namespace moe::moectl
