// The cache's side of the hit path through shared memory
// (services/cache/residency_listener.h): every ready slot is published, a
// ready slot is taken back before it changes, and one a worker pinned is
// neither chosen nor changed, whatever the policy; local hits count as the
// hits of an acquire would.
#include <map>
#include <random>
#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/cache/expert_cache.h"
#include "services/cache/fake_copy_engine.h"
#include "tests/cache/cache_test_options.h"

namespace moe::cache {
namespace {

constexpr int kLayers = 4;
constexpr int kExperts = 6;

// Records the cache's calls, and keeps the slots the test pins.
class FakeBoard : public ResidencyListener {
 public:
  void Publish(SlotId slot, const ExpertKey& key) override {
    EXPECT_EQ(published.count(slot), 0u) << "slot " << slot << " published twice";
    published[slot] = key;
  }
  bool Pinned(SlotId slot) const override { return pinned.contains(slot); }
  bool TryRetract(SlotId slot) override {
    EXPECT_EQ(published.count(slot), 1u) << "slot " << slot << " taken back unpublished";
    ++retract_calls;
    if (pinned.contains(slot) || refuse_next > 0) {
      refuse_next = std::max(0, refuse_next - 1);
      ++refused;
      return false;
    }
    published.erase(slot);
    return true;
  }
  std::map<SlotId, ExpertKey> published;
  std::set<SlotId> pinned;
  int refuse_next = 0;  // a worker pins it between Pinned and TryRetract
  int retract_calls = 0;
  int refused = 0;
};

ExpertCacheOptions Options(int capacity) {
  return testing::TestCacheOptions(kLayers, kExperts, capacity, /*prefetch=*/false);
}

PolicyConfig Config(int capacity) {
  return testing::TestPolicyConfig(kLayers, kExperts, capacity);
}

absl::StatusOr<AcquireResult> AcquireNow(ExpertCache& cache, FakeCopyEngine& engine,
                                         const RequestOwner& owner, int layer,
                                         std::vector<ExpertDemand> demands) {
  auto t = cache.StartAcquire(owner, {.layer = layer, .demands = demands});
  if (!t.ok()) return t.status();
  while (!*cache.IsReady(*t)) engine.AdvanceTo(*engine.NextCompletionTime());
  return cache.FinishAcquire(*t);
}

// The board always matches the cache: exactly its ready slots, with their
// keys.
void ExpectBoardMatches(const ExpertCache& cache, const FakeBoard& board) {
  std::map<SlotId, ExpertKey> ready;
  const std::vector<SlotInfo> slots = cache.SlotsForTest();
  for (SlotId s = 0; s < static_cast<SlotId>(slots.size()); ++s) {
    if (slots[s].state == SlotState::kReady) ready[s] = slots[s].key;
  }
  EXPECT_EQ(board.published, ready);
}

TEST(ResidencyListenerTest, PinnedSlotsNeverChangeWhateverThePolicy) {
  for (const std::string& name : OnlinePolicyNames()) {
    SCOPED_TRACE(name);
    const int capacity = 8;
    auto engine = *FakeCopyEngine::Create({1000000000, 1000000, 0, 0, nullptr});
    auto cache = *ExpertCache::Create(Options(capacity), *MakePolicy(name, Config(capacity)),
                                      engine.get());
    FakeBoard board;
    cache->SetResidencyListener(&board);
    const RequestOwner owner{1, 0};
    cache->BeginRequest(owner);
    std::mt19937 rng(11);
    std::map<SlotId, ExpertKey> pinned_keys;
    for (int step = 0; step < 400; ++step) {
      // Now and then a worker pins a published slot, or lets one go.
      if (step % 7 == 0 && !board.published.empty()) {
        auto it = board.published.begin();
        std::advance(it, rng() % board.published.size());
        if (pinned_keys.size() < 3) {
          board.pinned.insert(it->first);
          pinned_keys[it->first] = it->second;
        }
      }
      if (step % 11 == 0 && !pinned_keys.empty()) {
        board.pinned.erase(pinned_keys.begin()->first);
        pinned_keys.erase(pinned_keys.begin());
      }
      if (step % 13 == 0) board.refuse_next = 1;
      const int layer = step % kLayers;
      const int a = static_cast<int>(rng() % kExperts);
      const int b = (a + 1 + static_cast<int>(rng() % (kExperts - 1))) % kExperts;
      auto r = AcquireNow(*cache, *engine, owner, layer, {{a, 1}, {b, 1}});
      ASSERT_TRUE(r.ok()) << r.status();
      ASSERT_TRUE(cache->Release(owner.session, r->leases).ok());
      // Every pinned slot still holds what it held when pinned, published.
      const std::vector<SlotInfo> slots = cache->SlotsForTest();
      for (const auto& [slot, key] : pinned_keys) {
        EXPECT_EQ(slots[slot].state, SlotState::kReady) << "slot " << slot;
        EXPECT_EQ(slots[slot].key, key) << "slot " << slot;
      }
      ExpectBoardMatches(*cache, board);
      cache->CheckInvariantsForTest();
    }
    EXPECT_GT(board.retract_calls, 0);
    EXPECT_GT(board.refused, 0);  // the race of Pinned and TryRetract happened
  }
}

TEST(ResidencyListenerTest, EverySlotPinnedLeavesNoVictim) {
  const int capacity = kExperts;  // one layer
  auto engine = *FakeCopyEngine::Create({1000000000, 1000000, 0, 0, nullptr});
  auto cache = *ExpertCache::Create(Options(capacity), *MakePolicy("lru", Config(capacity)),
                                    engine.get());
  const RequestOwner owner{1, 0};
  std::vector<ExpertDemand> all;
  for (int e = 0; e < kExperts; ++e) all.push_back({e, 1});
  auto r = AcquireNow(*cache, *engine, owner, 0, all);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(cache->Release(owner.session, r->leases).ok());
  // Set late: the slots ready now are published at once.
  FakeBoard board;
  cache->SetResidencyListener(&board);
  ExpectBoardMatches(*cache, board);
  ASSERT_EQ(board.published.size(), static_cast<size_t>(kExperts));
  for (const auto& [slot, key] : board.published) board.pinned.insert(slot);
  r = AcquireNow(*cache, *engine, owner, 1, {{0, 1}});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  board.pinned.erase(board.published.begin()->first);
  r = AcquireNow(*cache, *engine, owner, 1, {{0, 1}});
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectBoardMatches(*cache, board);
}

TEST(ResidencyListenerTest, LocalHitsCountAsTheHitsOfAnAcquire) {
  const int capacity = kLayers * kExperts;
  auto engine = *FakeCopyEngine::Create({1000000000, 1000000, 0, 0, nullptr});
  auto cache = *ExpertCache::Create(Options(capacity), *MakePolicy("lru", Config(capacity)),
                                    engine.get());
  const RequestOwner owner{1, 0};
  auto r = AcquireNow(*cache, *engine, owner, 2, {{1, 1}, {4, 3}});
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(cache->Release(owner.session, r->leases).ok());
  const CachePhaseStats before = cache->GetStats(Phase::kDecode);
  cache->RecordLocalHits(owner, {.layer = 2, .demands = std::vector<ExpertDemand>{{1, 1}, {4, 3}}});
  // An expert evicted since the worker used it still counts as its hit, and
  // nothing is loaded for it.
  cache->RecordLocalHits(owner, {.layer = 3, .demands = std::vector<ExpertDemand>{{0, 2}}});
  const CachePhaseStats after = cache->GetStats(Phase::kDecode);
  EXPECT_EQ(after.hits, before.hits + 3);
  EXPECT_EQ(after.misses, before.misses);
  EXPECT_EQ(after.bytes_moved, before.bytes_moved);
  EXPECT_FALSE(engine->NextCompletionTime().has_value());
  const ExpertCache::Gauges g = cache->GetGauges();
  EXPECT_EQ(g.layer_hits[2], 2u);
  EXPECT_EQ(g.layer_hits[3], 1u);
  cache->CheckInvariantsForTest();
}

}  // namespace
}  // namespace moe::cache
