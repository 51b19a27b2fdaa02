#include "services/cache/simulator.h"

#include <algorithm>
#include <limits>
#include <list>
#include <random>
#include <set>

#include "gtest/gtest.h"
#include "services/cache/policy.h"
#include "services/cache/synth_trace.h"

namespace moe::cache {
namespace {

using trace::Phase;
using trace::Trace;

Trace RandomTrace(uint64_t seed, int layers, int experts, int top_k, int requests) {
  std::mt19937_64 rng(seed);
  Trace t;
  t.header = {"random", layers, experts, top_k};
  for (int r = 0; r < requests; ++r) {
    trace::TraceRequest req;
    req.id = std::to_string(r);
    const int prefill = static_cast<int>(rng() % 3);
    const int decode = 1 + static_cast<int>(rng() % 6);
    for (int tok = 0; tok < prefill + decode; ++tok) {
      req.phase.push_back(tok < prefill ? Phase::kPrefill : Phase::kDecode);
      std::vector<std::vector<int32_t>> ls(layers);
      for (int l = 0; l < layers; ++l) {
        // Skewed towards low ids so that there is reuse to exploit.
        while (static_cast<int>(ls[l].size()) < top_k) {
          int e = static_cast<int>((rng() % experts) * (rng() % experts) / experts);
          if (std::find(ls[l].begin(), ls[l].end(), e) == ls[l].end()) ls[l].push_back(e);
        }
      }
      req.experts.push_back(ls);
    }
    t.requests.push_back(req);
  }
  return t;
}

int KeyId(const ExpertKey& k) { return k.layer * 1000 + k.expert; }

// Timing-free LRU on the flattened sequence; the current group is pinned.
uint64_t BruteLruMisses(const std::vector<std::vector<ExpertKey>>& groups, int capacity) {
  std::list<int> lru;  // front = most recent
  uint64_t misses = 0;
  for (const auto& g : groups) {
    std::set<int> cur;
    for (const auto& k : g) cur.insert(KeyId(k));
    for (const auto& k : g) {
      const int id = KeyId(k);
      auto it = std::find(lru.begin(), lru.end(), id);
      if (it != lru.end()) {
        lru.erase(it);
      } else {
        ++misses;
        if (static_cast<int>(lru.size()) >= capacity) {
          for (auto v = lru.rbegin(); v != lru.rend(); ++v) {
            if (!cur.count(*v)) {
              lru.erase(std::next(v).base());
              break;
            }
          }
        }
      }
      lru.push_front(id);
    }
  }
  return misses;
}

// Timing-free Belady: evict the resident key (not in the current group)
// whose next use is farthest.
uint64_t BruteBeladyMisses(const std::vector<std::vector<ExpertKey>>& groups, int capacity) {
  std::set<int> resident;
  uint64_t misses = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    std::set<int> cur;
    for (const auto& k : groups[g]) cur.insert(KeyId(k));
    for (const auto& k : groups[g]) {
      const int id = KeyId(k);
      if (resident.count(id)) continue;
      ++misses;
      if (static_cast<int>(resident.size()) >= capacity) {
        int victim = -1;
        size_t far = 0;
        for (int r : resident) {
          if (cur.count(r)) continue;
          size_t next = std::numeric_limits<size_t>::max();
          for (size_t h = g + 1; h < groups.size(); ++h) {
            bool used = false;
            for (const auto& x : groups[h]) used |= KeyId(x) == r;
            if (used) {
              next = h;
              break;
            }
          }
          if (victim < 0 || next > far) victim = r, far = next;
        }
        resident.erase(victim);
      }
      resident.insert(id);
    }
  }
  return misses;
}

TEST(SimulatorTest, LruAndBeladyMatchBruteForce) {
  for (uint64_t seed : {1, 2, 3}) {
    Trace t = RandomTrace(seed, 3, 6, 2, 6);
    const auto groups = FlattenAccessGroups(t, 1);
    for (int capacity : {6, 8, 11}) {
      SimOptions o;
      o.capacity = capacity;
      auto lru = Simulate(t, "lru", o);
      auto bel = Simulate(t, "belady", o);
      ASSERT_TRUE(lru.ok() && bel.ok());
      EXPECT_EQ(lru->decode.misses + lru->prefill.misses, BruteLruMisses(groups, capacity))
          << "seed " << seed << " capacity " << capacity;
      EXPECT_EQ(bel->decode.misses + bel->prefill.misses, BruteBeladyMisses(groups, capacity))
          << "seed " << seed << " capacity " << capacity;
    }
  }
}

TEST(SimulatorTest, BeladyNeverMissesMoreThanDemandPolicies) {
  for (uint64_t seed = 10; seed < 16; ++seed) {
    Trace t = RandomTrace(seed, 4, 8, 2, 5);
    for (int capacity : {8, 12, 20}) {
      SimOptions o;
      o.capacity = capacity;
      auto bel = Simulate(t, "belady", o);
      ASSERT_TRUE(bel.ok());
      const uint64_t bm = bel->decode.misses + bel->prefill.misses;
      for (const auto& p : OnlinePolicyNames()) {
        auto r = Simulate(t, p, o);
        ASSERT_TRUE(r.ok()) << p << ": " << r.status();
        EXPECT_LE(bm, r->decode.misses + r->prefill.misses) << p << " seed " << seed;
      }
    }
  }
}

// One request, three decode tokens, L=2, E=2, top-1, capacity 2, 1 ms per
// expert transfer, 0.5 ms per layer (worked out in the comments).
TEST(SimulatorTest, ClockArithmeticOnAThreeTokenTrace) {
  Trace t;
  t.header = {"hand", 2, 2, 1};
  trace::TraceRequest r;
  r.phase = {Phase::kDecode, Phase::kDecode, Phase::kDecode};
  r.experts = {{{0}, {0}}, {{1}, {0}}, {{1}, {1}}};
  t.requests.push_back(r);
  SimOptions o;
  o.capacity = 2;
  o.link = LinkModel{1.0, 1.0, 0.5, 1.0};  // 1 MB, 1 GB/s -> 1 ms; 0.5 ms/layer
  auto lru = Simulate(t, "lru", o);
  auto bel = Simulate(t, "belady", o);
  ASSERT_TRUE(lru.ok() && bel.ok());
  // tok0: L0 miss [0,1] compute ->1.5; L1 miss [1.5,2.5] ->3.0
  // tok1: L0 miss (evict L0/E0) [3,4] ->4.5; L1 hit ->5.0
  // tok2: L0 hit ->5.5; L1 miss [5.5,6.5] ->7.0
  EXPECT_EQ(lru->decode.misses, 4u);
  EXPECT_EQ(lru->decode.hits, 2u);
  EXPECT_NEAR(lru->decode.time_ms, 7.0, 1e-9);
  EXPECT_NEAR(lru->decode.stall_ms, 4.0, 1e-9);
  EXPECT_EQ(lru->decode.bytes_moved, 4000000u);
  auto j = ReportJson(t.header, o, *lru, *bel);
  EXPECT_NEAR(j["tpot_ms"].get<double>(), 7.0 / 3, 1e-9);
  EXPECT_NEAR(j["stall_ms_per_token"].get<double>(), 4.0 / 3, 1e-9);
  EXPECT_NEAR(j["hit_rate"].get<double>(), 2.0 / 6, 1e-9);
  // floor = max(2 x 0.5, 4 Belady misses / 3 tokens x 1 ms)
  EXPECT_NEAR(j["floor_tpot_ms"].get<double>(), 4.0 / 3, 1e-9);
  EXPECT_NEAR(j["tpot_over_floor"].get<double>(), 1.75, 1e-9);
  EXPECT_EQ(j["policy"], "lru");
  EXPECT_EQ(j["capacity"], 2);
  EXPECT_TRUE(j["prefill"].contains("hit_rate"));
}

TEST(SimulatorTest, PrefetchRunsForEveryPolicyAndAccountsConsistently) {
  trace::SynthOptions so;
  so.num_layers = 8;
  so.num_experts = 8;
  so.requests = 6;
  so.decode_tokens = 24;
  so.prefill_tokens = 8;
  so.hint_accuracy = 0.7;
  auto t = trace::GenerateSyntheticTrace(so);
  ASSERT_TRUE(t.ok());
  for (const auto& p : OnlinePolicyNames()) {
    SimOptions o;
    o.capacity = 16;
    o.prefetch = true;
    auto r = Simulate(*t, p, o);
    ASSERT_TRUE(r.ok()) << p << ": " << r.status();
    EXPECT_LE(r->decode.prefetches_used, r->decode.prefetches_issued) << p;
    EXPECT_EQ(r->decode.hits + r->decode.misses,
              static_cast<uint64_t>(r->decode.iterations) * so.num_layers * so.top_k);
    EXPECT_GT(r->decode.prefetches_issued, 0u) << p;  // hints make candidates
  }
}

// Misses served on the host (Mixtral-size experts: a copy over 25 GB/s costs
// 13.4 ms, reading one at 60 GB/s 5.6 ms): host mode never stalls and runs
// every miss there; auto runs decode misses on the host, fetches for a long
// prefill's busy experts (their FLOPs grow with the tokens), and beats
// fetch-only on decode
// without losing on the prefill.
TEST(SimulatorTest, MissModesFollowTheCostModel) {
  trace::SynthOptions so;
  so.num_layers = 8;
  so.num_experts = 8;
  so.requests = 4;
  so.prefill_tokens = 256;
  so.decode_tokens = 40;
  auto t = trace::GenerateSyntheticTrace(so);
  ASSERT_TRUE(t.ok());
  SimOptions o;
  o.capacity = 16;
  o.link.expert_mb = 336;
  o.link.link_gbps = 25;
  o.link.layer_ms = 1;
  o.host_gbps = 60;
  o.host_gflops = 500;
  for (const std::string policy : {"lru-layer", "moe-infinity"}) {
    SCOPED_TRACE(policy);
    o.miss_mode = MissMode::kFetch;
    auto fetch = Simulate(*t, policy, o);
    o.miss_mode = MissMode::kHost;
    auto host = Simulate(*t, policy, o);
    o.miss_mode = MissMode::kAuto;
    auto automatic = Simulate(*t, policy, o);
    ASSERT_TRUE(fetch.ok() && host.ok() && automatic.ok());
    EXPECT_EQ(fetch->decode.host_runs, 0u);
    EXPECT_EQ(host->decode.stall_ms, 0.0);
    EXPECT_EQ(host->decode.host_runs, host->decode.misses);
    EXPECT_GT(automatic->decode.host_runs, 0u);
    // A long prefill routes many tokens to most experts: those are copied
    // (their FLOPs grow with the tokens); only lightly used ones run on the host.
    EXPECT_LT(automatic->prefill.host_runs, automatic->prefill.misses / 2);
    const double tokens = static_cast<double>(fetch->decode.iterations);
    const double tpot_fetch = fetch->decode.time_ms / tokens;
    const double tpot_auto = automatic->decode.time_ms / tokens;
    EXPECT_LT(tpot_auto, 0.6 * tpot_fetch) << tpot_auto << " vs " << tpot_fetch;
    EXPECT_LE(automatic->prefill.time_ms, fetch->prefill.time_ms * 1.0001);
    // The same demands were served either way.
    EXPECT_EQ(automatic->decode.hits + automatic->decode.misses,
              fetch->decode.hits + fetch->decode.misses);
  }
}

// 4 requests x 40 decode tokens, no prompt, 8 layers x 8 experts.
trace::SynthOptions DecodeOnlySynth() {
  trace::SynthOptions so;
  so.num_layers = 8;
  so.num_experts = 8;
  so.requests = 4;
  so.prefill_tokens = 0;
  so.decode_tokens = 40;
  return so;
}

// Mixtral-size experts (336 MB) over 25 GB/s, 1 ms per layer.
SimOptions MixtralLink(int capacity) {
  SimOptions o;
  o.capacity = capacity;
  o.link.expert_mb = 336;
  o.link.link_gbps = 25;
  o.link.layer_ms = 1;
  return o;
}

// The oracle placement knows the trace's counts: moectl validates every run
// first (ValidateSimulation) and must accept it; placed before the first
// token (WarmUp), with misses on the host it is never behind the online
// static-popular on the first pass.
TEST(SimulatorTest, OraclePopularityPlacesBeforeTheFirstToken) {
  auto t = trace::GenerateSyntheticTrace(DecodeOnlySynth());
  ASSERT_TRUE(t.ok());
  SimOptions o = MixtralLink(/*capacity=*/24);
  o.miss_mode = MissMode::kHost;
  EXPECT_TRUE(ValidateSimulation(t->header, "static-popular-oracle", o).ok());
  auto oracle = Simulate(*t, "static-popular-oracle", o);
  auto online = Simulate(*t, "static-popular", o);
  ASSERT_TRUE(oracle.ok()) << oracle.status();
  ASSERT_TRUE(online.ok()) << online.status();
  EXPECT_LE(oracle->decode.host_runs, online->decode.host_runs);
  EXPECT_LT(oracle->decode.host_runs, oracle->decode.hits + oracle->decode.misses);
}

// The oracle sees the trace: after layer l of an iteration it proposes
// exactly the experts of that iteration's later layers, and admits a copy
// behind only when the key is used again before its victim.
TEST(SimulatorTest, OracleProposesExactlyTheRestOfTheIteration) {
  Trace t = RandomTrace(7, /*layers=*/4, /*experts=*/6, /*top_k=*/2, /*requests=*/3);
  const auto groups = FlattenAccessGroups(t, /*passes=*/1, /*batch=*/1);
  PolicyConfig pc;
  pc.num_layers = 4;
  pc.num_experts = 6;
  pc.top_k = 2;
  pc.capacity = 8;
  auto oracle = MakeOraclePolicy(groups, pc);
  EXPECT_EQ(oracle->name(), "oracle");
  EXPECT_EQ(oracle->PrefetchDistance(RequestOwner{1, 0}), 3);
  const RequestOwner owner{1, 0};
  // Walk the first two iterations; after layer l, proposals = groups of
  // layers l+1..3 of the same iteration.
  for (size_t g = 0; g < 8; ++g) {
    const int layer = static_cast<int>(g % 4);
    std::vector<ExpertDemand> demands;
    for (const ExpertKey& k : groups[g]) demands.push_back({k.expert, 1});
    oracle->OnRoute(owner, layer, Phase::kDecode, demands);
    std::vector<ExpertHint> got;
    oracle->ProposePrefetch(owner, layer, &got);
    std::vector<std::pair<int, int>> want, have;
    for (int l = layer + 1; l < 4; ++l) {
      for (const ExpertKey& k : groups[g + (l - layer)]) want.emplace_back(k.layer, k.expert);
    }
    for (const ExpertHint& h : got) {
      have.emplace_back(h.layer, h.expert);
      EXPECT_EQ(h.probability, 1.0f);
    }
    EXPECT_EQ(have, want) << "group " << g;
  }
  // Now at group 7 (iteration 1, layer 3). A key never used again is not
  // worth a copy; one used at group 8 beats one used later (or never).
  const ExpertKey soon = groups[8][0];
  EXPECT_TRUE(oracle->AdmitBehind(soon, nullptr));
  for (int e = 0; e < 6; ++e) {
    const ExpertKey other{soon.layer, e};
    if (e == soon.expert) continue;
    bool in_next = false;
    for (const ExpertKey& k : groups[8]) in_next |= k == other;
    if (in_next) continue;
    EXPECT_TRUE(oracle->AdmitBehind(soon, &other)) << e;
    EXPECT_FALSE(oracle->AdmitBehind(other, &soon)) << e;
  }
  // Plain belady keeps its demand-only behaviour.
  auto belady = MakeBeladyPolicy(groups, pc);
  std::vector<ExpertHint> none;
  belady->ProposePrefetch(owner, 0, &none);
  EXPECT_TRUE(none.empty());
}

// With host execution the oracle's foresight (Belady's victims, copies
// behind only of keys used before their victim) beats every online policy's
// host runs and decode time on a synthetic Mixtral-like trace, and moectl
// accepts it. Its in-iteration prefetches are exact but can land late (a
// 336 MB copy takes 13 layers of 1 ms): with prefetch on it only has to
// issue them.
TEST(SimulatorTest, OracleBoundsTheOnlinePoliciesUnderAuto) {
  auto t = trace::GenerateSyntheticTrace(DecodeOnlySynth());
  ASSERT_TRUE(t.ok());
  SimOptions o = MixtralLink(/*capacity=*/24);
  o.miss_mode = MissMode::kAuto;
  o.host_gbps = 60;
  EXPECT_TRUE(ValidateSimulation(t->header, "oracle", o).ok());
  auto oracle = Simulate(*t, "oracle", o);
  ASSERT_TRUE(oracle.ok()) << oracle.status();
  for (const std::string policy :
       {"lru", "lfu", "lru-layer", "minvisit", "moe-infinity", "static-popular"}) {
    auto r = Simulate(*t, policy, o);
    ASSERT_TRUE(r.ok()) << policy << ": " << r.status();
    EXPECT_LT(oracle->decode.host_runs, r->decode.host_runs) << policy;
    EXPECT_LT(oracle->decode.time_ms, r->decode.time_ms) << policy;
  }
  o.prefetch = true;
  auto prefetching = Simulate(*t, "oracle", o);
  ASSERT_TRUE(prefetching.ok()) << prefetching.status();
  EXPECT_GT(prefetching->decode.prefetches_issued, oracle->decode.prefetches_issued);
}

// moe-infinity matches each iteration's prediction only when a victim or a
// prefetch reads it (lazy_prediction, the default): the replay must be the
// one of matching at every iteration, hit for hit, whatever the batch, the
// prefetch or the mode, with requests ending (the EAMC changing) on the way.
TEST(SimulatorTest, LazyPredictionReplaysAsEagerMatching) {
  trace::SynthOptions so;
  so.num_layers = 8;
  so.num_experts = 8;
  so.requests = 16;
  so.decode_tokens = 20;
  so.prefill_tokens = 6;
  so.hint_accuracy = 0.7;
  auto t = trace::GenerateSyntheticTrace(so);
  ASSERT_TRUE(t.ok());
  int compared = 0;
  for (const std::string policy : {"moe-infinity", "moe-infinity-paper"}) {
    for (const int batch : {1, 4}) {
      for (const bool prefetch : {false, true}) {
        SCOPED_TRACE(policy + " batch " + std::to_string(batch) +
                     (prefetch ? " prefetch" : ""));
        SimOptions o;
        o.capacity = 20;
        o.batch = batch;
        o.prefetch = prefetch;
        auto lazy = Simulate(*t, policy, o);
        auto eager = Simulate(*t, policy + ":lazy_prediction=0", o);
        ASSERT_TRUE(lazy.ok() && eager.ok()) << lazy.status() << eager.status();
        for (const bool decode : {true, false}) {
          const PhaseResult& a = decode ? lazy->decode : lazy->prefill;
          const PhaseResult& b = decode ? eager->decode : eager->prefill;
          EXPECT_EQ(a.hits, b.hits);
          EXPECT_EQ(a.misses, b.misses);
          EXPECT_EQ(a.prefetches_issued, b.prefetches_issued);
          EXPECT_EQ(a.prefetches_used, b.prefetches_used);
          EXPECT_EQ(a.stall_ms, b.stall_ms);
        }
        ++compared;
      }
    }
  }
  EXPECT_EQ(compared, 8);
}

TEST(SimulatorTest, RejectsBadOptions) {
  Trace t = RandomTrace(1, 2, 4, 1, 1);
  SimOptions o;
  o.capacity = 3;  // below one layer's experts
  EXPECT_EQ(Simulate(t, "lru", o).status().code(), absl::StatusCode::kInvalidArgument);
  o.capacity = 4;
  EXPECT_EQ(Simulate(t, "nope", o).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(CapacityFromFraction(t.header, 0).ok());
  EXPECT_EQ(*CapacityFromFraction(t.header, 0.5), 4);
}

}  // namespace
// Issue 14: --batch N replays the requests N at a time; each step's layer is
// one acquire for the union of its members' experts.
TEST(SimulatorTest, BatchedReplayAcquiresTheUnionOncePerStep) {
  // Two one-token-prompt requests, decoding 2 and 1 tokens; 1 layer, top-1.
  Trace t;
  t.header = {"hand", 1, 4, 1};
  trace::TraceRequest a, b;
  a.phase = {Phase::kPrefill, Phase::kDecode, Phase::kDecode};
  a.experts = {{{0}}, {{1}}, {{1}}};
  b.phase = {Phase::kPrefill, Phase::kDecode};
  b.experts = {{{0}}, {{2}}};
  t.requests = {a, b};
  // Steps: [a prefill + b prefill] -> {0}; [a, b decode] -> {1, 2};
  // [a decode] -> {1}.
  const auto groups = FlattenAccessGroups(t, 1, 2);
  ASSERT_EQ(groups.size(), 3u);
  EXPECT_EQ(groups[0].size(), 1u);
  ASSERT_EQ(groups[1].size(), 2u);
  EXPECT_EQ(groups[1][0].expert, 1);
  EXPECT_EQ(groups[1][1].expert, 2);
  ASSERT_EQ(groups[2].size(), 1u);
  EXPECT_EQ(groups[2][0].expert, 1);
  SimOptions o;
  o.capacity = 4;
  o.batch = 2;
  o.link = LinkModel{1.0, 1.0, 0.5, 1.0};  // 1 ms per expert, 0.5 ms per layer
  auto lru = Simulate(t, "lru", o);
  auto bel = Simulate(t, "belady", o);
  ASSERT_TRUE(lru.ok() && bel.ok()) << lru.status() << bel.status();
  // Prefill step: 1 acquire, 1 miss (expert 0 serves both prompts).
  EXPECT_EQ(lru->prefill.iterations, 1u);
  EXPECT_EQ(lru->prefill.tokens, 2u);
  EXPECT_EQ(lru->prefill.misses, 1u);
  // Decode: steps {1,2} (2 misses, 2 ms + 0.5) and {1} (hit, 0.5).
  EXPECT_EQ(lru->decode.iterations, 2u);
  EXPECT_EQ(lru->decode.tokens, 3u);
  EXPECT_EQ(lru->decode.misses, 2u);
  EXPECT_EQ(lru->decode.hits, 1u);
  EXPECT_NEAR(lru->decode.time_ms, 3.0, 1e-9);
  auto j = ReportJson(t.header, o, *lru, *bel);
  EXPECT_EQ(j["batch"], 2);
  EXPECT_EQ(j["tokens"], 3u);
  EXPECT_EQ(j["steps"], 2u);
  EXPECT_NEAR(j["tpot_ms"].get<double>(), 1.5, 1e-9);              // per step
  EXPECT_NEAR(j["stall_ms_per_token"].get<double>(), 2.0 / 3, 1e-9);  // per token
  EXPECT_NEAR(j["bytes_per_token"].get<double>(), 2e6 / 3, 1e-6);
  EXPECT_NEAR(j["tokens_per_s"].get<double>(), 1000.0, 1e-6);

  // On a larger trace: every iteration is replayed once (steps with a
  // prefill member count as prefill), in fewer steps, and Belady stays the
  // floor. (Bytes per token need not fall: requests with their own working
  // sets compete for the slots, see docs/benchmarks.md.)
  trace::SynthOptions so;
  so.num_layers = 8;
  so.num_experts = 8;
  so.requests = 12;
  so.decode_tokens = 16;
  so.prefill_tokens = 4;
  auto st = trace::GenerateSyntheticTrace(so);
  ASSERT_TRUE(st.ok());
  SimOptions one;
  one.capacity = 24;
  auto alone = Simulate(*st, "lru", one);
  SimOptions eight = one;
  eight.batch = 8;
  auto batched = Simulate(*st, "lru", eight);
  auto batched_bel = Simulate(*st, "belady", eight);
  ASSERT_TRUE(alone.ok() && batched.ok() && batched_bel.ok());
  EXPECT_EQ(batched->decode.tokens + batched->prefill.tokens,
            alone->decode.iterations + alone->prefill.iterations);
  EXPECT_LT(batched->decode.iterations + batched->prefill.iterations,
            alone->decode.iterations + alone->prefill.iterations);
  EXPECT_LE(batched_bel->decode.misses + batched_bel->prefill.misses,
            batched->decode.misses + batched->prefill.misses);
  // Members only change per-request state: a policy that keeps none (lru)
  // replays the same with or without them; moe-infinity's matrices differ.
  SimOptions lead_only = eight;
  lead_only.batch_members = false;
  auto batched_lead = Simulate(*st, "lru", lead_only);
  ASSERT_TRUE(batched_lead.ok());
  EXPECT_EQ(batched_lead->decode.misses, batched->decode.misses);
  EXPECT_EQ(batched_lead->prefill.misses, batched->prefill.misses);
  EXPECT_EQ(batched_lead->decode.iterations, batched->decode.iterations);
  EXPECT_EQ(ReportJson(st->header, lead_only, *batched_lead, *batched_bel)["batch_members"],
            false);
  SimOptions bad = one;
  bad.batch = 0;
  EXPECT_EQ(Simulate(*st, "lru", bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad.batch = kMaxSimBatch + 1;
  EXPECT_EQ(Simulate(*st, "lru", bad).status().code(), absl::StatusCode::kInvalidArgument);
}

// A layer leased in parts (SimOptions::lease_part, as moe-worker
// --lease-part) replayed on uniform routing, 16 requests batched through a
// cache of half the model (the transfer-bound benchmark's shape): every
// demand is still served once, and misses fall (the whole union no longer
// holds its slots at once). Belady stays the whole-layer optimum.
TEST(SimulatorTest, LayersInPartsServeEveryDemandWithFewerMisses) {
  std::mt19937_64 rng(29);
  Trace t;
  t.header = {"uniform", 4, 8, 2};
  for (int r = 0; r < 32; ++r) {
    trace::TraceRequest req;
    req.id = std::to_string(r);
    for (int tok = 0; tok < 9; ++tok) {
      req.phase.push_back(tok == 0 ? Phase::kPrefill : Phase::kDecode);
      std::vector<std::vector<int32_t>> ls(4);
      for (auto& l : ls) {
        while (l.size() < 2) {
          const int e = static_cast<int>(rng() % 8);
          if (std::find(l.begin(), l.end(), e) == l.end()) l.push_back(e);
        }
      }
      req.experts.push_back(ls);
    }
    t.requests.push_back(req);
  }
  SimOptions whole;
  whole.capacity = 16;
  whole.batch = 16;
  whole.link = LinkModel{1.0, 1.0, 0.2, 1.0};
  SimOptions parts = whole;
  parts.lease_part = 1;
  auto w = Simulate(t, "moe-infinity", whole);
  auto p = Simulate(t, "moe-infinity", parts);
  ASSERT_TRUE(w.ok() && p.ok()) << w.status() << p.status();
  EXPECT_EQ(p->decode.hits + p->decode.misses, w->decode.hits + w->decode.misses);
  EXPECT_EQ(p->prefill.hits + p->prefill.misses, w->prefill.hits + w->prefill.misses);
  EXPECT_EQ(p->decode.iterations, w->decode.iterations);
  EXPECT_LT(p->decode.misses, w->decode.misses * 9 / 10)
      << "parts " << p->decode.misses << " whole " << w->decode.misses;
  RecordProperty("decode_misses_whole", std::to_string(w->decode.misses));
  RecordProperty("decode_misses_parts", std::to_string(p->decode.misses));
  auto bw = Simulate(t, "belady", whole);
  auto bp = Simulate(t, "belady", parts);
  ASSERT_TRUE(bw.ok() && bp.ok());
  EXPECT_EQ(bp->decode.misses, bw->decode.misses);
  // Out of range.
  parts.lease_part = 9;
  EXPECT_EQ(Simulate(t, "lru", parts).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace moe::cache
