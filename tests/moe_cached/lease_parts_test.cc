// A layer leased in parts through moe-cached as a real process, over both
// transports (the shared-memory ring and gRPC): the parts come in order
// with the checkpoint's bytes, the next part is on its way while the one
// before is held, and a continue that is not the next part, or that
// carries what only an opening acquire may, is refused without disturbing
// the open layer.
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "services/client/cache_client.h"
#include "tests/moe_cached/tiny_daemon_test.h"

namespace moe::cached {
namespace {

using client::Transport;

class LeasePartsTest : public testing::TinyDaemonTest {};

std::vector<int32_t> Experts(const AcquireResult& r) {
  std::vector<int32_t> out;
  for (const SlotLease& l : r.leases) out.push_back(l.key.expert);
  return out;
}

TEST_F(LeasePartsTest, ALayerComesInPartsOverBothTransports) {
  // One layer's eight experts in the arena: whole layers would each evict
  // the layer before; in parts the layer never holds more than six.
  StartDaemon({"--cache-experts", "8"});
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  std::vector<ExpertDemand> layer;
  for (int e = 0; e < 8; ++e) layer.push_back({e, 1 + e % 3});
  const absl::Span<const ExpertDemand> all(layer);
  for (const Transport transport : {Transport::kShm, Transport::kGrpc}) {
    const int l = transport == Transport::kShm ? 0 : 1;
    SCOPED_TRACE(l);
    auto first = client->Acquire({.layer = l, .demands = all, .part = 3}, transport);
    ASSERT_TRUE(first.ok()) << first.status();
    EXPECT_EQ(Experts(*first), (std::vector<int32_t>{0, 1, 2}));
    for (const SlotLease& lease : first->leases) ExpectSlotMatches(*client, l, lease);
    ASSERT_TRUE(client->Release(first->leases).ok());

    auto out_of_order =
        client->Acquire({.layer = l, .demands = all.subspan(4, 1), .continues = true}, transport);
    EXPECT_TRUE(absl::IsFailedPrecondition(out_of_order.status())) << out_of_order.status();
    const std::vector<ExpertHint> hints = {{l, 7, 1.0f}};
    auto with_hints = client->Acquire(
        {.layer = l, .demands = all.subspan(3, 3), .hints = hints, .continues = true},
        transport);
    EXPECT_TRUE(absl::IsInvalidArgument(with_hints.status())) << with_hints.status();

    auto second =
        client->Acquire({.layer = l, .demands = all.subspan(3, 3), .continues = true}, transport);
    ASSERT_TRUE(second.ok()) << second.status();
    EXPECT_EQ(Experts(*second), (std::vector<int32_t>{3, 4, 5}));
    for (const SlotLease& lease : second->leases) ExpectSlotMatches(*client, l, lease);
    ASSERT_TRUE(client->Release(second->leases).ok());
    auto third =
        client->Acquire({.layer = l, .demands = all.subspan(6), .continues = true}, transport);
    ASSERT_TRUE(third.ok()) << third.status();
    EXPECT_EQ(Experts(*third), (std::vector<int32_t>{6, 7}));
    for (const SlotLease& lease : third->leases) ExpectSlotMatches(*client, l, lease);
    ASSERT_TRUE(client->Release(third->leases).ok());
    // The layer is answered: nothing is left to continue.
    auto more =
        client->Acquire({.layer = l, .demands = all.subspan(7), .continues = true}, transport);
    EXPECT_TRUE(absl::IsFailedPrecondition(more.status())) << more.status();
  }
  auto stats = client->GetStats("tiny");
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->models(0).hits() + stats->models(0).misses(), 16u);
  EXPECT_EQ(stats->models(0).leases_held(), 0u);
}

}  // namespace
}  // namespace moe::cached
