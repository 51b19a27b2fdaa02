// The hit path through shared memory, with moe-cached as a real process: an
// acquire whose experts are all resident is served by the client itself
// (pins through its channel's residency view, no round trip) with the same
// slots and bytes as the daemon's leases, counted as hits by the daemon; a
// pinned slot is never taken for another worker's miss; a worker's pins go
// with it when it dies, as its leases do.
#include <signal.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/model_desc.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/client/cache_client.h"
#include "tests/moe_cached/daemon_process.h"
#include "tests/moe_cached/tiny_daemon_test.h"

namespace moe::cached {
namespace {

using ::moe::client::kLocalLeaseGeneration;

class LocalHitsTest : public testing::TinyDaemonTest {
 protected:
  void StartDaemon(int experts) {
    TinyDaemonTest::StartDaemon({"--cache-experts", std::to_string(experts)});
  }

  static std::vector<ExpertDemand> Layer(int experts) {
    std::vector<ExpertDemand> all;
    for (int e = 0; e < experts; ++e) all.push_back({e, 1});
    return all;
  }
};

TEST_F(LocalHitsTest, ResidentExpertsAreServedWithoutARoundTrip) {
  StartDaemon(32);  // every expert of the tiny model
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  const std::vector<ExpertDemand> two = {{2, 1}, {5, 3}};
  auto first = client->Acquire({.layer = 1, .demands = two});
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->usage.misses, 2);
  for (const SlotLease& l : first->leases) EXPECT_NE(l.generation, kLocalLeaseGeneration);
  ASSERT_TRUE(client->Release(first->leases).ok());
  for (int round = 0; round < 3; ++round) {
    auto again = client->Acquire({.layer = 1, .demands = two});
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->usage.hits, 2);
    EXPECT_EQ(again->usage.misses, 0);
    ASSERT_EQ(again->leases.size(), 2u);
    for (size_t i = 0; i < 2; ++i) {
      const SlotLease& l = again->leases[i];
      EXPECT_EQ(l.generation, kLocalLeaseGeneration);  // pinned by the client
      EXPECT_EQ(l.slot, first->leases[i].slot);
      EXPECT_EQ(l.key, first->leases[i].key);
      ExpectSlotMatches(*client, 1, l);
    }
    ASSERT_TRUE(client->Release(again->leases).ok());
  }
  // The daemon counted them (GetStats first takes what was posted).
  auto stats = client->GetStats("tiny");
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->models(0).hits(), 6u);
  EXPECT_EQ(stats->models(0).misses(), 2u);
  EXPECT_EQ(stats->models(0).leases_held(), 0u);
}

TEST_F(LocalHitsTest, APinnedSlotIsNotTakenForAnotherWorkersMiss) {
  StartDaemon(8);  // one layer
  auto a = Connect();
  auto b = Connect();
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  auto warm = a->Acquire({.layer = 0, .demands = Layer(8)});
  ASSERT_TRUE(warm.ok()) << warm.status();
  ASSERT_TRUE(a->Release(warm->leases).ok());
  // The release is posted: a round trip on the same channel makes sure the
  // daemon took it before b asks.
  ASSERT_TRUE(a->GetStats("tiny").ok());
  auto pinned = a->Acquire({.layer = 0, .demands = std::vector<ExpertDemand>{{3, 1}}});
  ASSERT_TRUE(pinned.ok()) << pinned.status();
  ASSERT_EQ(pinned->leases.size(), 1u);
  ASSERT_EQ(pinned->leases[0].generation, kLocalLeaseGeneration);
  // All of layer 1 needs all 8 slots: one is pinned.
  auto blocked = b->Acquire({.layer = 1, .demands = Layer(8)});
  EXPECT_EQ(blocked.status().code(), absl::StatusCode::kResourceExhausted) << blocked.status();
  // Seven of it fit around the pin, which still holds L0/E3.
  auto seven = b->Acquire({.layer = 1, .demands = Layer(7)});
  ASSERT_TRUE(seven.ok()) << seven.status();
  for (const SlotLease& l : seven->leases) EXPECT_NE(l.slot, pinned->leases[0].slot);
  ExpectSlotMatches(*a, 0, pinned->leases[0]);
  ASSERT_TRUE(b->Release(seven->leases).ok());
  ASSERT_TRUE(a->Release(pinned->leases).ok());
  auto all = b->Acquire({.layer = 1, .demands = Layer(8)});
  ASSERT_TRUE(all.ok()) << all.status();
  for (const SlotLease& l : all->leases) ExpectSlotMatches(*b, 1, l);
}

TEST_F(LocalHitsTest, AKilledWorkersPinsGoWithIt) {
  StartDaemon(8);
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  auto warm = client->Acquire({.layer = 0, .demands = Layer(8)});
  ASSERT_TRUE(warm.ok()) << warm.status();
  ASSERT_TRUE(client->Release(warm->leases).ok());
  // Layer 0 is resident: the holder pins all of it itself.
  moe::testing::ChildProcess holder;
  ASSERT_NO_FATAL_FAILURE(SpawnLeaseHolder(holder, 0, 8));
  auto blocked = client->Acquire({.layer = 1, .demands = std::vector<ExpertDemand>{{0, 1}}});
  EXPECT_EQ(blocked.status().code(), absl::StatusCode::kResourceExhausted) << blocked.status();
  ASSERT_TRUE(holder.Signal(SIGKILL).ok());
  ASSERT_TRUE(holder.Wait(absl::Seconds(10)).ok());
  absl::StatusOr<AcquireResult> r;
  moe::testing::WaitFor(absl::Seconds(10), [&] {
    r = client->Acquire({.layer = 1, .demands = std::vector<ExpertDemand>{{0, 1}}});
    return r.ok();
  });
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectSlotMatches(*client, 1, r->leases[0]);
}

}  // namespace
}  // namespace moe::cached
