#include "common/spin_wait.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "common/cpu_budget.h"

namespace moe {
namespace {

constexpr int kPollsPerCheck = 32;  // pauses between clock reads and yields
constexpr int64_t kMinBudgetNs = 2'000;

std::atomic<int> g_spinners{0};
std::atomic<int64_t> g_next_sample_ns{0};
std::atomic<bool> g_oversubscribed{false};
// -1: measure; 0 / 1: forced by ForceMachineLoadForTest.
std::atomic<int> g_forced_load{-1};

bool LegacySpin() {
  static const bool legacy = [] {
    const char* env = std::getenv("MOE_SPIN");
    return env != nullptr && std::strcmp(env, "legacy") == 0;
  }();
  return legacy;
}

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

int64_t ToNanos(absl::Duration d) { return absl::ToInt64Nanoseconds(d); }

// Counts the caller among the process's spinners for its lifetime.
class SpinnerScope {
 public:
  SpinnerScope() { g_spinners.fetch_add(1, std::memory_order_relaxed); }
  ~SpinnerScope() { g_spinners.fetch_sub(1, std::memory_order_relaxed); }
};

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, absl::Duration timeout) {
  timespec ts = absl::ToTimespec(timeout);
  // Shared (not FUTEX_PRIVATE): the waker may be another process.
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWake(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr,
          0);
}

// The blocking half of WaitWordChange.
absl::Status SleepWhileEqual(std::atomic<uint32_t>& word, std::atomic<uint32_t>& asleep,
                             uint32_t value, absl::Time deadline,
                             absl::FunctionRef<absl::Status()> stop, absl::Duration poll_slice) {
  while (true) {
    // seq_cst on both sides: either the publisher sees `asleep` set and
    // wakes us, or we see its new value here (no lost wake-up).
    asleep.store(1, std::memory_order_seq_cst);
    if (word.load(std::memory_order_seq_cst) != value) {
      asleep.store(0, std::memory_order_relaxed);
      return absl::OkStatus();
    }
    absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      asleep.store(0, std::memory_order_relaxed);
      return absl::DeadlineExceededError("wait: timed out");
    }
    FutexWait(&word, value, std::min(left, poll_slice));
    asleep.store(0, std::memory_order_relaxed);
    if (word.load(std::memory_order_acquire) != value) return absl::OkStatus();
    absl::Status s = stop();
    if (!s.ok()) return s;
  }
}

}  // namespace

int64_t MonotonicNanos() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

SpinOutcome SpinWhileNot(absl::FunctionRef<bool()> done, int64_t budget_ns) {
  if (done()) return SpinOutcome::kDone;
  if (budget_ns <= 0) return SpinOutcome::kTimeUp;
  SpinnerScope counted;
  const bool legacy = LegacySpin();
  const int64_t start = MonotonicNanos();
  int64_t last = start;
  for (int i = 1;; ++i) {
    if (done()) return SpinOutcome::kDone;
    CpuRelax();
    if (i % kPollsPerCheck != 0) continue;
    const int64_t now = MonotonicNanos();
    if (!legacy && now - last > ToNanos(kPreemptedGap)) return SpinOutcome::kPreempted;
    if (now - start >= budget_ns) return SpinOutcome::kTimeUp;
    sched_yield();
    last = now;
  }
}

SpinGovernor::SpinGovernor(absl::Duration max_spin)
    : max_ns_(std::max<int64_t>(0, ToNanos(max_spin))), recent_ns_(static_cast<double>(max_ns_)), budget_ns_(max_ns_) {}

int64_t SpinGovernor::BudgetNanos() {
  if (LegacySpin()) return max_ns_;
  if (max_ns_ == 0 || UsableCpus() < 2) return 0;
  if (MachineOversubscribed()) return 0;
  return budget_ns_;
}

void SpinGovernor::Record(int64_t waited_ns, SpinOutcome outcome) {
  Record(waited_ns, outcome, MonotonicNanos());
}

void SpinGovernor::RecordNotHandOff(SpinOutcome outcome) {
  RecordNotHandOff(outcome, MonotonicNanos());
}

void SpinGovernor::RecordNotHandOff(SpinOutcome outcome, int64_t now) {
  if (Forget(outcome, now, 0)) SetBudget();
}

