#include "common/cpu_budget.h"

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace moe {
namespace {

// Reads a small /proc or /sys file (their stat size is 0, so no size check).
std::optional<std::string> ReadSmallFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::string out;
  char buf[512];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > (1 << 16)) break;
  }
  ::close(fd);
  return out;
}

std::optional<int64_t> ParseInt(absl::string_view text) {
  int64_t v = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &v)) return std::nullopt;
  return v;
}

int AffinityCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return OnlineCpus();
  return std::max(1, CPU_COUNT(&set));
}

// The parent of a cgroup path: "/a/b" -> "/a", "/a" -> "/"; "/" -> "".
std::string Parent(const std::string& path) {
  if (path.empty() || path == "/") return "";
  size_t slash = path.find_last_of('/');
  return slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
}

std::optional<double> QuotaAt(const std::string& dir, bool v1) {
  if (!v1) {
    std::optional<std::string> max = ReadSmallFile(dir + "/cpu.max");
    return max ? ParseCgroupV2CpuMax(*max) : std::nullopt;
  }
  std::optional<std::string> quota = ReadSmallFile(dir + "/cpu.cfs_quota_us");
  std::optional<std::string> period = ReadSmallFile(dir + "/cpu.cfs_period_us");
  return quota && period ? ParseCgroupV1Quota(*quota, *period) : std::nullopt;
}

}  // namespace

std::optional<double> ParseCgroupV2CpuMax(absl::string_view text) {
  std::vector<absl::string_view> parts =
      absl::StrSplit(absl::StripAsciiWhitespace(text), ' ', absl::SkipEmpty());
  if (parts.size() != 2 || parts[0] == "max") return std::nullopt;
  std::optional<int64_t> quota = ParseInt(parts[0]);
  std::optional<int64_t> period = ParseInt(parts[1]);
  if (!quota || !period || *quota <= 0 || *period <= 0) return std::nullopt;
  return static_cast<double>(*quota) / static_cast<double>(*period);
}

std::optional<double> ParseCgroupV1Quota(absl::string_view quota_us,
                                         absl::string_view period_us) {
  std::optional<int64_t> quota = ParseInt(quota_us);
  std::optional<int64_t> period = ParseInt(period_us);
  if (!quota || !period || *quota <= 0 || *period <= 0) return std::nullopt;
  return static_cast<double>(*quota) / static_cast<double>(*period);
}

std::optional<CgroupPath> ParseProcSelfCgroup(absl::string_view text) {
  std::optional<CgroupPath> v2;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    std::vector<absl::string_view> f = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (f.size() != 3 || f[2].empty() || f[2][0] != '/') continue;
    if (f[0] == "0" && f[1].empty()) {
      v2 = CgroupPath{std::string(f[2]), false};
      continue;
    }
    for (absl::string_view c : absl::StrSplit(f[1], ',')) {
      if (c == "cpu") return CgroupPath{std::string(f[2]), true};
    }
  }
  // A hybrid system lists a v2 line too, but the cpu controller is on v1.
  return v2;
}

std::optional<double> ReadCgroupQuota(const std::string& cgroup_root, const CgroupPath& path) {
  std::string base = cgroup_root;
  if (path.v1) {
    // The cpu controller's mount: "cpu,cpuacct" on most distributions.
    base = cgroup_root + "/cpu,cpuacct";
    if (::access(base.c_str(), F_OK) != 0) base = cgroup_root + "/cpu";
  }
  std::optional<double> best;
  // In a cgroup namespace the path may not exist below the root we see;
  // walking up still reaches the root's own limit.
  for (std::string p = path.path; !p.empty(); p = Parent(p)) {
    std::optional<double> q = QuotaAt(p == "/" ? base : base + p, path.v1);
    if (q && (!best || *q < *best)) best = q;
  }
  return best;
}

int CpusFromLimits(int affinity_cpus, std::optional<double> quota_cpus) {
  int cpus = std::max(1, affinity_cpus);
  if (quota_cpus && *quota_cpus > 0) {
    cpus = std::min(cpus, static_cast<int>(std::ceil(*quota_cpus - 1e-9)));
  }
  return std::max(1, cpus);
}

std::optional<int> ParseLoadavgRunnable(absl::string_view text) {
  std::vector<absl::string_view> f = absl::StrSplit(text, ' ', absl::SkipEmpty());
  if (f.size() < 4) return std::nullopt;
  size_t slash = f[3].find('/');
  if (slash == absl::string_view::npos) return std::nullopt;
  std::optional<int64_t> n = ParseInt(f[3].substr(0, slash));
  if (!n || *n < 0 || *n > (1 << 30)) return std::nullopt;
  return static_cast<int>(*n);
}

int UsableCpus() {
  static const int cpus = [] {
    std::optional<double> quota;
    if (std::optional<std::string> self = ReadSmallFile("/proc/self/cgroup")) {
      if (std::optional<CgroupPath> path = ParseProcSelfCgroup(*self)) {
        quota = ReadCgroupQuota("/sys/fs/cgroup", *path);
      }
    }
    return CpusFromLimits(AffinityCpus(), quota);
  }();
  return cpus;
}

int OnlineCpus() {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

std::optional<int> RunnableThreads() {
  std::optional<std::string> text = ReadSmallFile("/proc/loadavg");
  return text ? ParseLoadavgRunnable(*text) : std::nullopt;
}

}  // namespace moe
