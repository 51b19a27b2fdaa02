// A two-method time source, injected wherever time matters so that tests and
// the simulator can run on a virtual clock instead of sleeping.
//
//   RealClock   - std::chrono::steady_clock; SleepUntil really sleeps.
//   ManualClock - time moves only when told; SleepUntil jumps the clock
//                 forward at once and records the requested wake-up time, so a
//                 test can check a pacing schedule without waiting for it.
//
// Thread-safety: all methods of all three classes are thread-safe.
#ifndef MOECACHE_SERVICES_CACHE_CLOCK_H_
#define MOECACHE_SERVICES_CACHE_CLOCK_H_

#include <chrono>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"

namespace moe::cache {

class Clock {
 public:
  virtual ~Clock() = default;

  // Monotonic time in nanoseconds from an arbitrary origin.
  virtual int64_t NowNanos() const = 0;

  // Returns once NowNanos() >= t_ns (at once if that already holds).
  virtual void SleepUntil(int64_t t_ns) = 0;
};

class RealClock final : public Clock {
 public:
  int64_t NowNanos() const override {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  void SleepUntil(int64_t t_ns) override {
    std::this_thread::sleep_until(std::chrono::steady_clock::time_point(
        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
            std::chrono::nanoseconds(t_ns))));
  }

  // A process-wide instance, never destroyed.
  static RealClock* Get() {
    static RealClock* clock = new RealClock();
    return clock;
  }
};

class ManualClock final : public Clock {
 public:
  explicit ManualClock(int64_t start_ns = 0) : now_ns_(start_ns) {}

  int64_t NowNanos() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return now_ns_;
  }

  // Records t_ns, then moves the clock to max(now, t_ns). Never blocks.
  void SleepUntil(int64_t t_ns) override {
    std::lock_guard<std::mutex> lock(mu_);
    sleep_requests_.push_back(t_ns);
    if (t_ns > now_ns_) now_ns_ = t_ns;
  }

  // Moves the clock to max(now, t_ns): time never goes backwards.
  void AdvanceTo(int64_t t_ns) {
    std::lock_guard<std::mutex> lock(mu_);
    if (t_ns > now_ns_) now_ns_ = t_ns;
  }

  // REQUIRES: delta_ns >= 0.
  void AdvanceBy(int64_t delta_ns) {
    std::lock_guard<std::mutex> lock(mu_);
    if (delta_ns > 0) now_ns_ += delta_ns;
  }

  // Every t_ns passed to SleepUntil so far, in call order.
  std::vector<int64_t> SleepRequests() const {
    std::lock_guard<std::mutex> lock(mu_);
    return sleep_requests_;
  }

 private:
  // std::mutex rather than absl::Mutex: ThreadSanitizer understands it with
  // the uninstrumented Debian abseil.
  mutable std::mutex mu_;
  int64_t now_ns_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> sleep_requests_ ABSL_GUARDED_BY(mu_);
};

}  // namespace moe::cache

#endif  // MOECACHE_SERVICES_CACHE_CLOCK_H_
