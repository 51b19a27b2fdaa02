#include "services/cache/expert_cache.h"

#include <atomic>
#include <map>
#include <random>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/cache/chunk_scheduler.h"
#include "services/cache/eamc.h"
#include "services/cache/expertflow_policy.h"
#include "services/cache/fake_copy_engine.h"
#include "services/cache/moe_infinity_policy.h"
#include "tests/cache/cache_test_options.h"

namespace moe::cache {
namespace {

using testing::Config;
using testing::kExperts;
using testing::kLayers;

// A cache of `capacity` 1 MB experts over a 1 GB/s link, 1 ms per layer.
ExpertCacheOptions LinkOptions(int capacity, bool prefetch) {
  return testing::TestCacheOptions(kLayers, kExperts, capacity, prefetch);
}

// Drives one acquire on the virtual clock.
std::vector<SlotLease> AcquireNow(ExpertCache& cache, FakeCopyEngine& engine, OwnerId owner,
                              int layer, std::vector<ExpertDemand> demands) {
  auto t = cache.StartAcquire(owner, {.layer = layer, .demands = demands});
  EXPECT_TRUE(t.ok()) << t.status();
  while (!*cache.IsReady(*t)) engine.AdvanceTo(*engine.NextCompletionTime());
  auto r = cache.FinishAcquire(*t);
  EXPECT_TRUE(r.ok()) << r.status();
  return r->leases;
}

TEST(ExpertCacheTest, NoPolicyEvictsLeasedOrNeededSlots) {
  std::vector<std::string> names = OnlinePolicyNames();
  for (const std::string& name : names) {
    for (bool prefetch : {false, true}) {
      const int capacity = 8;
      auto engine = *FakeCopyEngine::Create({1000000000, 1000000, 0, 0, nullptr});
      const ExpertCacheOptions o = LinkOptions(capacity, prefetch);
      auto cache = *ExpertCache::Create(o, *MakePolicy(name, Config(capacity)), engine.get());
      // Owner 1 holds two leases for the whole test.
      cache->BeginRequest(1);
      std::vector<SlotLease> held = AcquireNow(*cache, *engine, 1, 0, {{0, 1}, {1, 1}});
      std::mt19937 rng(7);
      cache->BeginRequest(2);
      for (int step = 0; step < 300; ++step) {
        const int layer = step % kLayers;
        std::vector<ExpertDemand> d;
        int a = rng() % kExperts, b = (a + 1 + rng() % (kExperts - 1)) % kExperts;
        d.push_back({a, 1});
        d.push_back({b, 1});
        auto leases = AcquireNow(*cache, *engine, 2, layer, d);
        ASSERT_EQ(leases.size(), 2u);
        auto slots = cache->SlotsForTest();
        for (const SlotLease& l : held) {
          EXPECT_EQ(slots[l.slot].state, SlotState::kReady) << name;
          EXPECT_EQ(slots[l.slot].key, l.key) << name;
          EXPECT_EQ(slots[l.slot].generation, l.generation) << name;
        }
        for (const SlotLease& l : leases) {
          EXPECT_EQ(slots[l.slot].key, l.key) << name;
          EXPECT_EQ(slots[l.slot].state, SlotState::kReady) << name;
        }
        engine->AdvanceTo(engine->now_ns() + 1000000);
        ASSERT_TRUE(cache->Release(2, leases).ok());
        cache->CheckInvariantsForTest();
        // Per-layer monitoring figures add up to the totals and agree with
        // the slots.
        const ExpertCache::Gauges g = cache->GetGauges();
        ASSERT_EQ(g.layer_resident.size(), static_cast<size_t>(kLayers));
        std::vector<int> resident(kLayers, 0);
        for (const SlotInfo& s : cache->SlotsForTest()) {
          if (s.state == SlotState::kReady) ++resident[s.key.layer];
        }
        EXPECT_EQ(g.layer_resident, resident) << name;
        const CachePhaseStats st = cache->GetStats(Phase::kDecode);
        uint64_t hits = 0, misses = 0;
        for (int l = 0; l < kLayers; ++l) {
          hits += g.layer_hits[l];
          misses += g.layer_misses[l];
        }
        EXPECT_EQ(hits, st.hits) << name;
        EXPECT_EQ(misses, st.misses) << name;
        EXPECT_EQ(hits + misses, 2u * (step + 2)) << name;  // + owner 1's acquire
      }
      EXPECT_TRUE(cache->Release(1, held).ok());
      EXPECT_FALSE(cache->Release(1, held).ok());  // double release is refused
    }
  }
}

// Two requests (two sessions) interleave their layers on one cache: each
// ticket's usage is its own and they add up to the totals; iterations are
// counted per owner; a departed session's request state goes with it.
TEST(ExpertCacheTest, OwnersInterleaveWithExactUsageAndTheirOwnIterations) {
  for (const std::string& name : OnlinePolicyNames()) {
    const int capacity = 12;
    auto engine = *FakeCopyEngine::Create({1000000000, 1000000, 0, 0, nullptr});
    const ExpertCacheOptions o = LinkOptions(capacity, true);
    auto cache = *ExpertCache::Create(o, *MakePolicy(name, Config(capacity)), engine.get());
    const RequestOwner a{1, 7}, b{2, 7};  // same request id, other session
    cache->BeginRequest(a);
    cache->BeginRequest(b);
    auto run = [&](const RequestOwner& owner, int layer,
                   std::vector<ExpertDemand> d) {
      auto t = cache->StartAcquire(owner, {.layer = layer, .demands = d});
      EXPECT_TRUE(t.ok()) << t.status();
      while (!*cache->IsReady(*t))
        engine->AdvanceTo(*engine->NextCompletionTime());
      auto r = cache->FinishAcquire(*t);
      EXPECT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->usage.hits + r->usage.misses, static_cast<int>(d.size()));
      EXPECT_TRUE(cache->Release(owner.session, r->leases).ok());
      return r->usage;
    };
    AcquireUsage sum;
    // A misses layer 0's experts; B, right after, finds them resident.
    AcquireUsage first = run(a, 0, {{0, 1}, {1, 1}});
    EXPECT_EQ(first.misses, 2) << name;
    EXPECT_GT(first.stall_ns, 0) << name;
    sum += first;
    AcquireUsage second = run(b, 0, {{0, 1}, {1, 1}});
    EXPECT_EQ(second.hits, 2) << name;
    EXPECT_EQ(second.stall_ns, 0) << name;
    sum += second;
    // Interleaved tokens: A at layers 1..3 while B starts over at layer 0
    // each time. Per owner, that is 2 iterations of A and 4 of B.
    std::mt19937 rng(3);
    for (int token = 0; token < 2; ++token) {
      for (int layer = (token == 0 ? 1 : 0); layer < kLayers; ++layer) {
        const int e = rng() % kExperts;
        sum += run(a, layer, {{e, 1}, {(e + 1) % kExperts, 1}});
        sum += run(b, 0, {{(e + 2) % kExperts, 1}});
      }
    }
    const CachePhaseStats st = cache->GetStats(Phase::kDecode);
    EXPECT_EQ(static_cast<uint64_t>(sum.hits), st.hits) << name;
    EXPECT_EQ(static_cast<uint64_t>(sum.misses), st.misses) << name;
    EXPECT_EQ(st.iterations, 2u + 8u) << name;  // A: 2; B: 1 + 7 (layer 0 each time)
    cache->EndRequest(b);
    EXPECT_EQ(cache->ReleaseOwner(1), 0) << name;  // A's state goes with its session
    cache->CheckInvariantsForTest();
  }
}

// A cache smaller than a layer (issue 28, CheckCapacity): with host or auto
// misses every policy serves any layer from at most `capacity` leases plus
// host answers, down to 0 slots, and keeps filling its free slots behind the
// host runs; an acquire that may not run on the host is refused with
// RESOURCE_EXHAUSTED once its layer's experts find no slot, and with
// --miss-mode fetch such a cache cannot be made.
TEST(ExpertCacheTest, CachesSmallerThanALayerAnswerOnTheHost) {
  for (const std::string& name : OnlinePolicyNames()) {
    for (int capacity : {0, 2}) {
      SCOPED_TRACE(absl::StrCat(name, " capacity ", capacity));
      auto engine = *FakeCopyEngine::Create({1000000000, 1000000, 0, 0, nullptr});
      ExpertCacheOptions o = LinkOptions(capacity, /*prefetch=*/true);
      o.miss_mode = MissMode::kAuto;
      o.host = {10e9, 0};
      auto cache = ExpertCache::Create(o, *MakePolicy(name, Config(capacity)), engine.get());
      ASSERT_TRUE(cache.ok()) << cache.status();
      std::vector<ExpertDemand> all;
      for (int e = 0; e < kExperts; ++e) all.push_back({e, 1 + e});
      for (int token = 0; token < 6; ++token) {
        for (int layer = 0; layer < kLayers; ++layer) {
          auto t = (*cache)->StartAcquire(
              1, {.layer = layer, .demands = all, .host_ok = true});
          ASSERT_TRUE(t.ok()) << t.status();
          while (!*(*cache)->IsReady(*t)) engine->AdvanceTo(*engine->NextCompletionTime());
          auto r = (*cache)->FinishAcquire(*t);
          ASSERT_TRUE(r.ok()) << r.status();
          EXPECT_LE(r->leases.size(), static_cast<size_t>(capacity));
          EXPECT_EQ(r->leases.size() + r->host.size(), static_cast<size_t>(kExperts));
          ASSERT_TRUE((*cache)->Release(1, r->leases).ok());
          engine->AdvanceTo(engine->now_ns() + 5000000);  // copies behind land
        }
      }
      int resident = 0;
      for (const SlotInfo& info : (*cache)->SlotsForTest()) resident += info.state == SlotState::kReady;
      EXPECT_EQ(resident, capacity) << "free slots are filled behind host runs";
      if (capacity > 0) {
        // Three experts cannot all be fetched into two slots.
        std::vector<ExpertDemand> three = {{0, 1}, {1, 1}, {2, 1}};
        auto t = (*cache)->StartAcquire(2, {.layer = kLayers - 1, .demands = three});
        ASSERT_FALSE(t.ok());
        EXPECT_EQ(t.status().code(), absl::StatusCode::kResourceExhausted) << t.status();
      }
    }
  }
  ExpertCacheOptions fetch = LinkOptions(kExperts - 1, false);
  auto engine = *FakeCopyEngine::Create({1000000000, 1000000, 0, 0, nullptr});
  auto refused =
      ExpertCache::Create(fetch, *MakePolicy("lru", Config(kExperts - 1)), engine.get());
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), ::testing::HasSubstr("--miss-mode host or auto"));
}

