// Pieces of the one line each service logs when it starts serving (what it
// serves, in which mode), shared so that both services say it alike.
#ifndef MOECACHE_SERVICES_RPC_STARTUP_LOG_H_
#define MOECACHE_SERVICES_RPC_STARTUP_LOG_H_

#include <cstdint>
#include <string>

#include "common/model_desc.h"

namespace moe::rpc {

// `address` as given (unix:PATH or HOST:PORT), with a HOST:0 shown with the
// port it got (`bound_port`, when not 0).
std::string ShownAddress(const std::string& address, int bound_port);

// "512 B", "48.0 KiB", "1.25 GiB".
std::string HumanBytes(uint64_t bytes);

// "mixtral, dense bf16, experts bf16, 4 MoE layers x 8 experts of 48.0 KiB"
std::string ModelSummary(const ModelDescription& desc);

// Bytes of all routed experts of `desc` (what --cache none keeps in the
// worker's memory, and what moe-cached keeps on the host).
uint64_t AllExpertBytes(const ModelDescription& desc);

}  // namespace moe::rpc

#endif  // MOECACHE_SERVICES_RPC_STARTUP_LOG_H_
