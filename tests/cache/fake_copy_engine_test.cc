#include "services/cache/fake_copy_engine.h"

#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace moe::cache {
namespace {

using ::absl::StatusCode;
using ::testing::ElementsAre;

constexpr TransferPriority kDemand = TransferPriority::kDemand;
constexpr TransferPriority kPrefetch = TransferPriority::kPrefetch;

struct Event {
  TransferId id;
  int64_t t_ns;
  StatusCode code;
  bool operator==(const Event& o) const {
    return id == o.id && t_ns == o.t_ns && code == o.code;
  }
};

std::ostream& operator<<(std::ostream& os, const Event& e) {
  return os << "{id=" << e.id << " t=" << e.t_ns << " "
            << absl::StatusCodeToString(e.code) << "}";
}

// 1 byte/ns, 100-byte chunks unless told otherwise.
class FakeCopyEngineTest : public ::testing::Test {
 protected:
  void Make(int64_t latency_ns = 0, uint64_t chunk = 100,
            uint64_t bandwidth = 1'000'000'000) {
    FakeCopyEngineOptions o;
    o.bandwidth_bytes_per_sec = bandwidth;
    o.chunk_bytes = chunk;
    o.latency_ns = latency_ns;
    o.clock = &clock_;
    auto e = FakeCopyEngine::Create(o);
    ASSERT_TRUE(e.ok()) << e.status();
    engine_ = std::move(*e);
  }

  TransferId Submit(uint64_t bytes, TransferPriority p) {
    TransferRequest r;
    r.bytes = bytes;
    r.priority = p;
    auto id = engine_->Submit(r, [this](TransferId id, absl::Status s) {
      // The attached clock must show the event time inside the callback.
      EXPECT_EQ(clock_.NowNanos(), engine_->now_ns());
      events_.push_back({id, engine_->now_ns(), s.code()});
    });
    EXPECT_TRUE(id.ok()) << id.status();
    return *id;
  }