// With misses run on the host, a miss is copied in behind its answer only
// when the policy admits it: static-layers keeps the first capacity / E
// layers resident (llama.cpp's split), static-popular the most used experts.
TEST(ExpertCacheTest, HostAnswersAndStaticPlacements) {
  for (const std::string& name : {std::string("static-layers"), std::string("static-popular"),
                                  std::string("lru")}) {
    SCOPED_TRACE(name);
    const int capacity = 2 * kExperts;  // two layers' worth
    auto engine = *FakeCopyEngine::Create({1000000000, 1000000, 0, 0, nullptr});
    ExpertCacheOptions o = LinkOptions(capacity, false);
    o.miss_mode = MissMode::kHost;
    o.host = {10e9, 0};
    auto cache = *ExpertCache::Create(o, *MakePolicy(name, Config(capacity)), engine.get());
    std::mt19937 rng(11);
    std::vector<int> uses(kLayers * kExperts, 0);
    uint64_t host_answers = 0;
    for (int token = 0; token < 60; ++token) {
      for (int layer = 0; layer < kLayers; ++layer) {
        // Expert 0 of each layer is the popular one.
        const int e = rng() % 3 == 0 ? static_cast<int>(rng() % kExperts) : 0;
        std::vector<ExpertDemand> d = {{e, 1}};
        ++uses[layer * kExperts + e];
        auto t = cache->StartAcquire(
            1, {.layer = layer, .demands = d, .host_ok = true});
        ASSERT_TRUE(t.ok()) << t.status();
        while (!*cache->IsReady(*t)) engine->AdvanceTo(*engine->NextCompletionTime());
        auto r = cache->FinishAcquire(*t);
        ASSERT_TRUE(r.ok());
        EXPECT_EQ(r->leases.size() + r->host.size(), 1u);
        EXPECT_EQ(r->usage.host, static_cast<int>(r->host.size()));
        EXPECT_EQ(r->usage.stall_ns, 0);  // a host answer waits for nothing
        host_answers += r->host.size();
        ASSERT_TRUE(cache->Release(1, r->leases).ok());
        engine->AdvanceTo(engine->now_ns() + 5000000);  // the copy behind lands
      }
    }
    EXPECT_GT(host_answers, 0u);
    EXPECT_EQ(cache->GetStats(Phase::kDecode).host_runs, host_answers);
    int resident = 0;
    for (const SlotInfo& s : cache->SlotsForTest()) {
      if (s.state != SlotState::kReady) continue;
      ++resident;
      if (name == "static-layers") {
        EXPECT_LT(s.key.layer, 2) << s.key.ToString();
      }
    }
    EXPECT_GT(resident, 0);  // copies behind the answers filled the arena
    if (name == "static-popular") {
      // Every layer's popular expert is resident.
      for (int layer = 0; layer < kLayers; ++layer) {
        bool found = false;
        for (const SlotInfo& s : cache->SlotsForTest()) {
          found |= s.state == SlotState::kReady && s.key == ExpertKey{layer, 0};
        }
        EXPECT_TRUE(found) << "L" << layer << "/E0";
      }
    }
    cache->CheckInvariantsForTest();
  }
}

