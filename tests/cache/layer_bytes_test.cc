// ExpertCacheOptions::layer_bytes: where a model's layers hold experts of
// different sizes (a GGUF file of mixed types), a copy moves only its
// expert's own bytes, and the cache counts those.
#include <vector>

#include "gtest/gtest.h"
#include "services/cache/expert_cache.h"
#include "services/cache/fake_copy_engine.h"
#include "services/cache/policy.h"

namespace moe::cache {
namespace {

constexpr int kLayers = 2;
constexpr int kExperts = 4;
constexpr uint64_t kSlot = 1000000;

ExpertCacheOptions Options(std::vector<uint64_t> layer_bytes) {
  ExpertCacheOptions o;
  o.num_layers = kLayers;
  o.num_experts = kExperts;
  o.top_k = 2;
  o.capacity = 8;
  o.expert_bytes = kSlot;
  o.layer_bytes = std::move(layer_bytes);
  return o;
}

PolicyConfig Config() {
  PolicyConfig pc;
  pc.num_layers = kLayers;
  pc.num_experts = kExperts;
  pc.top_k = 2;
  pc.capacity = 8;
  pc.expert_bytes = kSlot;
  return pc;
}

TEST(LayerBytesTest, MalformedSizesAreRefused) {
  auto engine = *FakeCopyEngine::Create({1000000000, kSlot, 0, 0, nullptr});
  const std::vector<std::vector<uint64_t>> bad = {
      {kSlot},                // one entry for two layers
      {kSlot, 0},             // an empty expert
      {kSlot, kSlot + 1},     // larger than a slot
  };
  for (const std::vector<uint64_t>& b : bad) {
    auto cache = ExpertCache::Create(Options(b), *MakePolicy("lru", Config()), engine.get());
    EXPECT_EQ(cache.status().code(), absl::StatusCode::kInvalidArgument) << b.size();
  }
  EXPECT_TRUE(
      ExpertCache::Create(Options({}), *MakePolicy("lru", Config()), engine.get()).ok());
}

// Layer 0's experts are 400 kB, layer 1's fill the 1 MB slot: the engine
// moves and the cache counts exactly that per load, and a layer-0 load
// takes 0.4 of a layer-1 load on the link.
TEST(LayerBytesTest, EachLoadMovesItsLayersBytes) {
  auto engine = *FakeCopyEngine::Create({1000000000, kSlot, 0, 0, nullptr});
  auto cache = *ExpertCache::Create(Options({400000, kSlot}), *MakePolicy("lru", Config()),
                                    engine.get());
  cache->BeginRequest(1);
  int64_t took[kLayers];
  for (int layer = 0; layer < kLayers; ++layer) {
    const int64_t start = engine->now_ns();
    auto t = cache->StartAcquire(1, {.layer = layer, .demands = {{0, 1}, {1, 1}}});
    ASSERT_TRUE(t.ok()) << t.status();
    while (!*cache->IsReady(*t)) engine->AdvanceTo(*engine->NextCompletionTime());
    took[layer] = engine->now_ns() - start;
    auto r = cache->FinishAcquire(*t);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(cache->Release(1, r->leases).ok());
  }
  EXPECT_EQ(cache->GetStats(Phase::kDecode).bytes_moved + cache->GetStats(Phase::kPrefill).bytes_moved,
            2 * 400000 + 2 * kSlot);
  EXPECT_EQ(engine->GetStats().bytes_moved, 2 * 400000 + 2 * kSlot);
  EXPECT_NEAR(static_cast<double>(took[0]) / static_cast<double>(took[1]), 0.4, 0.01);
}

}  // namespace
}  // namespace moe::cache
