// The one place a cache's configuration becomes policy and ExpertCache
// options (cache_config.h): what moe-cached and the simulator both use.
#include "services/cache/cache_config.h"

#include <memory>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/cache/fake_copy_engine.h"

namespace moe::cache {
namespace {

using ::testing::HasSubstr;

CacheShape Shape() { return {/*num_layers=*/4, /*num_experts=*/8, /*top_k=*/2, 1000, 2000.0}; }

TEST(CacheConfigTest, ValidateNamesWhatIsWrong) {
  CacheConfig c;
  c.capacity = 7;
  absl::Status s = ValidateCacheConfig(Shape(), c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("capacity 7 is below one layer's experts (8)"));
  c.capacity = 8;
  EXPECT_TRUE(ValidateCacheConfig(Shape(), c).ok());
  c.link_bytes_per_sec = -1;
  EXPECT_FALSE(ValidateCacheConfig(Shape(), c).ok());
  c.link_bytes_per_sec = 0;
  c.miss_mode = MissMode::kAuto;
  s = ValidateCacheConfig(Shape(), c);
  EXPECT_THAT(s.message(), HasSubstr("host read bandwidth"));
  c.host.read_bytes_per_sec = 50e9;
  c.host.flops_per_sec = 0;  // bandwidth alone
  EXPECT_TRUE(ValidateCacheConfig(Shape(), c).ok());
}

// Below one layer's experts, down to 0 slots, only when misses may run on
// the host (issue 28); never negative.
TEST(CacheConfigTest, CachesSmallerThanALayerNeedHostMisses) {
  CacheConfig c;
  c.host.read_bytes_per_sec = 50e9;
  for (MissMode mode : {MissMode::kHost, MissMode::kAuto}) {
    c.miss_mode = mode;
    for (int capacity : {0, 1, 7}) {
      c.capacity = capacity;
      EXPECT_TRUE(ValidateCacheConfig(Shape(), c).ok()) << capacity;
    }
    c.capacity = -1;
    EXPECT_THAT(ValidateCacheConfig(Shape(), c).message(), HasSubstr("negative"));
  }
  c.miss_mode = MissMode::kFetch;
  c.capacity = 0;
  absl::Status s = ValidateCacheConfig(Shape(), c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--miss-mode host or auto"));
}

TEST(CacheConfigTest, OptionsCarryEveryFigureAndTheEnginesChunk) {
  FakeCopyEngineOptions eo;
  eo.bandwidth_bytes_per_sec = 10'000'000;
  eo.chunk_bytes = 250;
  auto engine = FakeCopyEngine::Create(eo);
  ASSERT_TRUE(engine.ok()) << engine.status();
  CacheConfig c;
  c.policy = "moe-infinity";
  c.capacity = 20;
  c.prefetch = true;
  c.link_bytes_per_sec = 25e9;
  c.layer_seconds = 3e-4;
  c.miss_mode = MissMode::kHost;
  c.host = {60e9, 5e11};
  ManualClock clock;
  const ExpertCacheOptions o = MakeCacheOptions(Shape(), c, **engine, &clock);
  EXPECT_EQ(o.num_layers, 4);
  EXPECT_EQ(o.num_experts, 8);
  EXPECT_EQ(o.top_k, 2);
  EXPECT_EQ(o.capacity, 20);
  EXPECT_EQ(o.expert_bytes, 1000u);
  EXPECT_TRUE(o.prefetch);
  EXPECT_EQ(o.miss_mode, MissMode::kHost);
  EXPECT_EQ(o.host.read_bytes_per_sec, 60e9);
  EXPECT_EQ(o.host.flops_per_sec, 5e11);
  EXPECT_EQ(o.expert_flops_per_token, 2000.0);
  EXPECT_EQ(o.link_bytes_per_sec, 25e9);
  EXPECT_EQ(o.chunk_bytes, 250u);
  EXPECT_EQ(o.layer_seconds, 3e-4);
  EXPECT_EQ(o.clock, &clock);

  const PolicyConfig pc = MakePolicyConfig(Shape(), c);
  EXPECT_EQ(pc.num_layers, 4);
  EXPECT_EQ(pc.num_experts, 8);
  EXPECT_EQ(pc.top_k, 2);
  EXPECT_EQ(pc.capacity, 20);
  EXPECT_EQ(pc.expert_bytes, 1000.0);
  EXPECT_EQ(pc.link_bytes_per_sec, 25e9);
  EXPECT_EQ(pc.layer_seconds, 3e-4);
  // And the cache accepts what it was given.
  auto policy = MakePolicy(c.policy, pc);
  ASSERT_TRUE(policy.ok()) << policy.status();
  auto cache = ExpertCache::Create(o, std::move(*policy), engine->get());
  EXPECT_TRUE(cache.ok()) << cache.status();
}

}  // namespace
}  // namespace moe::cache
