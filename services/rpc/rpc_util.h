// Shared plumbing of the gRPC services (moe-cached, moe-worker): the one place
// where absl::Status becomes grpc::Status, listen-address parsing with safe
// defaults (Unix sockets, mode 0600; TCP only when asked), server start with
// the standard health service and reflection, and systemd notification.
#ifndef MOECACHE_SERVICES_RPC_RPC_UTIL_H_
#define MOECACHE_SERVICES_RPC_RPC_UTIL_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/unix_socket.h"
#include "services/rpc/security.h"

namespace moe::rpc {

// The only conversions between the two status types.
grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

struct ListenAddress {
  bool is_unix = true;
  std::string unix_path;   // when is_unix
  std::string host_port;   // when !is_unix, e.g. "127.0.0.1:50051"
  std::string Uri() const;  // what grpc::ServerBuilder / CreateChannel take
};

// Accepts "unix:PATH", "unix:///PATH", "tcp://HOST:PORT" and "HOST:PORT"
// (the last two are TCP: only ever used when the user wrote them).
absl::StatusOr<ListenAddress> ParseListenAddress(const std::string& text);

// Limits applied to every server and channel we create.
struct RpcLimits {
  int max_receive_bytes = 4 << 20;
  int max_send_bytes = 16 << 20;
};

struct ServerOptions {
  std::vector<ListenAddress> listen;
  // Permissions of Unix sockets (0600 default; 0660 for a shared group).
  unsigned socket_mode = 0600;
  // Group, TLS and bearer token (see security.h); loaded by Start. With
  // socket_group set, Unix sockets get that group and mode 0660.
  SecurityOptions security;
  RpcLimits limits;
  std::vector<grpc::Service*> services;  // not owned
  // Full names of `services` ("moe.v1.Inference"): each gets a health
  // status (following SetServing), so a client can ask a server which
  // service it is; an unknown name is NOT_FOUND.
  std::vector<std::string> service_names;
};

// What Server::Start would refuse, checked without binding anything, so that a
// service that loads for minutes before it serves fails at once: each Unix
// socket's directory exists and is writable and no live process serves the
// socket (nor `extra_unix_sockets` beside it: suffix and socket type, e.g.
// {".fds", SOCK_SEQPACKET}), nothing accepts on a TCP address's port, and the
// security options load (files readable, group known). Messages name
// --listen and the address.
absl::Status CheckServerOptions(const ServerOptions& options,
                                const std::vector<std::pair<std::string, int>>&
                                    extra_unix_sockets = {});

// A started gRPC server with health (grpc.health.v1) and reflection.
class Server {
 public:
  // Starts serving. Unix sockets are created under a restrictive umask and
  // then chmod'ed to `socket_mode`; a stale socket file is replaced, a live
  // one (another process serves it) is ALREADY_EXISTS naming that pid.
  static absl::StatusOr<std::unique_ptr<Server>> Start(
      const ServerOptions& options);
  ~Server();

  // Health for "" and every registered service name.
  void SetServing(bool serving);
  // Stops accepting, lets in-flight calls finish until `deadline`, then
  // cancels them. Returns as soon as no call is left: client connections
  // that stay open (idle clients) are closed then, not waited for until
  // `deadline`. Idempotent.
  void Shutdown(absl::Duration deadline);
  // Port actually bound for TCP "HOST:0" addresses (first TCP address).
  int bound_port() const { return bound_port_; }

 private:
  Server() = default;
  std::unique_ptr<grpc::Server> server_;
  std::vector<std::string> unix_paths_;
  std::vector<FileIdentity> unix_ids_;  // of each bound socket, parallel to unix_paths_
  int bound_port_ = 0;
  bool shut_down_ = false;
  // Calls being served (long-lived health watches and reflection streams
  // not counted), kept by an interceptor.
  std::shared_ptr<std::atomic<int>> in_flight_ = std::make_shared<std::atomic<int>>(0);
};

// A client channel with our message limits. For unix: addresses the caller
// must be allowed to open the socket.
std::shared_ptr<grpc::Channel> MakeChannel(const ListenAddress& address,
                                           const RpcLimits& limits = {});
// The same with TLS and/or a bearer token (see security.h for how each
// travels); errors as LoadClientCredentials.
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(
    const ListenAddress& address, const ClientSecurity& security,
    const RpcLimits& limits = {});

// sd_notify(READY=1) / (STOPPING=1) when started by systemd (NOTIFY_SOCKET
// set); no-ops otherwise.
void NotifyReady();
void NotifyStopping();
// sd_notify(STATUS=...): the line `systemctl status` shows while starting.
void NotifyStatus(const std::string& status);

// The exit status of a service whose start failed with `status`: 78
// (EX_CONFIG, kExitConfig) when retrying cannot help (INVALID_ARGUMENT,
// FAILED_PRECONDITION, NOT_FOUND, PERMISSION_DENIED: a flag, the model or
// the other service's configuration is wrong), so that the systemd units'
// RestartPreventExitStatus stops the restart loop; 1 otherwise (UNAVAILABLE
// and the rest may pass: restart).
inline constexpr int kExitConfig = 78;
int StartFailureExitCode(const absl::Status& status);

// Blocks SIGTERM and SIGINT in the calling thread (call first thing in main,
// before any thread starts, so every thread inherits the mask) and returns
// a function that waits for one of them and returns its number.
class TerminationSignals {
 public:
  TerminationSignals();
  int Wait();
};

}  // namespace moe::rpc

#endif  // MOECACHE_SERVICES_RPC_RPC_UTIL_H_
