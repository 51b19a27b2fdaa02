#include "services/rpc/security.h"

#include <grp.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace moe::rpc {
namespace {

constexpr char kHealthPrefix[] = "/grpc.health.v1.Health/";

// Checks `authorization: Bearer <token>` on every call but health checks.
class BearerTokenProcessor : public grpc::AuthMetadataProcessor {
 public:
  explicit BearerTokenProcessor(const std::string& token)
      : expected_(absl::StrCat("Bearer ", token)) {}

  bool IsBlocking() const override { return false; }

  grpc::Status Process(const InputMetadata& auth_metadata, grpc::AuthContext*,
                       OutputMetadata* consumed, OutputMetadata*) override {
    auto path = auth_metadata.find(":path");
    if (path != auth_metadata.end() &&
        absl::StartsWith(absl::string_view(path->second.data(), path->second.size()),
                         kHealthPrefix)) {
      return grpc::Status::OK;
    }
    auto it = auth_metadata.find("authorization");
    if (it == auth_metadata.end()) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          "missing bearer token (authorization metadata)");
    }
    const absl::string_view got(it->second.data(), it->second.size());
    if (!ConstantTimeEquals(got, expected_)) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "bad bearer token");
    }
    // Services never see the token.
    consumed->emplace("authorization", std::string(got));
    return grpc::Status::OK;
  }

 private:
  const std::string expected_;
};

absl::StatusOr<std::string> ReadPem(const std::string& flag, const std::string& path) {
  absl::StatusOr<std::string> text = ReadFileToString(path, 1 << 20);
  if (!text.ok()) {
    return absl::Status(text.status().code(),
                        absl::StrCat("--", flag, " ", path, ": ", text.status().message()));
  }
  if (!absl::StrContains(*text, "-----BEGIN ")) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " ", path, ": not a PEM file"));
  }
  return text;
}

absl::Status WithFlag(const std::string& flag, const absl::Status& s) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat("--", flag, ": ", s.message()));
}

}  // namespace

bool ParseSecurityFlag(absl::string_view name, absl::string_view value,
                       SecurityOptions* options, absl::Status* status) {
  std::string* field = nullptr;
  if (name == "socket-group") {
    field = &options->socket_group;
  } else if (name == "tls-cert") {
    field = &options->tls_cert;
  } else if (name == "tls-key") {
    field = &options->tls_key;
  } else if (name == "tls-client-ca") {
    field = &options->tls_client_ca;
  } else if (name == "auth-token-file") {
    field = &options->auth_token_file;
  } else {
    return false;
  }
  if (value.empty()) {
    *status = absl::InvalidArgumentError(absl::StrCat("--", name, " needs a non-empty value"));
  } else {
    *field = std::string(value);
    *status = absl::OkStatus();
  }
  return true;
}

std::string SecurityFlagsUsage() {
  return "  --socket-group NAME     Unix sockets mode 0660 and this group "
         "(default: 0600)\n"
         "  --tls-cert FILE         PEM certificate: TLS on TCP listeners "
         "(with --tls-key)\n"
         "  --tls-key FILE          PEM private key of --tls-cert\n"
         "  --tls-client-ca FILE    require client certificates from this CA "
         "(mTLS)\n"
         "  --auth-token-file FILE  require 'authorization: Bearer <token>' "
         "(file mode 0600;\n"
         "                          health checks stay open)\n";
}

absl::StatusOr<gid_t> LookupGroup(const std::string& name) {
  std::vector<char> buf(16384);
  group g;
  group* result = nullptr;
  int rc = ::getgrnam_r(name.c_str(), &g, buf.data(), buf.size(), &result);
  if (rc != 0 || result == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--socket-group: no group named '", name, "'",
        rc != 0 ? absl::StrCat(" (", std::strerror(rc), ")") : ""));
  }
  return result->gr_gid;
}

absl::StatusOr<std::string> ReadAuthTokenFile(const std::string& path) {
  ASSIGN_OR_RETURN(OpenedFile file, OpenRegularFile(path));
  struct stat st;
  if (::fstat(file.fd(), &st) != 0) return ErrnoToStatus(errno, "fstat", path);
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return absl::InvalidArgumentError(absl::StrCat(
        "token file ", path, " has mode ", mode,
        ": it must not be accessible by group or others (chmod 600)"));
  }
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path, 4096));
  absl::string_view token = absl::StripAsciiWhitespace(text);
  if (token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("token file ", path, " is empty"));
  }
  for (char c : token) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token file ", path, ": the token must be printable ASCII without spaces"));
    }
  }
  return std::string(token);
}

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  // Walk the longer length so timing does not reveal a common prefix.
  const size_t n = std::max(a.size(), b.size());
  unsigned diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? a[i] : 0;
    const unsigned char y = i < b.size() ? b[i] : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

