// Small TCP probes for the services' start-up checks and for stopping the
// /metrics server quickly. Addresses are "HOST:PORT" as given to --listen or
// --metrics-addr ("[V6]:PORT" too; an empty, "0.0.0.0", "+" or "::" host is
// the wildcard, reached through loopback).
#ifndef MOECACHE_SERVICES_RPC_TCP_PROBE_H_
#define MOECACHE_SERVICES_RPC_TCP_PROBE_H_

#include <string>

namespace moe::rpc {

// The host to connect to for a listening address: loopback for wildcards.
std::string ReachableHost(const std::string& address);

// Opens and at once closes a TCP connection to host:port; true when the
// connection was accepted (something listens there).
bool ConnectOnce(const std::string& host, int port);

// Why binding `address` fails, as strerror text ("Address already in use"),
// or "" when it can be bound (or is malformed in a way bind cannot tell).
std::string BindError(const std::string& address);

}  // namespace moe::rpc

#endif  // MOECACHE_SERVICES_RPC_TCP_PROBE_H_