// The cost model counts a copy that is already a demand on the link once:
// waiting for it costs the backlog (which holds it), not the backlog plus
// its remaining bytes again. Link 1 GB/s, 1 MB experts: owner 1's demand
// copy of L0/E3 has 1 ms left; a host run takes 1.5 ms, so owner 2 waits
// for the copy. A host run of 0.5 ms is taken instead.
TEST(ExpertCacheTest, AutoCountsAnInFlightDemandCopyOnce) {
  for (double host_ms : {1.5, 0.5}) {
    SCOPED_TRACE(absl::StrCat("host run ", host_ms, " ms"));
    auto engine = *FakeCopyEngine::Create({1000000000, 1000000, 0, 0, nullptr});
    ExpertCacheOptions o = LinkOptions(2 * kExperts, false);
    o.miss_mode = MissMode::kAuto;
    o.host = {1e6 / (host_ms * 1e-3), 0};
    auto cache = *ExpertCache::Create(o, *MakePolicy("lru", Config(o.capacity)), engine.get());
    cache->BeginRequest(1);
    cache->BeginRequest(2);
    const std::vector<ExpertDemand> d = {{3, 1}};
    auto first = cache->StartAcquire(1, {.layer = 0, .demands = d});
    ASSERT_TRUE(first.ok()) << first.status();
    auto second =
        cache->StartAcquire(2, {.layer = 0, .demands = d, .host_ok = true});
    ASSERT_TRUE(second.ok()) << second.status();
    while (!*cache->IsReady(*second)) engine->AdvanceTo(*engine->NextCompletionTime());
    auto r2 = cache->FinishAcquire(*second);
    ASSERT_TRUE(r2.ok()) << r2.status();
    if (host_ms > 1.0) {
      EXPECT_EQ(r2->leases.size(), 1u);
      EXPECT_TRUE(r2->host.empty());
    } else {
      EXPECT_TRUE(r2->leases.empty());
      EXPECT_EQ(r2->host.size(), 1u);
    }
    while (!*cache->IsReady(*first)) engine->AdvanceTo(*engine->NextCompletionTime());
    auto r1 = cache->FinishAcquire(*first);
    ASSERT_TRUE(r1.ok()) << r1.status();
    EXPECT_TRUE(cache->Release(1, r1->leases).ok());
    EXPECT_TRUE(cache->Release(2, r2->leases).ok());
    cache->CheckInvariantsForTest();
  }
}

