#include "services/rpc/rpc_util.h"

#include <grpc/grpc.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/support/server_interceptor.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <future>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/unix_socket.h"
#include "services/rpc/tcp_probe.h"
#include "google/protobuf/descriptor.h"

namespace moe::rpc {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

std::string ListenAddress::Uri() const {
  return is_unix ? absl::StrCat("unix:", unix_path) : host_port;
}

absl::StatusOr<ListenAddress> ParseListenAddress(const std::string& text) {
  ListenAddress a;
  std::string rest = text;
  if (absl::StartsWith(rest, "unix://")) {
    a.unix_path = rest.substr(7);
  } else if (absl::StartsWith(rest, "unix:")) {
    a.unix_path = rest.substr(5);
  } else {
    a.is_unix = false;
    if (absl::StartsWith(rest, "tcp://")) rest = rest.substr(6);
    size_t colon = rest.rfind(':');
    int port = 0;
    if (colon == std::string::npos || colon == 0 ||
        !absl::SimpleAtoi(rest.substr(colon + 1), &port) || port < 0 ||
        port > 65535) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bad listen address '", text,
          "': want unix:PATH or HOST:PORT (TCP)"));
    }
    a.host_port = rest;
    return a;
  }
  if (a.unix_path.empty() || a.unix_path.size() > 100) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad unix socket path in '", text, "' (empty or over 100 bytes)"));
  }
  return a;
}

namespace {

// gRPC answers a request it cannot parse before any handler runs, with an
// empty INTERNAL (sync services) or UNIMPLEMENTED (callback services). For a
// method of ours that can only mean a malformed message: say so, as
// INVALID_ARGUMENT, so clients get one clear code for bad input.
class MalformedRequestInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit MalformedRequestInterceptor(std::string method) : method_(std::move(method)) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    using grpc::experimental::InterceptionHookPoints;
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      const grpc::Status s = methods->GetSendStatus();
      if ((s.error_code() == grpc::StatusCode::INTERNAL ||
           s.error_code() == grpc::StatusCode::UNIMPLEMENTED) &&
          s.error_message().empty()) {
        methods->ModifySendStatus(grpc::Status(
            grpc::StatusCode::INVALID_ARGUMENT,
            absl::StrCat("malformed request: not a valid message for ", method_)));
      }
    }
    methods->Proceed();
  }

 private:
  std::string method_;
};

// Counts a call from its start (its interceptors are created when a server
// thread takes it up) to the destruction of its context (after its status
// went out).
class InFlightInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit InFlightInterceptor(std::shared_ptr<std::atomic<int>> count)
      : count_(std::move(count)) {
    count_->fetch_add(1);
  }
  ~InFlightInterceptor() override { count_->fetch_sub(1); }
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    methods->Proceed();
  }

 private:
  std::shared_ptr<std::atomic<int>> count_;
};

class InFlightInterceptorFactory : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit InFlightInterceptorFactory(std::shared_ptr<std::atomic<int>> count)
      : count_(std::move(count)) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    // Streams that last until the client or the server goes are no work to
    // drain: a health watch, a reflection session.
    const char* m = info->method();
    if (m != nullptr && (absl::StartsWith(m, "/grpc.health.v1.Health/Watch") ||
                         absl::StartsWith(m, "/grpc.reflection."))) {
      return nullptr;
    }
    return new InFlightInterceptor(count_);
  }

 private:
  std::shared_ptr<std::atomic<int>> count_;
};

class MalformedRequestInterceptorFactory
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    // Only methods our protos define ("/pkg.Service/Method"); an unknown
    // method keeps its UNIMPLEMENTED.
    const char* m = info->method();
    if (m == nullptr || m[0] != '/') return nullptr;
    std::string full(m + 1);
    const size_t slash = full.find('/');
    if (slash == std::string::npos) return nullptr;
    const auto* service =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(full.substr(0, slash));
    if (service == nullptr || service->FindMethodByName(full.substr(slash + 1)) == nullptr) {
      return nullptr;
    }
    return new MalformedRequestInterceptor(m);
  }
};

}  // namespace

