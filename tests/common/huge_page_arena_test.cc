#include "common/huge_page_arena.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tests/common/test_util.h"

namespace moe {
namespace {

TEST(HugePageArenaTest, AllocationsAreAlignedZeroedDisjointAndAdvised) {
  HugePageArena arena(4 << 20);
  std::vector<std::pair<uint8_t*, uint64_t>> got;
  for (uint64_t bytes : {100u, 64u, 5000u, 1u, 3u << 20, 4096u, 7u, 3u << 20}) {
    auto p = arena.Allocate(bytes);
    ASSERT_TRUE(p.ok()) << p.status();
    const uintptr_t a = reinterpret_cast<uintptr_t>(*p);
    EXPECT_EQ(a % (bytes >= 4096 ? 4096 : 64), 0u) << bytes;
    for (uint64_t i = 0; i < bytes; ++i) ASSERT_EQ((*p)[i], 0) << bytes << " at " << i;
    std::memset(*p, 0xab, bytes);
    got.emplace_back(*p, bytes);
  }
  // Nothing handed out twice: every byte kept what its owner wrote.
  for (size_t i = 0; i < got.size(); ++i) {
    for (size_t j = i + 1; j < got.size(); ++j) {
      const bool apart = got[i].first + got[i].second <= got[j].first ||
                         got[j].first + got[j].second <= got[i].first;
      EXPECT_TRUE(apart) << i << " and " << j << " overlap";
    }
  }
  for (const auto& [p, n] : got) {
    for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(p[i], 0xab);
  }
  // The second 3 MiB did not fit in the first block: a second one.
  EXPECT_EQ(arena.mapped_bytes(), uint64_t{8} << 20);
  EXPECT_GE(arena.used_bytes(), (uint64_t{6} << 20) + 5000 + 4096 + 175);
  // Blocks start on a huge page and carry the advice (VmFlags "hg").
  EXPECT_EQ(reinterpret_cast<uintptr_t>(got[0].first) % HugePageArena::kHugePage, 0u);
  const std::string flags = testing::SmapsLine(got[0].first, "VmFlags:");
  EXPECT_NE(flags.find(" hg"), std::string::npos) << flags;
}

TEST(HugePageArenaTest, LargerThanABlockGetsItsOwn) {
  HugePageArena arena(2 << 20);
  auto small = arena.Allocate(1000);
  ASSERT_TRUE(small.ok());
  auto big = arena.Allocate((5 << 20) + 1);
  ASSERT_TRUE(big.ok()) << big.status();
  (*big)[5 << 20] = 1;
  EXPECT_EQ(arena.mapped_bytes(), (uint64_t{2} << 20) + (uint64_t{6} << 20));
  EXPECT_TRUE(arena.Holds(*small));
  EXPECT_TRUE(arena.Holds(*big + (5 << 20)));
  int elsewhere = 0;
  EXPECT_FALSE(arena.Holds(&elsewhere));
  // The block after the big one starts afresh.
  auto next = arena.Allocate(2 << 20);
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(arena.mapped_bytes(), uint64_t{10} << 20);
}

TEST(HugePageArenaTest, RefusesZeroAndImpossibleSizes) {
  HugePageArena arena;
  EXPECT_EQ(arena.Allocate(0).status().code(), absl::StatusCode::kInvalidArgument);
  auto huge = arena.Allocate(uint64_t{1} << 62);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(huge.status().message().find("bytes of host memory"), absl::string_view::npos);
  EXPECT_EQ(arena.mapped_bytes(), 0u);
}

TEST(HugePageArenaTest, MovedArenaKeepsItsMemory) {
  HugePageArena a;
  auto p = a.Allocate(64);
  ASSERT_TRUE(p.ok());
  (*p)[0] = 42;
  HugePageArena b(std::move(a));
  EXPECT_EQ((*p)[0], 42);
  EXPECT_EQ(b.mapped_bytes(), uint64_t{64} << 20);
  EXPECT_EQ(a.mapped_bytes(), 0u);  // NOLINT(bugprone-use-after-move): stated empty
}

}  // namespace
}  // namespace moe
