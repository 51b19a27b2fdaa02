// serving::Scheduler: admission (places, first come first served, queue
// full, a request that could never fit), the KV budget (a join waits for
// room), preemption (the youngest first, resumed before anything queued,
// its positions replayed), on the tiny model's real KV sizes. Nothing runs
// on the engine: sessions are made but never stepped, and Advance is fed
// the plan as if the step had run.
#include "services/serving/scheduler.h"

#include <memory>
#include <string>
#include <vector>

#include "common/model_maker.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "services/engine/in_memory_provider.h"
#include "services/serving/executor.h"
#include "services/serving/runner.h"
#include "tests/common/test_util.h"

namespace moe::serving {
namespace {

constexpr int kBlock = 4;  // positions per KV block

class SchedulerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MakeModelOptions o = TinyPreset(ModelFamily::kMixtral);
    o.seed = 11;
    ASSERT_TRUE(MakeModel(o, dir_.path()).ok());
    auto backend = CreateBackend("cpu");
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = std::move(*backend);
    auto model = MoeModel::Load(dir_.path(), backend_.get());
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(*model);
    auto provider = InMemoryExpertProvider::Create(*model_, std::nullopt);
    ASSERT_TRUE(provider.ok()) << provider.status();
    provider_ = std::move(*provider);
    executor_ = std::make_unique<Executor>(*model_, provider_.get(), kBlock);
  }

  static std::unique_ptr<Sequence> Seq(int prompt, int new_tokens) {
    auto s = std::make_unique<Sequence>();
    for (int i = 0; i < prompt; ++i) s->options.prompt.push_back(1 + i);
    s->options.max_new_tokens = new_tokens;
    return s;
  }

  // Admits, giving every started sequence a session.
  std::vector<uint64_t> Admit(Scheduler& s) {
    std::vector<uint64_t> started;
    s.Admit([&](Sequence& seq, bool) {
      EXPECT_TRUE(executor_->NewSession(seq, nullptr).ok());
      started.push_back(seq.options.request_id);
      return true;
    });
    return started;
  }

  static std::vector<uint64_t> Ids(const std::vector<std::unique_ptr<Sequence>>& v) {
    std::vector<uint64_t> out;
    for (const auto& s : v) out.push_back(s->options.request_id);
    return out;
  }

  // As if the step ran: positions advance, a sampled token is appended.
  static void Ran(Scheduler& s, const StepPlan& plan, int32_t token = 7) {
    for (const StepPlan::Entry& e : plan.entries) {
      if (s.Advance(e) == StepOutcome::kSample) e.sequence->Append(token);
    }
  }

  int64_t Blocks(int64_t positions, int64_t limit) const {
    return Session::KvBlockBytes(*model_, positions, kBlock, limit);
  }

  moe::testing::TempDir dir_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<MoeModel> model_;
  std::unique_ptr<InMemoryExpertProvider> provider_;
  std::unique_ptr<Executor> executor_;
};

// moe-worker's default batch: what the KV budget holds at 2048 positions
// per sequence (the context when shorter), 1 to 16; no budget given: 2 GiB,
// which becomes the budget. A given --max-batch is kept.
TEST(AutoBatchTest, ChosenFromTheKvBudget) {
  RunnerOptions o;
  o.max_batch = 0;
  // kjv-moe: 3072 B per token, 1024 positions: 3 MiB a sequence -> the cap.
  RunnerOptions r = ResolveAutoBatch(o, 3072, 1024);
  EXPECT_EQ(r.max_batch, kAutoMaxBatch);
  EXPECT_EQ(r.kv_budget_bytes, kAutoKvBudgetBytes);
  // Mixtral-8x7B, f32: 32 layers x 2 x 8 heads x 128 x 4 B = 256 KiB per
  // token, 512 MiB per 2048 positions: 4 in 2 GiB, 1 in 600 MiB, and never 0.
  r = ResolveAutoBatch(o, 256 << 10, 32768);
  EXPECT_EQ(r.max_batch, 4);
  o.kv_budget_bytes = int64_t{600} << 20;
  r = ResolveAutoBatch(o, 256 << 10, 32768);
  EXPECT_EQ(r.max_batch, 1);
  EXPECT_EQ(r.kv_budget_bytes, int64_t{600} << 20);
  o.kv_budget_bytes = 1;
  EXPECT_EQ(ResolveAutoBatch(o, 256 << 10, 32768).max_batch, 1);
  // Given: unchanged, budget included.
  RunnerOptions given;
  given.max_batch = 3;
  r = ResolveAutoBatch(given, 3072, 1024);
  EXPECT_EQ(r.max_batch, 3);
  EXPECT_EQ(r.kv_budget_bytes, 0);
}

