#include "services/cache/cache_config.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace moe::cache {

absl::Status ValidateCacheConfig(const CacheShape& shape,
                                 const CacheConfig& config) {
  RETURN_IF_ERROR(CheckCapacity(config.capacity, shape.num_experts,
                                config.miss_mode));
  if (!(config.link_bytes_per_sec >= 0) || !(config.layer_seconds >= 0)) {
    return absl::InvalidArgumentError(
        "link bandwidth and layer time must be >= 0");
  }
  if (config.miss_mode != MissMode::kFetch &&
      !(config.host.read_bytes_per_sec > 0 && config.host.flops_per_sec >= 0)) {
    return absl::InvalidArgumentError(
        "host execution needs a host read bandwidth > 0 and a FLOP rate >= 0 "
        "(0: bandwidth alone)");
  }
  return absl::OkStatus();
}

PolicyConfig MakePolicyConfig(const CacheShape& shape,
                              const CacheConfig& config) {
  PolicyConfig pc;
  pc.num_layers = shape.num_layers;
  pc.num_experts = shape.num_experts;
  pc.top_k = shape.top_k;
  pc.capacity = config.capacity;
  pc.expert_bytes = static_cast<double>(shape.expert_bytes);
  pc.link_bytes_per_sec = config.link_bytes_per_sec;
  pc.layer_seconds = config.layer_seconds;
  return pc;
}

ExpertCacheOptions MakeCacheOptions(const CacheShape& shape,
                                    const CacheConfig& config,
                                    const CopyEngine& engine, Clock* clock) {
  ExpertCacheOptions co;
  co.num_layers = shape.num_layers;
  co.num_experts = shape.num_experts;
  co.top_k = shape.top_k;
  co.capacity = config.capacity;
  co.expert_bytes = shape.expert_bytes;
  co.layer_bytes = shape.layer_bytes;
  co.prefetch = config.prefetch;
  co.miss_mode = config.miss_mode;
  co.host = config.host;
  co.expert_flops_per_token = shape.expert_flops_per_token;
  // The prefetch gate: C from the copy engine's chunk, T from layer_seconds
  // (0: estimated online from the owners' acquires).
  SetGateLinkFigures(engine, config.link_bytes_per_sec, config.layer_seconds,
                     &co);
  co.clock = clock;
  return co;
}

}  // namespace moe::cache
