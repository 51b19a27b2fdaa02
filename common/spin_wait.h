// Waiting for another thread or process without taking the CPU it needs.
//
// A hand-off (one thread publishes, another waits for it) costs a futex
// wake-up when the waiter sleeps: microseconds, tens of them in a VM. A
// waiter that spins on a core of its own sees the change at once. Spinning
// pays only while the thread it waits for runs on another core: when the
// machine has more runnable threads than CPUs, a spinner burns the time
// slice its peer needs, and each hand-off then costs a scheduler slice
// (issue 32: 40x slower requests beside one busy loop per core). So every
// wait here spins for at most SpinGovernor's budget, then blocks:
//
//  - no spin at all when the machine's runnable threads, this process's
//    spinners and the caller not counted, exceed its online CPUs (sampled
//    from /proc/loadavg at most every kLoadSampleEvery, by whichever waiter
//    comes first), or when the process may use a single CPU (UsableCpus);
//  - otherwise twice the longest recent hand-off (forgotten by half every
//    kForgetHalfLife of wall time; waits that outlast the site's maximum
//    do not count), at most that maximum.
//
// A spin that lost its CPU for a scheduler slice (a gap of more than
// kPreemptedGap between two polls) ends at once and its wait is not learnt
// (its length is the slice, not the hand-off), but it stops nothing: the
// 50 ms without spinning that used to follow measured no gain beside one or
// two busy loops on 2 CPUs (tests/bench/contention_bench.sh, HOGS=1 and 2),
// where the load rule above does the work, and it cost the first request
// after start 10-17%: an idle pool thread's spin lost its CPU to a passing
// process, and the quiet ran from the end of that wait, i.e. through the
// next request (issue 29, docs/benchmarks.md).
//
// The spinner polls with `pause` and yields the CPU every few polls, so a
// peer that shares its core gets it back without waiting for a tick.
//
// MOE_SPIN=legacy in the environment restores the fixed spin of before
// issue 32 (always the maximum, never backing off), for side-by-side
// benchmarks only.
#ifndef MOECACHE_COMMON_SPIN_WAIT_H_
#define MOECACHE_COMMON_SPIN_WAIT_H_

#include <atomic>
#include <cstdint>
#include <optional>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/time/time.h"

namespace moe {

inline constexpr absl::Duration kLoadSampleEvery = absl::Milliseconds(10);
inline constexpr absl::Duration kPreemptedGap = absl::Microseconds(500);
// SpinGovernor halves its memory of a slow hand-off per this much time.
inline constexpr absl::Duration kForgetHalfLife = absl::Milliseconds(20);

// CLOCK_MONOTONIC in nanoseconds (vDSO, no syscall).
int64_t MonotonicNanos();

enum class SpinOutcome {
  kDone,       // the condition became true
  kTimeUp,     // the budget ran out (or was zero)
  kPreempted,  // the spinner lost its CPU for more than kPreemptedGap
};

// Polls `done` until it returns true or `budget_ns` passes. A zero budget
// polls once. Counts the caller among this process's spinners meanwhile.
SpinOutcome SpinWhileNot(absl::FunctionRef<bool()> done, int64_t budget_ns);

// How long one wait site may spin; learns from the waits it is told about.
// Not thread-safe: one per waiting thread (or guarded by the caller).
class SpinGovernor {
 public:
  explicit SpinGovernor(absl::Duration max_spin);

  // Nanoseconds the next wait may spin; 0: block at once.
  int64_t BudgetNanos();

  // Reports a finished wait: it took `waited_ns` in all (spinning and
  // sleeping), and its spin ended with `outcome`.
  void Record(int64_t waited_ns, SpinOutcome outcome);
  // The same, the wait having ended at `now_ns` (MonotonicNanos' clock; a
  // test seam for the forgetting, which follows that clock).
  void Record(int64_t waited_ns, SpinOutcome outcome, int64_t now_ns);
  // Reports a finished wait that was not a hand-off worth spinning for (it
  // ended in a message nobody waits on): the memory decays with the time
  // as after any wait, but this wait's length is not learnt.
  void RecordNotHandOff(SpinOutcome outcome);
  void RecordNotHandOff(SpinOutcome outcome, int64_t now_ns);

  // Spins within the budget for `done`, and records nothing: the caller
  // blocks if it must, then calls Record. Returns the spin's outcome.
  SpinOutcome Spin(absl::FunctionRef<bool()> done) { return SpinWhileNot(done, BudgetNanos()); }

 private:
  // Decays the memory by the time since the previous wait ended (for the
  // first wait, `first_elapsed`); false after a preempted spin (nothing
  // to learn from it).
  bool Forget(SpinOutcome outcome, int64_t now_ns, int64_t first_elapsed);
  void SetBudget();  // from recent_ns_

  const int64_t max_ns_;
  double recent_ns_;  // the longest recent hand-off, decaying
  int64_t last_record_ns_ = 0;  // when the previous wait ended (0: none yet)
  int64_t budget_ns_;
};

// True when the last load sample found more runnable threads than CPUs
// (see above); takes a new sample when the last is older than
// kLoadSampleEvery.
bool MachineOversubscribed();

// The threads of this process inside SpinWhileNot now (the caller too, when
// it spins).
int ProcessSpinners();

// Test seam: forces MachineOversubscribed()'s answer (nullopt: measure).
void ForceMachineLoadForTest(std::optional<bool> oversubscribed);

// A 32-bit word that one side changes and the other waits on, across threads
// or processes (the words may live in MAP_SHARED memory: the futex calls are
// not FUTEX_PRIVATE). `asleep` is the waiter's announcement: PublishWord
// makes the futex_wake syscall only when it is set, so a busy hand-off costs
// no syscall, and clears it in the same step, so that a burst of publishes
// before the woken waiter runs makes one syscall, not one each (a batched
// step posts about a hundred messages to a sleeping moe-cached). One waiter
// per word at a time.

// Stores `value` into `word` and wakes its waiter if one announced itself
// and no publish has woken it since.
void PublishWord(std::atomic<uint32_t>& word, std::atomic<uint32_t>& asleep, uint32_t value);

// Waits until `word` differs from `value`: spins within `governor`'s budget,
// then sleeps on the futex in slices of at most `poll_slice`, calling `stop`
// after each slice that ended without a change (liveness checks). Returns OK
// when the word changed, DEADLINE_EXCEEDED when `deadline` passed first, or
// `stop`'s first non-OK status.
absl::Status WaitWordChange(std::atomic<uint32_t>& word, std::atomic<uint32_t>& asleep,
                            uint32_t value, absl::Time deadline, SpinGovernor& governor,
                            absl::FunctionRef<absl::Status()> stop, absl::Duration poll_slice);

// WaitWordChange that tells `governor` nothing: the caller reports the wait
// (Record or RecordNotHandOff) once it knows what ended it.
struct WordWait {
  absl::Status status;
  SpinOutcome spun = SpinOutcome::kTimeUp;
  int64_t waited_ns = 0;
};
WordWait WaitWordChangeUnrecorded(std::atomic<uint32_t>& word, std::atomic<uint32_t>& asleep,
                                  uint32_t value, absl::Time deadline, SpinGovernor& governor,
                                  absl::FunctionRef<absl::Status()> stop,
                                  absl::Duration poll_slice);

// Wakes every thread sleeping on `word` whether or not it announced itself
// (for closing a channel).
void WakeAllOnWord(std::atomic<uint32_t>& word);

}  // namespace moe

#endif  // MOECACHE_COMMON_SPIN_WAIT_H_
