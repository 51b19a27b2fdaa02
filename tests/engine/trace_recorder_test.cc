// TraceRecorder: live routing -> moe-trace/1, read back with the trace reader.
#include "services/engine/trace_recorder.h"

#include <algorithm>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model_maker.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "services/cache/trace.h"
#include "services/engine/generator.h"
#include "services/engine/in_memory_provider.h"

namespace moe {

// Readable test names in ctest output.
void PrintTo(ModelFamily family, std::ostream* os) {
  *os << ModelFamilyName(family);
}

namespace {

using ::testing::HasSubstr;

// What the observer saw, per call.
struct Call {
  int moe_layer;
  int64_t tokens;
  std::vector<int32_t> experts;
  std::vector<float> weights;
};

struct Loaded {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<MoeModel> model;
  std::unique_ptr<InMemoryExpertProvider> experts;
};

Loaded LoadModel(MakeModelOptions o, const std::string& name) {
  Loaded l;
  o.seed = 21;
  const std::string dir = absl::StrCat(::testing::TempDir(), "/trace_", name);
  absl::Status made = MakeModel(o, dir);
  EXPECT_TRUE(made.ok()) << made;
  auto backend = CreateBackend("cpu");
  EXPECT_TRUE(backend.ok()) << backend.status();
  l.backend = std::move(*backend);
  auto model = MoeModel::Load(dir, l.backend.get());
  EXPECT_TRUE(model.ok()) << model.status();
  l.model = std::move(*model);
  auto experts = InMemoryExpertProvider::Create(*l.model);
  EXPECT_TRUE(experts.ok()) << experts.status();
  l.experts = std::move(*experts);
  return l;
}

Loaded LoadTiny(ModelFamily family, const std::string& name) {
  return LoadModel(TinyPreset(family), name);
}

class TraceRecorderGenerateTest : public ::testing::TestWithParam<ModelFamily> {
};

TEST_P(TraceRecorderGenerateTest, RecordsObserverRoutingAsTrace) {
  const ModelFamily family = GetParam();
  const std::string name(ModelFamilyName(family));
  Loaded l = LoadTiny(family, name);
  ASSERT_NE(l.model, nullptr);
  const ModelConfig& c = l.model->config();
  const int L = c.num_moe_layers();
  const int k = static_cast<int>(c.top_k);
  // DeepSeek's dense first layer is not a trace layer.
  if (c.is_mla()) {
    EXPECT_EQ(L, c.num_hidden_layers - 1);
  }

  const std::string path =
      absl::StrCat(::testing::TempDir(), "/rec_", name, ".jsonl");
  auto recorder = TraceRecorder::Open(path, TraceHeaderFor(*l.model, name));
  ASSERT_TRUE(recorder.ok()) << recorder.status();

  GenerateOptions opts;
  opts.prompt = {5, 9, 200, 31, 77};
  opts.max_new_tokens = 6;
  opts.stop_at_eos = false;
  RequestRecording rec((*recorder)->header(), "req-a");
  std::vector<Call> calls;
  RoutingObserver record = rec.Observer();
  auto both = [&](int layer, int64_t t, absl::Span<const int32_t> e,
                  absl::Span<const float> w) {
    calls.push_back({layer, t, {e.begin(), e.end()}, {w.begin(), w.end()}});
    record(layer, t, e, w);
  };
  int generated = 0;
  auto summary = Generate(
      *l.model, l.experts.get(), opts,
      [&](const SampledToken&) { return ++generated > 0; }, both);
  ASSERT_TRUE(summary.ok()) << summary.status();
  ASSERT_EQ(summary->generated_tokens, 6);
  EXPECT_EQ(rec.iterations(), 6);  // prefill + 5 decode steps
  ASSERT_TRUE((*recorder)->Append(rec).ok());
  ASSERT_TRUE((*recorder)->Close().ok());

  auto trace = trace::ReadTraceFile(path);
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_EQ(trace->header.model, name);
  EXPECT_EQ(trace->header.num_layers, L);
  EXPECT_EQ(trace->header.num_experts, c.num_experts);
  EXPECT_EQ(trace->header.top_k, k);
  // One routed expert's weights: gate, up [inter, hidden], down [hidden,
  // inter], and GPT-OSS's biases (2 x inter for gate/up, hidden for down).
  const int64_t h = c.hidden_size, i = c.moe_intermediate_size;
  EXPECT_EQ(trace->header.expert_params,
            3 * h * i + (c.has_expert_biases() ? 2 * i + h : 0));
  ASSERT_EQ(trace->requests.size(), 1u);
  const trace::TraceRequest& r = trace->requests[0];
  EXPECT_EQ(r.id, "req-a");
  // The last sampled token never goes through the model.
  const int tokens = 5 + 6 - 1;
  ASSERT_EQ(r.num_tokens(), tokens);
  EXPECT_EQ(r.num_prefill_tokens(), 5);
  ASSERT_EQ(r.experts.size(), static_cast<size_t>(tokens));
  ASSERT_EQ(r.weights.size(), static_cast<size_t>(tokens));

  // Replay the observer's calls against the trace: iteration i starts at
  // layer 0; its tokens are the next `tokens` rows.
  ASSERT_EQ(calls.size(), static_cast<size_t>(6 * L));
  int row = 0;
  for (size_t i = 0; i < calls.size(); ++i) {
    const Call& call = calls[i];
    ASSERT_EQ(call.moe_layer, static_cast<int>(i % L));
    if (call.moe_layer == 0 && i > 0)
      row += static_cast<int>(calls[i - 1].tokens);
    for (int64_t t = 0; t < call.tokens; ++t) {
      const auto& ids = r.experts[row + t][call.moe_layer];
      const auto& ws = r.weights[row + t][call.moe_layer];
      std::vector<int32_t> want(call.experts.begin() + t * k,
                                call.experts.begin() + (t + 1) * k);
      EXPECT_EQ(ids, want) << "token " << row + t << " layer "
                           << call.moe_layer;
      ASSERT_EQ(ws.size(), static_cast<size_t>(k));
      for (int j = 0; j < k; ++j) {
        EXPECT_NEAR(ws[j], call.weights[t * k + j], 1e-6);
      }
    }
  }
  EXPECT_EQ(row + calls.back().tokens, tokens);
}

INSTANTIATE_TEST_SUITE_P(Families, TraceRecorderGenerateTest,
                         ::testing::Values(ModelFamily::kMixtral,
                                           ModelFamily::kQwen3Moe,
                                           ModelFamily::kDeepseekV2,
                                           ModelFamily::kDeepseekV3),
                         [](const auto& info) {
                           return std::string(ModelFamilyName(info.param));
                         });

// Forwards to an InMemoryExpertProvider and keeps every Hint call.
class HintSpy : public ExpertProvider {
 public:
  explicit HintSpy(ExpertProvider* inner) : inner_(inner) {}
  absl::Status BeginRequest(uint64_t id) override {
    return inner_->BeginRequest(id);
  }
  absl::Status EndRequest(uint64_t id) override {
    return inner_->EndRequest(id);
  }
  absl::StatusOr<AcquiredExperts> Acquire(int moe_layer,
                                      absl::Span<const ExpertDemand> demands,
                                      bool prefill) override {
    return inner_->Acquire(moe_layer, demands, prefill);
  }
  void Release(AcquiredExperts& lease) override { inner_->Release(lease); }
  void Hint(absl::Span<const ExpertHint> hints) override {
    calls.emplace_back(hints.begin(), hints.end());
  }