  ManualClock clock_;
  std::unique_ptr<FakeCopyEngine> engine_;
  std::vector<Event> events_;
};

TEST(LinkNanosTest, ExactRoundedUp) {
  EXPECT_EQ(LinkNanos(100, 1'000'000'000), 100);
  EXPECT_EQ(LinkNanos(1, 3), 333'333'334);  // 333333333.33 rounded up
  EXPECT_EQ(LinkNanos(3, 3), 1'000'000'000);
  // Mixtral-size expert over a 25 GB/s link: 13.44 ms.
  EXPECT_EQ(LinkNanos(336'000'000, 25'000'000'000), 13'440'000);
  // No overflow for a 1 TB transfer at 1 B/s... in 128-bit arithmetic.
  EXPECT_EQ(LinkNanos(1'000'000'000'000, 1'000'000), 1'000'000'000'000'000);
}

TEST_F(FakeCopyEngineTest, CreateRejectsBadOptions) {
  FakeCopyEngineOptions o;
  o.chunk_bytes = 100;
  EXPECT_EQ(FakeCopyEngine::Create(o).status().code(),
            StatusCode::kInvalidArgument);
  o.bandwidth_bytes_per_sec = 1;
  o.chunk_bytes = 0;
  EXPECT_EQ(FakeCopyEngine::Create(o).status().code(),
            StatusCode::kInvalidArgument);
  o.chunk_bytes = 1;
  o.latency_ns = -1;
  EXPECT_EQ(FakeCopyEngine::Create(o).status().code(),
            StatusCode::kInvalidArgument);
  Make();
  TransferRequest empty;
  EXPECT_EQ(engine_->Submit(empty, nullptr).status().code(),
            StatusCode::kInvalidArgument);
}

TEST_F(FakeCopyEngineTest, TransferNanosSumsChunks) {
  Make(/*latency_ns=*/7, /*chunk=*/16'000'000, /*bandwidth=*/25'000'000'000);
  // 21 chunks of 16 MB at 640 us each, plus latency once.
  EXPECT_EQ(engine_->TransferNanos(336'000'000), 13'440'007);
  // A partial last chunk: 2 x 640 us + 40 us.
  EXPECT_EQ(engine_->TransferNanos(33'000'000), 1'320'007);
}

// The header's example.
TEST_F(FakeCopyEngineTest, DemandPreemptsPrefetchAtChunkBoundary) {
  Make();
  const TransferId p = Submit(300, kPrefetch);
  engine_->AdvanceTo(150);
  const TransferId d = Submit(100, kDemand);
  EXPECT_EQ(engine_->NextCompletionTime(), 300);
  engine_->AdvanceTo(1000);
  EXPECT_THAT(events_, ElementsAre(Event{d, 300, StatusCode::kOk},
                                   Event{p, 400, StatusCode::kOk}));
  const CopyStats st = engine_->GetStats();
  EXPECT_EQ(st.preemptions, 1u);
  EXPECT_EQ(st.bytes_moved, 400u);
  EXPECT_EQ(st.demand_bytes, 100u);
  EXPECT_EQ(st.prefetch_bytes, 300u);
  EXPECT_EQ(st.transfers_completed, 2u);
  EXPECT_EQ(st.busy_ns, 400);
  EXPECT_EQ(engine_->now_ns(), 1000);
  EXPECT_EQ(clock_.NowNanos(), 1000);
}

// Three transfers, hand-computed, with and without per-transfer latency.
//   P1 400 B prefetch, P2 200 B prefetch at t=0; D 150 B demand at t=250.
// No latency: P1 [0,300) in 3 chunks; D [300,450); P1 [450,550); P2 [550,750).
TEST_F(FakeCopyEngineTest, ThreeTransfersExactTimes) {
  Make();
  const TransferId p1 = Submit(400, kPrefetch);
  const TransferId p2 = Submit(200, kPrefetch);
  EXPECT_EQ(engine_->NextCompletionTime(), 400);
  engine_->AdvanceTo(250);
  EXPECT_TRUE(events_.empty());
  const TransferId d = Submit(150, kDemand);
  EXPECT_EQ(engine_->NextCompletionTime(), 450);
  ASSERT_EQ(engine_->RunUntilDone(d).value(), 450);
  EXPECT_EQ(engine_->NextCompletionTime(), 550);
  EXPECT_EQ(engine_->RunUntilIdle(), 750);
  EXPECT_THAT(events_, ElementsAre(Event{d, 450, StatusCode::kOk},
                                   Event{p1, 550, StatusCode::kOk},
                                   Event{p2, 750, StatusCode::kOk}));
  EXPECT_EQ(engine_->NextCompletionTime(), std::nullopt);
}

// Latency 10 ns, paid once per transfer (not on resume):
//   P1 [0,110) [110,210) [210,310); D [310,420) [420,470);
//   P1 resumes [470,570); P2 [570,680) [680,780).
TEST_F(FakeCopyEngineTest, ThreeTransfersWithLatency) {
  Make(/*latency_ns=*/10);
  const TransferId p1 = Submit(400, kPrefetch);
  const TransferId p2 = Submit(200, kPrefetch);
  EXPECT_EQ(engine_->NextCompletionTime(), 410);
  engine_->AdvanceTo(250);
  const TransferId d = Submit(150, kDemand);
  EXPECT_EQ(engine_->NextCompletionTime(), 470);
  engine_->AdvanceTo(10'000);
  EXPECT_THAT(events_, ElementsAre(Event{d, 470, StatusCode::kOk},
                                   Event{p1, 570, StatusCode::kOk},
                                   Event{p2, 780, StatusCode::kOk}));
  EXPECT_EQ(engine_->GetStats().busy_ns, 780);
}

TEST_F(FakeCopyEngineTest, DemandRunsBeforeQueuedPrefetchesFifo) {
  Make();
  const TransferId p1 = Submit(100, kPrefetch);
  const TransferId d1 = Submit(100, kDemand);
  const TransferId p2 = Submit(100, kPrefetch);
  const TransferId d2 = Submit(50, kDemand);
  engine_->RunUntilIdle();
  EXPECT_THAT(events_, ElementsAre(Event{d1, 100, StatusCode::kOk},
                                   Event{d2, 150, StatusCode::kOk},
                                   Event{p1, 250, StatusCode::kOk},
                                   Event{p2, 350, StatusCode::kOk}));
  EXPECT_EQ(engine_->GetStats().preemptions, 0u);
}

TEST_F(FakeCopyEngineTest, DemandDoesNotPreemptDemand) {
  Make();
  const TransferId d1 = Submit(300, kDemand);
  engine_->AdvanceTo(50);
  const TransferId d2 = Submit(100, kDemand);
  engine_->RunUntilIdle();
  EXPECT_THAT(events_, ElementsAre(Event{d1, 300, StatusCode::kOk},
                                   Event{d2, 400, StatusCode::kOk}));
}

// Work submitted at time t competes for the chunk starting at t.
TEST_F(FakeCopyEngineTest, DecisionAtBoundarySeesWorkSubmittedThen) {
  Make();
  const TransferId p = Submit(200, kPrefetch);
  engine_->AdvanceTo(100);  // exactly at P's first chunk boundary
  const TransferId d = Submit(100, kDemand);
  engine_->RunUntilIdle();
  EXPECT_THAT(events_, ElementsAre(Event{d, 200, StatusCode::kOk},
                                   Event{p, 300, StatusCode::kOk}));
  EXPECT_EQ(engine_->GetStats().preemptions, 1u);
}

TEST_F(FakeCopyEngineTest, PromoteQueuedPrefetchJoinsDemandQueue) {
  Make();
  const TransferId p1 = Submit(300, kPrefetch);
  const TransferId p2 = Submit(300, kPrefetch);
  const TransferId d = Submit(100, kDemand);
  engine_->AdvanceTo(150);  // D done at 100; P1 chunk [100,200) on the link
  ASSERT_TRUE(engine_->Promote(p2).ok());
  EXPECT_EQ(engine_->Query(p2)->priority, kDemand);
  EXPECT_EQ(engine_->NextCompletionTime(), 500);
  engine_->RunUntilIdle();
  // P2 preempts P1 at 200 and runs [200,500); P1 resumes [500,700).
  EXPECT_THAT(events_, ElementsAre(Event{d, 100, StatusCode::kOk},
                                   Event{p2, 500, StatusCode::kOk},
                                   Event{p1, 700, StatusCode::kOk}));
  EXPECT_EQ(engine_->GetStats().promotions, 1u);
  EXPECT_EQ(engine_->GetStats().preemptions, 1u);
  EXPECT_EQ(engine_->Promote(p2).code(), StatusCode::kNotFound);
}

TEST_F(FakeCopyEngineTest, PromotedInFlightPrefetchIsNotPreempted) {
  Make();
  const TransferId p = Submit(300, kPrefetch);
  engine_->AdvanceTo(50);
  ASSERT_TRUE(engine_->Promote(p).ok());
  ASSERT_TRUE(engine_->Promote(p).ok());  // already demand: no-op
  const TransferId d = Submit(100, kDemand);
  engine_->RunUntilIdle();
  EXPECT_THAT(events_, ElementsAre(Event{p, 300, StatusCode::kOk},
                                   Event{d, 400, StatusCode::kOk}));
  EXPECT_EQ(engine_->GetStats().promotions, 1u);
  EXPECT_EQ(engine_->GetStats().preemptions, 0u);
  EXPECT_EQ(engine_->GetStats().demand_bytes, 300u);  // 2 chunks of P + D
  EXPECT_EQ(engine_->GetStats().prefetch_bytes, 100u);
}

TEST_F(FakeCopyEngineTest, CancelQueuedReportsAtCancelTime) {
  Make();
  const TransferId p1 = Submit(300, kPrefetch);
  const TransferId p2 = Submit(300, kPrefetch);
  engine_->AdvanceTo(50);
  ASSERT_TRUE(engine_->Cancel(p2).ok());
  EXPECT_TRUE(events_.empty());  // never from inside Cancel
  EXPECT_TRUE(engine_->IsPending(p2));
  EXPECT_FALSE(engine_->Query(p2).has_value());
  EXPECT_EQ(engine_->NextCompletionTime(), 50);
  engine_->RunUntilIdle();
  EXPECT_THAT(events_, ElementsAre(Event{p2, 50, StatusCode::kCancelled},
                                   Event{p1, 300, StatusCode::kOk}));
  EXPECT_EQ(engine_->Cancel(p2).code(), StatusCode::kNotFound);
  EXPECT_EQ(engine_->GetStats().transfers_cancelled, 1u);
  EXPECT_EQ(engine_->GetStats().bytes_moved, 300u);
}

TEST_F(FakeCopyEngineTest, CancelInFlightStopsAtChunkEnd) {
  Make();
  const TransferId p = Submit(300, kPrefetch);
  engine_->AdvanceTo(150);
  ASSERT_TRUE(engine_->Cancel(p).ok());
  ASSERT_TRUE(engine_->Cancel(p).ok());  // idempotent while cancelling
  const std::optional<TransferInfo> info = engine_->Query(p);
  ASSERT_TRUE(info.has_value());
  EXPECT_TRUE(info->cancel_requested);
  EXPECT_TRUE(info->on_link);
  EXPECT_EQ(info->bytes_done, 100u);
  EXPECT_EQ(engine_->Promote(p).code(), StatusCode::kFailedPrecondition);
  const TransferId d = Submit(100, kDemand);
  EXPECT_EQ(engine_->NextCompletionTime(), 200);
  engine_->RunUntilIdle();
  EXPECT_THAT(events_, ElementsAre(Event{p, 200, StatusCode::kCancelled},
                                   Event{d, 300, StatusCode::kOk}));
  EXPECT_EQ(engine_->GetStats().bytes_moved, 300u);
  EXPECT_EQ(engine_->GetStats().transfers_cancelled, 1u);
}

TEST_F(FakeCopyEngineTest, CancelPreemptedPrefetchIsImmediate) {
  Make();
  const TransferId p = Submit(300, kPrefetch);
  engine_->AdvanceTo(50);
  const TransferId d = Submit(200, kDemand);
  engine_->AdvanceTo(150);  // D on the link [100,300); P preempted at 100
  EXPECT_FALSE(engine_->Query(p)->on_link);
  EXPECT_EQ(engine_->Query(p)->bytes_done, 100u);
  ASSERT_TRUE(engine_->Cancel(p).ok());
  engine_->RunUntilIdle();
  EXPECT_THAT(events_, ElementsAre(Event{p, 150, StatusCode::kCancelled},
                                   Event{d, 300, StatusCode::kOk}));
}

TEST_F(FakeCopyEngineTest, CallbacksMaySubmitAndNewWorkStartsThen) {
  Make();
  std::vector<Event> chained;
  TransferRequest r;
  r.bytes = 100;
  TransferId second = kNoTransfer;
  auto first = engine_->Submit(r, [&](TransferId, absl::Status s) {
    ASSERT_TRUE(s.ok());
    auto id = engine_->Submit(r, [&](TransferId id, absl::Status s2) {
      chained.push_back({id, engine_->now_ns(), s2.code()});
    });
    ASSERT_TRUE(id.ok());
    second = *id;
  });
  ASSERT_TRUE(first.ok());
  engine_->AdvanceTo(150);
  ASSERT_NE(second, kNoTransfer);
  EXPECT_EQ(engine_->Query(second)->bytes_done, 0u);
  engine_->AdvanceTo(199);
  EXPECT_TRUE(chained.empty());
  engine_->AdvanceTo(200);
  EXPECT_THAT(chained, ElementsAre(Event{second, 200, StatusCode::kOk}));
}

TEST_F(FakeCopyEngineTest, RunUntilDoneErrorsAndPartialProgress) {
  Make();
  EXPECT_EQ(engine_->RunUntilDone(42).status().code(), StatusCode::kNotFound);
  const TransferId a = Submit(250, kDemand);
  const TransferId b = Submit(100, kDemand);
  ASSERT_EQ(engine_->RunUntilDone(b).value(), 350);
  EXPECT_THAT(events_, ElementsAre(Event{a, 250, StatusCode::kOk},
                                   Event{b, 350, StatusCode::kOk}));
  EXPECT_EQ(engine_->RunUntilDone(a).status().code(), StatusCode::kNotFound);
}

// Property: NextCompletionTime() predicts the next callback exactly, under a
// random mix of submissions, promotions and cancellations.
TEST_F(FakeCopyEngineTest, RandomOpsNextCompletionTimeIsExact) {
  Make(/*latency_ns=*/3, /*chunk=*/64, /*bandwidth=*/3'000'000'000);
  std::mt19937 rng(99);
  std::vector<TransferId> ids;
  for (int step = 0; step < 3000; ++step) {
    const int op = rng() % 6;
    if (op <= 1) {
      ids.push_back(Submit(1 + rng() % 500, op == 0 ? kDemand : kPrefetch));
    } else if (op == 2 && !ids.empty()) {
      (void)engine_->Promote(ids[rng() % ids.size()]);
    } else if (op == 3 && !ids.empty() && rng() % 3 == 0) {
      (void)engine_->Cancel(ids[rng() % ids.size()]);
    } else {
      const std::optional<int64_t> next = engine_->NextCompletionTime();
      const size_t before = events_.size();
      if (!next.has_value()) {
        engine_->AdvanceTo(engine_->now_ns() + 1 + rng() % 100);
        EXPECT_EQ(events_.size(), before);
        continue;
      }
      ASSERT_GE(*next, engine_->now_ns());
      if (*next > engine_->now_ns()) {
        engine_->AdvanceTo(*next - 1);
        ASSERT_EQ(events_.size(), before) << "completion before prediction";
      }
      engine_->AdvanceTo(*next);
      ASSERT_GT(events_.size(), before) << "no completion at " << *next;
      EXPECT_EQ(events_[before].t_ns, *next);
    }
  }
  engine_->RunUntilIdle();
  const CopyStats st = engine_->GetStats();
  EXPECT_EQ(st.transfers_completed + st.transfers_cancelled, ids.size());
  EXPECT_EQ(events_.size(), ids.size());
  EXPECT_EQ(st.demand_bytes + st.prefetch_bytes, st.bytes_moved);
  // Each on_done exactly once.
  std::vector<TransferId> seen;
  for (const Event& e : events_) seen.push_back(e.id);
  std::sort(seen.begin(), seen.end());
  EXPECT_TRUE(std::adjacent_find(seen.begin(), seen.end()) == seen.end());
}

}  // namespace
}  // namespace moe::cache