// Worker reports move the host figures: a read-bound report the read
// bandwidth, a compute-bound one the FLOP rate (EWMA, weight 0.2); and the
// decisions follow: once the host is measured slow, auto copies the miss.
TEST(ExpertCacheTest, HostRunReportsTrackTheHostFigures) {
  auto engine = *FakeCopyEngine::Create({1000000000, 1000000, 0, 0, nullptr});
  ExpertCacheOptions o = LinkOptions(2 * kExperts, false);
  o.miss_mode = MissMode::kAuto;
  o.host = {10e9, 1e12};             // a 1 MB expert: 0.1 ms to read
  o.expert_flops_per_token = 1e6;    // 1 us per token at 1 TFLOP/s
  auto cache = *ExpertCache::Create(o, *MakePolicy("lru", Config(o.capacity)), engine.get());
  // Read-bound (1 token each): 2 experts in 2 ms -> 1 GB/s measured.
  cache->ReportHostRuns({2, 2, 2, 2000000});
  EXPECT_NEAR(cache->host_figures().read_bytes_per_sec, 0.8 * 10e9 + 0.2 * 1e9, 1);
  EXPECT_EQ(cache->host_figures().flops_per_sec, 1e12);
  // Compute-bound (1000 tokens each: 1 ms at 1 TFLOP/s > 0.12 ms read):
  // 1 expert in 10 ms -> 0.1 TFLOP/s measured.
  cache->ReportHostRuns({1, 1, 1000, 10000000});
  EXPECT_NEAR(cache->host_figures().flops_per_sec, 0.8 * 1e12 + 0.2 * 1e11, 1);
  // A host now measured at ~0.1 GB/s loses to a 1 ms copy.
  for (int i = 0; i < 30; ++i) cache->ReportHostRuns({1, 1, 1, 10000000});
  EXPECT_LT(cache->host_figures().read_bytes_per_sec, 0.15e9);
  cache->BeginRequest(1);
  auto t = cache->StartAcquire(1, {.layer = 0,
                                   .demands = std::vector<ExpertDemand>{{1, 1}},
                                   .host_ok = true});
  ASSERT_TRUE(t.ok());
  while (!*cache->IsReady(*t)) engine->AdvanceTo(*engine->NextCompletionTime());
  auto r = cache->FinishAcquire(*t);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->host.empty());
  EXPECT_EQ(r->leases.size(), 1u);
  EXPECT_TRUE(cache->Release(1, r->leases).ok());
}

// Every slot leased by one session: another session's miss that auto would
// copy is answered on the host when it may run there, and refused with
// RESOURCE_EXHAUSTED when it may not (fetch mode, or no host execution).
TEST(ExpertCacheTest, NoFreeSlotRunsTheMissOnTheHostWhenItMay) {
  for (MissMode mode : {MissMode::kAuto, MissMode::kFetch}) {
    for (bool host_ok : {true, false}) {
      SCOPED_TRACE(absl::StrCat(MissModeName(mode), host_ok ? " host_ok" : ""));
      auto engine = *FakeCopyEngine::Create({1000000000, 1000000, 0, 0, nullptr});
      ExpertCacheOptions o = LinkOptions(kExperts, false);  // exactly one layer
      o.miss_mode = mode;
      o.host = {1e9, 1e12};  // a 1 MB expert: 1 ms on the host, as long as its copy
      o.expert_flops_per_token = 1e6;
      o.host_tracking_weight = 0;
      auto cache = *ExpertCache::Create(o, *MakePolicy("lru", Config(kExperts)), engine.get());
      std::vector<ExpertDemand> all;
      for (int e = 0; e < kExperts; ++e) all.push_back({e, 1000});  // prefill: copies win
      cache->BeginRequest(1);
      auto held =
          cache->StartAcquire(1, {.layer = 0, .demands = all, .prefill = true});
      ASSERT_TRUE(held.ok()) << held.status();
      while (!*cache->IsReady(*held)) engine->AdvanceTo(*engine->NextCompletionTime());
      auto leases = cache->FinishAcquire(*held);
      ASSERT_TRUE(leases.ok());
      cache->BeginRequest(2);
      auto t = cache->StartAcquire(
          2, {.layer = 1,
              .demands = std::vector<ExpertDemand>{{3, 1000}},
              .prefill = true,
              .host_ok = host_ok});
      if (mode == MissMode::kAuto && host_ok) {
        ASSERT_TRUE(t.ok()) << t.status();
        auto r = cache->FinishAcquire(*t);
        ASSERT_TRUE(r.ok()) << r.status();
        ASSERT_EQ(r->host.size(), 1u);
        EXPECT_EQ(r->host[0], (ExpertKey{1, 3}));
        EXPECT_TRUE(r->leases.empty());
      } else {
        EXPECT_EQ(t.status().code(), absl::StatusCode::kResourceExhausted) << t.status();
      }
      EXPECT_TRUE(cache->Release(1, leases->leases).ok());
      cache->CheckInvariantsForTest();
    }
  }
}

