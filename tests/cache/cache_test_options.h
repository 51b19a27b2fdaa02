// What the cache core's tests build their caches from: a cache of
// `capacity` 1 MB experts (top-2) over a 1 GB/s link, 1 ms per layer.
#ifndef MOECACHE_TESTS_CACHE_CACHE_TEST_OPTIONS_H_
#define MOECACHE_TESTS_CACHE_CACHE_TEST_OPTIONS_H_

#include "services/cache/expert_cache.h"
#include "services/cache/policy.h"

namespace moe::cache::testing {

inline PolicyConfig TestPolicyConfig(int layers, int experts, int capacity) {
  PolicyConfig pc;
  pc.num_layers = layers;
  pc.num_experts = experts;
  pc.top_k = 2;
  pc.capacity = capacity;
  pc.expert_bytes = 1e6;
  pc.link_bytes_per_sec = 1e9;
  pc.layer_seconds = 1e-3;
  return pc;
}

// The shape most cache and policy tests share: 4 layers of 6 experts.
inline constexpr int kLayers = 4;
inline constexpr int kExperts = 6;
inline PolicyConfig Config(int capacity) { return TestPolicyConfig(kLayers, kExperts, capacity); }

inline ExpertCacheOptions TestCacheOptions(int layers, int experts, int capacity, bool prefetch) {
  ExpertCacheOptions o;
  o.num_layers = layers;
  o.num_experts = experts;
  o.top_k = 2;
  o.capacity = capacity;
  o.expert_bytes = 1000000;
  o.prefetch = prefetch;
  o.link_bytes_per_sec = 1e9;
  o.layer_seconds = 1e-3;
  return o;
}

}  // namespace moe::cache::testing

#endif  // MOECACHE_TESTS_CACHE_CACHE_TEST_OPTIONS_H_
