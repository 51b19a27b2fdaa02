#include "kernels/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <optional>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "common/cpu_budget.h"
#include "common/spin_wait.h"
#include "gtest/gtest.h"

namespace moe {
namespace {

// Every index is visited exactly once, in chunks of the requested grain.
TEST(ThreadPoolTest, CoversEveryIndexOnce) {
  for (int threads : {1, 2, 5}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    for (int64_t n : {0, 1, 7, 1000}) {
      for (int64_t grain : {0, 1, 3, 64, 5000}) {
        std::vector<std::atomic<int>> hits(n);
        std::atomic<int> bad_chunks{0};
        pool.ParallelFor(n, grain, [&](int64_t b, int64_t e) {
          if (grain > 0 && e - b > grain) bad_chunks++;
          if (grain > 0 && b % grain != 0) bad_chunks++;
          for (int64_t i = b; i < e; ++i) hits[i]++;
        });
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_EQ(hits[i].load(), 1) << "n=" << n << " grain=" << grain;
        }
        EXPECT_EQ(bad_chunks.load(), 0);
      }
    }
  }
}

// Issue 32: the CPUs this process may use (affinity, cgroup quota), which
// hardware_concurrency() bounds (and equals on an unrestricted machine).
TEST(ThreadPoolTest, DefaultSizeIsTheUsableCpus) {
  ThreadPool pool(0);
  EXPECT_EQ(pool.size(), UsableCpus());
  EXPECT_LE(pool.size(),
            std::max(1, static_cast<int>(std::thread::hardware_concurrency())));
}

// Many small jobs back to back, with the waits spinning and with them
// blocking at once (an oversubscribed machine): no job is lost or run twice,
// and no waiter sleeps through its wake-up (the test would hang).
TEST(ThreadPoolTest, BackToBackJobsWithAndWithoutSpinning) {
  for (bool oversubscribed : {false, true}) {
    ForceMachineLoadForTest(oversubscribed);
    ThreadPool pool(3);
    int64_t total = 0;
    for (int round = 0; round < 5000; ++round) {
      std::atomic<int64_t> sum{0};
      pool.ParallelFor(6, 1, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) sum += i + round;
      });
      total += sum.load();
    }
    int64_t want = 0;
    for (int round = 0; round < 5000; ++round) want += 15 + 6 * round;
    EXPECT_EQ(total, want) << "oversubscribed " << oversubscribed;
  }
  ForceMachineLoadForTest(std::nullopt);
}

// Whether a product splits: from kMinParallelMacs multiply-adds always;
// while the workers spin, from kHotMinParallelWeights weights whatever the
// rows, never by a batch's multiply-adds over a small matrix (16 rows of
// the trained model's 192 x 192 projection: 590K, on weights in cache).
TEST(ThreadPoolTest, HotSplitsFollowTheWeights) {
  ForceMachineLoadForTest(false);
  ThreadPool pool(2);
  EXPECT_TRUE(pool.WorthSplitting(1, kMinParallelMacs));
  EXPECT_TRUE(pool.WorthSplitting(16, kMinParallelMacs / 16));
  EXPECT_FALSE(pool.WorthSplitting(1, kHotMinParallelWeights / 2));
  // Until the worker has been seen spinning 100 times (it starts after the
  // pool's constructor returns), or 5 s.
  int hot = 0;
  const absl::Time end = absl::Now() + absl::Seconds(5);
  for (int i = 0; hot < 100 && absl::Now() < end; ++i) {
    pool.ParallelFor(2, 1, [](int64_t, int64_t) {});  // the worker spins after it
    EXPECT_FALSE(pool.WorthSplitting(16, 192 * 192)) << "iteration " << i;
    hot += pool.WorthSplitting(1, kHotMinParallelWeights);
  }
  // Two CPUs: the worker spun between jobs at least sometimes (so the
  // check above ran hot); one CPU: it never spins.
  if (UsableCpus() >= 2) {
    EXPECT_GT(hot, 0);
  }
  ThreadPool eager(2, /*min_parallel_macs=*/0);
  EXPECT_TRUE(eager.WorthSplitting(1, 1));
  ForceMachineLoadForTest(std::nullopt);
}

// The workers are named for profiles and `top -H` (common/threads.h).
TEST(ThreadPoolTest, WorkersAreNamed) {
  auto named = [] {
    int n = 0;
    for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
      std::ifstream comm(task.path() / "comm");
      std::string name;
      std::getline(comm, name);
      n += name == "moe-pool";
    }
    return n;
  };
  const int before = named();
  ThreadPool pool(3);
  std::atomic<int> ran{0};
  pool.ParallelFor(3, 1, [&](int64_t, int64_t) { ran.fetch_add(1); });  // the workers have started
  EXPECT_EQ(ran.load(), 3);
  // A worker names itself as it starts: give the last one a moment.
  for (int i = 0; i < 200 && named() < before + 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(named(), before + 2);
}

TEST(ThreadPoolTest, SingleThreadPoolRunsInline) {
  ThreadPool pool(1);
  const std::thread::id caller = std::this_thread::get_id();
  bool other_thread = false;
  pool.ParallelFor(10, 1, [&](int64_t, int64_t) {
    other_thread |= std::this_thread::get_id() != caller;
  });
  EXPECT_FALSE(other_thread);
  EXPECT_EQ(pool.LastParticipantsForTest(), 1);
}

// A ParallelFor inside a chunk must not deadlock; it runs inline.
TEST(ThreadPoolTest, NestedParallelForRunsInline) {
  ThreadPool pool(3);
  std::atomic<int64_t> sum{0};
  pool.ParallelFor(6, 1, [&](int64_t b, int64_t e) {
    pool.ParallelFor(10, 2, [&](int64_t b2, int64_t e2) {
      for (int64_t i = b2; i < e2; ++i) sum += i;
    });
  });
  EXPECT_EQ(sum.load(), 6 * 45);
}

// Callers on several threads are serialised, each sees its own job done.
TEST(ThreadPoolTest, ConcurrentCallersEachCompleteTheirJob) {
  ThreadPool pool(3);
  constexpr int kCallers = 4, kRounds = 50;
  std::vector<int64_t> totals(kCallers, 0);
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      for (int r = 0; r < kRounds; ++r) {
        std::atomic<int64_t> sum{0};
        pool.ParallelFor(100, 7, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) sum += i;
        });
        totals[c] += sum.load();
      }
    });
  }
  for (auto& t : callers) t.join();
  for (int c = 0; c < kCallers; ++c) EXPECT_EQ(totals[c], kRounds * 4950);
}

}  // namespace
}  // namespace moe