void SpinGovernor::Record(int64_t waited_ns, SpinOutcome outcome, int64_t now) {
  if (!Forget(outcome, now, waited_ns)) return;
  // The longest hand-off of the last few kForgetHalfLife, forgotten by time,
  // not per wait: a forward pass alternates many quick hand-offs with a
  // slower one per layer or token, and forgetting an eighth per wait slept
  // through every slower one (a futex wake-up each, 13% of a 420 MB model's
  // decode on the Sapphire Rapids VM: docs/benchmarks.md, "The pool's spin
  // forgets by time"); waits longer than the maximum (idle periods) do not
  // count and wear it down to the floor within a few half-lives.
  if (waited_ns <= max_ns_) recent_ns_ = std::max(recent_ns_, static_cast<double>(waited_ns));
  SetBudget();
}

bool SpinGovernor::Forget(SpinOutcome outcome, int64_t now, int64_t first_elapsed) {
  const int64_t elapsed =
      last_record_ns_ == 0 ? first_elapsed : std::max<int64_t>(0, now - last_record_ns_);
  last_record_ns_ = now;
  if (outcome == SpinOutcome::kPreempted) return false;
  recent_ns_ *= std::exp2(-static_cast<double>(elapsed) / static_cast<double>(ToNanos(kForgetHalfLife)));
  return true;
}

void SpinGovernor::SetBudget() {
  budget_ns_ = std::clamp<int64_t>(static_cast<int64_t>(2 * recent_ns_), std::min(kMinBudgetNs, max_ns_),
                                   max_ns_);
}

bool MachineOversubscribed() {
  const int forced = g_forced_load.load(std::memory_order_relaxed);
  if (forced >= 0) return forced == 1;
  const int64_t now = MonotonicNanos();
  int64_t next = g_next_sample_ns.load(std::memory_order_relaxed);
  if (now >= next && g_next_sample_ns.compare_exchange_strong(
                         next, now + ToNanos(kLoadSampleEvery), std::memory_order_relaxed)) {
    if (std::optional<int> runnable = RunnableThreads()) {
      // The count includes this reader; our own spinners back off by
      // themselves and are not what a spin would compete with.
      const int others = *runnable - 1 - g_spinners.load(std::memory_order_relaxed);
      g_oversubscribed.store(others > OnlineCpus(), std::memory_order_relaxed);
    }
  }
  return g_oversubscribed.load(std::memory_order_relaxed);
}

int ProcessSpinners() { return g_spinners.load(std::memory_order_relaxed); }

void ForceMachineLoadForTest(std::optional<bool> oversubscribed) {
  g_forced_load.store(oversubscribed ? (*oversubscribed ? 1 : 0) : -1);
}

void PublishWord(std::atomic<uint32_t>& word, std::atomic<uint32_t>& asleep, uint32_t value) {
  word.store(value, std::memory_order_seq_cst);
  // The waiter sets `asleep` again before each sleep (SleepWhileEqual), so
  // taking it here loses no wake-up.
  if (asleep.exchange(0, std::memory_order_seq_cst) != 0) FutexWake(&word);
}

WordWait WaitWordChangeUnrecorded(std::atomic<uint32_t>& word, std::atomic<uint32_t>& asleep,
                                  uint32_t value, absl::Time deadline, SpinGovernor& governor,
                                  absl::FunctionRef<absl::Status()> stop,
                                  absl::Duration poll_slice) {
  const int64_t start = MonotonicNanos();
  WordWait w;
  w.spun = governor.Spin([&] { return word.load(std::memory_order_acquire) != value; });
  w.status = w.spun == SpinOutcome::kDone
                 ? absl::OkStatus()
                 : SleepWhileEqual(word, asleep, value, deadline, stop, poll_slice);
  w.waited_ns = MonotonicNanos() - start;
  return w;
}

absl::Status WaitWordChange(std::atomic<uint32_t>& word, std::atomic<uint32_t>& asleep,
                            uint32_t value, absl::Time deadline, SpinGovernor& governor,
                            absl::FunctionRef<absl::Status()> stop, absl::Duration poll_slice) {
  WordWait w = WaitWordChangeUnrecorded(word, asleep, value, deadline, governor, stop, poll_slice);
  governor.Record(w.waited_ns, w.spun);
  return w.status;
}

void WakeAllOnWord(std::atomic<uint32_t>& word) { FutexWake(&word); }

}  // namespace moe
