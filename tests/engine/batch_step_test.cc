// The batched step: a sequence's logits are bit-identical alone or batched
// (with other sequences of other lengths, joining at other steps, prompts in
// chunks), one acquire per MoE layer for the batch's union, and per-request
// usage that adds up exactly.
#include "services/engine/batch_step.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model_maker.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "services/engine/in_memory_provider.h"
#include "services/engine/session.h"

namespace moe {
namespace {

// Counts acquires and reports made-up usage (so attribution has something
// to split): hits = demands, misses = 1, stall = 1000 ns + tokens.
class CountingProvider : public ExpertProvider {
 public:
  explicit CountingProvider(ExpertProvider* inner) : inner_(inner) {}
  absl::StatusOr<AcquiredExperts> Acquire(
      int moe_layer, absl::Span<const ExpertDemand> demands,
      bool prefill) override {
    absl::StatusOr<AcquiredExperts> a =
        inner_->Acquire(moe_layer, demands, prefill);
    if (!a.ok()) return a;
    ++acquires;
    a->usage.hits = static_cast<int32_t>(demands.size());
    a->usage.misses = 1;
    int64_t tokens = 0;
    for (const ExpertDemand& d : demands) tokens += d.tokens;
    a->usage.stall_ns = 1000 + tokens;
    total += a->usage;
    last_demands.assign(demands.begin(), demands.end());
    return a;
  }
  absl::StatusOr<AcquiredExperts> AcquireBatch(
      int moe_layer, absl::Span<const ExpertDemand> demands,
      absl::Span<const MemberDemands> members, bool prefill) override {
    last_members.assign(members.begin(), members.end());
    return Acquire(moe_layer, demands, prefill);
  }
  void Release(AcquiredExperts& a) override { inner_->Release(a); }