  std::vector<std::vector<ExpertHint>> calls;

 private:
  ExpertProvider* inner_;
};

struct HintRun {
  trace::TraceRequest request;  // read back from the recorded file
  // What the provider was hinted, per [token][moe layer] (the hints for a
  // layer belong to the iteration whose routing of that layer follows them).
  trace::TokenLayerLists<int32_t> hinted;
  size_t hint_calls = 0;
};

// Generates 3 prompt + 5 new tokens with pre-gating `pregate` at `distance`,
// recording both the trace and the provider's Hint calls.
void RunWithHints(Loaded& l, const std::string& name, bool pregate,
                  HintRun* out, int distance = 1) {
  const int L = l.model->config().num_moe_layers();
  const std::string path = absl::StrCat(::testing::TempDir(), "/hints_", name,
                                        pregate, "_", distance, ".jsonl");
  auto recorder = TraceRecorder::Open(path, TraceHeaderFor(*l.model, name));
  ASSERT_TRUE(recorder.ok()) << recorder.status();
  HintSpy spy(l.experts.get());
  RequestRecording rec((*recorder)->header(), "h");
  RoutingObserver record = rec.Observer();
  size_t seen_calls = 0;
  int64_t next_row = 0;  // first token of the current iteration
  int64_t iter_tokens = 0;
  std::vector<std::vector<int32_t>> given(L);  // per layer, not yet routed
  auto routing = [&](int layer, int64_t t, absl::Span<const int32_t> e,
                     absl::Span<const float> w) {
    if (layer == 0) {
      next_row += iter_tokens;
      iter_tokens = t;
      for (int64_t i = 0; i < t; ++i) out->hinted.emplace_back(L);
    }
    // Hints given since the last routing call are for this layer or, at a
    // larger distance, a later one of this iteration.
    for (; seen_calls < spy.calls.size(); ++seen_calls) {
      for (const ExpertHint& h : spy.calls[seen_calls]) {
        ASSERT_GE(h.layer, layer);
        given[h.layer].push_back(h.expert);
      }
    }
    out->hinted[next_row + t - 1][layer] = std::move(given[layer]);
    given[layer].clear();
    record(layer, t, e, w);
  };
  RoutingObserver both(routing, [&](absl::Span<const ExpertHint> h) {
    record.Hints(h);
  });
  GenerateOptions opts;
  opts.prompt = {5, 9, 200};
  opts.max_new_tokens = 6;
  opts.stop_at_eos = false;
  opts.pregate_hints = pregate;
  opts.pregate_distance = distance;
  auto summary =
      Generate(*l.model, &spy, opts, [](const SampledToken&) { return true; },
               both);
  ASSERT_TRUE(summary.ok()) << summary.status();
  ASSERT_TRUE((*recorder)->Append(rec).ok());
  ASSERT_TRUE((*recorder)->Close().ok());
  auto trace = trace::ReadTraceFile(path);
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_EQ(trace->requests.size(), 1u);
  out->request = trace->requests[0];
  out->hint_calls = spy.calls.size();
}

TEST_P(TraceRecorderGenerateTest, RecordsPregateHintsAsGiven) {
  const ModelFamily family = GetParam();
  const std::string name(ModelFamilyName(family));
  Loaded l = LoadTiny(family, absl::StrCat(name, "_hints"));
  ASSERT_NE(l.model, nullptr);
  const int L = l.model->config().num_moe_layers();
  const int k = static_cast<int>(l.model->config().top_k);

  HintRun on;
  RunWithHints(l, name, /*pregate=*/true, &on);
  const trace::TraceRequest& r = on.request;
  const int tokens = 3 + 6 - 1;
  ASSERT_EQ(r.num_tokens(), tokens);
  // Every decode iteration hints each MoE layer after the first decoder
  // layer (all but the first MoE layer; all of them for DeepSeek, whose
  // first layer is dense).
  const ModelConfig& c = l.model->config();
  int hinted_layers = 0;
  for (int m = 0; m < L; ++m) hinted_layers += c.LayerOfMoeLayer(m) > 0;
  EXPECT_EQ(on.hint_calls, static_cast<size_t>(5 * hinted_layers));
  ASSERT_EQ(r.hints.size(), static_cast<size_t>(tokens));
  ASSERT_EQ(on.hinted.size(), static_cast<size_t>(tokens));
  for (int t = 0; t < tokens; ++t) {
    ASSERT_EQ(r.hints[t].size(), static_cast<size_t>(L));
    for (int m = 0; m < L; ++m) {
      EXPECT_EQ(r.hints[t][m], on.hinted[t][m]) << "token " << t << " layer "
                                                << m;
      const bool hinted =
          r.phase[t] == trace::Phase::kDecode && c.LayerOfMoeLayer(m) > 0;
      EXPECT_EQ(r.hints[t][m].size(), hinted ? static_cast<size_t>(k) : 0u)
          << "token " << t << " layer " << m;
    }
  }

  HintRun off;
  RunWithHints(l, name, /*pregate=*/false, &off);
  EXPECT_EQ(off.hint_calls, 0u);
  EXPECT_TRUE(off.request.hints.empty());
  // Hints only add a field: the routing is the same.
  EXPECT_EQ(off.request.experts, r.experts);
}

// Distance 2: the hints for a MoE layer come from the output of the layer
// two before it and are recorded under the layer they predict; the first
// two layers get none.
TEST_P(TraceRecorderGenerateTest, RecordsDistanceTwoHintsUnderTheirLayer) {
  const ModelFamily family = GetParam();
  const std::string name(ModelFamilyName(family));
  Loaded l = LoadTiny(family, absl::StrCat(name, "_hints2"));
  ASSERT_NE(l.model, nullptr);
  const ModelConfig& c = l.model->config();
  const int L = c.num_moe_layers();
  const int k = static_cast<int>(c.top_k);
  std::vector<bool> predicted(L, false);  // MoE layers 2 layers after one
  for (int h = 2; h < c.num_hidden_layers; ++h) {
    const int m = l.model->layer(h).moe_index;
    if (m >= 0) predicted[m] = true;
  }
  const int per_iteration =
      static_cast<int>(std::count(predicted.begin(), predicted.end(), true));
  ASSERT_GT(per_iteration, 0);
  ASSERT_LT(per_iteration, L);

  HintRun on;
  RunWithHints(l, name, /*pregate=*/true, &on, /*distance=*/2);
  const trace::TraceRequest& r = on.request;
  EXPECT_EQ(on.hint_calls, static_cast<size_t>(5 * per_iteration));
  ASSERT_EQ(r.hints.size(), static_cast<size_t>(r.num_tokens()));
  EXPECT_EQ(r.hints, on.hinted);
  for (int t = 0; t < r.num_tokens(); ++t) {
    ASSERT_EQ(r.hints[t].size(), static_cast<size_t>(L));
    for (int m = 0; m < L; ++m) {
      const bool hinted = r.phase[t] == trace::Phase::kDecode && predicted[m];
      EXPECT_EQ(r.hints[t][m].size(), hinted ? static_cast<size_t>(k) : 0u)
          << "token " << t << " layer " << m;
    }
  }
  HintRun d1;
  RunWithHints(l, name, /*pregate=*/true, &d1, /*distance=*/1);
  EXPECT_EQ(d1.request.experts, r.experts);  // hints never change routing
}

// A dense first layer: the session hints MoE layer 0 from its output, and
// the recorder keeps those hints too.
TEST(TraceRecorderDenseFirstTest, RecordsHintsForMoeLayerZero) {
  MakeModelOptions o = TinyPreset(ModelFamily::kQwen3Moe);
  o.mlp_only_layers = {0};
  Loaded l = LoadModel(o, "qwen3_dense0");
  ASSERT_NE(l.model, nullptr);
  const int L = l.model->config().num_moe_layers();
  HintRun on;
  RunWithHints(l, "qwen3_dense0", /*pregate=*/true, &on);
  EXPECT_EQ(on.hint_calls, static_cast<size_t>(5 * L));
  const trace::TraceRequest& r = on.request;
  ASSERT_EQ(r.hints.size(), static_cast<size_t>(r.num_tokens()));
  EXPECT_EQ(r.hints, on.hinted);
  for (int t = 0; t < r.num_tokens(); ++t) {
    const bool decode = r.phase[t] == trace::Phase::kDecode;
    EXPECT_EQ(r.hints[t][0].empty(), !decode) << "token " << t;
  }
}

trace::TraceHeader SmallHeader() {
  trace::TraceHeader h;
  h.model = "synthetic";
  h.num_layers = 2;
  h.num_experts = 4;
  h.top_k = 2;
  return h;
}

// Feeds one iteration of `tokens` tokens through both layers.
void Iterate(RequestRecording& rec, int64_t tokens, int32_t base) {
  for (int layer = 0; layer < 2; ++layer) {
    std::vector<int32_t> ids;
    std::vector<float> ws;
    for (int64_t t = 0; t < tokens; ++t) {
      ids.push_back((base + layer) % 4);
      ids.push_back((base + layer + 1) % 4);
      ws.push_back(0.75f);
      ws.push_back(0.25f);
    }
    rec.Observe(layer, tokens, ids, ws);
  }
}

TEST(RequestRecordingTest, PhasesFollowIterations) {
  RequestRecording rec(SmallHeader(), "r");
  Iterate(rec, 3, 0);
  Iterate(rec, 1, 1);
  Iterate(rec, 1, 2);
  auto r = rec.Finish();
  ASSERT_TRUE(r.ok()) << r.status();
  using trace::Phase;
  EXPECT_EQ(r->phase, (std::vector<Phase>{Phase::kPrefill, Phase::kPrefill,
                                          Phase::kPrefill, Phase::kDecode,
                                          Phase::kDecode}));
  EXPECT_EQ(r->experts[4][1], (std::vector<int32_t>{3, 0}));
  EXPECT_TRUE(trace::ValidateRequest(SmallHeader(), *r).ok());
}

// Chunked prefill (a batched worker): the chunks join the one prefill
// iteration; a multi-token iteration after decode began is still refused.
TEST(RequestRecordingTest, PrefillChunksFormOnePrefill) {
  RequestRecording rec(SmallHeader(), "r");
  Iterate(rec, 2, 0);
  rec.ContinuePrefill();
  Iterate(rec, 3, 1);
  Iterate(rec, 1, 2);
  auto r = rec.Finish();
  ASSERT_TRUE(r.ok()) << r.status();
  using trace::Phase;
  EXPECT_EQ(r->phase, (std::vector<Phase>{Phase::kPrefill, Phase::kPrefill, Phase::kPrefill,
                                          Phase::kPrefill, Phase::kPrefill, Phase::kDecode}));
  EXPECT_EQ(rec.iterations(), 2);
  EXPECT_TRUE(trace::ValidateRequest(SmallHeader(), *r).ok());
  rec.ContinuePrefill();  // too late: decode began
  Iterate(rec, 2, 3);
  EXPECT_FALSE(rec.Finish().ok());
}

TEST(RequestRecordingTest, RejectsBadRouting) {
  {
    RequestRecording rec(SmallHeader(), "empty");
    EXPECT_EQ(rec.Finish().status().code(),
              absl::StatusCode::kFailedPrecondition);
  }
  {
    RequestRecording rec(SmallHeader(), "partial");
    rec.Observe(0, 1, std::vector<int32_t>{0, 1}, std::vector<float>{1, 0});
    EXPECT_EQ(rec.Finish().status().code(),
              absl::StatusCode::kFailedPrecondition);
  }
  {
    RequestRecording rec(SmallHeader(), "order");
    rec.Observe(1, 1, std::vector<int32_t>{0, 1}, std::vector<float>{1, 0});
    EXPECT_THAT(rec.Finish().status().message(), HasSubstr("expected"));
  }
  {
    RequestRecording rec(SmallHeader(), "decode2");
    Iterate(rec, 2, 0);
    Iterate(rec, 2, 0);
    EXPECT_THAT(rec.Finish().status().message(), HasSubstr("decode iteration"));
  }
  {
    RequestRecording rec(SmallHeader(), "shape");
    rec.Observe(0, 2, std::vector<int32_t>{0, 1}, std::vector<float>{1, 0});
    EXPECT_EQ(rec.Finish().status().code(), absl::StatusCode::kInternal);
  }
}

std::vector<ExpertHint> HintsFor(int layer, std::vector<int32_t> experts) {
  std::vector<ExpertHint> out;
  for (int32_t e : experts) out.push_back({layer, e, 0.5f});
  return out;
}

TEST(RequestRecordingTest, HintsGoToTheLastTokenOfTheLayersIteration) {
  RequestRecording rec(SmallHeader(), "hinted");
  RoutingObserver obs = rec.Observer();
  ASSERT_TRUE(obs.wants_hints());
  Iterate(rec, 2, 0);  // prefill: no hints
  // Decode 1: hint layer 1 between the layers' routing.
  rec.Observe(0, 1, std::vector<int32_t>{0, 1}, std::vector<float>{1, 0});
  obs.Hints(HintsFor(1, {3, 2}));
  rec.Observe(1, 1, std::vector<int32_t>{2, 3}, std::vector<float>{1, 0});
  Iterate(rec, 1, 2);  // decode 2: no hints
  auto r = rec.Finish();
  ASSERT_TRUE(r.ok()) << r.status();
  using Lists = std::vector<std::vector<int32_t>>;
  ASSERT_EQ(r->hints.size(), 4u);
  EXPECT_EQ(r->hints[0], (Lists{{}, {}}));
  EXPECT_EQ(r->hints[1], (Lists{{}, {}}));
  EXPECT_EQ(r->hints[2], (Lists{{}, {3, 2}}));
  EXPECT_EQ(r->hints[3], (Lists{{}, {}}));

  // Round trip through the recorder's writer and the trace reader.
  std::ostringstream out;
  auto recorder = TraceRecorder::ToStream(&out, SmallHeader());
  ASSERT_TRUE(recorder.ok());
  ASSERT_TRUE((*recorder)->Append(rec).ok());
  EXPECT_THAT(out.str(), HasSubstr("\"hints\":[[[],[]],[[],[]],[[],[3,2]]"));
  std::istringstream in(out.str());
  auto back = trace::ReadTrace(in, "hinted");
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->requests.size(), 1u);
  EXPECT_EQ(back->requests[0].hints, r->hints);
  EXPECT_EQ(back->requests[0].experts, r->experts);
}

// Hints from several distances: a layer's hints may come several layers
// early, and two predictions for one layer are recorded as their union.
TEST(RequestRecordingTest, HintsFromEarlierLayersAndSeveralDistances) {
  trace::TraceHeader h = SmallHeader();
  h.num_layers = 3;
  RequestRecording rec(h, "far");
  const std::vector<int32_t> ids{0, 1};
  const std::vector<float> ws{1, 0};
  for (int m = 0; m < 3; ++m) rec.Observe(m, 1, ids, ws);  // prefill
  rec.ObserveHints(HintsFor(1, {2, 3}));  // before layer 0 (dense layer 0)
  rec.Observe(0, 1, ids, ws);
  rec.ObserveHints(HintsFor(2, {3, 1}));  // distance 2
  rec.Observe(1, 1, ids, ws);
  rec.ObserveHints(HintsFor(2, {1, 0}));  // distance 1 for the same layer
  rec.Observe(2, 1, ids, ws);
  auto r = rec.Finish();
  ASSERT_TRUE(r.ok()) << r.status();
  using Lists = std::vector<std::vector<int32_t>>;
  ASSERT_EQ(r->hints.size(), 2u);
  EXPECT_EQ(r->hints[0], (Lists{{}, {}, {}}));
  EXPECT_EQ(r->hints[1], (Lists{{}, {2, 3}, {3, 1, 0}}));
  EXPECT_TRUE(trace::ValidateRequest(h, *r).ok());
  {
    RequestRecording late(h, "routed");
    for (int m = 0; m < 3; ++m) late.Observe(m, 1, ids, ws);
    late.Observe(0, 1, ids, ws);
    late.Observe(1, 1, ids, ws);
    late.ObserveHints(HintsFor(1, {2}));  // layer 1 already routed
    late.Observe(2, 1, ids, ws);
    EXPECT_EQ(late.Finish().status().code(), absl::StatusCode::kInternal);
  }
}

TEST(RequestRecordingTest, NoHintsNoField) {
  RequestRecording rec(SmallHeader(), "plain");
  RoutingObserver obs = rec.Observer();
  Iterate(rec, 2, 0);
  obs.Hints({});  // an empty call is not a hint
  Iterate(rec, 1, 1);
  auto r = rec.Finish();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->hints.empty());
  EXPECT_EQ(trace::SerializeRequest(*r).find("hints"), std::string::npos);
}

