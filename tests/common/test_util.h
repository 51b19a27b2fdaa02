// Helpers shared by the tests: a self-deleting temporary directory, small
// file writers, WaitFor (a deadline on a condition), a loopback port held
// busy, and a field of this process's /proc/self/smaps.
#ifndef MOECACHE_TESTS_COMMON_TEST_UTIL_H_
#define MOECACHE_TESTS_COMMON_TEST_UTIL_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "kernels/cpu_matmul.h"

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

// A test's command line: `base` (a helper's defaults) less the flags that
// `extra` gives, then `extra`. The binaries refuse a repeated flag
// (common/flags.h), so a test's flag replaces its helper's default instead
// of following it. Flags in `repeatable` are kept (moe-worker: --model is
// once but harmless here, --listen repeats; moe-cached: pass {"--model"},
// its --listen is once); --backend is --device's old spelling.
inline std::vector<std::string> WithFlags(
    std::vector<std::string> base, const std::vector<std::string>& extra,
    const std::set<std::string>& repeatable = {"--model", "--listen"}) {
  auto name_of = [](const std::string& arg) {
    std::string name = arg.substr(0, arg.find('='));
    return name == "--backend" ? std::string("--device") : name;
  };
  std::set<std::string> given;
  for (const std::string& a : extra) {
    if (a.rfind("--", 0) == 0 && repeatable.count(name_of(a)) == 0) given.insert(name_of(a));
  }
  std::vector<std::string> out;
  for (size_t i = 0; i < base.size(); ++i) {
    const std::string& a = base[i];
    const bool flag = a.rfind("--", 0) == 0;
    const bool takes_next = flag && a.find('=') == std::string::npos && i + 1 < base.size() &&
                            base[i + 1].rfind("--", 0) != 0;
    if (flag && given.count(name_of(a)) > 0) {
      if (takes_next) ++i;
      continue;
    }
    out.push_back(a);
  }
  out.insert(out.end(), extra.begin(), extra.end());
  return out;
}

// Sets environment variable `name` to `value` (nullptr: unsets it) until
// destroyed, then restores what it was. Processes started meanwhile
// inherit it. Not thread-safe (setenv).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* was = ::getenv(name);
    had_ = was != nullptr;
    if (had_) was_ = was;
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (had_) {
      ::setenv(name_.c_str(), was_.c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_, was_;
  bool had_ = false;
};

// Products read f32 activations (MOE_BF16_DOT=0) in this process, which
// reads the variable once (SetBf16DotForTest), and in processes started
// meanwhile (the variable). Links moe_kernels.
class ScopedF32Activations {
 public:
  ScopedF32Activations() { SetBf16DotForTest(false); }
  ~ScopedF32Activations() { SetBf16DotForTest(std::nullopt); }

 private:
  ScopedEnv env_{"MOE_BF16_DOT", "0"};
};

// The engine's reference arithmetic, for as long as it lives: products
// read f32 activations (MOE_BF16_DOT=0: bf16 weights on AVX512_BF16
// otherwise round them to bf16, kernels/cpu_matmul.h) and matrices are held
// row-major (MOE_ROWS16=0: the interleaved layouts sum in their own order).
// For comparisons with the float64 references (tests/reference/), whose
// products are exact: rounded activations flip near-tied tokens and
// routes of the tiny random models, which the op-level tests
// (bf16_dot_test, backend_ops_test, rows16_test) cover with the rounding
// in the reference instead. Processes started meanwhile inherit it.
struct ReferenceArithmetic {
  ScopedF32Activations bf16;
  ScopedEnv rows{"MOE_ROWS16", "0"};
};

// A TCP port on 127.0.0.1 that this process listens on until destroyed:
// a port in use, for testing how a service refuses it. port() is 0 if the
// socket could not be set up.
class BusyLoopbackPort {
 public:
  BusyLoopbackPort() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (fd_ >= 0 && ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
        ::listen(fd_, 1) == 0 &&
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      port_ = ntohs(addr.sin_port);
    }
  }
  ~BusyLoopbackPort() {
    if (fd_ >= 0) ::close(fd_);
  }
  BusyLoopbackPort(const BusyLoopbackPort&) = delete;
  BusyLoopbackPort& operator=(const BusyLoopbackPort&) = delete;
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

// The line of /proc/self/smaps that starts with `field` ("Rss:",
// "VmFlags:") in the entry of the mapping that holds `p`; "" if none.
inline std::string SmapsLine(const void* p, const std::string& field) {
  std::ifstream smaps("/proc/self/smaps");
  const uintptr_t at = reinterpret_cast<uintptr_t>(p);
  std::string line;
  bool in = false;
  while (std::getline(smaps, line)) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 &&
        line.find('-') < line.find(' ')) {
      in = lo <= at && at < hi;
      continue;
    }
    if (in && line.rfind(field, 0) == 0) return line;
  }
  return "";
}

// Whether this kernel moves shared memory onto huge pages on request
// (MADV_COLLAPSE: Linux 6.1 or later), given its `shmem_mode` (the
// bracketed word of shmem_enabled; "" where the kernel has no transparent
// huge pages; "deny" refuses them).
inline bool KernelCollapsesSharedMemory(const std::string& shmem_mode) {
  std::ifstream in("/proc/sys/kernel/osrelease");
  int major = 0, minor = 0;
  char dot = 0;
  in >> major >> dot >> minor;
  return (major > 6 || (major == 6 && minor >= 1)) && !shmem_mode.empty() &&
         shmem_mode != "deny";
}

}  // namespace moe::testing

#endif  // MOECACHE_TESTS_COMMON_TEST_UTIL_H_
