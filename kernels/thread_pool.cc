#include "kernels/thread_pool.h"

#include <algorithm>

#include "common/cpu_budget.h"
#include "common/spin_wait.h"
#include "common/threads.h"

namespace moe {
namespace {
thread_local bool t_in_pool_task = false;

SpinGovernor& DoneWait(int64_t max_spin_ns) {
  // Per calling thread: it learns that thread's hand-offs (issue 32).
  thread_local SpinGovernor governor(absl::Nanoseconds(max_spin_ns));
  return governor;
}
}  // namespace

ThreadPool::ThreadPool(int threads, int64_t min_parallel_macs)
    : size_(threads > 0 ? threads : UsableCpus()), min_parallel_macs_(min_parallel_macs) {
  workers_.reserve(size_ - 1);
  for (int i = 1; i < size_; ++i) {
    workers_.emplace_back([this] { WorkerLoop(); });
  }
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::RunChunks(const Job& job) {
  bool ran = false;
  for (;;) {
    int64_t c = next_chunk_.fetch_add(1, std::memory_order_relaxed);
    if (c >= job.chunks) break;
    if (!ran) {
      ran = true;
      participants_.fetch_add(1, std::memory_order_relaxed);
    }
    int64_t begin = c * job.grain;
    int64_t end = std::min(job.n, begin + job.grain);
    (*job.fn)(begin, end);
  }
}

void ThreadPool::WorkerLoop() {
  NameThisThread("moe-pool");
  uint64_t seen = 0;
  Job job;
  t_in_pool_task = true;  // a worker only ever runs chunks
  SpinGovernor job_wait(absl::Nanoseconds(kSpinNanos));
  for (;;) {
    const int64_t wait_start = MonotonicNanos();
    spinning_workers_.fetch_add(1, std::memory_order_relaxed);
    // A job, or another thread of the process spinning on something else
    // (the caller waiting on moe-cached's reply): no job comes before that
    // ends, and on a small machine the two spins would hold the CPUs the
    // reply needs; block instead.
    const SpinOutcome spun = job_wait.Spin([&] {
      return published_generation_.load(std::memory_order_acquire) != seen ||
             ProcessSpinners() > spinning_workers_.load(std::memory_order_relaxed) +
                                     spinning_callers_.load(std::memory_order_relaxed);
    });
    spinning_workers_.fetch_sub(1, std::memory_order_relaxed);
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || generation_ != seen;
      };
      mu_.Await(absl::Condition(&ready));
      if (stop_) return;
      seen = generation_;
      ++busy_workers_;
      published_busy_.store(busy_workers_, std::memory_order_release);
      job = job_;
    }
    job_wait.Record(MonotonicNanos() - wait_start, spun);
    RunChunks(job);
    absl::MutexLock lock(&mu_);
    --busy_workers_;
    published_busy_.store(busy_workers_, std::memory_order_release);
  }
}

bool ThreadPool::WorthSplitting(int64_t rows, int64_t weights) const {
  if (rows * weights >= min_parallel_macs_) return true;
  return size_ > 1 && spinning_workers_.load(std::memory_order_relaxed) == size_ - 1 &&
         weights >= std::min(min_parallel_macs_, kHotMinParallelWeights);
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  if (grain <= 0) grain = (n + size_ - 1) / size_;
  int64_t chunks = (n + grain - 1) / grain;
  if (size_ == 1 || chunks == 1 || t_in_pool_task) {
    for (int64_t b = 0; b < n; b += grain) fn(b, std::min(n, b + grain));
    last_participants_.store(1);
    return;
  }
  absl::MutexLock run_lock(&run_mu_);
  Job job{&fn, n, grain, chunks};
  {
    absl::MutexLock lock(&mu_);
    // A worker that woke late for the previous job may still hold its copy.
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return busy_workers_ == 0;
    };
    mu_.Await(absl::Condition(&idle));
    job_ = job;
    next_chunk_.store(0, std::memory_order_relaxed);
    participants_.store(0, std::memory_order_relaxed);
    ++generation_;
    published_generation_.store(generation_, std::memory_order_release);
  }
  t_in_pool_task = true;
  RunChunks(job);
  t_in_pool_task = false;
  // Chunks are all claimed; wait for workers still inside one. A worker that
  // wakes late finds no chunk left and only touches the counters.
  SpinGovernor& done_wait = DoneWait(kSpinNanos);
  const int64_t wait_start = MonotonicNanos();
  spinning_callers_.fetch_add(1, std::memory_order_relaxed);
  const SpinOutcome spun =
      done_wait.Spin([&] { return published_busy_.load(std::memory_order_acquire) == 0; });
  spinning_callers_.fetch_sub(1, std::memory_order_relaxed);
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return busy_workers_ == 0;
  };
  mu_.Await(absl::Condition(&idle));
  done_wait.Record(MonotonicNanos() - wait_start, spun);
  last_participants_.store(participants_.load());
  job_ = Job{};
}

}  // namespace moe
