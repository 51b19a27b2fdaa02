#include "services/cache/miss_planner.h"

#include "gtest/gtest.h"

namespace moe::cache {
namespace {

TEST(HostRunSecondsTest, ReadOnceComputePerToken) {
  const HostFigures h{/*read_bytes_per_sec=*/1e9, /*flops_per_sec=*/1e10};
  // 1 MB read in 1 ms; 1e6 FLOPs per token take 0.1 ms each.
  EXPECT_DOUBLE_EQ(HostRunSeconds(h, 1e6, 1e6, 1), 1e-3);
  EXPECT_DOUBLE_EQ(HostRunSeconds(h, 1e6, 1e6, 10), 1e-3);
  EXPECT_DOUBLE_EQ(HostRunSeconds(h, 1e6, 1e6, 20), 2e-3);
  EXPECT_DOUBLE_EQ(HostRunSeconds(h, 1e6, 1e6, 0), 1e-3);  // at least 1
  EXPECT_DOUBLE_EQ(HostRunSeconds(HostFigures{}, 1e6, 1e6, 4), 0.0);
}

TEST(TrackHostFiguresTest, ReadBoundRunsMoveTheBandwidth) {
  const HostFigures h{1e9, 1e12};  // reads dominate
  // 2 experts in 4 ms: 2 ms each for 1 MB: 0.5 GB/s measured.
  const HostRunReport r{2, 2, 2, 4'000'000};
  const HostFigures t = TrackHostFigures(h, r, 1e6, 1e3, 0.25);
  EXPECT_DOUBLE_EQ(t.read_bytes_per_sec, 0.75 * 1e9 + 0.25 * 0.5e9);
  EXPECT_DOUBLE_EQ(t.flops_per_sec, 1e12);
  // No bandwidth yet: the measurement as it is.
  const HostFigures z = TrackHostFigures(HostFigures{}, r, 1e6, 1e3, 0.25);
  EXPECT_DOUBLE_EQ(z.read_bytes_per_sec, 0.5e9);
}

TEST(TrackHostFiguresTest, ComputeBoundRunsMoveTheFlopRate) {
  const HostFigures h{1e12, 1e9};  // compute dominates
  // 1 expert, 100 tokens of 1e6 FLOPs in 0.2 s: 5e8 FLOP/s measured.
  const HostRunReport r{1, 1, 100, 200'000'000};
  const HostFigures t = TrackHostFigures(h, r, 1e6, 1e6, 0.5);
  EXPECT_DOUBLE_EQ(t.flops_per_sec, 0.5 * 1e9 + 0.5 * 5e8);
  EXPECT_DOUBLE_EQ(t.read_bytes_per_sec, 1e12);
}

MissPlanner::Figures Figures(MissMode mode, double host_read) {
  MissPlanner::Figures f;
  f.mode = mode;
  f.link_bytes_per_sec = 1e6;  // one 1 MB expert: 1 s on the link
  f.expert_bytes = 1e6;
  f.host = HostFigures{host_read, 0};
  return f;
}

TEST(MissPlannerTest, FetchModeNeverHosts) {
  MissPlanner p(Figures(MissMode::kFetch, 1e9), /*host_ok=*/true,
                [] { return 0.0; });
  EXPECT_FALSE(p.may_host());
  EXPECT_DOUBLE_EQ(p.copy_seconds(), 1.0);
  MissPlanner q(Figures(MissMode::kAuto, 1e9), /*host_ok=*/false,
                [] { return 0.0; });
  EXPECT_FALSE(q.may_host());
}

TEST(MissPlannerTest, HostModeAlwaysHostsWithoutAskingTheLink) {
  int asked = 0;
  MissPlanner p(Figures(MissMode::kHost, 1.0), true, [&] {
    ++asked;
    return 0.0;
  });
  ASSERT_TRUE(p.may_host());
  EXPECT_TRUE(p.RunOnHost(1, 1.0));
  EXPECT_TRUE(p.RunOnHost(1000, 0.0));
  EXPECT_EQ(asked, 0);
}

TEST(MissPlannerTest, AutoComparesTheHostRunWithTheStallACopyAdds) {
  int asked = 0;
  // Host run 1.5 s (1 MB at 0.667 MB/s) vs copies of 1 s behind a backlog.
  MissPlanner p(Figures(MissMode::kAuto, 1e6 / 1.5), true, [&] {
    ++asked;
    return 0.0;
  });
  EXPECT_FALSE(p.RunOnHost(1, 1.0));  // 1.5 > 1: copy (waits until 1)
  EXPECT_FALSE(p.RunOnHost(1, 1.0));  // adds 1 s more: 1.5 > 1: copy
  // The third copy would end at 3 while the acquire waits until 2 anyway:
  // still 1 s of added stall, still cheaper than 1.5 s on the host.
  EXPECT_FALSE(p.RunOnHost(1, 1.0));
  EXPECT_EQ(asked, 1);  // the backlog is read once per acquire

  // Behind 5 s of queued copies the first miss's copy adds 6 s of stall.
  MissPlanner busy(Figures(MissMode::kAuto, 1e6 / 1.5), true,
                   [] { return 5.0; });
  EXPECT_TRUE(busy.RunOnHost(1, 1.0));
  // A copy already on the link as a demand (fetch_seconds 0) still waits
  // for the backlog.
  EXPECT_TRUE(busy.RunOnHost(1, 0.0));

  // A faster host wins on an idle link.
  MissPlanner fast(Figures(MissMode::kAuto, 2e6), true, [] { return 0.0; });
  EXPECT_TRUE(fast.RunOnHost(1, 1.0));
}

TEST(MissPlannerTest, AutoWithoutALinkModelFetches) {
  MissPlanner::Figures f = Figures(MissMode::kAuto, 1e12);
  f.link_bytes_per_sec = 0;
  MissPlanner p(f, true, [] { return 0.0; });
  EXPECT_TRUE(p.may_host());
  EXPECT_DOUBLE_EQ(p.copy_seconds(), 0.0);
  EXPECT_FALSE(p.RunOnHost(1, 0.0));
}

}  // namespace
}  // namespace moe::cache
