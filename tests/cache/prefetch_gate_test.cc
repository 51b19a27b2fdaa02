// The prefetch gate's calibration: C (the chunk a demand may wait behind,
// clipped to one expert), T (compute per layer, estimated online from the
// owners' acquires on the cache's clock), and the gate refusing a prefetch
// whose expected gain is below its cost.
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "services/cache/clock.h"
#include "services/cache/expert_cache.h"
#include "services/cache/fake_copy_engine.h"
#include "services/cache/prefetcher.h"

namespace moe::cache {
namespace {

constexpr int kLayers = 4;
constexpr int kExperts = 6;
constexpr uint64_t kExpertBytes = 1000000;  // X = 1 ms at 1 GB/s
constexpr double kLink = 1e9;

TEST(PrefetchGateTest, ChunkWaitIsOneChunkClippedToOneExpert) {
  // A 4 MiB chunk never holds the link longer than the 786,432-byte expert
  // it belongs to.
  EXPECT_DOUBLE_EQ(ChunkWaitSeconds(4ull << 20, 786432, 1e9), 786432 / 1e9);
  EXPECT_DOUBLE_EQ(ChunkWaitSeconds(64 << 10, 786432, 1e9), 65536 / 1e9);
  EXPECT_DOUBLE_EQ(ChunkWaitSeconds(1000000, 17000000, 25e9), 1e6 / 25e9);
  EXPECT_EQ(ChunkWaitSeconds(0, 786432, 1e9), 0.0);   // no chunk: no wait
  EXPECT_EQ(ChunkWaitSeconds(65536, 786432, 0), 0.0);  // unpaced link
}

TEST(PrefetchGateTest, SetGateLinkFiguresTakesTheEnginesChunk) {
  auto engine = *FakeCopyEngine::Create({1000000000, 4ull << 20, 0, 0, nullptr});
  ExpertCacheOptions o;
  SetGateLinkFigures(*engine, kLink, 0.25e-3, &o);
  EXPECT_EQ(o.chunk_bytes, 4ull << 20);
  EXPECT_EQ(o.link_bytes_per_sec, kLink);
  EXPECT_EQ(o.layer_seconds, 0.25e-3);
}

TEST(PrefetchGateTest, LayerEstimateIsAnEwmaOfObservations) {
  PrefetcherOptions po;
  po.num_layers = kLayers;
  po.num_experts = kExperts;
  Prefetcher online(po);
  EXPECT_EQ(online.layer_seconds(), 0.0);  // unknown: refuse
  online.ObserveLayerSeconds(1e-3);
  EXPECT_DOUBLE_EQ(online.layer_seconds(), 1e-3);
  online.ObserveLayerSeconds(3e-3);
  EXPECT_DOUBLE_EQ(online.layer_seconds(), 1e-3 + Prefetcher::kLayerEwmaWeight * 2e-3);
  po.layer_seconds = 0.5e-3;  // fixed: observations are ignored
  Prefetcher fixed(po);
  fixed.ObserveLayerSeconds(3e-3);
  EXPECT_EQ(fixed.layer_seconds(), 0.5e-3);
}

// A cache on a virtual clock (the engine moves it), lru, 16 slots.
struct Rig {
  ManualClock clock;
  std::unique_ptr<FakeCopyEngine> engine;
  std::unique_ptr<ExpertCache> cache;

  Rig(uint64_t chunk_bytes, double layer_seconds) {
    engine = *FakeCopyEngine::Create({1000000000, chunk_bytes, 0, 0, &clock});
    ExpertCacheOptions o;
    o.num_layers = kLayers;
    o.num_experts = kExperts;
    o.top_k = 2;
    o.capacity = 16;
    o.expert_bytes = kExpertBytes;
    o.prefetch = true;
    o.clock = &clock;
    SetGateLinkFigures(*engine, kLink, layer_seconds, &o);
    PolicyConfig pc;
    pc.num_layers = kLayers;
    pc.num_experts = kExperts;
    pc.top_k = 2;
    pc.capacity = 16;
    pc.expert_bytes = kExpertBytes;
    pc.link_bytes_per_sec = kLink;
    cache = *ExpertCache::Create(o, *MakePolicy("lru", pc), engine.get());
  }

  // Acquires `layer` (experts 0 and 1), waits on the virtual link, releases,
  // then computes for `compute_ns` of virtual time.
  void Layer(int layer, Phase phase, int64_t compute_ns) {
    std::vector<ExpertDemand> d = {{0, 1}, {1, 1}};
    auto t = cache->StartAcquire(
        1, {.layer = layer, .demands = d, .prefill = phase == Phase::kPrefill});
    ASSERT_TRUE(t.ok()) << t.status();
    while (!*cache->IsReady(*t)) engine->AdvanceTo(*engine->NextCompletionTime());
    auto leases = cache->FinishAcquire(*t);
    ASSERT_TRUE(leases.ok()) << leases.status();
    engine->AdvanceTo(engine->now_ns() + compute_ns);
    ASSERT_TRUE(cache->Release(1, leases->leases).ok());
  }

