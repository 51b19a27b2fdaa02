// Security settings of the gRPC services (moe-cached, moe-worker) and their
// clients (moe-worker's cache connection, moectl):
//
//  - Unix sockets are mode 0600 (owner only); `--socket-group NAME` makes
//    them 0660 and chowns them to that group. Unix sockets carry no TLS: the
//    file mode is their protection.
//  - TCP is used only when a listen address asks for it; `--tls-cert` and
//    `--tls-key` then serve TLS on every TCP listener, and `--tls-client-ca`
//    also requires client certificates signed by that CA (mTLS).
//  - `--auth-token-file FILE` requires `authorization: Bearer <token>` on
//    every call on every listener (Unix and TCP) except the health service
//    grpc.health.v1.Health, so probes keep working; anything else gets
//    UNAUTHENTICATED. The token is compared in constant time. A token is
//    never accepted over plaintext TCP (it would travel in the clear): with
//    a token, TCP listeners need TLS.
//
// How the token travels. gRPC attaches call credentials only to channels
// with a security level, so plaintext channels cannot carry them. Unix
// sockets therefore use gRPC's "local" credentials (UDS) on both sides when
// a token is configured: they add no handshake bytes (a plaintext client
// still talks to such a server) yet count as private, so the server's
// AuthMetadataProcessor runs and the client's access-token credentials are
// sent. TCP uses TLS credentials.
//
//   SecurityOptions s;
//   absl::Status st;
//   if (ParseSecurityFlag(name, value, &s, &st)) { if (!st.ok()) ...; }
//   RETURN_IF_ERROR(ValidateSecurityOptions(s));   // at the end of parsing
//   ServerOptions so; so.security = s; Server::Start(so);  // loads the files
#ifndef MOECACHE_SERVICES_RPC_SECURITY_H_
#define MOECACHE_SERVICES_RPC_SECURITY_H_

#include <grpcpp/grpcpp.h>
#include <sys/types.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace moe::rpc {

// Server side, from the command line (file names, not contents).
struct SecurityOptions {
  std::string socket_group;     // --socket-group: Unix sockets 0660, this group
  std::string tls_cert;         // --tls-cert: PEM certificate chain (TCP)
  std::string tls_key;          // --tls-key: PEM private key (TCP)
  std::string tls_client_ca;    // --tls-client-ca: require client certs (mTLS)
  std::string auth_token_file;  // --auth-token-file: bearer token (mode 0600)
};

// When `name` (without the leading "--") is one of the five flags above,
// stores `value` and returns true, with *status OK or INVALID_ARGUMENT for
// an empty value; returns false (status untouched) for any other name.
bool ParseSecurityFlag(absl::string_view name, absl::string_view value,
                       SecurityOptions* options, absl::Status* status);

// Usage lines for the five flags (each ends with '\n').
std::string SecurityFlagsUsage();

// Checks what can be checked before serving: --tls-cert and --tls-key come
// together, --tls-client-ca needs them, the group exists, the token file is
// private and not empty. INVALID_ARGUMENT naming the flag otherwise.
absl::Status ValidateSecurityOptions(const SecurityOptions& options);

// The gid of group `name`; INVALID_ARGUMENT when there is no such group.
absl::StatusOr<gid_t> LookupGroup(const std::string& name);

// The token in `path`, surrounding whitespace trimmed. INVALID_ARGUMENT when
// the file is accessible by group or others (mode & 077), empty, or holds
// characters outside printable ASCII; NOT_FOUND when missing.
absl::StatusOr<std::string> ReadAuthTokenFile(const std::string& path);

// Equality whose time depends only on the lengths, not on where a and b
// differ.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

// Server side, loaded: what Server::Start uses per listener.
struct ServerSecurity {
  bool has_group = false;
  gid_t group = 0;
  std::shared_ptr<grpc::ServerCredentials> unix_credentials;
  std::shared_ptr<grpc::ServerCredentials> tcp_credentials;
};

// Reads the certificates, key and token and builds the credentials. Logs
// when TLS flags are given without TCP listeners; INVALID_ARGUMENT for a
// token with TCP listeners but no TLS, and for everything
// ValidateSecurityOptions refuses.
absl::StatusOr<ServerSecurity> LoadServerSecurity(const SecurityOptions& options,
                                                  bool has_unix, bool has_tcp);

// Client side.
struct ClientSecurity {
  std::string tls_ca;           // PEM CA file: use TLS (TCP addresses only)
  std::string tls_cert;         // client certificate for mTLS (with tls_key)
  std::string tls_key;
  std::string tls_server_name;  // name checked in the server's certificate
  std::string auth_token_file;  // bearer token sent on every call
};

// Channel credentials (and, for TLS, the target-name override to set on the
// channel arguments) for a Unix (`is_unix`) or TCP address. INVALID_ARGUMENT
// for TLS flags on a Unix address, a client cert without key, or a token over
// plaintext TCP; file errors as ReadAuthTokenFile / ReadFileToString.
struct ClientCredentials {
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  std::string server_name_override;  // "" : none
};
absl::StatusOr<ClientCredentials> LoadClientCredentials(const ClientSecurity& security,
                                                        bool is_unix);

}  // namespace moe::rpc

#endif  // MOECACHE_SERVICES_RPC_SECURITY_H_
