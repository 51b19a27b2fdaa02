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

// How the experts are held when not as the checkpoint stores them (the
// daemon's --expert-format): the held format and the bytes of one expert's
// block in it.
struct HeldExperts {
  std::string format;  // as ExpertFormatsName spells it, e.g. "q4", "Q4_K+Q6_K"
  uint64_t block_bytes = 0;  // the largest (a slot)
  uint64_t total_bytes = 0;  // every expert
};

// "mixtral, dense bf16, experts bf16, 4 MoE layers x 8 experts of 48.0 KiB";
// with `held`, the experts part names the held format and its block size
// ("experts q4 (stored bf16), ... of 13.5 KiB").
std::string ModelSummary(const ModelDescription& desc,
                         const HeldExperts* held = nullptr);

// Bytes of all routed experts of `desc` (what --cache none keeps in the
// worker's memory, and what moe-cached keeps on the host), as stored or, with
// `held`, as held.
uint64_t AllExpertBytes(const ModelDescription& desc,
                        const HeldExperts* held = nullptr);

}  // namespace moe::rpc

#endif  // MOECACHE_SERVICES_RPC_STARTUP_LOG_H_
