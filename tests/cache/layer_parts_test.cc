// A layer leased in parts (AcquireCall::part, ::continues): the cache
// answers the first part, keeps the rest from eviction, copies the next part
// ahead, evicts the layer's answered experts first, routes the layer once,
// and refuses a continue that is not the next part.
#include <algorithm>
#include <vector>

#include "gtest/gtest.h"
#include "services/cache/expert_cache.h"
#include "services/cache/fake_copy_engine.h"
#include "tests/cache/cache_test_options.h"

namespace moe::cache {
namespace {

using testing::Config;
using testing::kExperts;
using testing::kLayers;

struct Fixture {
  explicit Fixture(int capacity, const std::string& policy = "lfu") {
    engine = *FakeCopyEngine::Create({1000000000, 1000000, 0, 0, nullptr});
    cache = *ExpertCache::Create(testing::TestCacheOptions(kLayers, kExperts, capacity, false),
                                 *MakePolicy(policy, Config(capacity)), engine.get());
  }

  // One acquire on the virtual clock; the result (or its error).
  absl::StatusOr<AcquireResult> Acquire(const RequestOwner& owner, const AcquireCall& call) {
    absl::StatusOr<ExpertCache::Ticket> t = cache->StartAcquire(owner, call);
    if (!t.ok()) return t.status();
    while (!*cache->IsReady(*t)) engine->AdvanceTo(*engine->NextCompletionTime());
    return cache->FinishAcquire(*t);
  }

  // Acquires and releases at once, `times` times (to make experts popular).
  void Touch(const RequestOwner& owner, int layer, std::vector<ExpertDemand> demands,
             int times = 1) {
    for (int i = 0; i < times; ++i) {
      absl::StatusOr<AcquireResult> r = Acquire(owner, {.layer = layer, .demands = demands});
      ASSERT_TRUE(r.ok()) << r.status();
      ASSERT_TRUE(cache->Release(owner.session, r->leases).ok());
    }
  }

