#include "services/rpc/process_metrics.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "prometheus/text_serializer.h"
#include "services/rpc/build_info.h"

namespace moe::rpc {
namespace {

prometheus::Gauge& Gauge(prometheus::Registry& r, const char* name,
                         const char* help,
                         const prometheus::Labels& labels = {}) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(r).Add(labels);
}

// Seconds since the epoch at which this process started (from the boot time
// in /proc/stat and the start tick in /proc/self/stat); 0 when unreadable.
double StartTimeSeconds() {
  std::ifstream stat("/proc/self/stat");
  std::string text((std::istreambuf_iterator<char>(stat)),
                   std::istreambuf_iterator<char>());
  // Fields after the command name (which may hold spaces) start at ") ".
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::vector<std::string> fields = absl::StrSplit(text.substr(close + 2), ' ');
  // Field 22 (starttime) of stat(5) is index 19 after the state field.
  if (fields.size() < 20) return 0;
  double ticks = 0;
  if (!absl::SimpleAtod(fields[19], &ticks)) return 0;
  std::ifstream boot("/proc/stat");
  std::string key;
  double btime = 0;
  while (boot >> key) {
    if (key == "btime") {
      boot >> btime;
      break;
    }
  }
  return btime + ticks / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

}  // namespace

ProcessMetrics::ProcessMetrics(std::shared_ptr<prometheus::Registry> registry,
                               const std::string& program)
    : registry_(std::move(registry)),
      resident_(Gauge(*registry_, "process_resident_memory_bytes",
                      "Resident memory size")),
      virtual_(Gauge(*registry_, "process_virtual_memory_bytes",
                     "Virtual memory size")),
      open_fds_(Gauge(*registry_, "process_open_fds", "Open file descriptors")),
      start_time_(Gauge(*registry_, "process_start_time_seconds",
                        "Start time of the process since the epoch, seconds")) {
  Gauge(*registry_, "moe_build_info",
        "1, labelled with the build of this binary",
        {{"program", program},
         {"version", Version()},
         {"revision", GitRevision()}})
      .Set(1);
  start_time_.Set(StartTimeSeconds());
  Refresh();
}

void ProcessMetrics::Refresh() const {
  std::ifstream statm("/proc/self/statm");
  double pages_virtual = 0, pages_resident = 0;
  if (statm >> pages_virtual >> pages_resident) {
    const double page = static_cast<double>(::sysconf(_SC_PAGESIZE));
    virtual_.Set(pages_virtual * page);
    resident_.Set(pages_resident * page);
  }
  std::error_code ec;
  double fds = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++fds;
  }
  if (!ec) open_fds_.Set(fds);
}

std::vector<prometheus::MetricFamily> ProcessMetrics::Collect() const {
  Refresh();
  return registry_->Collect();
}

std::string ProcessMetrics::Text() const {
  return prometheus::TextSerializer().Serialize(Collect());
}

}  // namespace moe::rpc
