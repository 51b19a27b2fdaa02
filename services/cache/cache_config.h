// One cache's configuration, built once by whoever runs the cache and turned
// into the policy's and the ExpertCache's options here and nowhere else, so
// that moe-cached and the simulator run the same cache from the same figures.
//
//   CacheShape shape = ...;                     // the model's (or trace's)
//   CacheConfig config = ...;                   // the user's choices
//   RETURN_IF_ERROR(ValidateCacheConfig(shape, config));
//   ASSIGN_OR_RETURN(auto policy, MakePolicy(config.policy,
//   MakePolicyConfig(shape, config))); ExpertCacheOptions o =
//   MakeCacheOptions(shape, config, engine, clock); ASSIGN_OR_RETURN(auto
//   cache, ExpertCache::Create(o, std::move(policy), &engine, ...));
//
// moe-cached builds a CacheConfig per model from its flags (the capacity
// from the model's plan); the simulator builds one from SimOptions
// (SimCacheConfig), with policies that need the trace (belady, oracle) made
// by the simulator itself from the same PolicyConfig.
//
// Plain values, no state; thread-compatible.
#ifndef MOECACHE_SERVICES_CACHE_CACHE_CONFIG_H_
#define MOECACHE_SERVICES_CACHE_CACHE_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "services/cache/clock.h"
#include "services/cache/copy_engine.h"
#include "services/cache/expert_cache.h"
#include "services/cache/policy.h"
#include "services/exchange/expert_exchange.h"

namespace moe::cache {

// What the cache holds: one model's (or trace's) MoE layers and experts.
struct CacheShape {
  int num_layers = 0;
  int num_experts = 0;  // routed experts per layer
  int top_k = 1;
  uint64_t expert_bytes = 0;          // one expert's block (a slot)
  double expert_flops_per_token = 0;  // 2 x the expert's parameters
  // Bytes copied for an expert of each layer where layers differ (mixed
  // types, ExpertCacheOptions::layer_bytes); empty: expert_bytes for all.
  std::vector<uint64_t> layer_bytes;
};

// What the user chose.
struct CacheConfig {
  std::string policy = "lru";  // a MakePolicy spec (policies.h)
  int capacity = 0;            // slots; >= num_experts (invariant 5)
  bool prefetch = false;
  double link_bytes_per_sec = 0;  // the link's model; 0: none (unpaced)
  double layer_seconds = 0;       // compute per MoE layer; 0: estimated online
  MissMode miss_mode = MissMode::kFetch;
  HostFigures host;  // the workers' host, for miss_mode host or auto
};

// INVALID_ARGUMENT, naming the value, for a capacity below one layer's
// experts, negative link or layer figures, or host execution without a host
// read bandwidth (flops_per_sec 0 means "bandwidth alone").
absl::Status ValidateCacheConfig(const CacheShape& shape,
                                 const CacheConfig& config);

PolicyConfig MakePolicyConfig(const CacheShape& shape,
                              const CacheConfig& config);

// The ExpertCache's options; the prefetch gate's chunk is `engine`'s
// (SetGateLinkFigures). `clock` null: the real clock.
ExpertCacheOptions MakeCacheOptions(const CacheShape& shape,
                                    const CacheConfig& config,
                                    const CopyEngine& engine, Clock* clock);

}  // namespace moe::cache

#endif  // MOECACHE_SERVICES_CACHE_CACHE_CONFIG_H_
