// A small fixed-size thread pool for data-parallel loops (ParallelFor).
//
// The calling thread takes part in the work, so a pool of size 1 has no
// worker threads at all. Work is split into fixed chunks whose boundaries do
// not depend on which thread runs them, so results are identical for every
// pool size as long as each output element is written by one chunk.
//
// Thread-safe: ParallelFor may be called from several threads; calls are
// serialised. A ParallelFor issued from inside a running chunk runs inline.
#ifndef MOECACHE_KERNELS_THREAD_POOL_H_
#define MOECACHE_KERNELS_THREAD_POOL_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace moe {

// Products (kernels/cpu_matmul.cc, cpu_quant_matmul.cc) that
// WorthSplitting() turns down run whole on the calling thread. Handing a
// chunk to a worker that has gone to sleep costs a futex wake-up (20-60 us
// in a VM) and, on a loaded machine, maybe a scheduler slice while the
// caller waits for that chunk; a million bf16 multiply-adds take one zen4
// core about as long, so below kMinParallelMacs splitting does not pay.
// While every worker is spinning for its next job a hand-off costs about a
// microsecond, and a product that reads kHotMinParallelWeights weights or
// more splits: at one row it streams them from memory, and a second
// thread adds read bandwidth (the 420 MB model's 262K-524K-weight k, v and
// lm-head products: q4 decode 1.57 ms a token without, 1.39 with). Not
// the multiply-adds: a batch of rows over a small matrix is compute on
// weights in cache, and on AMX tiles 16 rows of the trained model's 37K
// weights (590K multiply-adds) take a few microseconds, less than the
// split costs (batch 16 in process 8.0-10.3K tokens/s split hot, 11.3-12.5K
// whole, Sapphire Rapids). docs/benchmarks.md, "Small products on the
// calling thread" and "Batched products by their weights".
inline constexpr int64_t kMinParallelMacs = int64_t{1} << 20;
inline constexpr int64_t kHotMinParallelWeights = int64_t{1} << 17;

class ThreadPool {
 public:
  // threads <= 0: UsableCpus() (common/cpu_budget.h: affinity and quota).
  // min_parallel_macs: see kMinParallelMacs (tests pass 0 to split every
  // product, hot or not).
  explicit ThreadPool(int threads, int64_t min_parallel_macs = kMinParallelMacs);
  ~ThreadPool();  // joins the workers
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return size_; }
  // Whether a product of `rows` activation rows by a `weights`-element
  // matrix is worth splitting now: from min_parallel_macs multiply-adds
  // on, or while every worker is spinning for its next job (a hand-off
  // then costs about a microsecond, not a wake-up) from the smaller of
  // kHotMinParallelWeights and min_parallel_macs weights on.
  bool WorthSplitting(int64_t rows, int64_t weights) const;

  // Calls fn(begin, end) over [0, n) in chunks of `grain` items (the last may
  // be shorter) and returns when all chunks are done. grain <= 0 picks
  // ceil(n / size()).
  void ParallelFor(int64_t n, int64_t grain,
                   const std::function<void(int64_t, int64_t)>& fn);

  // Number of threads that ran at least one chunk in the last ParallelFor.
  int LastParticipantsForTest() const { return last_participants_.load(); }

 private:
  struct Job {
    const std::function<void(int64_t, int64_t)>* fn = nullptr;
    int64_t n = 0;
    int64_t grain = 1;
    int64_t chunks = 0;
  };

  void WorkerLoop();
  // Runs chunks of `job` until none is left.
  void RunChunks(const Job& job);

  const int size_;
  const int64_t min_parallel_macs_;
  std::vector<std::thread> workers_;

  absl::Mutex run_mu_;  // serialises ParallelFor callers
  absl::Mutex mu_;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  int busy_workers_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;

  // The current job. A new job is installed only when no worker is busy, so
  // a worker's copy (taken under mu_) always matches next_chunk_.
  Job job_ ABSL_GUARDED_BY(mu_);
  // Mirrors of generation_ and busy_workers_ (written under mu_) that an
  // idle worker and a waiting caller poll for at most kSpinNanos (less per
  // SpinGovernor, none on a busy machine) before they block on mu_: the next
  // small op then starts without a futex wake-up (tens of us in a VM).
  // 500 us covers a decode step's slower gaps (a layer's serial work, the
  // step's end); at 50 us the worker slept 2-3 times a token and a
  // 420 MB model's decode was 10% slower (docs/benchmarks.md, "The pool's
  // spin forgets by time").
  static constexpr int64_t kSpinNanos = 500'000;
  std::atomic<uint64_t> published_generation_{0};
  std::atomic<int> published_busy_{0};
  std::atomic<int64_t> next_chunk_{0};
  std::atomic<int> participants_{0};
  std::atomic<int> spinning_workers_{0};
  std::atomic<int> spinning_callers_{0};  // callers spinning for their job's end
  std::atomic<int> last_participants_{0};
};

}  // namespace moe

#endif  // MOECACHE_KERNELS_THREAD_POOL_H_