// Pre-gating hints arrive between acquires (after layer l, for layer l+1):
// the copy must start when the hint arrives, not at the next acquire.
TEST(ExpertCacheTest, HintForTheNextLayerStartsItsCopyAtOnce) {
  for (const std::string& name : {std::string("lru"), std::string("moe-infinity")}) {
    const int capacity = 16;
    auto engine = *FakeCopyEngine::Create({1000000000, 1000000, 0, 0, nullptr});
    const ExpertCacheOptions o = LinkOptions(capacity, true);
    auto cache = *ExpertCache::Create(o, *MakePolicy(name, Config(capacity)), engine.get());
    cache->BeginRequest(1);
    std::vector<SlotLease> l0 = AcquireNow(*cache, *engine, 1, 0, {{0, 1}, {1, 1}});
    ASSERT_TRUE(cache->Release(1, l0).ok());
    const uint64_t before = cache->GetStats(Phase::kDecode).prefetches_issued;
    auto loading = [&](int layer, int expert) {
      for (const SlotInfo& s : cache->SlotsForTest()) {
        if (s.state != SlotState::kEmpty && s.key == ExpertKey{layer, expert}) return true;
      }
      return false;
    };
    ASSERT_FALSE(loading(1, 5)) << name;
    std::vector<ExpertHint> hint = {{1, 5, 0.9f}};
    cache->AddHints(1, hint);
    EXPECT_TRUE(loading(1, 5)) << name << ": the hinted expert's copy did not start";
    EXPECT_GT(cache->GetStats(Phase::kDecode).prefetches_issued, before) << name;
    // The acquire of layer 1 then finds it (ready once the link delivers).
    engine->AdvanceTo(engine->now_ns() + 5000000);
    std::vector<SlotLease> l1 = AcquireNow(*cache, *engine, 1, 1, {{5, 1}, {2, 1}});
    EXPECT_EQ(cache->GetStats(Phase::kDecode).prefetches_used, 1u) << name;
    ASSERT_TRUE(cache->Release(1, l1).ok());
    cache->CheckInvariantsForTest();
  }
}

// Bad demands are preconditions of the cache (SessionManager validates what
// comes from the wire): a violation dies loudly instead of being re-checked
// with other rules.
TEST(ExpertCacheDeathTest, BadDemandsArePreconditions) {
  auto engine = *FakeCopyEngine::Create({1000000000, 1000000, 0, 0, nullptr});
  ExpertCacheOptions o;
  o.num_layers = kLayers;
  o.num_experts = kExperts;
  o.capacity = kExperts;
  o.expert_bytes = 1;
  auto cache = *ExpertCache::Create(o, *MakePolicy("lru", Config(kExperts)), engine.get());
  std::vector<ExpertDemand> dup = {{1, 1}, {1, 1}};
  EXPECT_DEATH((void)cache->StartAcquire(1, {.layer = 0, .demands = dup}),
               "duplicate expert 1");
  std::vector<ExpertDemand> bad = {{kExperts, 1}};
  EXPECT_DEATH((void)cache->StartAcquire(1, {.layer = 0, .demands = bad}),
               "out of range");
  std::vector<ExpertDemand> none = {{0, 0}};
  EXPECT_DEATH((void)cache->StartAcquire(1, {.layer = 0, .demands = none}),
               "token count 0");
  EXPECT_DEATH((void)cache->StartAcquire(1, {.layer = kLayers, .demands = {}}),
               "layer");
  std::vector<ExpertHint> hint = {{kLayers, 0, 0.5f}};
  EXPECT_DEATH(cache->AddHints(1, hint), "out of range");
}

TEST(ExpertCacheTest, RejectsBadOptionsWithStatus) {
  auto engine = *FakeCopyEngine::Create({1000000000, 1000000, 0, 0, nullptr});
  ExpertCacheOptions o;
  o.num_layers = kLayers;
  o.num_experts = kExperts;
  o.capacity = kExperts - 1;
  o.expert_bytes = 1;
  EXPECT_FALSE(ExpertCache::Create(o, *MakePolicy("lru", Config(8)), engine.get()).ok());
  o.capacity = kExperts;
  EXPECT_TRUE(ExpertCache::Create(o, *MakePolicy("lru", Config(kExperts)), engine.get()).ok());
  EXPECT_FALSE(MakePolicy("moe-infinity:bogus=1", Config(8)).ok());
  EXPECT_FALSE(MakePolicy("lru:x=1", Config(8)).ok());
  EXPECT_FALSE(MakePolicy("belady", Config(8)).ok());
}

TEST(EamcTest, MatchesByCosineOnHandMadeMatrices) {
  for (bool inverted : {false, true}) {
    Eamc eamc({2, 3, 10, 0, inverted});
    auto make = [](std::vector<float> v) {
      Eam e(2, 3);
      for (int i = 0; i < 6; ++i) {
        if (v[i] != 0) e.Add(i / 3, i % 3, v[i]);
      }
      return e;
    };
    Eam empty(2, 3);
    eamc.Add(empty, make({3, 0, 0, 0, 2, 0}));  // A
    eamc.Add(empty, make({0, 3, 0, 0, 0, 2}));  // B
    eamc.Add(empty, make({1, 1, 0, 0, 1, 1}));  // C
    auto m = eamc.FindBest(make({2, 0, 0, 0, 1, 0}), EamPhase::kDecode, 3);
    ASSERT_EQ(m.size(), 2u);  // B shares nothing with the query
    EXPECT_EQ(m[0].index, 0);
    // cos(q, A) = (6 + 2) / (sqrt(5) * sqrt(13))
    EXPECT_NEAR(m[0].cosine, 8.0 / (std::sqrt(5.0) * std::sqrt(13.0)), 1e-6);
    EXPECT_EQ(m[1].index, 2);
    EXPECT_NEAR(m[1].cosine, 3.0 / (std::sqrt(5.0) * 2.0), 1e-6);
    EXPECT_TRUE(eamc.FindBest(make({0, 0, 1, 0, 0, 0}), EamPhase::kDecode, 3).empty());
  }
}

TEST(EamcTest, FullCollectionReplacesTheMostSimilarRecord) {
  Eamc eamc({2, 3, 2, 0, false});
  Eam empty(2, 3), a(2, 3), b(2, 3), c(2, 3);
  a.Add(0, 0, 3);
  b.Add(0, 1, 3);
  c.Add(0, 1, 2);
  c.Add(1, 2, 1);
  EXPECT_EQ(eamc.Add(empty, a), 0);
  EXPECT_EQ(eamc.Add(empty, b), 1);
  EXPECT_EQ(eamc.Add(empty, c), 1);  // c is closest to b
  EXPECT_EQ(eamc.size(), 2);
  auto m = eamc.FindBest(c, EamPhase::kDecode, 1);
  ASSERT_EQ(m.size(), 1u);
  EXPECT_NEAR(m[0].cosine, 1.0, 1e-6);
  EXPECT_EQ(eamc.Add(empty, empty), -1);
}

