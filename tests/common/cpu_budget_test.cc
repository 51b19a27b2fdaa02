#include "common/cpu_budget.h"

#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"
#include "tests/common/test_util.h"

namespace moe {
namespace {

void WriteAt(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path) << text;
}

TEST(CpuBudgetTest, CgroupV2CpuMax) {
  EXPECT_EQ(ParseCgroupV2CpuMax("max 100000\n"), std::nullopt);
  EXPECT_DOUBLE_EQ(*ParseCgroupV2CpuMax("150000 100000\n"), 1.5);
  EXPECT_DOUBLE_EQ(*ParseCgroupV2CpuMax("200000 100000"), 2.0);
  EXPECT_DOUBLE_EQ(*ParseCgroupV2CpuMax("50000 100000"), 0.5);
  EXPECT_EQ(ParseCgroupV2CpuMax(""), std::nullopt);
  EXPECT_EQ(ParseCgroupV2CpuMax("abc 100000"), std::nullopt);
  EXPECT_EQ(ParseCgroupV2CpuMax("100000 0"), std::nullopt);
  EXPECT_EQ(ParseCgroupV2CpuMax("100000"), std::nullopt);
}

TEST(CpuBudgetTest, CgroupV1Quota) {
  EXPECT_EQ(ParseCgroupV1Quota("-1\n", "100000\n"), std::nullopt);
  EXPECT_DOUBLE_EQ(*ParseCgroupV1Quota("300000\n", "100000\n"), 3.0);
  EXPECT_DOUBLE_EQ(*ParseCgroupV1Quota("25000", "100000"), 0.25);
  EXPECT_EQ(ParseCgroupV1Quota("x", "100000"), std::nullopt);
  EXPECT_EQ(ParseCgroupV1Quota("100000", ""), std::nullopt);
}

TEST(CpuBudgetTest, ProcSelfCgroup) {
  std::optional<CgroupPath> v2 = ParseProcSelfCgroup("0::/system.slice/moe-worker.service\n");
  ASSERT_TRUE(v2.has_value());
  EXPECT_EQ(v2->path, "/system.slice/moe-worker.service");
  EXPECT_FALSE(v2->v1);

  // Hybrid: the v2 line is there, but the cpu controller is on v1.
  std::optional<CgroupPath> hybrid = ParseProcSelfCgroup(
      "9:name=systemd:/\n4:memory:/x\n2:cpu,cpuacct:/docker/abc\n1:pids:/\n0::/\n");
  ASSERT_TRUE(hybrid.has_value());
  EXPECT_EQ(hybrid->path, "/docker/abc");
  EXPECT_TRUE(hybrid->v1);

  // "cpuacct" alone or "cpuset" are not the cpu controller.
  std::optional<CgroupPath> none = ParseProcSelfCgroup("3:cpuset:/a\n2:cpuacct:/b\n");
  EXPECT_FALSE(none.has_value());
  EXPECT_FALSE(ParseProcSelfCgroup("").has_value());
}

TEST(CpuBudgetTest, V2QuotaIsTheSmallestOnThePathToTheRoot) {
  testing::TempDir dir;
  WriteAt(dir.Sub("cpu.max"), "max 100000\n");
  WriteAt(dir.Sub("system.slice/cpu.max"), "150000 100000\n");
  WriteAt(dir.Sub("system.slice/moe.service/cpu.max"), "400000 100000\n");
  std::optional<double> q =
      ReadCgroupQuota(dir.path(), CgroupPath{"/system.slice/moe.service", false});
  ASSERT_TRUE(q.has_value());
  EXPECT_DOUBLE_EQ(*q, 1.5);
  // A namespaced path that is not below our root: the root's own file.
  WriteAt(dir.Sub("cpu.max"), "300000 100000\n");
  EXPECT_DOUBLE_EQ(*ReadCgroupQuota(dir.path(), CgroupPath{"/not/here", false}), 3.0);
}

TEST(CpuBudgetTest, V2NoQuota) {
  testing::TempDir dir;
  WriteAt(dir.Sub("cpu.max"), "max 100000\n");
  EXPECT_EQ(ReadCgroupQuota(dir.path(), CgroupPath{"/", false}), std::nullopt);
  testing::TempDir empty;
  EXPECT_EQ(ReadCgroupQuota(empty.path(), CgroupPath{"/a/b", false}), std::nullopt);
}

TEST(CpuBudgetTest, V1QuotaUnderCpuController) {
  testing::TempDir dir;
  WriteAt(dir.Sub("cpu,cpuacct/cpu.cfs_quota_us"), "-1\n");
  WriteAt(dir.Sub("cpu,cpuacct/cpu.cfs_period_us"), "100000\n");
  WriteAt(dir.Sub("cpu,cpuacct/docker/abc/cpu.cfs_quota_us"), "250000\n");
  WriteAt(dir.Sub("cpu,cpuacct/docker/abc/cpu.cfs_period_us"), "100000\n");
  std::optional<double> q = ReadCgroupQuota(dir.path(), CgroupPath{"/docker/abc", true});
  ASSERT_TRUE(q.has_value());
  EXPECT_DOUBLE_EQ(*q, 2.5);

  testing::TempDir plain;  // mounted as "cpu" alone
  WriteAt(plain.Sub("cpu/cpu.cfs_quota_us"), "100000\n");
  WriteAt(plain.Sub("cpu/cpu.cfs_period_us"), "100000\n");
  EXPECT_DOUBLE_EQ(*ReadCgroupQuota(plain.path(), CgroupPath{"/", true}), 1.0);
}

TEST(CpuBudgetTest, CpusFromLimits) {
  EXPECT_EQ(CpusFromLimits(8, std::nullopt), 8);
  EXPECT_EQ(CpusFromLimits(8, 2.0), 2);
  EXPECT_EQ(CpusFromLimits(8, 1.5), 2);  // rounded up: bursts may use the second
  EXPECT_EQ(CpusFromLimits(8, 0.5), 1);
  EXPECT_EQ(CpusFromLimits(2, 16.0), 2);
  EXPECT_EQ(CpusFromLimits(0, std::nullopt), 1);
}

TEST(CpuBudgetTest, LoadavgRunnable) {
  EXPECT_EQ(ParseLoadavgRunnable("0.52 0.58 0.59 3/1024 12345\n"), 3);
  EXPECT_EQ(ParseLoadavgRunnable("12.91 8.27 3.70 13/172 10615"), 13);
  EXPECT_EQ(ParseLoadavgRunnable("0.52 0.58 0.59"), std::nullopt);
  EXPECT_EQ(ParseLoadavgRunnable("0.52 0.58 0.59 x/1024 1"), std::nullopt);
  EXPECT_EQ(ParseLoadavgRunnable("0.52 0.58 0.59 1024 1"), std::nullopt);
}

TEST(CpuBudgetTest, LiveReadersAreSane) {
  EXPECT_GE(UsableCpus(), 1);
  EXPECT_LE(UsableCpus(), OnlineCpus());
  std::optional<int> runnable = RunnableThreads();
  ASSERT_TRUE(runnable.has_value());
  EXPECT_GE(*runnable, 1);  // this thread is running
}

}  // namespace
}  // namespace moe
