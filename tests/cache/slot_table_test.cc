#include "services/cache/slot_table.h"

#include <random>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "gtest/gtest.h"

namespace moe::cache {
namespace {

using ::absl::StatusCode;

constexpr ExpertKey kA{0, 1};
constexpr ExpertKey kB{0, 2};
constexpr ExpertKey kC{3, 1};
constexpr OwnerId kWorker1 = 101;
constexpr OwnerId kWorker2 = 202;

TEST(ExpertKeyTest, EqualityHashAndOrder) {
  EXPECT_EQ(kA, (ExpertKey{0, 1}));
  EXPECT_NE(kA, kB);
  EXPECT_NE(kA, (ExpertKey{1, 0}));
  EXPECT_TRUE(kA < kB);
  EXPECT_TRUE(kB < kC);
  EXPECT_FALSE(kC < kA);
  absl::flat_hash_set<ExpertKey> set = {kA, kB, kC, ExpertKey{0, 1}};
  EXPECT_EQ(set.size(), 3u);
  EXPECT_EQ(ExpertKeyHash()(kA), ExpertKeyHash()(ExpertKey{0, 1}));
  EXPECT_EQ(kC.ToString(), "L3/E1");
}

TEST(SlotTableTest, StartsEmpty) {
  SlotTable t(3);
  EXPECT_EQ(t.num_slots(), 3);
  EXPECT_EQ(t.CountInState(SlotState::kEmpty), 3);
  EXPECT_EQ(t.FindEmpty(), 0);
  EXPECT_FALSE(t.Lookup(kA).has_value());
  for (SlotId s = 0; s < 3; ++s) {
    EXPECT_TRUE(t.Evictable(s));
    EXPECT_EQ(t.Get(s).generation, 0u);
  }
  EXPECT_FALSE(t.IsValidSlot(3));
  EXPECT_FALSE(t.IsValidSlot(-1));
}

TEST(SlotTableTest, LoadLifecycleAndGenerations) {
  SlotTable t(2);
  const uint64_t g1 = t.BeginLoad(1, kA);
  EXPECT_EQ(g1, 1u);
  EXPECT_EQ(t.Get(1).state, SlotState::kLoading);
  EXPECT_EQ(t.Get(1).key, kA);
  EXPECT_EQ(t.Lookup(kA), 1);
  EXPECT_FALSE(t.Evictable(1));
  EXPECT_EQ(t.FindEmpty(), 0);
  // Loading slots cannot be leased (invariant 2: no reads before the copy).
  EXPECT_EQ(t.Lease(1, kWorker1).status().code(),
            StatusCode::kFailedPrecondition);

  EXPECT_EQ(t.CompleteLoad(1, g1 + 1).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(t.CompleteLoad(1, g1).ok());
  EXPECT_EQ(t.Get(1).state, SlotState::kReady);
  EXPECT_EQ(t.Get(1).generation, g1);
  // A second completion of the same load is stale.
  EXPECT_EQ(t.CompleteLoad(1, g1).code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(t.Evictable(1));

  // Replacing a ready, unleased slot unmaps the old key and bumps the
  // generation.
  const uint64_t g2 = t.BeginLoad(1, kB);
  EXPECT_EQ(g2, g1 + 1);
  EXPECT_FALSE(t.Lookup(kA).has_value());
  EXPECT_EQ(t.Lookup(kB), 1);
  t.CheckInvariantsForTest();
}

TEST(SlotTableTest, AbortLoadEmptiesSlot) {
  SlotTable t(1);
  const uint64_t g = t.BeginLoad(0, kA);
  EXPECT_EQ(t.AbortLoad(0, g + 7).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(t.AbortLoad(0, g).ok());
  EXPECT_EQ(t.Get(0).state, SlotState::kEmpty);
  EXPECT_EQ(t.Get(0).generation, g + 1);
  EXPECT_FALSE(t.Lookup(kA).has_value());
  // The cancelled copy's late completion must not make the slot ready.
  EXPECT_EQ(t.CompleteLoad(0, g).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(t.AbortLoad(0, g).code(), StatusCode::kFailedPrecondition);
  t.CheckInvariantsForTest();
}

TEST(SlotTableTest, BadSlotIdsFromOutsideAreErrors) {
  SlotTable t(2);
  EXPECT_EQ(t.Lease(2, kWorker1).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(t.Lease(-1, kWorker1).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(t.Release(5, 0, kWorker1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(t.CompleteLoad(9, 1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(t.LeasesHeldBy(kWorker1, 9), 0);
}

TEST(SlotTableTest, LeasesPinAndRelease) {
  SlotTable t(2);
  const uint64_t g = t.BeginLoad(0, kA);
  ASSERT_TRUE(t.CompleteLoad(0, g).ok());
  ASSERT_EQ(*t.Lease(0, kWorker1), g);
  ASSERT_EQ(*t.Lease(0, kWorker1), g);
  ASSERT_EQ(*t.Lease(0, kWorker2), g);
  EXPECT_EQ(t.Get(0).leases, 3);
  EXPECT_FALSE(t.Evictable(0));
  EXPECT_EQ(t.LeasesHeldBy(kWorker1, 0), 2);
  EXPECT_EQ(t.LeasesHeldBy(kWorker1), 2);
  t.CheckInvariantsForTest();

  // Stale generation: nothing changes.
  EXPECT_EQ(t.Release(0, g + 1, kWorker1).code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(t.Get(0).leases, 3);
  // Owner without a lease: underflow, nothing changes.
  EXPECT_EQ(t.Release(0, g, 999).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(t.Get(0).leases, 3);

  ASSERT_TRUE(t.Release(0, g, kWorker2).ok());
  EXPECT_EQ(t.Release(0, g, kWorker2).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(t.Release(0, g, kWorker1).ok());
  ASSERT_TRUE(t.Release(0, g, kWorker1).ok());
  EXPECT_EQ(t.Get(0).leases, 0);
  EXPECT_TRUE(t.Evictable(0));
  EXPECT_EQ(t.Release(0, g, kWorker1).code(), StatusCode::kFailedPrecondition);
  t.CheckInvariantsForTest();
}

TEST(SlotTableTest, ReleaseAllForOwnerReclaimsDeadWorker) {
  SlotTable t(3);
  for (SlotId s = 0; s < 3; ++s) {
    ASSERT_TRUE(t.CompleteLoad(s, t.BeginLoad(s, ExpertKey{s, 0})).ok());
  }
  ASSERT_TRUE(t.Lease(0, kWorker1).ok());
  ASSERT_TRUE(t.Lease(0, kWorker1).ok());
  ASSERT_TRUE(t.Lease(1, kWorker1).ok());
  ASSERT_TRUE(t.Lease(1, kWorker2).ok());
  EXPECT_EQ(t.ReleaseAllForOwner(kWorker1), 3);
  EXPECT_EQ(t.ReleaseAllForOwner(kWorker1), 0);
  EXPECT_EQ(t.LeasesHeldBy(kWorker1), 0);
  EXPECT_TRUE(t.Evictable(0));
  EXPECT_FALSE(t.Evictable(1));  // worker 2 still holds it
  EXPECT_EQ(t.Get(1).leases, 1);
  t.CheckInvariantsForTest();
  EXPECT_TRUE(t.Release(1, t.Get(1).generation, kWorker2).ok());
  EXPECT_TRUE(t.Evictable(1));
}

TEST(SlotTableTest, EvictDropsContent) {
  SlotTable t(1);
  const uint64_t g = t.BeginLoad(0, kA);
  ASSERT_TRUE(t.CompleteLoad(0, g).ok());
  t.Evict(0);
  EXPECT_EQ(t.Get(0).state, SlotState::kEmpty);
  EXPECT_EQ(t.Get(0).generation, g + 1);
  EXPECT_FALSE(t.Lookup(kA).has_value());
  t.Evict(0);  // no-op on empty
  EXPECT_EQ(t.Get(0).generation, g + 1);
  // A lease taken before an eviction can't be released against the new
  // content: covered by generations.
  EXPECT_EQ(t.Release(0, g, kWorker1).code(), StatusCode::kFailedPrecondition);
}

using SlotTableDeathTest = ::testing::Test;

TEST(SlotTableDeathTest, BeginLoadOnLeasedSlotDies) {
  SlotTable t(1);
  ASSERT_TRUE(t.CompleteLoad(0, t.BeginLoad(0, kA)).ok());
  ASSERT_TRUE(t.Lease(0, kWorker1).ok());
  EXPECT_DEATH(t.BeginLoad(0, kB), "invariant 1");
  EXPECT_DEATH(t.Evict(0), "invariant 1");
}

TEST(SlotTableDeathTest, BeginLoadOnLoadingSlotDies) {
  SlotTable t(2);
  t.BeginLoad(0, kA);
  EXPECT_DEATH(t.BeginLoad(0, kB), "loading slot");
  EXPECT_DEATH(t.Evict(0), "invariant 1");
}

TEST(SlotTableDeathTest, DuplicateKeyDies) {
  SlotTable t(2);
  t.BeginLoad(0, kA);
  EXPECT_DEATH(t.BeginLoad(1, kA), "already in slot 0");
}

// Random operations against a simple model; the table's invariants and its
// answers must match the model at every step.
TEST(SlotTableTest, RandomOperationsKeepInvariants) {
  constexpr int kSlots = 6;
  SlotTable t(kSlots);
  std::mt19937 rng(1234);
  struct Model {
    SlotState state = SlotState::kEmpty;
    ExpertKey key;
    uint64_t gen = 0;
    std::vector<OwnerId> leases;
  };
  std::vector<Model> m(kSlots);
  for (int step = 0; step < 20000; ++step) {
    const SlotId s = static_cast<SlotId>(rng() % kSlots);
    const OwnerId owner = rng() % 3;
    Model& ms = m[s];
    switch (rng() % 6) {
      case 0: {  // BeginLoad with a key not resident anywhere
        if (ms.state == SlotState::kLoading || !ms.leases.empty()) break;
        ExpertKey k{static_cast<int32_t>(rng() % 4),
                    static_cast<int32_t>(rng() % 8)};
        if (t.Lookup(k).has_value()) break;
        ms.gen = t.BeginLoad(s, k);
        ms.state = SlotState::kLoading;
        ms.key = k;
        break;
      }
      case 1: {
        absl::Status st = t.CompleteLoad(s, ms.gen);
        EXPECT_EQ(st.ok(), ms.state == SlotState::kLoading);
        if (st.ok()) ms.state = SlotState::kReady;
        break;
      }
      case 2: {
        absl::Status st = t.AbortLoad(s, ms.gen);
        EXPECT_EQ(st.ok(), ms.state == SlotState::kLoading);
        if (st.ok()) {
          ms.state = SlotState::kEmpty;
          ++ms.gen;
        }
        break;
      }
      case 3: {
        absl::StatusOr<uint64_t> g = t.Lease(s, owner);
        EXPECT_EQ(g.ok(), ms.state == SlotState::kReady);
        if (g.ok()) {
          EXPECT_EQ(*g, ms.gen);
          ms.leases.push_back(owner);
        }
        break;
      }
      case 4: {
        auto it = std::find(ms.leases.begin(), ms.leases.end(), owner);
        absl::Status st = t.Release(s, ms.gen, owner);
        EXPECT_EQ(st.ok(), it != ms.leases.end());
        if (st.ok()) ms.leases.erase(it);
        break;
      }
      case 5: {
        if (rng() % 20 != 0) break;  // owners die rarely
        int64_t expect = 0;
        for (Model& mm : m) {
          expect += std::erase(mm.leases, owner);
        }
        EXPECT_EQ(t.ReleaseAllForOwner(owner), expect);
        break;
      }
    }
    ASSERT_EQ(t.Get(s).state, ms.state) << "step " << step;
    ASSERT_EQ(t.Get(s).generation, ms.gen) << "step " << step;
    ASSERT_EQ(t.Get(s).leases, static_cast<int32_t>(ms.leases.size()));
    if (step % 97 == 0) t.CheckInvariantsForTest();
  }
  t.CheckInvariantsForTest();
}

}  // namespace
}  // namespace moe::cache