TEST(EamcTest, PruningKeepsTheLargestCountsPerLayer) {
  Eamc eamc({1, 4, 4, 2, true});
  Eam e(1, 4);
  e.Add(0, 0, 1);
  e.Add(0, 1, 5);
  e.Add(0, 2, 3);
  e.Add(0, 3, 2);
  SparseEam s = eamc.Prune(e);
  ASSERT_EQ(s.entries().size(), 2u);
  EXPECT_EQ(s.entries()[0].index, 1u);
  EXPECT_EQ(s.entries()[1].index, 2u);
}

TEST(ExpertFlowTest, StrideStartsFromTheFormulaAndFollowsStallsAndWaste) {
  ExpertFlowPolicy p;
  PolicyConfig pc = Config(12);
  pc.num_layers = 32;
  pc.expert_bytes = 17e6;  // 2 x 17 MB / (25 GB/s x 0.3 ms) = 4.53 -> 5
  pc.link_bytes_per_sec = 25e9;
  pc.layer_seconds = 0.3e-3;
  p.Configure(pc);
  const RequestOwner a{1, 1}, b{2, 1};
  p.OnBeginRequest(a);
  p.OnBeginRequest(b);
  EXPECT_EQ(p.PrefetchDistance(a), 5);
  for (int i = 0; i < ExpertFlowPolicy::kStallsPerStep * 2; ++i) p.OnStall(a, 1000);
  EXPECT_EQ(p.PrefetchDistance(a), 7);
  for (int i = 0; i < 10; ++i) p.OnStall(a, 0);  // no stall, no change
  EXPECT_EQ(p.PrefetchDistance(a), 7);
  EXPECT_EQ(p.PrefetchDistance(b), 5);  // counters are per owner
  EXPECT_EQ(p.MaxPrefetchDistance(), 7);
  for (int i = 0; i < ExpertFlowPolicy::kWastePerStep * 3; ++i) p.OnPrefetchOutcome(a, false);
  EXPECT_EQ(p.PrefetchDistance(a), 4);
  for (int i = 0; i < 100; ++i) p.OnPrefetchOutcome(a, true);  // used: no change
  EXPECT_EQ(p.PrefetchDistance(a), 4);
  for (int i = 0; i < 1000; ++i) p.OnPrefetchOutcome(a, false);
  EXPECT_EQ(p.PrefetchDistance(a), 1);  // never below 1
  EXPECT_EQ(p.PrefetchDistance(b), 5);
  p.OnEndRequest(a);
  EXPECT_EQ(p.PrefetchDistance(a), 5);  // a new request starts from the formula
}

}  // namespace
}  // namespace moe::cache

namespace moe::cache {
namespace {

TEST(PrefetcherTest, GateClosesForASourceWhosePrefetchesGoUnused) {
  PrefetcherOptions o;
  o.num_layers = 4;
  o.num_experts = 8;
  o.transfer_seconds = 0.68e-3;  // 17 MB at 25 GB/s
  o.layer_seconds = 0.3e-3;
  o.chunk_seconds = 0.04e-3;
  Prefetcher pf(o);
  const ExpertHint policy{1, 3, 0.9f, HintSource::kPolicy};
  const ExpertHint hint{1, 3, 0.9f, HintSource::kHint};
  EXPECT_TRUE(pf.Gate(policy, 0.0));
  EXPECT_FALSE(pf.Gate({1, 3, 0.5f, HintSource::kPolicy}, 1.0));  // the victim is worth more
  // Below the cost of holding the link for one chunk: never, even for free.
  EXPECT_FALSE(pf.Gate({1, 3, 0.1f, HintSource::kAffinity}, 0.0));
  for (int i = 0; i < 20; ++i) {
    pf.OnIssued(policy);
    pf.OnOutcome(HintSource::kPolicy, false);
  }
  EXPECT_LT(pf.accuracy_scale(HintSource::kPolicy), 0.1);
  EXPECT_FALSE(pf.Gate(policy, 0.0));  // no floor lets it through
  EXPECT_TRUE(pf.Gate(hint, 0.0));     // other sources keep their own record
  EXPECT_TRUE(pf.Gate({1, 3, 0.9f, HintSource::kAffinity}, 0.0));
  for (int i = 0; i < 20; ++i) {
    pf.OnIssued(policy);
    pf.OnOutcome(HintSource::kPolicy, true);
  }
  EXPECT_TRUE(pf.Gate(policy, 0.0));  // recovers when they start paying
}

// A link whose first `fail_first` chunks fail, as a CUDA copy does after an
// illegal address (every later copy fails too), with `code`.
class FailingMover : public ChunkMover {
 public:
  FailingMover(int fail_first, absl::StatusCode code) : fail_first_(fail_first), code_(code) {}
  absl::StatusOr<int64_t> Move(const internal::Chunk&, bool) override {
    if (calls_.fetch_add(1) < fail_first_) {
      return absl::Status(code_, "an illegal memory access was encountered");
    }
    return 0;
  }
  int calls() const { return calls_.load(); }

