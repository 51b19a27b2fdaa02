// How many CPUs this process may use, and how busy the machine is.
//
// The default thread counts (the CPU backend's pool, the host-expert
// threads) follow UsableCpus(): the CPUs in this process's affinity mask
// (sched_getaffinity, which `taskset`, systemd's CPUAffinity= and container
// cpusets set), capped by the cgroup CPU quota (systemd's CPUQuota=,
// `docker --cpus`; cgroup v2 cpu.max, or v1 cpu.cfs_quota_us /
// cpu.cfs_period_us) rounded up. std::thread::hardware_concurrency() sees
// neither and would oversubscribe a limited process.
//
// The parsers take file contents, so tests feed them samples; the readers
// apply them to /proc and /sys.
//
// Thread-safe.
#ifndef MOECACHE_COMMON_CPU_BUDGET_H_
#define MOECACHE_COMMON_CPU_BUDGET_H_

#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace moe {

// cgroup v2 cpu.max: "QUOTA PERIOD" (microseconds) -> QUOTA / PERIOD CPUs.
// nullopt for "max ..." (no limit) and for malformed text.
std::optional<double> ParseCgroupV2CpuMax(absl::string_view text);

// cgroup v1 cpu.cfs_quota_us and cpu.cfs_period_us -> quota / period CPUs.
// nullopt when the quota is -1 (no limit) or either text is malformed.
std::optional<double> ParseCgroupV1Quota(absl::string_view quota_us,
                                         absl::string_view period_us);

// The cgroup of this process from /proc/self/cgroup contents: the path of the
// v1 line whose controllers include "cpu" ("4:cpu,cpuacct:/docker/abc"),
// else of the v2 line ("0::/system.slice/moe.service"); a hybrid system lists
// both and keeps the cpu controller on v1. `v1` tells which.
struct CgroupPath {
  std::string path;
  bool v1 = false;
};
std::optional<CgroupPath> ParseProcSelfCgroup(absl::string_view text);

// The smallest CPU quota on the way from the cgroup `path` up to the root
// of the hierarchy mounted at `cgroup_root` (normally /sys/fs/cgroup; for v1
// the cpu controller's directory is looked up under it). nullopt: no quota.
std::optional<double> ReadCgroupQuota(const std::string& cgroup_root, const CgroupPath& path);

// min(affinity_cpus, ceil(quota_cpus)), at least 1.
int CpusFromLimits(int affinity_cpus, std::optional<double> quota_cpus);

// The runnable-thread count of /proc/loadavg contents
// ("0.52 0.58 0.59 3/1024 12345" -> 3); nullopt when malformed.
std::optional<int> ParseLoadavgRunnable(absl::string_view text);

// The CPUs this process may use (affinity and quota, read once, cached).
int UsableCpus();

// The machine's online CPUs (sysconf), at least 1.
int OnlineCpus();

// The machine's runnable threads right now, this caller included (reads
// /proc/loadavg); nullopt when unreadable.
std::optional<int> RunnableThreads();

}  // namespace moe

#endif  // MOECACHE_COMMON_CPU_BUDGET_H_