  // Experts of `layer` resident (ready or loading), ascending.
  std::vector<int32_t> Resident(int layer) const {
    std::vector<int32_t> out;
    for (const SlotInfo& s : cache->SlotsForTest()) {
      if (s.state != SlotState::kEmpty && s.key.layer == layer) out.push_back(s.key.expert);
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  std::unique_ptr<FakeCopyEngine> engine;
  std::unique_ptr<ExpertCache> cache;
};

std::vector<int32_t> Experts(const std::vector<SlotLease>& leases) {
  std::vector<int32_t> out;
  for (const SlotLease& l : leases) out.push_back(l.key.expert);
  return out;
}

const std::vector<ExpertDemand> kWholeLayer = {{0, 3}, {1, 1}, {2, 2}, {3, 1}, {4, 1}, {5, 4}};

// The layer's demands from `first` on.
absl::Span<const ExpertDemand> From(size_t first) {
  return absl::MakeConstSpan(kWholeLayer).subspan(first);
}

// A whole layer of six in parts of one miss through a full cache of six
// slots that holds four of another layer: each part is answered in order,
// the next part is copied while the caller computes, and the later parts
// evict the layer's answered experts, not the other layer's, though LRU
// ranks those lower (used before the layer began).
TEST(LayerPartsTest, PartsComeInOrderAndEvictTheLayersAnsweredExpertsFirst) {
  Fixture f(6, "lru");
  const RequestOwner owner{1, 1};
  f.cache->BeginRequest(owner);
  f.Touch(owner, 1, {{0, 1}, {1, 1}, {2, 1}, {3, 1}});
  f.cache->ResetStats();

  absl::StatusOr<AcquireResult> first =
      f.Acquire(owner, {.layer = 0, .demands = kWholeLayer, .part = 1});
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(Experts(first->leases), (std::vector<int32_t>{0}));
  EXPECT_EQ(first->usage.misses, 1);
  // The next part (1) is on the link already, in the last empty slot.
  EXPECT_EQ(f.Resident(0), (std::vector<int32_t>{0, 1}));
  ASSERT_TRUE(f.cache->Release(1, first->leases).ok());
  for (size_t next = 1; next < kWholeLayer.size(); ++next) {
    SCOPED_TRACE(next);
    absl::StatusOr<AcquireResult> part =
        f.Acquire(owner, {.layer = 0, .demands = From(next), .continues = true});
    ASSERT_TRUE(part.ok()) << part.status();
    ASSERT_EQ(Experts(part->leases), (std::vector<int32_t>{kWholeLayer[next].expert}));
    // Copied ahead, not resident when the layer routed: a miss, done or not.
    EXPECT_EQ(part->usage.misses, 1);
    // The part after it took the slot of an answered one, not layer 1's.
    EXPECT_EQ(f.Resident(1), (std::vector<int32_t>{0, 1, 2, 3}));
    ASSERT_TRUE(f.cache->Release(1, part->leases).ok());
    f.cache->CheckInvariantsForTest();
  }
  // One layer routed once: one iteration, six misses.
  const CachePhaseStats st = f.cache->GetStats(Phase::kDecode);
  EXPECT_EQ(st.iterations, 1u);
  EXPECT_EQ(st.misses, 6u);
  EXPECT_EQ(st.hits, 0u);
  // The layer is closed: nothing left to continue.
  absl::StatusOr<AcquireResult> more =
      f.Acquire(owner, {.layer = 0, .demands = From(5), .continues = true});
  EXPECT_TRUE(absl::IsFailedPrecondition(more.status())) << more.status();
}

// Resident experts cost a part no slot: they ride along with its misses.
TEST(LayerPartsTest, HitsRideAlongWithAPartsMisses) {
  Fixture f(12);
  const RequestOwner owner{1, 1};
  f.cache->BeginRequest(owner);
  f.Touch(owner, 0, {{0, 1}, {1, 1}, {3, 1}});
  absl::StatusOr<AcquireResult> first =
      f.Acquire(owner, {.layer = 0, .demands = kWholeLayer, .part = 1});
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(Experts(first->leases), (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(first->usage.hits, 3);
  EXPECT_EQ(first->usage.misses, 1);
  ASSERT_TRUE(f.cache->Release(1, first->leases).ok());
  absl::StatusOr<AcquireResult> second =
      f.Acquire(owner, {.layer = 0, .demands = From(4), .continues = true});
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(Experts(second->leases), (std::vector<int32_t>{4}));
  ASSERT_TRUE(f.cache->Release(1, second->leases).ok());
}

// What an open layer has yet to answer stays resident whoever needs a slot:
// another session's acquire then finds none (fetch mode) until the layer is
// closed.
TEST(LayerPartsTest, AnOpenLayersUnansweredExpertsAreNotVictims) {
  Fixture f(6);
  const RequestOwner a{1, 1}, b{2, 1};
  f.cache->BeginRequest(a);
  f.cache->BeginRequest(b);
  f.Touch(a, 0, {{0, 1}, {4, 1}, {5, 1}});
  f.Touch(b, 1, {{0, 1}, {1, 1}});
  absl::StatusOr<AcquireResult> first =
      f.Acquire(a, {.layer = 0, .demands = kWholeLayer, .part = 1});
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(Experts(first->leases), (std::vector<int32_t>{0, 1}));
  ASSERT_TRUE(f.cache->Release(1, first->leases).ok());
  // Answered 0 and 1 are free, as is layer 1's last; 4 and 5 are resident
  // and kept, 2 loading: three victims for four misses.
  EXPECT_EQ(f.Resident(0), (std::vector<int32_t>{0, 1, 2, 4, 5}));
  absl::StatusOr<AcquireResult> other =
      f.Acquire(b, {.layer = 1, .demands = {{2, 1}, {3, 1}, {4, 1}, {5, 1}}});
  EXPECT_TRUE(absl::IsResourceExhausted(other.status())) << other.status();
  EXPECT_EQ(f.Resident(0), (std::vector<int32_t>{2, 4, 5}));
  // Ending the request closes its open layer: the rest may go again.
  f.cache->EndRequest(a);
  absl::StatusOr<AcquireResult> later =
      f.Acquire(b, {.layer = 1, .demands = {{2, 1}, {3, 1}, {4, 1}, {5, 1}}});
  EXPECT_TRUE(later.ok()) << later.status();
  f.cache->CheckInvariantsForTest();
}

TEST(LayerPartsTest, AContinueThatIsNotTheNextPartIsRefused) {
  Fixture f(12);
  const RequestOwner owner{1, 1};
  f.cache->BeginRequest(owner);
  auto continue_with = [&](int layer, std::vector<ExpertDemand> d) {
    return f.Acquire(owner, {.layer = layer, .demands = d, .continues = true}).status();
  };
  EXPECT_TRUE(absl::IsFailedPrecondition(continue_with(0, {{2, 2}})));  // nothing open
  absl::StatusOr<AcquireResult> first =
      f.Acquire(owner, {.layer = 0, .demands = kWholeLayer, .part = 2});
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(f.cache->Release(1, first->leases).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(continue_with(1, {{2, 2}, {3, 1}})));  // layer
  EXPECT_TRUE(absl::IsFailedPrecondition(continue_with(0, {{3, 1}})));          // order
  EXPECT_TRUE(absl::IsFailedPrecondition(continue_with(0, {{2, 1}})));          // tokens
  EXPECT_TRUE(absl::IsFailedPrecondition(continue_with(0, {{2, 2}, {4, 1}})));  // skips 3
  EXPECT_TRUE(absl::IsFailedPrecondition(
      f.Acquire(owner, {.layer = 0, .demands = {{2, 2}}, .prefill = true, .continues = true})
          .status()));  // phase
  // A refused continue changes nothing: the right one is still answered.
  absl::StatusOr<AcquireResult> next =
      f.Acquire(owner, {.layer = 0, .demands = {{2, 2}}, .continues = true});
  ASSERT_TRUE(next.ok()) << next.status();
  ASSERT_TRUE(f.cache->Release(1, next->leases).ok());
  // Acquiring anything else abandons the open layer.
  f.Touch(owner, 1, {{0, 1}});
  EXPECT_TRUE(absl::IsFailedPrecondition(continue_with(0, {{3, 1}})));
  f.cache->CheckInvariantsForTest();
}

// A part at least the layer's size answers everything at once: no layer
// opens.
TEST(LayerPartsTest, APartAsLargeAsTheLayerAnswersItWhole) {
  Fixture f(12);
  const RequestOwner owner{1, 1};
  f.cache->BeginRequest(owner);
  absl::StatusOr<AcquireResult> r =
      f.Acquire(owner, {.layer = 2, .demands = kWholeLayer, .part = 6});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->leases.size(), 6u);
  ASSERT_TRUE(f.cache->Release(1, r->leases).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(
      f.Acquire(owner, {.layer = 2, .demands = {{0, 3}}, .continues = true}).status()));
}

}  // namespace
}  // namespace moe::cache