TEST(RequestRecordingTest, RejectsMisplacedHints) {
  const std::vector<int32_t> ids{0, 1};
  const std::vector<float> ws{1, 0};
  {
    RequestRecording rec(SmallHeader(), "wrong-layer");
    rec.Observe(0, 1, ids, ws);
    rec.ObserveHints(HintsFor(0, {1}));  // layer 1 is next, not 0
    rec.Observe(1, 1, ids, ws);
    EXPECT_EQ(rec.Finish().status().code(), absl::StatusCode::kInternal);
  }
  {
    RequestRecording rec(SmallHeader(), "mixed");
    rec.Observe(0, 1, ids, ws);
    std::vector<ExpertHint> h = HintsFor(1, {1});
    h.push_back({0, 2, 0.1f});
    rec.ObserveHints(h);
    rec.Observe(1, 1, ids, ws);
    EXPECT_THAT(rec.Finish().status().message(), HasSubstr("among hints"));
  }
  {
    RequestRecording rec(SmallHeader(), "range");
    rec.Observe(0, 1, ids, ws);
    rec.ObserveHints(HintsFor(1, {4}));
    rec.Observe(1, 1, ids, ws);
    EXPECT_EQ(rec.Finish().status().code(), absl::StatusCode::kInternal);
  }
  {
    RequestRecording rec(SmallHeader(), "beyond");
    rec.Observe(0, 1, ids, ws);
    rec.ObserveHints(HintsFor(2, {1}));  // the header has 2 layers
    rec.Observe(1, 1, ids, ws);
    EXPECT_THAT(rec.Finish().status().message(),
                HasSubstr("still to be routed"));
  }
  {
    RequestRecording rec(SmallHeader(), "dangling");
    Iterate(rec, 1, 0);
    rec.ObserveHints(HintsFor(0, {1}));  // layer 0 of an iteration never run
    EXPECT_THAT(rec.Finish().status().message(),
                HasSubstr("not followed by its routing"));
  }
}