  bool Loading(int layer, int expert) const {
    for (const SlotInfo& s : cache->SlotsForTest()) {
      if (s.state != SlotState::kEmpty && s.key == ExpertKey{layer, expert}) return true;
    }
    return false;
  }

  // A pre-gating hint for layer 2 (expert 5) after layer 1: the gate decides
  // at once (its precision prior is 0.5, the victim an empty slot).
  bool HintIssued() {
    const uint64_t before = cache->GetStats(Phase::kDecode).prefetches_issued;
    std::vector<ExpertHint> hint = {{2, 5, 0.9f}};
    cache->AddHints(1, hint);
    const bool issued = cache->GetStats(Phase::kDecode).prefetches_issued > before;
    EXPECT_EQ(issued, Loading(2, 5));
    return issued;
  }
};

TEST(PrefetchGateTest, KnownAcquireSpacingGivesTheKnownLayerTime) {
  Rig rig(100000, /*layer_seconds=*/0);
  rig.cache->BeginRequest(1);
  // Prefill gaps and gaps across iterations (lm_head, sampling) are not a
  // layer's compute.
  for (int l = 0; l < kLayers; ++l) rig.Layer(l, Phase::kPrefill, 5000000);
  rig.Layer(0, Phase::kDecode, 0);
  EXPECT_EQ(rig.cache->GetGauges().layer_seconds, 0.0);
  rig.Layer(1, Phase::kDecode, 300000);  // gap 0 -> 1 was 0 ns
  EXPECT_DOUBLE_EQ(rig.cache->GetGauges().layer_seconds, 0.0);
  rig.Layer(2, Phase::kDecode, 7000000);  // gap 1 -> 2: 300 us
  const double w = Prefetcher::kLayerEwmaWeight;
  EXPECT_DOUBLE_EQ(rig.cache->GetGauges().layer_seconds, w * 300e-6);
  rig.Layer(0, Phase::kDecode, 400000);  // 2 -> 0: a new iteration, not a sample
  EXPECT_DOUBLE_EQ(rig.cache->GetGauges().layer_seconds, w * 300e-6);
  rig.Layer(2, Phase::kDecode, 0);  // 0 -> 2 skips a layer: 400 us / 2
  EXPECT_DOUBLE_EQ(rig.cache->GetGauges().layer_seconds,
                   w * 300e-6 + w * (200e-6 - w * 300e-6));

  // Steady spacing converges to it.
  Rig steady(100000, 0);
  steady.cache->BeginRequest(1);
  for (int l = 0; l < kLayers; ++l) steady.Layer(l, Phase::kDecode, 250000);
  EXPECT_DOUBLE_EQ(steady.cache->GetGauges().layer_seconds, 250e-6);
  // A fixed T is what the gauge shows.
  Rig fixed(100000, 1e-3);
  fixed.cache->BeginRequest(1);
  for (int l = 0; l < kLayers; ++l) fixed.Layer(l, Phase::kDecode, 250000);
  EXPECT_EQ(fixed.cache->GetGauges().layer_seconds, 1e-3);
}

// gain = p * min(X, T) against cost = (1 - p) * value * X + C, with p = 0.5
// (the hints' precision prior), value 0 (an empty slot), X = 1 ms.
TEST(PrefetchGateTest, PrefetchWhoseGainIsBelowItsCostIsNotIssued) {
  {  // 1 MB chunk = one expert: C = X = 1 ms > 0.5 ms, even with T = 1 ms.
    Rig rig(1000000, 1e-3);
    rig.cache->BeginRequest(1);
    rig.Layer(0, Phase::kDecode, 0);
    rig.Layer(1, Phase::kDecode, 0);
    EXPECT_FALSE(rig.HintIssued());
  }
  {  // 100 kB chunks: C = 0.1 ms < 0.5 ms.
    Rig rig(100000, 1e-3);
    rig.cache->BeginRequest(1);
    rig.Layer(0, Phase::kDecode, 0);
    rig.Layer(1, Phase::kDecode, 0);
    EXPECT_TRUE(rig.HintIssued());
  }
  // Online T, 100 kB chunks: the worker's compute between acquires decides.
  {  // No gap seen yet: T = 0, no gain.
    Rig rig(100000, 0);
    rig.cache->BeginRequest(1);
    rig.Layer(0, Phase::kDecode, 0);
    EXPECT_FALSE(rig.HintIssued());
  }
  {  // 150 us per layer: gain 0.075 ms < C = 0.1 ms.
    Rig rig(100000, 0);
    rig.cache->BeginRequest(1);
    rig.Layer(0, Phase::kDecode, 150000);
    rig.Layer(1, Phase::kDecode, 150000);
    EXPECT_NEAR(rig.cache->GetGauges().layer_seconds, 150e-6, 1e-12);
    EXPECT_FALSE(rig.HintIssued());
  }
  {  // 500 us per layer: gain 0.25 ms > C = 0.1 ms.
    Rig rig(100000, 0);
    rig.cache->BeginRequest(1);
    rig.Layer(0, Phase::kDecode, 500000);
    rig.Layer(1, Phase::kDecode, 500000);
    EXPECT_TRUE(rig.HintIssued());
  }
}

}  // namespace
}  // namespace moe::cache
