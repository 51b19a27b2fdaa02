#include "kernels/thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <chrono>

namespace moe {
namespace {
thread_local bool t_in_pool_task = false;

// Polls `done` for up to `nanos`, pausing, and yielding the CPU every few
// polls so that a thread that needs it (the peer, another process) runs.
template <typename Done>
void SpinUntil(const Done& done, int64_t nanos) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::nanoseconds(nanos);
  for (int i = 1; !done(); ++i) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
    if (i % 32 == 0) {
      if (std::chrono::steady_clock::now() >= end) return;
      sched_yield();
    }
  }
}
}  // namespace

ThreadPool::ThreadPool(int threads)
    : size_(threads > 0
                 ? threads
                 : std::max(1, static_cast<int>(
                                   std::thread::hardware_concurrency()))) {
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
  uint64_t seen = 0;
  Job job;
  t_in_pool_task = true;  // a worker only ever runs chunks
  for (;;) {
    SpinUntil([&] { return published_generation_.load(std::memory_order_acquire) != seen; },
              kSpinNanos);
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
    RunChunks(job);
    absl::MutexLock lock(&mu_);
    --busy_workers_;
    published_busy_.store(busy_workers_, std::memory_order_release);
  }
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
  SpinUntil([&] { return published_busy_.load(std::memory_order_acquire) == 0; }, kSpinNanos);
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return busy_workers_ == 0;
  };
  mu_.Await(absl::Condition(&idle));
  last_participants_.store(participants_.load());
  job_ = Job{};
}

}  // namespace moe
