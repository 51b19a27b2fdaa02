// Helpers shared by the tests: a self-deleting temporary directory, small
// file writers, and WaitFor (a deadline on a condition).
#ifndef MOECACHE_TESTS_COMMON_TEST_UTIL_H_
#define MOECACHE_TESTS_COMMON_TEST_UTIL_H_

#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace moe::testing {

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/moe_common_test.XXXXXX";
    const char* p = ::mkdtemp(tmpl);
    path_ = p != nullptr ? p : "";
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string Sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// The value of the sample `series` (name plus labels exactly as exposed,
// e.g. `moe_worker_requests_total{status="ok"}`) in a Prometheus text
// exposition; nullopt when absent or not a number.
inline std::optional<double> MetricSample(const std::string& exposition,
                                          const std::string& series) {
  std::istringstream in(exposition);
  std::string line;
  while (std::getline(in, line)) {
    if (line.size() > series.size() + 1 && line.compare(0, series.size(), series) == 0 &&
        line[series.size()] == ' ') {
      char* end = nullptr;
      const std::string value = line.substr(series.size() + 1);
      const double v = std::strtod(value.c_str(), &end);
      if (end != value.c_str()) return v;
    }
  }
  return std::nullopt;
}

inline void WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

inline std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Evaluates `done` until it returns true or `timeout` has passed; returns
// whether it did. For conditions with no event a test can block on: state
// in another process (a daemon's session table read over gRPC, a ring in
// shared memory). Rechecks after 0.1 ms, backing off to 20 ms, so a fast
// condition costs little and a slow one little CPU. Pick `timeout` as an
// upper bound ("the daemon notices within its poll interval"), not a guess of
// how long it usually takes: a loaded or sanitized run may take 10x longer.
template <typename Pred>
bool WaitFor(absl::Duration timeout, Pred done) {
  const absl::Time end = absl::Now() + timeout;
  absl::Duration pause = absl::Microseconds(100);
  while (!done()) {
    if (absl::Now() >= end) return false;
    absl::SleepFor(pause);
    pause = std::min(pause * 2, absl::Milliseconds(20));
  }
  return true;
}

}  // namespace moe::testing

#endif  // MOECACHE_TESTS_COMMON_TEST_UTIL_H_
