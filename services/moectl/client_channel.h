// How moectl commands that talk to a service (generate, stats) dial it:
// the same TLS and bearer-token options on every such command.
//
//   DeclareClientSecurityFlags(f);  // --tls-ca --tls-cert --tls-key
//                                   // --tls-server-name --auth-token-file
//   ASSIGN_OR_RETURN(auto channel, DialFromFlags(f, f.GetString("target")));
#ifndef MOECACHE_SERVICES_MOECTL_CLIENT_CHANNEL_H_
#define MOECACHE_SERVICES_MOECTL_CLIENT_CHANNEL_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "services/moectl/flags.h"

namespace moe::moectl {

void DeclareClientSecurityFlags(FlagSet& f);

// A channel to `address` (unix:PATH or HOST:PORT) with the flags' TLS and
// token settings; INVALID_ARGUMENT for a bad address or flag combination
// (see rpc::LoadClientCredentials).
absl::StatusOr<std::shared_ptr<grpc::Channel>> DialFromFlags(
    const FlagSet& f, const std::string& address);

// The two moecache services a command can be pointed at.
enum class MoeService { kWorker, kCache };

// Says what is at `address` before a command calls it, through the standard
// health service (no token needed): when the server there serves the other
// moecache service, FAILED_PRECONDITION naming what it is and what `flag`
// wants ("unix:/run/moecache/moe-cached.sock is moe-cached, not a worker:
// --target wants moe-worker's address ..."). OK when it serves `want`, and
// whenever it cannot tell (unreachable, no health service): the command's
// own call then reports (also for a server that names neither service).
absl::Status CheckServes(const std::shared_ptr<grpc::Channel>& channel,
                         const std::string& address, MoeService want,
                         const std::string& flag);

// DialFromFlags, then CheckServes: a channel to the service `want` at
// `address` (named by `flag`), or why not.
absl::StatusOr<std::shared_ptr<grpc::Channel>> DialService(const FlagSet& f,
                                                           const std::string& address,
                                                           MoeService want,
                                                           const std::string& flag);

}  // namespace moe::moectl

#endif  // MOECACHE_SERVICES_MOECTL_CLIENT_CHANNEL_H_
