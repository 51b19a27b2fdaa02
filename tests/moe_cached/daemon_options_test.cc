#include "services/moe_cached/daemon_options.h"

#include <cstdlib>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace moe::cached {
namespace {

using ::testing::HasSubstr;

TEST(ParseDaemonFlagsTest, ModelsNamesAndDefaults) {
  ::unsetenv("RUNTIME_DIRECTORY");
  auto o = ParseDaemonFlags({"--model", "/m/mixtral-8x7b/", "--model=small=/m/x", "--policy",
                             "lru", "--prefetch=off", "--link-gbps", "12.5"});
  ASSERT_TRUE(o.ok()) << o.status();
  ASSERT_EQ(o->models.size(), 2u);
  EXPECT_EQ(o->models[0].name, "mixtral-8x7b");
  EXPECT_EQ(o->models[0].dir, "/m/mixtral-8x7b/");
  EXPECT_EQ(o->models[1].name, "small");
  EXPECT_EQ(o->models[1].dir, "/m/x");
  EXPECT_EQ(o->policy, "lru");
  EXPECT_FALSE(o->prefetch);
  EXPECT_DOUBLE_EQ(o->link_gbps, 12.5);
  EXPECT_EQ(o->listen, "unix:/tmp/moe-cached.sock");
  EXPECT_EQ(o->metrics_addr, "127.0.0.1:9464");
}

TEST(ParseDaemonFlagsTest, RuntimeDirectoryAndEmptyMetrics) {
  ::setenv("RUNTIME_DIRECTORY", "/run/moe-cached", 1);
  auto o = ParseDaemonFlags({"--model", "/m/a", "--metrics-addr", ""});
  ::unsetenv("RUNTIME_DIRECTORY");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->listen, "unix:/run/moe-cached/moe-cached.sock");
  EXPECT_EQ(o->metrics_addr, "");
}

TEST(ParseDaemonFlagsTest, RejectsBadInput) {
  struct Case {
    std::vector<std::string> args;
    const char* message;
  } cases[] = {
      {{}, "--model is required"},
      {{"--model", "/a", "--model", "/b/a"}, "given twice"},
      {{"--model", "/a", "--cache-experts", "-1"}, "--cache-experts"},  // 0: host misses
      {{"--model", "/a", "--cache-experts", "x"}, "--cache-experts"},
      {{"--model", "/a", "--cache-fraction", "1.5"}, "--cache-fraction"},
      {{"--model", "/a", "--cache-experts", "8", "--cache-bytes", "100"}, "only one of"},
      {{"--model", "/a", "--prefetch", "maybe"}, "on or off"},
      {{"--model", "/a", "--link-gbps", "-1"}, "--link-gbps"},
      {{"--model", "/a", "--bogus", "1"}, "unknown flag --bogus"},
      {{"--model"}, "needs a value"},
      {{"--model", "/a", "stray"}, "unexpected argument"},
      {{"--model", "/a", "--max-sessions", "0"}, "--max-sessions"},
      {{"--model", "/a", "--max-sessions", "-3"}, "--max-sessions"},
      {{"--model", "/a", "--max-sessions", "many"}, "--max-sessions"},
      {{"--model", "/a", "--device", "tpu"}, "--device"},
  };
  for (const Case& c : cases) {
    auto o = ParseDaemonFlags(c.args);
    EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(o.status().message(), HasSubstr(c.message));
  }
}

TEST(ParseDaemonFlagsTest, MaxSessionsDefaultsTo64AndParses) {
  auto d = ParseDaemonFlags({"--model", "/a"});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->max_sessions, 64);
  auto o = ParseDaemonFlags({"--model", "/a", "--max-sessions=3"});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->max_sessions, 3);
}

TEST(ComputeCapacityTest, EachWayAndTheFloor) {
  // 4 layers x 8 experts of 1000 bytes.
  EXPECT_EQ(ComputeCapacity({.experts = 12}, "m", 4, 8, 1000).value(), 12);
  EXPECT_EQ(ComputeCapacity({.experts = 99}, "m", 4, 8, 1000).value(), 32);  // capped
  EXPECT_EQ(ComputeCapacity({.bytes = 10999}, "m", 4, 8, 1000).value(), 10);
  EXPECT_EQ(ComputeCapacity({.fraction = 0.25}, "m", 4, 8, 1000).value(), 8);
  EXPECT_EQ(ComputeCapacity({}, "m", 4, 8, 1000).value(), 16);  // default: half
  // On a device (free bytes given): the fraction is still of the experts;
  // the default is what half the free memory holds; more than the free
  // memory is refused, naming both.
  EXPECT_EQ(ComputeCapacity({.fraction = 0.25}, "m", 4, 8, 1000, 100000).value(), 8);
  EXPECT_EQ(ComputeCapacity({}, "m", 4, 8, 1000, 20000).value(), 10);
  EXPECT_EQ(ComputeCapacity({}, "m", 4, 8, 1000, 1000000).value(), 32);  // capped
  absl::StatusOr<int> over = ComputeCapacity({.fraction = 0.5}, "m", 4, 8, 1000, 10000);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(over.status().message()), ::testing::HasSubstr("10000 free bytes"));
  EXPECT_EQ(ComputeCapacity({.experts = 11}, "m", 4, 8, 1000, 10000).status().code(),
            absl::StatusCode::kFailedPrecondition);
  for (CapacitySpec small : {CapacitySpec{.experts = 7}, CapacitySpec{.bytes = 7999},
                             CapacitySpec{.fraction = 0.2}}) {
    auto c = ComputeCapacity(small, "mixtral", 4, 8, 1000);
    EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(c.status().message(), HasSubstr("mixtral"));
    EXPECT_THAT(c.status().message(), HasSubstr("fewer than one layer's 8 experts"));
    // With misses on the host the same counts are allowed (issue 28).
    for (MissMode mode : {MissMode::kHost, MissMode::kAuto}) {
      EXPECT_TRUE(ComputeCapacity(small, "mixtral", 4, 8, 1000, 0, mode).ok());
    }
  }
  EXPECT_EQ(ComputeCapacity({.experts = 0}, "m", 4, 8, 1000, 0, MissMode::kHost).value(), 0);
  EXPECT_EQ(ComputeCapacity({.experts = 0}, "m", 4, 8, 1000).status().code(),
            absl::StatusCode::kFailedPrecondition);
  auto zero = ParseDaemonFlags({"--model", "/a", "--cache-experts", "0"});
  ASSERT_TRUE(zero.ok()) << zero.status();
  EXPECT_EQ(zero->capacity.experts, 0);
  EXPECT_EQ(ParseDaemonFlags({"--model", "/a"})->capacity.experts, -1);  // not given
}

}  // namespace
}  // namespace moe::cached
