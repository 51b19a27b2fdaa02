#include "services/plan/machine.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/device_memory.h"

namespace moe::plan {

namespace {

// The first clause of a device error ("CUDA module not found; tried: ...").
std::string Reason(absl::string_view message) {
  const size_t end = message.find_first_of(";\n");
  return std::string(message.substr(0, end));
}

}  // namespace

GpuInfo ProbeGpu() {
  GpuInfo info;
  absl::StatusOr<std::unique_ptr<DeviceMemory>> memory = CreateDeviceMemory("cuda");
  if (!memory.ok()) {
    info.description = absl::StrCat("no GPU (", Reason(memory.status().message()), ")");
    return info;
  }
  absl::StatusOr<DeviceMemoryUsage> usage = (*memory)->QueryUsage();
  if (!usage.ok()) {
    info.description = absl::StrCat("no GPU (", Reason(usage.status().message()), ")");
    return info;
  }
  info.total_bytes = static_cast<int64_t>(usage->total_bytes);
  info.description = (*memory)->Describe();
  return info;
}

int64_t HostMemoryBytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit) {
    if (key == "MemTotal:") return kib * 1024;
  }
  return 0;
}

double MeasureHostReadGbps(int64_t bytes) {
  std::vector<uint64_t> buf(static_cast<size_t>(bytes) / sizeof(uint64_t), 1);
  double best = 0;
  volatile uint64_t sink = 0;
  for (int pass = 0; pass < 3; ++pass) {
    const auto start = std::chrono::steady_clock::now();
    uint64_t sum = 0;
    for (size_t i = 0; i < buf.size(); i += 8) sum += buf[i] + buf[i + 4];
    sink = sink + sum;
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (s > 0) best = std::max(best, static_cast<double>(bytes) / s / 1e9);
  }
  return best;
}

}  // namespace moe::plan