TEST_F(SchedulerTest, NothingIsQueuedBeforeOpenOrAfterClose) {
  Scheduler s(*model_, SchedulerOptions{}, nullptr);
  EXPECT_EQ(s.Enqueue(Seq(2, 2)).code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(s.Open());
  EXPECT_FALSE(s.Open());
  ASSERT_TRUE(s.Enqueue(Seq(2, 2)).ok());
  EXPECT_EQ(s.Close().size(), 1u);
  EXPECT_EQ(s.Enqueue(Seq(2, 2)).code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(s.Open());
  EXPECT_EQ(s.TakeNext(), nullptr);  // closed with nothing left: no wait
}

TEST_F(SchedulerTest, AQueueFullIsRefusedAndUsesNoRequestId) {
  SchedulerOptions o;
  o.max_queue = 1;  // one running (max_batch 1) and one waiting
  Scheduler s(*model_, o, nullptr);
  ASSERT_TRUE(s.Open());
  ASSERT_TRUE(s.Enqueue(Seq(2, 2)).ok());
  ASSERT_TRUE(s.Enqueue(Seq(2, 2)).ok());
  EXPECT_EQ(s.Enqueue(Seq(2, 2)).code(), absl::StatusCode::kResourceExhausted);
  std::unique_ptr<Sequence> first = s.TakeNext();
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first->options.request_id, 1u);
  // One running, one waiting: still full.
  EXPECT_EQ(s.Enqueue(Seq(2, 2)).code(), absl::StatusCode::kResourceExhausted);
  s.FinishTaken();
  ASSERT_TRUE(s.Enqueue(Seq(2, 2)).ok());
  EXPECT_EQ(s.TakeNext()->options.request_id, 2u);
  s.FinishTaken();
  EXPECT_EQ(s.TakeNext()->options.request_id, 3u);  // the refused ones took no id
}

TEST_F(SchedulerTest, AdmitsFirstComeFirstServedUpToMaxBatch) {
  SchedulerOptions o;
  o.max_batch = 2;
  o.max_queue = 8;
  Scheduler s(*model_, o, nullptr);
  ASSERT_TRUE(s.Open());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(s.Enqueue(Seq(3, 4)).ok());
  EXPECT_EQ(Admit(s), (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(s.queued(), 1);
  const StepPlan plan = s.Plan();
  ASSERT_EQ(plan.entries.size(), 2u);
  EXPECT_TRUE(plan.entries[0].prefill);
  EXPECT_EQ(plan.entries[0].tokens.size(), 3u);  // the whole prompt
  EXPECT_TRUE(plan.preempted.empty());
  Ran(s, plan);
  s.Remove(s.running()[0].get());
  EXPECT_EQ(Admit(s), (std::vector<uint64_t>{3}));
  EXPECT_EQ(Ids(s.running()), (std::vector<uint64_t>{2, 3}));
}

TEST_F(SchedulerTest, PromptsRunInChunksThenDecodeTheLastToken) {
  SchedulerOptions o;
  o.max_batch = 2;
  o.prefill_chunk = 2;
  Scheduler s(*model_, o, nullptr);
  ASSERT_TRUE(s.Open());
  ASSERT_TRUE(s.Enqueue(Seq(5, 4)).ok());
  Admit(s);
  std::vector<size_t> sizes;
  std::vector<StepOutcome> outcomes;
  for (int step = 0; step < 4; ++step) {
    const StepPlan plan = s.Plan();
    ASSERT_EQ(plan.entries.size(), 1u);
    sizes.push_back(plan.entries[0].tokens.size());
    const StepOutcome out = s.Advance(plan.entries[0]);
    outcomes.push_back(out);
    if (out == StepOutcome::kSample) plan.entries[0].sequence->Append(9);
  }
  EXPECT_EQ(sizes, (std::vector<size_t>{2, 2, 1, 1}));
  EXPECT_EQ(outcomes, (std::vector<StepOutcome>{StepOutcome::kPrefilling,
                                                StepOutcome::kPrefilling, StepOutcome::kSample,
                                                StepOutcome::kSample}));
  EXPECT_EQ(s.running()[0]->output, (std::vector<int32_t>{9, 9}));
}

TEST_F(SchedulerTest, AJoinWaitsForKvRoomAndANeverFitIsRefused) {
  // Room for one sequence's first blocks plus headroom, not two.
  const int64_t first = Blocks(3 + 1, 3 + 5);
  const int64_t block = Session::KvCacheBytes(*model_, kBlock);
  SchedulerOptions o;
  o.max_batch = 4;
  o.kv_block_tokens = kBlock;
  o.kv_budget_bytes = first + block + first / 2;
  Scheduler s(*model_, o, nullptr);
  ASSERT_TRUE(s.Open());
  EXPECT_EQ(s.Enqueue(Seq(3, 1000)).code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(s.Enqueue(Seq(3, 5)).ok());  // two blocks at most
  ASSERT_TRUE(s.Enqueue(Seq(3, 5)).ok());
  EXPECT_EQ(Admit(s).size(), 1u);  // the second waits at the head
  EXPECT_EQ(s.queued(), 1);
  Ran(s, s.Plan());
  EXPECT_EQ(Admit(s).size(), 0u);
  s.Remove(s.running()[0].get());  // frees its blocks
  EXPECT_EQ(Admit(s).size(), 1u);
}

TEST_F(SchedulerTest, TheYoungestIsPreemptedAndResumesFirstWithItsPositions) {
  SchedulerOptions o;
  o.max_batch = 3;
  o.kv_block_tokens = kBlock;
  o.max_queue = 8;
  // Three sequences of prompt 3 fit their first block each; the step that
  // needs a second block for all three does not fit.
  const int64_t one = Blocks(kBlock, 3 + 8);
  // Three join (a first block each plus a block of headroom each); three
  // sequences at 3 blocks do not fit (at position 9).
  o.kv_budget_bytes = 6 * one;
  Scheduler s(*model_, o, nullptr);
  ASSERT_TRUE(s.Open());
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(s.Enqueue(Seq(3, 8)).ok());
  ASSERT_TRUE(s.Enqueue(Seq(3, 8)).ok());  // a fourth, queued behind
  EXPECT_EQ(Admit(s), (std::vector<uint64_t>{1, 2, 3}));  // max_batch: the fourth waits
  EXPECT_EQ(s.queued(), 1);
  StepPlan plan;
  for (int step = 0; step < 12 && plan.preempted.empty(); ++step) {
    plan = s.Plan();
    Ran(s, plan, static_cast<int32_t>(20 + step));
  }
  ASSERT_FALSE(plan.preempted.empty());
  const Sequence* young = plan.preempted[0];
  EXPECT_EQ(young->options.request_id, 3u);  // the youngest gave its blocks up
  EXPECT_EQ(young->session, nullptr);
  EXPECT_EQ(young->kv_bytes, 0);
  ASSERT_EQ(s.preempted().size(), 1u);
  ASSERT_FALSE(young->output.empty());
  // It replays its prompt and every token but the last.
  std::vector<int32_t> replay = young->options.prompt;
  replay.insert(replay.end(), young->output.begin(), young->output.end() - 1);
  EXPECT_EQ(young->replay, replay);
  EXPECT_EQ(young->fed, 0u);
  // Nothing queued overtakes it: once there is room it comes back first.
  s.Remove(s.running()[0].get());
  s.Remove(s.running()[0].get());
  EXPECT_EQ(Admit(s).front(), 3u);
  const StepPlan again = s.Plan();
  ASSERT_FALSE(again.entries.empty());
  EXPECT_EQ(again.entries[0].sequence->options.request_id, 3u);
  EXPECT_TRUE(again.entries[0].prefill);
  EXPECT_EQ(again.entries[0].tokens.size(), replay.size());
  EXPECT_EQ(s.Advance(again.entries[0]), StepOutcome::kResumed);
}

}  // namespace
}  // namespace moe::serving
