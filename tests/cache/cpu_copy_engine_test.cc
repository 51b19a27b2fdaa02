#include "services/cache/cpu_copy_engine.h"

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace moe::cache {
namespace {

using ::absl::StatusCode;
using ::testing::ElementsAre;

constexpr TransferPriority kDemand = TransferPriority::kDemand;
constexpr TransferPriority kPrefetch = TransferPriority::kPrefetch;

struct Done {
  TransferId id;
  StatusCode code;
  bool operator==(const Done& o) const { return id == o.id && code == o.code; }
};

std::ostream& operator<<(std::ostream& os, const Done& d) {
  return os << "{" << d.id << " " << absl::StatusCodeToString(d.code) << "}";
}

// Collects completions; WaitFor blocks (no sleeping) until n have arrived.
// std::mutex, not absl::Mutex, so that ThreadSanitizer builds understand it.
class Completions {
 public:
  TransferDoneFn Callback() {
    return [this](TransferId id, absl::Status s) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        done_.push_back({id, s.code()});
      }
      cv_.notify_all();
    };
  }
  std::vector<Done> WaitFor(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    EXPECT_TRUE(cv_.wait_for(lock, std::chrono::seconds(60),
                             [&] { return done_.size() >= n; }))
        << "only " << done_.size() << " of " << n << " completions";
    return done_;
  }
  std::vector<Done> Snapshot() {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Done> done_;
};

// Records the chunks the copy thread ran, in order.
struct ChunkLog {
  struct Entry {
    TransferId id;
    uint64_t offset;
    bool operator==(const Entry& o) const {
      return id == o.id && offset == o.offset;
    }
  };
  std::mutex mu;
  std::vector<Entry> entries;
  void Add(const internal::Chunk& c) {
    std::lock_guard<std::mutex> lock(mu);
    entries.push_back({c.id, c.offset});
  }
};

std::ostream& operator<<(std::ostream& os, const ChunkLog::Entry& e) {
  return os << "{" << e.id << "@" << e.offset << "}";
}

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (uint8_t& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

class CpuCopyEngineTest : public ::testing::Test {
 protected:
  void Make(uint64_t arena_bytes, uint64_t chunk, uint64_t rate = 0,
            Clock* clock = nullptr) {
    arena_.assign(arena_bytes, 0);
    CpuCopyEngineOptions o;
    o.arena = arena_.data();
    o.arena_bytes = arena_bytes;
    o.chunk_bytes = chunk;
    o.link_bytes_per_sec = rate;
    o.clock = clock;
    engine_ = std::make_unique<CpuCopyEngine>(o);
  }

  TransferId Submit(const std::vector<uint8_t>& src, uint64_t dst,
                    TransferPriority p) {
    TransferRequest r;
    r.src = src.data();
    r.bytes = src.size();
    r.dst_offset = dst;
    r.priority = p;
    auto id = engine_->Submit(r, done_.Callback());
    EXPECT_TRUE(id.ok()) << id.status();
    return id.value_or(kNoTransfer);
  }

  bool ArenaHolds(uint64_t dst, const std::vector<uint8_t>& src,
                  uint64_t n) const {
    return std::memcmp(arena_.data() + dst, src.data(), n) == 0;
  }
  bool ArenaZero(uint64_t from, uint64_t to) const {
    for (uint64_t i = from; i < to; ++i) {
      if (arena_[i] != 0) return false;
    }
    return true;
  }

  std::vector<uint8_t> arena_;
  Completions done_;
  std::unique_ptr<CpuCopyEngine> engine_;
};

TEST_F(CpuCopyEngineTest, RejectsBadOptionsAndRequests) {
  CpuCopyEngineOptions o;
  o.arena_bytes = 10;  // null arena
  CpuCopyEngine bad(o);
  EXPECT_EQ(bad.Start().code(), StatusCode::kInvalidArgument);

  Make(1000, 100);
  std::vector<uint8_t> src(200, 7);
  TransferRequest r;
  r.src = src.data();
  r.bytes = 0;
  EXPECT_EQ(engine_->Submit(r, nullptr).status().code(),
            StatusCode::kInvalidArgument);
  r.bytes = 200;
  r.dst_offset = 801;  // 801 + 200 > 1000
  EXPECT_EQ(engine_->Submit(r, nullptr).status().code(),
            StatusCode::kInvalidArgument);
  r.dst_offset = ~uint64_t{0} - 10;  // would wrap around
  EXPECT_EQ(engine_->Submit(r, nullptr).status().code(),
            StatusCode::kInvalidArgument);
  r.dst_offset = 0;
  r.src = nullptr;
  EXPECT_EQ(engine_->Submit(r, nullptr).status().code(),
            StatusCode::kInvalidArgument);
  ASSERT_TRUE(engine_->Start().ok());
  EXPECT_EQ(engine_->Start().code(), StatusCode::kFailedPrecondition);
  engine_->Stop();
  engine_->Stop();  // idempotent
  EXPECT_EQ(engine_->Start().code(), StatusCode::kFailedPrecondition);
  r.src = src.data();
  EXPECT_EQ(engine_->Submit(r, nullptr).status().code(),
            StatusCode::kFailedPrecondition);
}

TEST_F(CpuCopyEngineTest, CopiesBytesExactly) {
  constexpr uint64_t kChunk = 64 << 10;
  Make(8 << 20, kChunk);
  // Odd sizes: partial last chunks; one smaller than a chunk.
  const std::vector<uint8_t> a = RandomBytes(1'000'003, 1);
  const std::vector<uint8_t> b = RandomBytes(777, 2);
  const std::vector<uint8_t> c = RandomBytes(3 * kChunk, 3);
  const uint64_t da = 5, db = 2'000'000, dc = 4'000'000;
  ASSERT_TRUE(engine_->Start().ok());
  Submit(a, da, kDemand);
  Submit(b, db, kPrefetch);
  Submit(c, dc, kPrefetch);
  std::vector<Done> done = done_.WaitFor(3);
  for (const Done& d : done) EXPECT_EQ(d.code, StatusCode::kOk);
  EXPECT_TRUE(ArenaHolds(da, a, a.size()));
  EXPECT_TRUE(ArenaHolds(db, b, b.size()));
  EXPECT_TRUE(ArenaHolds(dc, c, c.size()));
  EXPECT_TRUE(ArenaZero(0, da));
  EXPECT_TRUE(ArenaZero(da + a.size(), db));
  EXPECT_TRUE(ArenaZero(db + b.size(), dc));
  EXPECT_TRUE(ArenaZero(dc + c.size(), arena_.size()));
  const CopyStats st = engine_->GetStats();
  EXPECT_EQ(st.bytes_moved, a.size() + b.size() + c.size());
  EXPECT_EQ(st.transfers_completed, 3u);
}

TEST_F(CpuCopyEngineTest, DemandFirstThenPrefetchFifoWithPromote) {
  Make(4000, 100);
  ChunkLog log;
  engine_->SetChunkObserverForTest([&](const internal::Chunk& c) { log.Add(c); });
  const auto src = RandomBytes(200, 4);
  // Queued before Start, so the order is decided with all of them present.
  const TransferId p1 = Submit(src, 0, kPrefetch);
  const TransferId p2 = Submit(src, 1000, kPrefetch);
  const TransferId p3 = Submit(src, 2000, kPrefetch);
  const TransferId d = Submit(src, 3000, kDemand);
  ASSERT_TRUE(engine_->Promote(p3).ok());
  EXPECT_EQ(engine_->Promote(12345).code(), StatusCode::kNotFound);
  ASSERT_TRUE(engine_->Start().ok());
  EXPECT_THAT(done_.WaitFor(4),
              ElementsAre(Done{d, StatusCode::kOk}, Done{p3, StatusCode::kOk},
                          Done{p1, StatusCode::kOk},
                          Done{p2, StatusCode::kOk}));
  std::lock_guard<std::mutex> lock(log.mu);
  EXPECT_THAT(log.entries,
              ElementsAre(ChunkLog::Entry{d, 0}, ChunkLog::Entry{d, 100},
                          ChunkLog::Entry{p3, 0}, ChunkLog::Entry{p3, 100},
                          ChunkLog::Entry{p1, 0}, ChunkLog::Entry{p1, 100},
                          ChunkLog::Entry{p2, 0}, ChunkLog::Entry{p2, 100}));
}

TEST_F(CpuCopyEngineTest, DemandPreemptsPrefetchAtChunkBoundary) {
  Make(8000, 1000);
  const auto big = RandomBytes(4000, 5);
  const auto small = RandomBytes(1500, 6);
  ChunkLog log;
  TransferId d = kNoTransfer;
  // After the prefetch's first chunk, a demand arrives (from the copy
  // thread, so the timing is deterministic).
  engine_->SetChunkObserverForTest([&](const internal::Chunk& c) {
    log.Add(c);
    if (c.offset == 0 && d == kNoTransfer) {
      d = Submit(small, 5000, kDemand);
    }
  });
  const TransferId p = Submit(big, 0, kPrefetch);
  ASSERT_TRUE(engine_->Start().ok());
  const std::vector<Done> done = done_.WaitFor(2);
  ASSERT_NE(d, kNoTransfer);
  EXPECT_THAT(done, ElementsAre(Done{d, StatusCode::kOk},
                                Done{p, StatusCode::kOk}));
  {
    std::lock_guard<std::mutex> lock(log.mu);
    EXPECT_THAT(log.entries,
                ElementsAre(ChunkLog::Entry{p, 0}, ChunkLog::Entry{d, 0},
                            ChunkLog::Entry{d, 1000}, ChunkLog::Entry{p, 1000},
                            ChunkLog::Entry{p, 2000},
                            ChunkLog::Entry{p, 3000}));
  }
  EXPECT_TRUE(ArenaHolds(0, big, big.size()));
  EXPECT_TRUE(ArenaHolds(5000, small, small.size()));
  const CopyStats st = engine_->GetStats();
  EXPECT_EQ(st.preemptions, 1u);
  EXPECT_EQ(st.bytes_moved, 5500u);  // nothing copied twice
  EXPECT_EQ(st.prefetch_bytes, 4000u);
  EXPECT_EQ(st.demand_bytes, 1500u);
}

TEST_F(CpuCopyEngineTest, CancelQueuedAndInFlight) {
  Make(10000, 1000);
  const auto src = RandomBytes(3000, 7);
  TransferId p1 = kNoTransfer;
  engine_->SetChunkObserverForTest([&](const internal::Chunk& c) {
    // Cancel P1 while its first chunk is on the link: it stops there.
    if (c.id == p1 && c.offset == 0) {
      EXPECT_TRUE(engine_->Cancel(p1).ok());
    }
  });
  p1 = Submit(src, 0, kPrefetch);
  const TransferId p2 = Submit(src, 4000, kPrefetch);
  const TransferId p3 = Submit(src, 7000, kPrefetch);
  ASSERT_TRUE(engine_->Cancel(p2).ok());
  EXPECT_TRUE(done_.Snapshot().empty());  // never from inside Cancel
  ASSERT_TRUE(engine_->Start().ok());
  std::vector<Done> done = done_.WaitFor(3);
  EXPECT_THAT(done, ElementsAre(Done{p2, StatusCode::kCancelled},
                                Done{p1, StatusCode::kCancelled},
                                Done{p3, StatusCode::kOk}));
  EXPECT_TRUE(ArenaHolds(0, src, 1000));  // P1's one chunk
  EXPECT_TRUE(ArenaZero(1000, 7000));     // rest of P1, all of P2
  EXPECT_TRUE(ArenaHolds(7000, src, 3000));
  EXPECT_EQ(engine_->Cancel(p3).code(), StatusCode::kNotFound);
  const CopyStats st = engine_->GetStats();
  EXPECT_EQ(st.transfers_cancelled, 2u);
  EXPECT_EQ(st.bytes_moved, 4000u);
}

// Pacing on a ManualClock: the requested wake-ups follow the link model
// exactly. 1 GB/s = 1 byte/ns; chunks of 1000 B take 1000 ns.
TEST_F(CpuCopyEngineTest, PacesToLinkScheduleOnManualClock) {
  ManualClock clock(/*start_ns=*/500);
  Make(10000, 1000, /*rate=*/1'000'000'000, &clock);
  const auto a = RandomBytes(2500, 8);
  const auto b = RandomBytes(1000, 9);
  Submit(a, 0, kDemand);
  Submit(b, 3000, kPrefetch);
  ASSERT_TRUE(engine_->Start().ok());
  done_.WaitFor(2);
  // a: 1000+1000+500 bytes from t=500; then b.
  EXPECT_THAT(clock.SleepRequests(), ElementsAre(1500, 2500, 3000, 4000));
  // The link idles; the next chunk starts at the new "now", not back-to-back.
  clock.AdvanceTo(10'000);
  Submit(b, 5000, kDemand);
  done_.WaitFor(3);
  EXPECT_THAT(clock.SleepRequests(),
              ElementsAre(1500, 2500, 3000, 4000, 11'000));
  EXPECT_EQ(engine_->GetStats().busy_ns, 4500);
  EXPECT_TRUE(ArenaHolds(0, a, a.size()));
  EXPECT_TRUE(ArenaHolds(5000, b, b.size()));
}

// A clock whose sleeps overshoot by 500 ns, like a loaded machine.
class LateClock final : public Clock {
 public:
  int64_t NowNanos() const override { return inner_.NowNanos(); }
  void SleepUntil(int64_t t_ns) override {
    inner_.SleepUntil(t_ns);
    inner_.AdvanceBy(500);
  }
  ManualClock inner_;
};

// Back-to-back chunks keep the link's schedule despite late wake-ups.
TEST_F(CpuCopyEngineTest, PacingCatchesUpAfterLateWakeups) {
  LateClock clock;
  Make(10000, 1000, /*rate=*/1'000'000'000, &clock);
  const auto a = RandomBytes(3000, 15);
  Submit(a, 0, kDemand);
  ASSERT_TRUE(engine_->Start().ok());
  done_.WaitFor(1);
  EXPECT_THAT(clock.inner_.SleepRequests(), ElementsAre(1000, 2000, 3000));
  EXPECT_EQ(clock.NowNanos(), 3500);
  EXPECT_TRUE(ArenaHolds(0, a, a.size()));
}

// With the real clock, pacing can only make copies slower, never faster than
// the modelled link: a lower bound, robust on a loaded machine.
TEST_F(CpuCopyEngineTest, PacedRealClockNoFasterThanLink) {
  constexpr uint64_t kBytes = 32 << 20;
  constexpr uint64_t kRate = 1'000'000'000;  // 1 GB/s -> >= 33.5 ms
  Make(kBytes, 1 << 20, kRate);
  const auto src = RandomBytes(kBytes, 10);
  const int64_t t0 = RealClock::Get()->NowNanos();
  ASSERT_TRUE(engine_->Start().ok());
  Submit(src, 0, kDemand);
  done_.WaitFor(1);
  const int64_t elapsed = RealClock::Get()->NowNanos() - t0;
  EXPECT_GE(elapsed, LinkNanos(kBytes, kRate));
  EXPECT_TRUE(ArenaHolds(0, src, kBytes));
  std::printf("paced 1 GB/s: %.3f GB/s effective\n",
              static_cast<double>(kBytes) / static_cast<double>(elapsed));
}

TEST_F(CpuCopyEngineTest, UnpacedThroughput) {
  constexpr uint64_t kBytes = 64 << 20;
  Make(kBytes, 4 << 20);
  const auto src = RandomBytes(kBytes, 11);
  ASSERT_TRUE(engine_->Start().ok());
  const int64_t t0 = RealClock::Get()->NowNanos();
  Submit(src, 0, kDemand);
  done_.WaitFor(1);
  const int64_t elapsed = RealClock::Get()->NowNanos() - t0;
  EXPECT_TRUE(ArenaHolds(0, src, kBytes));
  EXPECT_GT(engine_->GetStats().busy_ns, 0);
  std::printf("unpaced memcpy: %.2f GB/s\n",
              static_cast<double>(kBytes) / static_cast<double>(elapsed));
}

TEST_F(CpuCopyEngineTest, StopBeforeStartCancelsOnCallerThread) {
  Make(1000, 100);
  const auto src = RandomBytes(300, 12);
  const TransferId a = Submit(src, 0, kDemand);
  const TransferId b = Submit(src, 500, kPrefetch);
  engine_->Stop();
  EXPECT_THAT(done_.Snapshot(), ElementsAre(Done{a, StatusCode::kCancelled},
                                            Done{b, StatusCode::kCancelled}));
  EXPECT_TRUE(ArenaZero(0, 1000));
}

// Stop from the copy thread mid-transfer: deterministic outcome.
TEST_F(CpuCopyEngineTest, StopCancelsPendingAndInFlightWork) {
  Make(100000, 1000);
  const auto src = RandomBytes(5000, 13);
  std::vector<TransferId> ids;
  engine_->SetChunkObserverForTest([&](const internal::Chunk& c) {
    if (c.id == ids[0] && c.offset == 1000) engine_->Stop();
  });
  for (int i = 0; i < 10; ++i) {
    ids.push_back(Submit(src, 10000 * i, i < 5 ? kDemand : kPrefetch));
  }
  ASSERT_TRUE(engine_->Start().ok());
  std::vector<Done> done = done_.WaitFor(10);
  engine_->Stop();  // joins
  ASSERT_EQ(done.size(), 10u);
  // The in-flight one is reported at the end of its chunk, then the queued
  // ones in queue order.
  EXPECT_EQ(done[0], (Done{ids[0], StatusCode::kCancelled}));
  for (int i = 1; i < 10; ++i) {
    EXPECT_EQ(done[i], (Done{ids[i], StatusCode::kCancelled}));
  }
  EXPECT_TRUE(ArenaHolds(0, src, 2000));
  EXPECT_TRUE(ArenaZero(2000, arena_.size()));
  EXPECT_EQ(engine_->GetStats().transfers_cancelled, 10u);
  EXPECT_EQ(engine_->GetStats().bytes_moved, 2000u);
}

// Stop from another thread at an arbitrary moment: every transfer still gets
// exactly one callback before Stop returns, and completed ones are intact.
TEST_F(CpuCopyEngineTest, StopFromOtherThreadReportsEveryTransferOnce) {
  Make(32 << 20, 64 << 10);
  const auto src = RandomBytes(1 << 20, 14);
  std::vector<TransferId> ids;
  for (int i = 0; i < 30; ++i) {
    ids.push_back(Submit(src, (i % 30) << 20, i % 3 ? kPrefetch : kDemand));
  }
  ASSERT_TRUE(engine_->Start().ok());
  engine_->Stop();
  std::vector<Done> done = done_.Snapshot();
  ASSERT_EQ(done.size(), ids.size());
  std::vector<TransferId> seen;
  for (const Done& d : done) {
    seen.push_back(d.id);
    EXPECT_TRUE(d.code == StatusCode::kOk || d.code == StatusCode::kCancelled);
    if (d.code == StatusCode::kOk) {
      const uint64_t i = d.id - ids[0];
      EXPECT_TRUE(ArenaHolds(i << 20, src, src.size())) << d;
    }
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, ids);
}

TEST_F(CpuCopyEngineTest, ConcurrentStopsAreSafe) {
  Make(4 << 20, 4096);
  const auto src = RandomBytes(1 << 20, 16);
  for (int i = 0; i < 4; ++i) Submit(src, uint64_t(i) << 20, kPrefetch);
  ASSERT_TRUE(engine_->Start().ok());
  std::vector<std::thread> stoppers;
  for (int i = 0; i < 3; ++i) stoppers.emplace_back([&] { engine_->Stop(); });
  for (std::thread& t : stoppers) t.join();
  EXPECT_EQ(done_.Snapshot().size(), 4u);
  engine_.reset();  // destructor after Stop
}


// ---- ChunkScheduler with a fake mover: the scheduling that CudaCopyEngine
// shares, exercised without a device. ----

// A mover that records each chunk and blocks in Move until the test lets it
// go (Release), so the test acts while a chunk is "on the link". It can fail
// one chosen chunk.
class GatedMover : public ChunkMover {
 public:
  struct Call {
    TransferId id;
    uint64_t offset;
    bool after_idle;
  };

  absl::StatusOr<int64_t> Move(const internal::Chunk& chunk,
                               bool after_idle) override {
    std::unique_lock<std::mutex> lock(mu_);
    calls_.push_back({chunk.id, chunk.offset, after_idle});
    cv_.notify_all();
    cv_.wait(lock, [&] { return released_ >= calls_.size(); });
    if (chunk.id == fail_id_ && chunk.offset == fail_offset_) {
      return absl::InternalError("fake DMA fault");
    }
    return static_cast<int64_t>(chunk.bytes);
  }
  // Blocks until Move has been entered `n` times in all.
  void WaitForCalls(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    EXPECT_TRUE(cv_.wait_for(lock, std::chrono::seconds(60),
                             [&] { return calls_.size() >= n; }));
  }
  void Release(size_t n = 1000000) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      released_ += n;
    }
    cv_.notify_all();
  }
  void FailAt(TransferId id, uint64_t offset) {
    std::lock_guard<std::mutex> lock(mu_);
    fail_id_ = id;
    fail_offset_ = offset;
  }
  std::vector<Call> calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Call> calls_;
  size_t released_ = 0;
  TransferId fail_id_ = kNoTransfer;
  uint64_t fail_offset_ = 0;
};

class ChunkSchedulerTest : public ::testing::Test {
 protected:
  ChunkSchedulerTest() {
    ChunkSchedulerOptions o;
    o.arena_bytes = 100000;
    o.chunk_bytes = 1000;
    o.mover = &mover_;
    engine_ = std::make_unique<ChunkScheduler>(o);
  }
  ~ChunkSchedulerTest() override {
    mover_.Release();
    engine_->Stop();
  }
  TransferId Submit(uint64_t bytes, uint64_t dst, TransferPriority p) {
    TransferRequest r;
    r.src = src_.data();
    r.bytes = bytes;
    r.dst_offset = dst;
    r.priority = p;
    auto id = engine_->Submit(r, done_.Callback());
    EXPECT_TRUE(id.ok()) << id.status();
    return id.value_or(kNoTransfer);
  }

  std::vector<uint8_t> src_ = std::vector<uint8_t>(10000, 1);
  GatedMover mover_;
  Completions done_;
  std::unique_ptr<ChunkScheduler> engine_;
};

TEST_F(ChunkSchedulerTest, RejectsMissingMoverAndBadRequests) {
  ChunkSchedulerOptions o;
  o.arena_bytes = 10;
  ChunkScheduler no_mover(o);
  EXPECT_EQ(no_mover.Start().code(), StatusCode::kInvalidArgument);
  TransferRequest r;
  r.src = src_.data();
  r.bytes = 5;
  EXPECT_EQ(no_mover.Submit(r, nullptr).status().code(),
            StatusCode::kInvalidArgument);
  r.dst_offset = 99999;
  r.bytes = 2;
  EXPECT_EQ(engine_->Submit(r, nullptr).status().code(),
            StatusCode::kInvalidArgument);
  ChunkScheduler failed_engine(o, absl::InvalidArgumentError("engine says no"));
  EXPECT_EQ(failed_engine.Start().message(), "engine says no");
}

TEST_F(ChunkSchedulerTest, PreemptPromoteAndCancelWhileChunkOnLink) {
  const TransferId p = Submit(3000, 0, kPrefetch);
  ASSERT_TRUE(engine_->Start().ok());
  mover_.WaitForCalls(1);  // P@0 on the link
  const TransferId d = Submit(2000, 10000, kDemand);
  const TransferId p2 = Submit(1000, 20000, kPrefetch);
  const TransferId p3 = Submit(2000, 30000, kPrefetch);
  ASSERT_TRUE(engine_->Promote(p2).ok());  // queued: joins the demand tail
  EXPECT_TRUE(done_.Snapshot().empty());   // nothing from Submit/Promote
  ASSERT_TRUE(engine_->Query(p)->on_link);
  mover_.Release(1);          // P@0 ends; D preempts P
  mover_.WaitForCalls(2);     // D@0 on the link
  ASSERT_TRUE(engine_->Cancel(d).ok());  // stops at this chunk's end
  EXPECT_TRUE(engine_->Query(d)->cancel_requested);
  ASSERT_TRUE(engine_->Cancel(p3).ok());  // queued: reported at once
  EXPECT_TRUE(done_.Snapshot().empty());  // never from inside Cancel
  mover_.Release();
  const std::vector<Done> done = done_.WaitFor(4);
  // D's chunk ends before the copy thread looks at queued cancellations.
  EXPECT_THAT(done, ElementsAre(Done{d, StatusCode::kCancelled},
                                Done{p3, StatusCode::kCancelled},
                                Done{p2, StatusCode::kOk},
                                Done{p, StatusCode::kOk}));
  std::vector<std::pair<TransferId, uint64_t>> order;
  for (const GatedMover::Call& c : mover_.calls()) {
    order.emplace_back(c.id, c.offset);
  }
  EXPECT_THAT(order, ElementsAre(std::pair{p, 0ul}, std::pair{d, 0ul},
                                 std::pair{p2, 0ul}, std::pair{p, 1000ul},
                                 std::pair{p, 2000ul}));
  const CopyStats st = engine_->GetStats();
  EXPECT_EQ(st.preemptions, 1u);
  EXPECT_EQ(st.promotions, 1u);
  EXPECT_EQ(st.transfers_cancelled, 2u);
  EXPECT_EQ(st.transfers_completed, 2u);
  EXPECT_EQ(st.bytes_moved, 5000u);
  EXPECT_EQ(st.busy_ns, 5000);  // the mover's reported link time, summed
}

TEST_F(ChunkSchedulerTest, MoverFailureEndsTransferWithItsErrorOnce) {
  mover_.FailAt(2, 1000);  // transfer 2's second (last) chunk
  const TransferId a = Submit(2000, 0, kDemand);
  const TransferId b = Submit(2000, 5000, kDemand);
  const TransferId c = Submit(1500, 9000, kPrefetch);
  ASSERT_EQ(b, 2u);
  ASSERT_TRUE(engine_->Start().ok());
  mover_.Release();
  const std::vector<Done> done = done_.WaitFor(3);
  EXPECT_THAT(done, ElementsAre(Done{a, StatusCode::kOk},
                                Done{b, StatusCode::kInternal},
                                Done{c, StatusCode::kOk}));
  const CopyStats st = engine_->GetStats();
  EXPECT_EQ(st.transfers_completed, 2u);
  EXPECT_EQ(st.transfers_cancelled, 1u);
  EXPECT_EQ(st.bytes_moved, 4500u);  // the failed chunk's bytes never arrived
  EXPECT_EQ(st.demand_bytes, 3000u);
  EXPECT_EQ(engine_->Query(b), std::nullopt);
}

TEST_F(ChunkSchedulerTest, AfterIdleMarksFirstChunkAfterTheLinkRanDry) {
  mover_.Release();
  Submit(2000, 0, kDemand);
  ASSERT_TRUE(engine_->Start().ok());
  done_.WaitFor(1);
  Submit(1000, 0, kDemand);
  done_.WaitFor(2);
  const std::vector<GatedMover::Call> calls = mover_.calls();
  ASSERT_EQ(calls.size(), 3u);
  EXPECT_TRUE(calls[0].after_idle);
  EXPECT_FALSE(calls[1].after_idle);  // back to back
  EXPECT_TRUE(calls[2].after_idle);   // the link was idle in between
}

}  // namespace
}  // namespace moe::cache