absl::Status ValidateSecurityOptions(const SecurityOptions& o) {
  if (o.tls_cert.empty() != o.tls_key.empty()) {
    return absl::InvalidArgumentError(
        o.tls_key.empty() ? "--tls-cert needs --tls-key" : "--tls-key needs --tls-cert");
  }
  if (!o.tls_client_ca.empty() && o.tls_cert.empty()) {
    return absl::InvalidArgumentError("--tls-client-ca needs --tls-cert and --tls-key");
  }
  if (!o.socket_group.empty()) RETURN_IF_ERROR(LookupGroup(o.socket_group).status());
  if (!o.auth_token_file.empty()) {
    RETURN_IF_ERROR(WithFlag("auth-token-file", ReadAuthTokenFile(o.auth_token_file).status()));
  }
  return absl::OkStatus();
}

absl::StatusOr<ServerSecurity> LoadServerSecurity(const SecurityOptions& o, bool has_unix,
                                                  bool has_tcp) {
  RETURN_IF_ERROR(ValidateSecurityOptions(o));
  ServerSecurity s;
  if (!o.socket_group.empty()) {
    ASSIGN_OR_RETURN(s.group, LookupGroup(o.socket_group));
    s.has_group = true;
  }
  std::shared_ptr<BearerTokenProcessor> processor;
  if (!o.auth_token_file.empty()) {
    absl::StatusOr<std::string> token = ReadAuthTokenFile(o.auth_token_file);
    RETURN_IF_ERROR(WithFlag("auth-token-file", token.status()));
    processor = std::make_shared<BearerTokenProcessor>(*token);
  }
  const bool tls = !o.tls_cert.empty();
  if (tls && !has_tcp) {
    MOE_LOG(INFO) << "--tls-cert given but no TCP listener: Unix sockets stay "
                     "plaintext (protected by their file mode)";
  }
  if (processor != nullptr && has_tcp && !tls) {
    return absl::InvalidArgumentError(
        "--auth-token-file with a TCP listener needs --tls-cert and --tls-key "
        "(a bearer token must not travel over plaintext TCP)");
  }
  if (has_unix) {
    if (processor != nullptr) {
      s.unix_credentials = grpc::experimental::LocalServerCredentials(UDS);
      s.unix_credentials->SetAuthMetadataProcessor(processor);
    } else {
      s.unix_credentials = grpc::InsecureServerCredentials();
    }
  }
  if (has_tcp) {
    if (tls) {
      grpc::SslServerCredentialsOptions ssl(
          o.tls_client_ca.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                                  : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
      grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
      ASSIGN_OR_RETURN(pair.private_key, ReadPem("tls-key", o.tls_key));
      ASSIGN_OR_RETURN(pair.cert_chain, ReadPem("tls-cert", o.tls_cert));
      ssl.pem_key_cert_pairs.push_back(std::move(pair));
      if (!o.tls_client_ca.empty()) {
        ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadPem("tls-client-ca", o.tls_client_ca));
      }
      s.tcp_credentials = grpc::SslServerCredentials(ssl);
      if (processor != nullptr) s.tcp_credentials->SetAuthMetadataProcessor(processor);
    } else {
      s.tcp_credentials = grpc::InsecureServerCredentials();
    }
  }
  return s;
}

absl::StatusOr<ClientCredentials> LoadClientCredentials(const ClientSecurity& c, bool is_unix) {
  const bool tls = !c.tls_ca.empty();
  if (c.tls_cert.empty() != c.tls_key.empty()) {
    return absl::InvalidArgumentError("a client certificate needs its key and vice versa");
  }
  if (!tls && (!c.tls_cert.empty() || !c.tls_server_name.empty())) {
    return absl::InvalidArgumentError(
        "a client certificate or TLS server name needs a TLS CA file (--tls-ca)");
  }
  if (tls && is_unix) {
    return absl::InvalidArgumentError(
        "TLS is for TCP addresses; Unix sockets are plaintext (drop --tls-ca)");
  }
  std::string token;
  if (!c.auth_token_file.empty()) {
    absl::StatusOr<std::string> t = ReadAuthTokenFile(c.auth_token_file);
    RETURN_IF_ERROR(WithFlag("auth-token-file", t.status()));
    token = *std::move(t);
    if (!is_unix && !tls) {
      return absl::InvalidArgumentError(
          "a bearer token is sent only over TLS or a Unix socket: give --tls-ca");
    }
  }
  ClientCredentials out;
  if (tls) {
    grpc::SslCredentialsOptions ssl;
    ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadPem("tls-ca", c.tls_ca));
    if (!c.tls_cert.empty()) {
      ASSIGN_OR_RETURN(ssl.pem_cert_chain, ReadPem("tls-cert", c.tls_cert));
      ASSIGN_OR_RETURN(ssl.pem_private_key, ReadPem("tls-key", c.tls_key));
    }
    out.credentials = grpc::SslCredentials(ssl);
    out.server_name_override = c.tls_server_name;
  } else if (!token.empty()) {
    // Local (UDS) credentials: no handshake bytes, but a security level
    // that lets gRPC attach the call credentials below.
    out.credentials = grpc::experimental::LocalCredentials(UDS);
  } else {
    out.credentials = grpc::InsecureChannelCredentials();
  }
  if (!token.empty()) {
    out.credentials = grpc::CompositeChannelCredentials(
        out.credentials, grpc::AccessTokenCredentials(token));
  }
  return out;
}

}  // namespace moe::rpc