 private:
  const int fail_first_;
  const absl::StatusCode code_;
  std::atomic<int> calls_{0};
};

// Engine errors other than CANCELLED: a load is retried kMaxLoadRetries
// times, then the acquire fails with the engine's message (INTERNAL, or
// UNAVAILABLE when the engine said so) and the slot is freed; no hang. A
// failure that clears up within the retries goes unnoticed by the acquire.
TEST(ExpertCacheTest, EngineErrorsFailTheAcquireAfterBoundedRetries) {
  constexpr uint64_t kBytes = 4096;
  static const std::vector<char> host(kBytes, 'x');
  struct Case {
    int fail_first;
    absl::StatusCode engine_code;
    absl::StatusCode want;  // kOk: the acquire succeeds
  };
  const int tries = 1 + ExpertCache::kMaxLoadRetries;
  // A mover that failed forever would hang an unbounded retry loop; one that
  // recovers after 50 failures makes such a loop end in a (wrong) success.
  for (const Case& c : {Case{50, absl::StatusCode::kInternal, absl::StatusCode::kInternal},
                        Case{50, absl::StatusCode::kUnavailable, absl::StatusCode::kUnavailable},
                        Case{50, absl::StatusCode::kDataLoss, absl::StatusCode::kInternal},
                        Case{tries - 1, absl::StatusCode::kInternal, absl::StatusCode::kOk}}) {
    SCOPED_TRACE(absl::StrCat("fail_first ", c.fail_first, " code ", c.engine_code));
    FailingMover mover(c.fail_first, c.engine_code);
    ChunkSchedulerOptions eo;
    eo.arena_bytes = kExperts * kBytes;
    eo.chunk_bytes = kBytes;
    eo.mover = &mover;
    ChunkScheduler engine(eo);
    ASSERT_TRUE(engine.Start().ok());
    ExpertCacheOptions o;
    o.num_layers = kLayers;
    o.num_experts = kExperts;
    o.top_k = 2;
    o.capacity = kExperts;
    o.expert_bytes = kBytes;
    auto cache = *ExpertCache::Create(o, *MakePolicy("lru", Config(kExperts)), &engine,
                                      [](const ExpertKey&) { return host.data(); });
    cache->BeginRequest(1);
    auto leases = cache->Acquire(
        1, {.layer = 0, .demands = std::vector<ExpertDemand>{{2, 1}}});
    cache->CheckInvariantsForTest();
    if (c.want == absl::StatusCode::kOk) {
      ASSERT_TRUE(leases.ok()) << leases.status();
      EXPECT_EQ(cache->SlotsForTest()[leases->leases[0].slot].state, SlotState::kReady);
      EXPECT_EQ(mover.calls(), tries);
      EXPECT_TRUE(cache->Release(1, leases->leases).ok());
    } else {
      EXPECT_EQ(leases.status().code(), c.want) << leases.status();
      EXPECT_THAT(std::string(leases.status().message()),
                  ::testing::HasSubstr("illegal memory access"));
      EXPECT_EQ(mover.calls(), tries);
      for (const SlotInfo& slot : cache->SlotsForTest()) {
        EXPECT_EQ(slot.state, SlotState::kEmpty);  // the failed slot was freed
      }
      // The next acquire fails the same way, after its own retries.
      auto again = cache->Acquire(
          1, {.layer = 0, .demands = std::vector<ExpertDemand>{{2, 1}}});
      EXPECT_EQ(again.status().code(), c.want) << again.status();
      EXPECT_EQ(mover.calls(), 2 * tries);
      cache->CheckInvariantsForTest();
    }
    engine.Stop();  // callbacks reach the cache: stop before it goes
  }
}

// Records the request-scoped events it gets, and evicts the first candidate.
class RecordingPolicy : public CachePolicy {
 public:
  struct Route {
    RequestOwner owner;
    int layer;
    Phase phase;
    std::vector<std::pair<int32_t, int32_t>> demands;  // (expert, tokens)
  };
  std::string name() const override { return "recording"; }
  void OnBeginIteration(const RequestOwner& owner, Phase phase) override {
    iterations.push_back({owner, phase});
  }
  void OnRoute(const RequestOwner& owner, int layer, Phase phase,
               absl::Span<const ExpertDemand> demands) override {
    Route r{owner, layer, phase, {}};
    for (const ExpertDemand& d : demands) r.demands.push_back({d.expert, d.tokens});
    routes.push_back(r);
  }
  size_t ChooseVictim(absl::Span<const ExpertKey>, const VictimContext&) override { return 0; }