namespace {

bool MayUseGroup(gid_t group) {
  if (::geteuid() == 0 || ::getegid() == group) return true;
  std::vector<gid_t> groups(::getgroups(0, nullptr) + 1);
  const int n = ::getgroups(static_cast<int>(groups.size()), groups.data());
  for (int i = 0; i < n; ++i) {
    if (groups[i] == group) return true;
  }
  return false;
}

// gRPC listens with SO_REUSEPORT: a second server on a live port would share
// it and take half of the first one's connections, so ask first.
absl::Status CheckTcpPortFree(const ListenAddress& a) {
  int port = 0;
  if (!absl::SimpleAtoi(a.host_port.substr(a.host_port.rfind(':') + 1), &port)) port = 0;
  if (port > 0 && ConnectOnce(ReachableHost(a.host_port), port)) {
    return absl::AlreadyExistsError(
        absl::StrCat("--listen ", a.host_port, ": another process already listens on port ",
                     port, "; stop it first, or choose another port"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckServerOptions(
    const ServerOptions& options,
    const std::vector<std::pair<std::string, int>>& extra_unix_sockets) {
  bool has_unix = false, has_tcp = false;
  for (const ListenAddress& a : options.listen) {
    (a.is_unix ? has_unix : has_tcp) = true;
    if (!a.is_unix) {
      RETURN_IF_ERROR(CheckTcpPortFree(a));
      continue;
    }
    std::vector<std::pair<std::string, int>> paths = {{a.unix_path, SOCK_STREAM}};
    for (const auto& [suffix, type] : extra_unix_sockets) {
      paths.push_back({a.unix_path + suffix, type});
    }
    for (const auto& [path, type] : paths) {
      if (absl::Status s = CheckUnixSocketFree(path, type); !s.ok()) {
        return absl::Status(s.code(), absl::StrCat("--listen ", a.Uri(), ": ", s.message()));
      }
    }
  }
  absl::StatusOr<ServerSecurity> security =
      LoadServerSecurity(options.security, has_unix, has_tcp);
  if (!security.ok()) return security.status();
  // Only root or a member may chgrp a socket to the group (Start does that).
  if (has_unix && security->has_group && !MayUseGroup(security->group)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--socket-group ", options.security.socket_group, ": this process (uid ", ::geteuid(),
        ") is not a member of the group, so its sockets cannot get it; add the service user "
        "to the group (usermod -aG GROUP USER) or drop --socket-group"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Server>> Server::Start(
    const ServerOptions& options) {
  if (options.listen.empty()) {
    return absl::InvalidArgumentError("no listen address");
  }
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.SetMaxReceiveMessageSize(options.limits.max_receive_bytes);
  builder.SetMaxSendMessageSize(options.limits.max_send_bytes);
  bool has_unix = false, has_tcp = false;
  for (const ListenAddress& a : options.listen) (a.is_unix ? has_unix : has_tcp) = true;
  absl::StatusOr<ServerSecurity> security =
      LoadServerSecurity(options.security, has_unix, has_tcp);
  if (!security.ok()) return security.status();
  std::unique_ptr<Server> server(new Server());
  std::vector<int> ports(options.listen.size(), 0);
  for (size_t i = 0; i < options.listen.size(); ++i) {
    const ListenAddress& a = options.listen[i];
    if (a.is_unix) {
      // Never replace the socket of a live process; a stale one goes.
      if (absl::Status s = ClaimUnixSocketPath(a.unix_path, SOCK_STREAM); !s.ok()) {
        return absl::Status(s.code(), absl::StrCat("--listen ", a.Uri(), ": ", s.message()));
      }
      server->unix_paths_.push_back(a.unix_path);
      builder.AddListeningPort(a.Uri(), security->unix_credentials);
    } else {
      RETURN_IF_ERROR(CheckTcpPortFree(a));
      builder.AddListeningPort(a.Uri(), security->tcp_credentials, &ports[i]);
    }
  }
  for (grpc::Service* s : options.services) builder.RegisterService(s);
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<MalformedRequestInterceptorFactory>());
  interceptors.push_back(std::make_unique<InFlightInterceptorFactory>(server->in_flight_));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  // The socket file is created while binding: a tight umask closes the
  // window before the chmod below.
  mode_t old_mask = ::umask(0177);
  server->server_ = builder.BuildAndStart();
  ::umask(old_mask);
  if (server->server_ == nullptr) {
    return absl::UnavailableError(
        "gRPC server failed to start (address in use or not permitted?)");
  }
  for (const std::string& path : server->unix_paths_) {
    server->unix_ids_.push_back(IdentifyFile(path));
  }
  if (auto* health = server->server_->GetHealthCheckService(); health != nullptr) {
    for (const std::string& name : options.service_names) health->SetServingStatus(name, false);
  }
  const unsigned mode = security->has_group ? 0660 : options.socket_mode;
  for (const std::string& path : server->unix_paths_) {
    // Group first: the socket is never group-accessible with the wrong group.
    if (security->has_group && ::chown(path.c_str(), -1, security->group) != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("chown ", path, " to group ", options.security.socket_group, ": ",
                       std::strerror(errno), " (is this user a member of it?)"));
    }
    if (::chmod(path.c_str(), mode) != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("chmod ", path, ": ", std::strerror(errno)));
    }
  }
  for (size_t i = 0; i < ports.size(); ++i) {
    if (!options.listen[i].is_unix) {
      if (ports[i] == 0) {
        return absl::UnavailableError(absl::StrCat(
            "could not bind ", options.listen[i].host_port));
      }
      if (server->bound_port_ == 0) server->bound_port_ = ports[i];
    }
  }
  return server;
}

Server::~Server() { Shutdown(absl::ZeroDuration()); }

void Server::SetServing(bool serving) {
  if (server_ == nullptr) return;
  auto* health = server_->GetHealthCheckService();
  if (health != nullptr) health->SetServingStatus(serving);
}

void Server::Shutdown(absl::Duration deadline) {
  if (shut_down_ || server_ == nullptr) return;
  shut_down_ = true;
  SetServing(false);
  const absl::Time end = absl::Now() + deadline;
  // grpc::Server::Shutdown returns once every connection is gone, not only
  // every call. A client idling on its connection answers the GOAWAY only
  // when its process next polls the socket, so it used to hold shutdown
  // until `end` (measured: --drain-seconds, 2 s). Once no call is in flight,
  // close the connections (grpc_server_cancel_all_calls) instead. Repeated:
  // the first may come before gRPC stopped accepting.
  std::promise<void> done;
  std::future<void> finished = done.get_future();
  std::thread stopper([this, end, &done] {
    server_->Shutdown(absl::ToChronoTime(end));
    done.set_value();
  });
  while (finished.wait_for(std::chrono::milliseconds(10)) != std::future_status::ready) {
    if (absl::Now() >= end) continue;  // gRPC cancels what is left itself
    if (in_flight_->load() == 0) grpc_server_cancel_all_calls(server_->c_server());
  }
  stopper.join();
  server_->Wait();
  // Only what this server bound: a process that started on the path since
  // (after this one went stale) keeps its socket.
  for (size_t i = 0; i < unix_ids_.size(); ++i) UnlinkIfSameFile(unix_paths_[i], unix_ids_[i]);
}

std::shared_ptr<grpc::Channel> MakeChannel(const ListenAddress& address,
                                           const RpcLimits& limits) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(limits.max_send_bytes);
  args.SetMaxSendMessageSize(limits.max_receive_bytes);
  return grpc::CreateCustomChannel(address.Uri(),
                                   grpc::InsecureChannelCredentials(), args);
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(
    const ListenAddress& address, const ClientSecurity& security,
    const RpcLimits& limits) {
  absl::StatusOr<ClientCredentials> creds =
      LoadClientCredentials(security, address.is_unix);
  if (!creds.ok()) return creds.status();
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(limits.max_send_bytes);
  args.SetMaxSendMessageSize(limits.max_receive_bytes);
  if (!creds->server_name_override.empty()) {
    args.SetSslTargetNameOverride(creds->server_name_override);
  }
  return grpc::CreateCustomChannel(address.Uri(), creds->credentials, args);
}

void NotifyReady() { sd_notify(0, "READY=1"); }
void NotifyStopping() { sd_notify(0, "STOPPING=1"); }
void NotifyStatus(const std::string& status) {
  sd_notify(0, absl::StrCat("STATUS=", status).c_str());
}

int StartFailureExitCode(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kPermissionDenied:
      return kExitConfig;
    default:
      return 1;
  }
}

TerminationSignals::TerminationSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int TerminationSignals::Wait() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  int sig = 0;
  while (sigwait(&set, &sig) != 0) {
  }
  return sig;
}


}  // namespace moe::rpc