TEST(TraceRecorderTest, ConcurrentAppendsKeepLinesWhole) {
  std::ostringstream out;
  auto recorder = TraceRecorder::ToStream(&out, SmallHeader());
  ASSERT_TRUE(recorder.ok()) << recorder.status();
  constexpr int kThreads = 4;
  constexpr int kPerThread = 25;
  std::vector<std::thread> threads;
  for (int th = 0; th < kThreads; ++th) {
    threads.emplace_back([&, th] {
      for (int i = 0; i < kPerThread; ++i) {
        RequestRecording rec(SmallHeader(), absl::StrCat("t", th, "-", i));
        Iterate(rec, 2 + i % 3, th);
        for (int d = 0; d < i % 5; ++d) Iterate(rec, 1, th + d);
        EXPECT_TRUE((*recorder)->Append(rec).ok());
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ((*recorder)->requests(), kThreads * kPerThread);

  std::istringstream in(out.str());
  auto trace = trace::ReadTrace(in, "concurrent");
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_EQ(trace->requests.size(), static_cast<size_t>(kThreads * kPerThread));
  std::vector<std::string> ids;
  for (const auto& r : trace->requests) {
    ids.push_back(r.id);
    const int i = std::stoi(r.id.substr(r.id.find('-') + 1));
    EXPECT_EQ(r.num_prefill_tokens(), 2 + i % 3) << r.id;
    EXPECT_EQ(r.num_decode_tokens(), i % 5) << r.id;
  }
  std::vector<std::string> want;
  for (int th = 0; th < kThreads; ++th) {
    for (int i = 0; i < kPerThread; ++i)
      want.push_back(absl::StrCat("t", th, "-", i));
  }
  EXPECT_THAT(ids, ::testing::UnorderedElementsAreArray(want));
}

TEST(TraceRecorderTest, ErrorsAreStatuses) {
  trace::TraceHeader bad = SmallHeader();
  bad.top_k = 9;
  EXPECT_FALSE(
      TraceRecorder::Open(absl::StrCat(::testing::TempDir(), "/bad.jsonl"), bad)
          .ok());
  EXPECT_FALSE(
      TraceRecorder::Open("/nonexistent-dir/x/trace.jsonl", SmallHeader())
          .ok());

  std::ostringstream out;
  auto recorder = TraceRecorder::ToStream(&out, SmallHeader());
  ASSERT_TRUE(recorder.ok());
  RequestRecording empty(SmallHeader(), "none");
  EXPECT_FALSE((*recorder)->Append(empty).ok());
  trace::TraceRequest out_of_range;
  out_of_range.id = "x";
  out_of_range.phase = {trace::Phase::kPrefill};
  out_of_range.experts = {{{0, 7}, {1, 2}}};
  EXPECT_EQ((*recorder)->Append(out_of_range).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE((*recorder)->Close().ok());
  RequestRecording one(SmallHeader(), "late");
  Iterate(one, 1, 0);
  EXPECT_EQ((*recorder)->Append(one).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*recorder)->requests(), 0);
}

}  // namespace
}  // namespace moe