  std::vector<std::pair<RequestOwner, Phase>> iterations;
  std::vector<Route> routes;
};

// A batched acquire's routing goes to each member with its own row and
// phase (one iteration each), while the ticket, its leases and its usage
// belong to the acquiring owner; without members the owner gets the union.
TEST(ExpertCacheTest, BatchedAcquireRoutesEachMemberItsOwnRow) {
  auto engine = *FakeCopyEngine::Create({1000000000, 1000000, 0, 0, nullptr});
  auto policy = std::make_unique<RecordingPolicy>();
  RecordingPolicy* rec = policy.get();
  policy->Configure(Config(12));
  auto cache = *ExpertCache::Create(LinkOptions(12, /*prefetch=*/false), std::move(policy),
                                    engine.get());
  const RequestOwner a{5, 1}, b{5, 2};
  cache->BeginRequest(a);
  cache->BeginRequest(b);
  const std::vector<ExpertDemand> uni = {{0, 3}, {2, 1}, {4, 2}};
  std::vector<MemberDemands> members(2);
  members[0].request = 1;
  members[0].demands = {{0, 2}, {4, 2}};  // a: a prompt chunk of two tokens
  members[0].prefill = true;
  members[1].request = 2;
  members[1].demands = {{0, 1}, {2, 1}};  // b: one decode token
  auto t = cache->StartAcquire(
      a, {.layer = 1, .demands = uni, .prefill = true, .members = members});
  ASSERT_TRUE(t.ok()) << t.status();
  while (!*cache->IsReady(*t)) engine->AdvanceTo(*engine->NextCompletionTime());
  auto r = cache->FinishAcquire(*t);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->leases.size(), 3u);
  EXPECT_EQ(r->usage.misses, 3);
  ASSERT_EQ(rec->routes.size(), 2u);
  EXPECT_EQ(rec->routes[0].owner, a);
  EXPECT_EQ(rec->routes[0].phase, Phase::kPrefill);
  EXPECT_EQ(rec->routes[0].demands, (std::vector<std::pair<int32_t, int32_t>>{{0, 2}, {4, 2}}));
  EXPECT_EQ(rec->routes[1].owner, b);
  EXPECT_EQ(rec->routes[1].phase, Phase::kDecode);
  EXPECT_EQ(rec->routes[1].demands, (std::vector<std::pair<int32_t, int32_t>>{{0, 1}, {2, 1}}));
  ASSERT_EQ(rec->iterations.size(), 2u);
  EXPECT_EQ(rec->iterations[0].first, a);
  EXPECT_EQ(rec->iterations[1].first, b);
  EXPECT_EQ(cache->GetStats(Phase::kPrefill).iterations, 1u);
  EXPECT_EQ(cache->GetStats(Phase::kDecode).iterations, 1u);
  // The leases are the session's: released once, by it.
  ASSERT_TRUE(cache->Release(5, r->leases).ok());
  // The next layer of the same step is no new iteration for either member.
  members[0].demands = {{1, 4}};
  members[1].demands = {{1, 1}};
  const std::vector<ExpertDemand> uni2 = {{1, 5}};
  auto t2 = cache->StartAcquire(
      a, {.layer = 2, .demands = uni2, .prefill = true, .members = members});
  ASSERT_TRUE(t2.ok());
  while (!*cache->IsReady(*t2)) engine->AdvanceTo(*engine->NextCompletionTime());
  auto r2 = cache->FinishAcquire(*t2);
  ASSERT_TRUE(r2.ok());
  ASSERT_TRUE(cache->Release(5, r2->leases).ok());
  EXPECT_EQ(rec->iterations.size(), 2u);
  ASSERT_EQ(rec->routes.size(), 4u);
  EXPECT_EQ(rec->routes[3].demands, (std::vector<std::pair<int32_t, int32_t>>{{1, 1}}));
  // Without members the acquiring owner routes the union.
  auto t3 = cache->StartAcquire(a, {.layer = 3, .demands = uni});
  ASSERT_TRUE(t3.ok());
  while (!*cache->IsReady(*t3)) engine->AdvanceTo(*engine->NextCompletionTime());
  ASSERT_TRUE(cache->Release(5, cache->FinishAcquire(*t3)->leases).ok());
  ASSERT_EQ(rec->routes.size(), 5u);
  EXPECT_EQ(rec->routes[4].owner, a);
  EXPECT_EQ(rec->routes[4].demands.size(), 3u);
  cache->CheckInvariantsForTest();
}

// moe-infinity with members: each request's activation matrix holds its own
// experts, so the EAMC learns one distinct matrix per request at its end;
// made for the first request alone, the other requests learn nothing.
TEST(MoeInfinityTest, BatchedMembersEachLearnTheirOwnMatrix) {
  for (bool with_members : {true, false}) {
    SCOPED_TRACE(with_members ? "members" : "lead only");
    auto engine = *FakeCopyEngine::Create({1000000000, 1000000, 0, 0, nullptr});
    auto cache = *ExpertCache::Create(LinkOptions(kLayers * kExperts, false),
                                      *MakePolicy("moe-infinity", Config(kLayers * kExperts)),
                                      engine.get());
    const int kRequests = 3;
    for (int q = 1; q <= kRequests; ++q) cache->BeginRequest(RequestOwner{7, uint64_t(q)});
    for (int token = 0; token < 4; ++token) {
      for (int layer = 0; layer < kLayers; ++layer) {
        std::map<int32_t, int32_t> sum;
        std::vector<MemberDemands> members(kRequests);
        for (int q = 0; q < kRequests; ++q) {
          members[q].request = q + 1;
          // Request q always uses experts 2q and 2q+1: disjoint rows.
          members[q].demands = {{2 * q, 1}, {2 * q + 1, 1}};
          for (const ExpertDemand& d : members[q].demands) sum[d.expert] += d.tokens;
        }
        std::vector<ExpertDemand> uni;
        for (const auto& [e, n] : sum) uni.push_back({e, n});
        auto t = cache->StartAcquire(
            RequestOwner{7, 1},
            {.layer = layer,
             .demands = uni,
             .members = with_members ? absl::MakeConstSpan(members)
                                     : absl::Span<const MemberDemands>()});
        ASSERT_TRUE(t.ok()) << t.status();
        while (!*cache->IsReady(*t)) engine->AdvanceTo(*engine->NextCompletionTime());
        ASSERT_TRUE(cache->Release(7, cache->FinishAcquire(*t)->leases).ok());
      }
    }
    for (int q = 1; q <= kRequests; ++q) cache->EndRequest(RequestOwner{7, uint64_t(q)});
    EXPECT_EQ(cache->GetGauges().eamc_entries, with_members ? kRequests : 1);
  }
}

}  // namespace
}  // namespace moe::cache