  ExpertProvider* inner_;
  int64_t acquires = 0;
  AcquireUsage total;
  std::vector<ExpertDemand> last_demands;
  std::vector<MemberDemands> last_members;
};

struct Loaded {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<MoeModel> model;
  std::unique_ptr<InMemoryExpertProvider> experts;
};

Loaded Load(ModelFamily family, uint64_t seed, const std::string& name) {
  MakeModelOptions o = TinyPreset(family);
  o.seed = seed;
  // DeepSeek's latent attention has as many key/value heads as query heads.
  if (family != ModelFamily::kDeepseekV2 && family != ModelFamily::kDeepseekV3) {
    o.kv_heads = o.heads / 2;
  }
  if (family == ModelFamily::kQwen2Moe) o.mlp_only_layers = {1};
  // More than two experts per token, so that their order in each row's sum
  // shows in the bits (two terms add the same either way).
  if (family == ModelFamily::kQwen3Moe) o.top_k = 3;
  if (family == ModelFamily::kOlmoe) o.top_k = 4;
  if (family == ModelFamily::kGptOss) o.top_k = 3;  // sinks, sliding window 8
  const std::string dir = absl::StrCat(::testing::TempDir(), "/batch_", name);
  Loaded l;
  EXPECT_TRUE(MakeModel(o, dir).ok());
  auto backend = CreateBackend("cpu");
  EXPECT_TRUE(backend.ok());
  l.backend = std::move(*backend);
  auto model = MoeModel::Load(dir, l.backend.get());
  EXPECT_TRUE(model.ok()) << model.status();
  l.model = std::move(*model);
  auto experts = InMemoryExpertProvider::Create(*l.model);
  EXPECT_TRUE(experts.ok());
  l.experts = std::move(*experts);
  return l;
}

// A sequence: its prompt, then teacher-forced decode tokens.
struct Seq {
  std::vector<int32_t> prompt;
  std::vector<int32_t> decode;
};

std::vector<Seq> MakeSeqs(int64_t vocab) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> tok(0,
                                             static_cast<int32_t>(vocab) - 1);
  std::vector<Seq> seqs;
  const int prompt_lens[] = {7, 1, 12, 4, 9};
  const int decode_lens[] = {6, 9, 3, 7, 5};
  for (int i = 0; i < 5; ++i) {
    Seq s;
    for (int j = 0; j < prompt_lens[i]; ++j) s.prompt.push_back(tok(rng));
    for (int j = 0; j < decode_lens[i]; ++j) s.decode.push_back(tok(rng));
    seqs.push_back(s);
  }
  return seqs;
}

using Logits = std::vector<std::vector<float>>;  // per produced token

// Alone: the whole prompt in one Forward, then one token per Forward.
Logits RunAlone(const MoeModel& model, ExpertProvider* experts, const Seq& s) {
  Session session(model, experts, 64);
  session.set_pregate_hints(true);
  Logits out;
  auto l = session.Forward(s.prompt, /*prefill=*/true);
  EXPECT_TRUE(l.ok()) << l.status();
  if (!l.ok()) return out;
  out.emplace_back(l->begin(), l->end());
  for (int32_t t : s.decode) {
    l = session.Forward(absl::Span<const int32_t>(&t, 1), /*prefill=*/false);
    EXPECT_TRUE(l.ok()) << l.status();
    if (!l.ok()) return out;
    out.emplace_back(l->begin(), l->end());
  }
  return out;
}

// Batched: sequence i joins at step i; prompts run in chunks of `chunk`;
// each step holds every live sequence's next chunk or decode token.
std::vector<Logits> RunBatched(const MoeModel& model, ExpertProvider* experts,
                               const std::vector<Seq>& seqs, int chunk) {
  const size_t n = seqs.size();
  std::vector<std::unique_ptr<Session>> sessions(n);
  std::vector<size_t> fed(n, 0);  // prompt tokens fed so far
  std::vector<size_t> decoded(n, 0);
  std::vector<Logits> out(n);
  BatchStep step(model, experts);
  for (int s = 0; s < 200; ++s) {
    std::vector<BatchStep::Entry> entries;
    std::vector<size_t> who;
    for (size_t i = 0; i < n && i <= static_cast<size_t>(s); ++i) {
      if (!sessions[i]) {
        sessions[i] = std::make_unique<Session>(model, experts, 64);
        sessions[i]->set_pregate_hints(true);
      }
      const Seq& q = seqs[i];
      BatchStep::Entry e;
      e.session = sessions[i].get();
      e.request = i + 1;
      if (fed[i] < q.prompt.size()) {
        const size_t take = std::min<size_t>(chunk, q.prompt.size() - fed[i]);
        e.tokens = absl::Span<const int32_t>(q.prompt.data() + fed[i], take);
        e.prefill = true;
      } else if (decoded[i] < q.decode.size()) {
        e.tokens = absl::Span<const int32_t>(q.decode.data() + decoded[i], 1);
      } else {
        continue;  // finished: left the batch
      }
      entries.push_back(e);
      who.push_back(i);
    }
    if (entries.empty()) break;
    absl::Status st = step.Run(entries);
    EXPECT_TRUE(st.ok()) << st;
    if (!st.ok()) return out;
    for (size_t j = 0; j < who.size(); ++j) {
      const size_t i = who[j];
      bool produced;
      if (entries[j].prefill) {
        fed[i] += entries[j].tokens.size();
        produced = fed[i] == seqs[i].prompt.size();
      } else {
        ++decoded[i];
        produced = true;
      }
      if (produced) {
        absl::Span<const float> l = step.logits(j);
        out[i].emplace_back(l.begin(), l.end());
      }
    }
  }
  return out;
}

class BatchStepFamilyTest : public ::testing::TestWithParam<ModelFamily> {};

TEST_P(BatchStepFamilyTest, BitIdenticalAloneAndBatched) {
  Loaded l = Load(GetParam(), 31,
                  absl::StrCat("family", static_cast<int>(GetParam())));
  ASSERT_NE(l.model, nullptr);
  const std::vector<Seq> seqs = MakeSeqs(l.model->config().vocab_size);
  for (int chunk : {1, 3, 64}) {
    std::vector<Logits> batched =
        RunBatched(*l.model, l.experts.get(), seqs, chunk);
    for (size_t i = 0; i < seqs.size(); ++i) {
      Logits alone = RunAlone(*l.model, l.experts.get(), seqs[i]);
      ASSERT_EQ(alone.size(), seqs[i].decode.size() + 1);
      ASSERT_EQ(batched[i].size(), alone.size()) << "sequence " << i;
      for (size_t t = 0; t < alone.size(); ++t) {
        ASSERT_EQ(alone[t].size(), batched[i][t].size());
        EXPECT_EQ(0, std::memcmp(alone[t].data(), batched[i][t].data(),
                                 alone[t].size() * sizeof(float)))
            << "chunk " << chunk << " sequence " << i << " token " << t;
      }
    }
  }
}

// Prefix reuse (Session::SaveKv / LoadKv, what the serving prefix cache
// does): a session that loads the first p positions of another's keys and
// values and runs the rest gives bit-identical logits to running them all,
// for every split point (inside the prompt, at its end, inside the output),
// whether the rest runs as one prefill chunk or a token at a time.
TEST_P(BatchStepFamilyTest, LoadedPrefixIsBitIdenticalToRunningIt) {
  Loaded l = Load(GetParam(), 41, absl::StrCat("prefix", static_cast<int>(GetParam())));
  ASSERT_NE(l.model, nullptr);
  const Seq seq = MakeSeqs(l.model->config().vocab_size)[2];  // prompt 12, decode 3
  std::vector<int32_t> all = seq.prompt;
  all.insert(all.end(), seq.decode.begin(), seq.decode.end());
  const int64_t n = static_cast<int64_t>(all.size());
  // Every position's logits, running one token at a time.
  Session first(*l.model, l.experts.get(), 64);
  Logits every;
  for (int64_t i = 0; i < n; ++i) {
    auto lg = first.Forward(absl::Span<const int32_t>(&all[i], 1), /*prefill=*/i == 0);
    ASSERT_TRUE(lg.ok()) << lg.status();
    every.emplace_back(lg->begin(), lg->end());
  }
  for (int64_t p : {int64_t{1}, int64_t{5}, int64_t{11}, int64_t{12}, n - 1}) {
    absl::StatusOr<KvSnapshot> snap = first.SaveKv(p);
    ASSERT_TRUE(snap.ok()) << snap.status();
    EXPECT_EQ(snap->positions, p);
    EXPECT_EQ(snap->bytes(), Session::KvCacheBytes(*l.model, p));
    // The rest as one chunk, into a cache of KV blocks (as batched).
    Session chunk(*l.model, l.experts.get(), 64);
    ASSERT_TRUE(chunk.set_kv_block_tokens(4).ok());
    ASSERT_TRUE(chunk.LoadKv(*snap, p).ok());
    EXPECT_EQ(chunk.position(), p);
    auto lg = chunk.Forward(absl::Span<const int32_t>(all).subspan(p), /*prefill=*/true);
    ASSERT_TRUE(lg.ok()) << lg.status();
    EXPECT_EQ(0, std::memcmp(lg->data(), every.back().data(), lg->size() * sizeof(float)))
        << "split at " << p;
    // The rest a token at a time.
    Session stepwise(*l.model, l.experts.get(), 64);
    ASSERT_TRUE(stepwise.LoadKv(*snap, p).ok());
    for (int64_t i = p; i < n; ++i) {
      lg = stepwise.Forward(absl::Span<const int32_t>(&all[i], 1), /*prefill=*/i == p);
      ASSERT_TRUE(lg.ok()) << lg.status();
      EXPECT_EQ(0, std::memcmp(lg->data(), every[i].data(), lg->size() * sizeof(float)))
          << "split at " << p << ", position " << i;
    }
  }
}

TEST(SessionPrefixTest, BadSavesAndLoadsAreRefused) {
  Loaded l = Load(ModelFamily::kMixtral, 43, "prefix_bad");
  ASSERT_NE(l.model, nullptr);
  Session s(*l.model, l.experts.get(), 16);
  EXPECT_EQ(s.SaveKv(1).status().code(), absl::StatusCode::kInvalidArgument);  // nothing ran
  const std::vector<int32_t> prompt = {1, 2, 3, 4};
  ASSERT_TRUE(s.Forward(prompt, true).ok());
  EXPECT_EQ(s.SaveKv(5).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.SaveKv(0).status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<KvSnapshot> snap = s.SaveKv(4);
  ASSERT_TRUE(snap.ok());
  // Into a session that ran: refused; more positions than saved, or the
  // whole of a session (nothing left to run): refused.
  EXPECT_EQ(s.LoadKv(*snap, 2).code(), absl::StatusCode::kFailedPrecondition);
  Session fresh(*l.model, l.experts.get(), 16);
  EXPECT_EQ(fresh.LoadKv(*snap, 5).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(fresh.LoadKv(*snap, 0).code(), absl::StatusCode::kInvalidArgument);
  Session small(*l.model, l.experts.get(), 4);
  EXPECT_EQ(small.LoadKv(*snap, 4).code(), absl::StatusCode::kInvalidArgument);
  // A snapshot of another layout.
  KvSnapshot other = *snap;
  other.caches.pop_back();
  EXPECT_EQ(fresh.LoadKv(other, 2).code(), absl::StatusCode::kInvalidArgument);
  other = *snap;
  other.caches[1].pop_back();
  EXPECT_EQ(fresh.LoadKv(other, 2).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(fresh.position(), 0);
  EXPECT_TRUE(fresh.LoadKv(*snap, 3).ok());
  EXPECT_EQ(fresh.position(), 3);
}

// Answers odd experts "on host" and hands a separate CPU backend to run
// them, as DaemonExpertProvider does for a device worker.
class SplitHostProvider : public ExpertProvider {
 public:
  SplitHostProvider(ExpertProvider* inner, Backend* host, bool mark)
      : inner_(inner), host_(host), mark_(mark) {}
  absl::StatusOr<AcquiredExperts> Acquire(int moe_layer, absl::Span<const ExpertDemand> demands,
                                          bool prefill) override {
    absl::StatusOr<AcquiredExperts> a = inner_->Acquire(moe_layer, demands, prefill);
    if (!a.ok()) return a;
    for (ExpertView& v : a->views) {
      v.on_host = mark_ && v.expert % 2 == 1;
      host_runs += v.on_host;
    }
    a->host_backend = host_;
    return a;
  }
  void Release(AcquiredExperts& a) override { inner_->Release(a); }

  ExpertProvider* inner_;
  Backend* host_;
  bool mark_;
  int64_t host_runs = 0;
};

// Host answers computed by another backend beside the engine's (a device
// worker's path, run here with two CPU backends): the host part's sum is
// added to the device part's, so logits move only by rounding (the stated
// tolerance: 1e-4 of the largest logit), alone and batched; with nothing
// answered on the host, the bits are the one-backend bits.
// The seed is one whose routing has no decision within rounding of a tie
// at any level: with seed 37 the gpt-oss model's router ties at sequence
// 3, token 6 under AMX's arithmetic (a flipped expert moves every logit of
// the last two tokens by ~1e-3, which is no rounding).
TEST_P(BatchStepFamilyTest, HostAnswersOnAnotherBackendStayWithinTolerance) {
  Loaded l = Load(GetParam(), 38, absl::StrCat("split", static_cast<int>(GetParam())));
  ASSERT_NE(l.model, nullptr);
  auto host = CreateBackend("cpu");
  ASSERT_TRUE(host.ok());
  const std::vector<Seq> seqs = MakeSeqs(l.model->config().vocab_size);
  SplitHostProvider split(l.experts.get(), host->get(), true);
  SplitHostProvider unmarked(l.experts.get(), host->get(), false);
  std::vector<Logits> batched = RunBatched(*l.model, &split, seqs, 3);
  double worst = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const Logits alone = RunAlone(*l.model, l.experts.get(), seqs[i]);
    const Logits split_alone = RunAlone(*l.model, &split, seqs[i]);
    const Logits same = RunAlone(*l.model, &unmarked, seqs[i]);
    ASSERT_EQ(split_alone.size(), alone.size());
    ASSERT_EQ(batched[i].size(), alone.size());
    ASSERT_EQ(same.size(), alone.size());
    for (size_t t = 0; t < alone.size(); ++t) {
      float scale = 0;
      for (float v : alone[t]) scale = std::max(scale, std::abs(v));
      for (size_t j = 0; j < alone[t].size(); ++j) {
        for (const Logits* other : {&split_alone, static_cast<const Logits*>(&batched[i])}) {
          const double d = std::abs(static_cast<double>((*other)[t][j]) - alone[t][j]);
          worst = std::max(worst, d / std::max(scale, 1e-6f));
          ASSERT_LE(d, 1e-4 * std::max(scale, 1.0f)) << "sequence " << i << " token " << t;
        }
      }
      EXPECT_EQ(0, std::memcmp(alone[t].data(), same[t].data(), alone[t].size() * 4));
    }
  }
  EXPECT_GT(split.host_runs, 0);
  EXPECT_EQ(unmarked.host_runs, 0);
  RecordProperty("worst_relative_logit_difference", std::to_string(worst));
}

// Answers every layer in parts of `part` experts (ExpertProvider::
// AcquireRest), as DaemonExpertProvider does with --lease-part; `part` 0
// answers nothing (a broken provider).
class PartingProvider : public ExpertProvider {
 public:
  PartingProvider(ExpertProvider* inner, size_t part) : inner_(inner), part_(part) {}
  absl::StatusOr<AcquiredExperts> Acquire(int moe_layer, absl::Span<const ExpertDemand> demands,
                                          bool prefill) override {
    ++opened;
    return inner_->Acquire(moe_layer, demands.first(std::min(part_, demands.size())), prefill);
  }
  absl::StatusOr<AcquiredExperts> AcquireRest(int moe_layer, absl::Span<const ExpertDemand> rest,
                                              bool prefill) override {
    ++continued;
    return inner_->Acquire(moe_layer, rest.first(std::min(part_, rest.size())), prefill);
  }
  void Release(AcquiredExperts& a) override { inner_->Release(a); }

  ExpertProvider* inner_;
  size_t part_;
  int64_t opened = 0, continued = 0;
};

// A layer computed in parts (each part's experts added to the output in
// ascending id, as one whole call adds them) gives the bits of the whole
// layer, alone and batched, for parts of one, two and three experts.
TEST_P(BatchStepFamilyTest, LayersInPartsAreBitIdenticalToWholeLayers) {
  Loaded l = Load(GetParam(), 47, absl::StrCat("parts", static_cast<int>(GetParam())));
  ASSERT_NE(l.model, nullptr);
  const std::vector<Seq> seqs = MakeSeqs(l.model->config().vocab_size);
  const std::vector<Logits> whole = RunBatched(*l.model, l.experts.get(), seqs, 3);
  for (size_t part : {1, 2, 3}) {
    PartingProvider parts(l.experts.get(), part);
    const std::vector<Logits> batched = RunBatched(*l.model, &parts, seqs, 3);
    ASSERT_EQ(batched.size(), whole.size());
    for (size_t i = 0; i < seqs.size(); ++i) {
      const Logits alone = RunAlone(*l.model, &parts, seqs[i]);
      ASSERT_EQ(alone.size(), whole[i].size());
      ASSERT_EQ(batched[i].size(), whole[i].size());
      for (size_t t = 0; t < alone.size(); ++t) {
        EXPECT_EQ(0, std::memcmp(alone[t].data(), whole[i][t].data(), alone[t].size() * 4))
            << "part " << part << " sequence " << i << " token " << t;
        EXPECT_EQ(0, std::memcmp(batched[i][t].data(), whole[i][t].data(),
                                 alone[t].size() * 4))
            << "part " << part << " batched sequence " << i << " token " << t;
      }
    }
    EXPECT_GT(parts.continued, 0) << "part " << part;  // layers did split
  }
  // A provider that answers none of a layer fails the step, not loops.
  PartingProvider none(l.experts.get(), 0);
  Session s(*l.model, &none, 16);
  const std::vector<int32_t> prompt = {1, 2, 3};
  EXPECT_EQ(s.Forward(prompt, /*prefill=*/true).status().code(), absl::StatusCode::kInternal);
}

INSTANTIATE_TEST_SUITE_P(Families, BatchStepFamilyTest,
                         ::testing::Values(ModelFamily::kMixtral,
                                           ModelFamily::kQwen2Moe,
                                           ModelFamily::kQwen3Moe,
                                           ModelFamily::kOlmoe,
                                           ModelFamily::kDeepseekV2,
                                           ModelFamily::kDeepseekV3,
                                           ModelFamily::kGptOss,
                                           ModelFamily::kGlm4Moe));

TEST(BatchStepTest, OneAcquirePerMoeLayerForTheUnion) {
  Loaded l = Load(ModelFamily::kMixtral, 32, "union");
  ASSERT_NE(l.model, nullptr);
  CountingProvider counting(l.experts.get());
  const ModelConfig& c = l.model->config();
  std::vector<std::unique_ptr<Session>> sessions;
  std::vector<std::vector<int32_t>> tokens = {{1, 2, 3}, {4}, {5, 6}};
  std::vector<BatchStep::Entry> entries;
  for (size_t i = 0; i < tokens.size(); ++i) {
    sessions.push_back(std::make_unique<Session>(*l.model, &counting, 16));
    entries.push_back({sessions.back().get(), tokens[i], true, 10 + i});
  }
  BatchStep step(*l.model, &counting);
  ASSERT_TRUE(step.Run(entries).ok());
  EXPECT_EQ(counting.acquires, c.num_moe_layers());
  int64_t demanded = 0;
  for (const ExpertDemand& d : counting.last_demands) demanded += d.tokens;
  EXPECT_EQ(demanded, 6 * c.top_k);  // every row's top_k, summed over experts
  ASSERT_EQ(counting.last_members.size(), 3u);
  EXPECT_EQ(counting.last_members[0].request, 10u);
  EXPECT_EQ(counting.last_members[2].request, 12u);
  EXPECT_EQ(counting.last_members[0].tokens(), 3 * c.top_k);
  EXPECT_EQ(counting.last_members[1].tokens(), 1 * c.top_k);
  EXPECT_EQ(counting.last_members[2].tokens(), 2 * c.top_k);
  for (const MemberDemands& m : counting.last_members) {
    EXPECT_TRUE(m.prefill);
    for (size_t j = 1; j < m.demands.size(); ++j) {
      EXPECT_LT(m.demands[j - 1].expert, m.demands[j].expert);  // ascending, distinct
    }
  }
  // Each member's row is its own, and the rows add up to the union.
  EXPECT_TRUE(ValidateMembers(ExchangeShape{c.num_moe_layers(), static_cast<int>(c.num_experts)},
                              c.num_moe_layers() - 1, counting.last_demands,
                              counting.last_members)
                  .ok());
  // The sessions' shares add up to exactly what the acquires reported.
  int64_t hits = 0, misses = 0;
  double stall = 0;
  for (const auto& s : sessions) {
    hits += s->stats().expert_hits;
    misses += s->stats().expert_misses;
    stall += s->stats().expert_stall_seconds;
    EXPECT_EQ(s->position(),
              static_cast<int64_t>(tokens[&s - &sessions[0]].size()));
  }
  EXPECT_EQ(hits, counting.total.hits);
  EXPECT_EQ(misses, counting.total.misses);
  EXPECT_NEAR(stall, counting.total.stall_seconds(), 1e-12);
}

TEST(BatchStepTest, BadBatchesAreRefusedBeforeAnythingRuns) {
  Loaded l = Load(ModelFamily::kMixtral, 33, "bad");
  ASSERT_NE(l.model, nullptr);
  Session a(*l.model, l.experts.get(), 4), b(*l.model, l.experts.get(), 4);
  BatchStep step(*l.model, l.experts.get());
  std::vector<int32_t> one = {1}, five = {1, 2, 3, 4, 5}, bad = {-1};
  EXPECT_EQ(step.Run({}).code(), absl::StatusCode::kInvalidArgument);
  std::vector<BatchStep::Entry> dup = {{&a, one, true, 1}, {&a, one, true, 1}};
  EXPECT_EQ(step.Run(dup).code(), absl::StatusCode::kInvalidArgument);
  std::vector<BatchStep::Entry> too_long = {{&a, one, true, 1},
                                            {&b, five, true, 2}};
  EXPECT_EQ(step.Run(too_long).code(), absl::StatusCode::kOutOfRange);
  std::vector<BatchStep::Entry> bad_id = {{&a, one, true, 1},
                                          {&b, bad, true, 2}};
  EXPECT_EQ(step.Run(bad_id).code(), absl::StatusCode::kInvalidArgument);
  std::vector<BatchStep::Entry> empty = {{&a, {}, true, 1}};
  EXPECT_EQ(step.Run(empty).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a.position(), 0);
  EXPECT_EQ(b.position(), 0);
}

// Pre-gating hints of a batch are filed under the member that made them.
TEST(BatchStepTest, PregateHintsNameTheirMember) {
  class HintRecorder : public ExpertProvider {
   public:
    explicit HintRecorder(ExpertProvider* inner) : inner_(inner) {}
    absl::StatusOr<AcquiredExperts> Acquire(int layer, absl::Span<const ExpertDemand> d,
                                            bool prefill) override {
      return inner_->Acquire(layer, d, prefill);
    }
    void Release(AcquiredExperts& a) override { inner_->Release(a); }
    void Hint(absl::Span<const ExpertHint> hints) override { requests.push_back(0); }
    void HintFor(uint64_t request, absl::Span<const ExpertHint> hints) override {
      requests.push_back(request);
    }
    ExpertProvider* inner_;
    std::vector<uint64_t> requests;
  };
  Loaded l = Load(ModelFamily::kMixtral, 17, "hints");
  ASSERT_NE(l.model, nullptr);
  HintRecorder rec(l.experts.get());
  Session a(*l.model, &rec, 16), b(*l.model, &rec, 16);
  a.set_pregate_hints(true);
  b.set_pregate_hints(true);
  BatchStep step(*l.model, &rec);
  const std::vector<int32_t> pa = {1, 2, 3}, pb = {4, 5};
  ASSERT_TRUE(step.Run({{&a, pa, true, 10}, {&b, pb, true, 11}}).ok());
  EXPECT_TRUE(rec.requests.empty());  // no hints for prompts
  const int32_t ta = 6, tb = 7;
  ASSERT_TRUE(step.Run({{&a, absl::Span<const int32_t>(&ta, 1), false, 10},
                        {&b, absl::Span<const int32_t>(&tb, 1), false, 11}})
                  .ok());
  ASSERT_FALSE(rec.requests.empty());
  EXPECT_EQ(std::count(rec.requests.begin(), rec.requests.end(), 10u),
            std::count(rec.requests.begin(), rec.requests.end(), 11u));
  EXPECT_EQ(std::count(rec.requests.begin(), rec.requests.end(), 0u), 0);
  // Alone, a session's hints are the provider's current request's.
  rec.requests.clear();
  ASSERT_TRUE(a.Forward(absl::Span<const int32_t>(&tb, 1), false).ok());
  ASSERT_FALSE(rec.requests.empty());
  EXPECT_EQ(std::count(rec.requests.begin(), rec.requests.end(), 0u),
            static_cast<long>(rec.requests.size()));
}

TEST(SplitUsageTest, SharesAddUpExactlyAndFollowTokens) {
  std::mt19937 rng(9);
  for (int trial = 0; trial < 500; ++trial) {
    AcquireUsage u;
    u.hits = static_cast<int32_t>(rng() % 200);
    u.misses = static_cast<int32_t>(rng() % 50);
    u.host = static_cast<int32_t>(rng() % (u.misses + 1));
    u.stall_ns = static_cast<int64_t>(rng() % 100000000);
    std::vector<int64_t> owners(1 + rng() % 16);
    int64_t sum = 0;
    for (size_t i = 0; i < owners.size(); ++i) {
      owners[i] = static_cast<int64_t>(rng() % 40);
      sum += owners[i];
    }
    if (sum == 0) owners[0] = sum = 3;
    std::vector<AcquireUsage> shares = SplitUsage(u, owners);
    ASSERT_EQ(shares.size(), owners.size());
    AcquireUsage total;
    for (size_t i = 0; i < shares.size(); ++i) {
      total += shares[i];
      const double exact = static_cast<double>(u.hits) * owners[i] / sum;
      EXPECT_LT(std::abs(shares[i].hits - exact), 1.0) << trial;
      if (owners[i] == 0) {
        EXPECT_EQ(shares[i].hits + shares[i].misses + shares[i].stall_ns, 0);
      }
    }
    EXPECT_EQ(total.hits, u.hits);
    EXPECT_EQ(total.misses, u.misses);
    EXPECT_EQ(total.host, u.host);
    EXPECT_EQ(total.stall_ns, u.stall_ns);
  }
  // One owner gets everything; equal owners split evenly, earlier first.
  AcquireUsage u{5, 3, 0, 7};
  std::vector<AcquireUsage> one = SplitUsage(u, {4});
  EXPECT_EQ(one[0].hits, 5);
  EXPECT_EQ(one[0].stall_ns, 7);
  std::vector<AcquireUsage> two = SplitUsage(u, {2, 2});
  EXPECT_EQ(two[0].hits, 3);
  EXPECT_EQ(two[1].hits, 2);
}

}  // namespace
}  // namespace moe
