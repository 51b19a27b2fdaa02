#include "services/moe_cached/huge_page_collapser.h"

#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "services/cache/shm_region.h"
#include "tests/common/test_util.h"

namespace moe::cached {
namespace {

// Two ranges, collapsed in the background: every whole 2 MiB, the bytes
// unchanged, and the thread done by itself.
TEST(HugePageCollapserTest, CollapsesEveryRangeAndKeepsTheBytes) {
  constexpr uint64_t kBytes = 6 << 20;
  std::vector<cache::ShmRegion> regions;
  std::vector<HugePageCollapser::Range> ranges;
  for (int r = 0; r < 2; ++r) {
    auto region = cache::ShmRegion::Create("", kBytes);
    ASSERT_TRUE(region.ok()) << region.status();
    for (uint64_t i = 0; i < kBytes; i += 512) region->mutable_data()[i] = static_cast<uint8_t>(i / 512 + r);
    regions.push_back(std::move(*region));
  }
  for (int r = 0; r < 2; ++r) ranges.push_back({"test range", regions[r].data(), kBytes});
  HugePageCollapser collapser(ranges);
  const absl::Time end = absl::Now() + absl::Seconds(60);
  while (!collapser.finished() && absl::Now() < end) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_TRUE(collapser.finished());
  EXPECT_EQ(collapser.done_bytes(), testing::KernelCollapsesSharedMemory(cache::ShmemHugePageMode()) ? 2 * kBytes : 0);
  for (int r = 0; r < 2; ++r) {
    for (uint64_t i = 0; i < kBytes; i += 512) {
      ASSERT_EQ(regions[r].data()[i], static_cast<uint8_t>(i / 512 + r)) << r << " " << i;
    }
  }
}

// Destroyed at once over a large range: it stops at its next chunk (the
// memory may go right after).
TEST(HugePageCollapserTest, StopsWhenDestroyed) {
  constexpr uint64_t kBytes = 4 * HugePageCollapser::kChunkBytes;
  auto region = cache::ShmRegion::Create("", kBytes);
  ASSERT_TRUE(region.ok()) << region.status();
  uint64_t done = 0;
  {
    HugePageCollapser collapser({{"big", region->data(), kBytes}});
    absl::SleepFor(absl::Milliseconds(1));
    done = collapser.done_bytes();
  }
  EXPECT_LE(done, kBytes);
  EXPECT_EQ(region->data()[kBytes - 1], 0);  // still mapped, untouched
}

TEST(HugePageCollapserTest, NeededOnlyWhereAllocationGaveSmallPages) {
  EXPECT_TRUE(HugePageCollapser::Needed("never"));
  EXPECT_FALSE(HugePageCollapser::Needed("advise"));
  EXPECT_FALSE(HugePageCollapser::Needed("always"));
  EXPECT_FALSE(HugePageCollapser::Needed("deny"));
  EXPECT_FALSE(HugePageCollapser::Needed(""));
}

}  // namespace
}  // namespace moe::cached
