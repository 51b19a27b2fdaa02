// Hint recall/precision over traces, and what replaying hints does in the
// simulator.
#include "services/cache/trace_stats.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "services/cache/policy.h"
#include "services/cache/simulator.h"
#include "services/cache/synth_trace.h"
#include "services/cache/trace.h"

namespace moe::trace {
namespace {

TraceHeader Header() {
  TraceHeader h;
  h.model = "hand";
  h.num_layers = 3;
  h.num_experts = 4;
  h.top_k = 2;
  return h;
}

// Two requests; only the first has hints, worked out by hand below.
Trace HandTrace() {
  Trace t;
  t.header = Header();
  TraceRequest a;
  a.id = "a";
  a.phase = {Phase::kPrefill, Phase::kDecode, Phase::kDecode};
  a.experts = {{{0, 1}, {2, 3}, {0, 2}},
               {{0, 1}, {1, 2}, {3, 0}},
               {{2, 3}, {0, 1}, {1, 2}}};
  a.hints = {{{}, {}, {}},
             // layer 1: routed {1,2}, hinted {1,3} (3 twice): 1 correct
             // layer 2: routed {3,0}, hinted {3,0,2,1}: 2 correct
             {{}, {1, 3, 3}, {3, 0, 2, 1}},
             // layer 1: routed {0,1}, hinted {0,1}: 2 correct
             // layer 2: routed {1,2}, hinted {3}: 0 correct
             {{}, {0, 1}, {3}}};
  TraceRequest b;
  b.id = "b";
  b.phase = {Phase::kDecode};
  b.experts = {{{0, 1}, {0, 1}, {0, 1}}};
  t.requests = {a, b};
  return t;
}

TEST(HintStatsTest, HandMadeTraceHasKnownRecallAndPrecision) {
  auto s = ComputeHintStats(HandTrace());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->hinted_pairs, 4);
  EXPECT_EQ(s->routed, 8);
  EXPECT_EQ(s->hinted, 2 + 4 + 2 + 1);
  EXPECT_EQ(s->correct, 1 + 2 + 2 + 0);
  EXPECT_DOUBLE_EQ(s->recall(), 5.0 / 8);
  EXPECT_DOUBLE_EQ(s->precision(), 5.0 / 9);
  EXPECT_EQ(s->requests_with_hints, 1);
  ASSERT_EQ(s->per_layer.size(), 3u);
  EXPECT_EQ(s->per_layer[0].hinted_pairs, 0);
  EXPECT_DOUBLE_EQ(s->per_layer[1].recall(), 3.0 / 4);
  EXPECT_DOUBLE_EQ(s->per_layer[2].recall(), 2.0 / 4);
  EXPECT_DOUBLE_EQ(s->per_layer[2].precision(), 2.0 / 5);

  nlohmann::json j = HintStatsJson(*s);
  EXPECT_DOUBLE_EQ(j["recall"].get<double>(), 5.0 / 8);
  EXPECT_DOUBLE_EQ(j["precision"].get<double>(), 5.0 / 9);
  EXPECT_TRUE(j["per_layer_recall"][0].is_null());
  EXPECT_DOUBLE_EQ(j["per_layer_recall"][2].get<double>(), 0.5);
}

TEST(HintStatsTest, NoHintsGivesZeroPairs) {
  Trace t = HandTrace();
  t.requests[0].hints.clear();
  auto s = ComputeHintStats(t);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->hinted_pairs, 0);
  EXPECT_EQ(s->requests_with_hints, 0);
  EXPECT_EQ(s->recall(), 0.0);
  EXPECT_EQ(s->precision(), 0.0);
}

TEST(HintStatsTest, MalformedHintsAreInvalidArgument) {
  Trace t = HandTrace();
  t.requests[0].hints.pop_back();  // not every token listed
  EXPECT_EQ(ComputeHintStats(t).status().code(),
            absl::StatusCode::kInvalidArgument);
  t = HandTrace();
  t.requests[0].hints[1][1] = {7};  // no such expert
  EXPECT_EQ(ComputeHintStats(t).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(HintStatsTest, SurvivesTheFileRoundTrip) {
  const std::string path = ::testing::TempDir() + "/hand_hints.jsonl";
  ASSERT_TRUE(WriteTraceFile(path, HandTrace()).ok());
  auto back = ReadTraceFile(path);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->requests[0].hints, HandTrace().requests[0].hints);
  auto s = ComputeHintStats(*back);
  ASSERT_TRUE(s.ok());
  EXPECT_DOUBLE_EQ(s->recall(), 5.0 / 8);
}

Trace PerfectHintTrace(double accuracy) {
  SynthOptions so;
  so.num_layers = 8;
  so.num_experts = 8;
  so.requests = 6;
  so.decode_tokens = 24;
  so.prefill_tokens = 8;
  so.hint_accuracy = accuracy;
  so.seed = 5;
  auto t = GenerateSyntheticTrace(so);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *t : Trace{};
}

TEST(HintStatsTest, SyntheticHintAccuracyIsRecall) {
  auto perfect = ComputeHintStats(PerfectHintTrace(1.0));
  ASSERT_TRUE(perfect.ok()) << perfect.status();
  ASSERT_GT(perfect->hinted_pairs, 0);
  EXPECT_DOUBLE_EQ(perfect->recall(), 1.0);
  auto half = ComputeHintStats(PerfectHintTrace(0.5));
  ASSERT_TRUE(half.ok()) << half.status();
  EXPECT_GT(half->recall(), 0.3);
  EXPECT_LT(half->recall(), 0.8);
}

// Replaying perfect hints (prefetch on) lets the link start a layer early:
// fewer decode stalls than the same trace without its hints.
TEST(SimulatorHintReplayTest, PerfectHintsCutDecodeStalls) {
  const Trace hinted = PerfectHintTrace(1.0);
  Trace plain = hinted;
  for (TraceRequest& r : plain.requests) r.hints.clear();
  for (const std::string& policy : {std::string("lru"), std::string("lfu")}) {
    cache::SimOptions o;
    o.capacity = 24;
    o.prefetch = true;
    auto with = cache::Simulate(hinted, policy, o);
    auto without = cache::Simulate(plain, policy, o);
    ASSERT_TRUE(with.ok()) << with.status();
    ASSERT_TRUE(without.ok()) << without.status();
    EXPECT_LT(with->decode.stall_ms, 0.9 * without->decode.stall_ms) << policy;
    EXPECT_GT(with->decode.prefetches_used, without->decode.prefetches_used)
        << policy;
  }
}

}  // namespace
}  // namespace moe::trace
