#include "services/cache/eamc_store.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <numeric>
#include <set>
#include <random>

#include "common/file_util.h"
#include "gtest/gtest.h"
#include "services/cache/expert_cache.h"
#include "services/cache/fake_copy_engine.h"
#include "services/cache/moe_infinity_policy.h"
#include "services/cache/synth_trace.h"

namespace moe::cache {
namespace {

constexpr int kLayers = 4;
constexpr int kExperts = 6;

PolicyConfig Config(int layers, int experts, int top_k) {
  PolicyConfig pc;
  pc.num_layers = layers;
  pc.num_experts = experts;
  pc.top_k = top_k;
  pc.capacity = layers * experts / 2;
  pc.expert_bytes = 1e6;
  pc.link_bytes_per_sec = 1e9;
  pc.layer_seconds = 1e-3;
  return pc;
}

std::string TempPath(const std::string& name) {
  const std::string dir = JoinPath(
      ::testing::TempDir(), "eamc_store_test." + std::to_string(::getpid()));
  ::mkdir(dir.c_str(), 0700);
  const std::string p = JoinPath(dir, name);
  ::unlink(p.c_str());
  return p;
}

void WriteRaw(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << bytes;
}

// Feeds `tokens` iterations of request `r` (prefill as one iteration).
void Feed(CachePolicy& p, const trace::TraceRequest& r, int layers,
          int tokens) {
  const int prefill = r.num_prefill_tokens();
  if (prefill > 0) {
    p.OnBeginIteration(1, Phase::kPrefill);
    for (int l = 0; l < layers; ++l) {
      std::map<int32_t, int32_t> counts;
      for (int t = 0; t < prefill; ++t) {
        for (int32_t e : r.experts[t][l]) ++counts[e];
      }
      std::vector<ExpertDemand> d;
      for (auto [e, n] : counts) d.push_back({e, n});
      p.OnRoute(1, l, Phase::kPrefill, d);
    }
  }
  for (int t = prefill; t < std::min(r.num_tokens(), prefill + tokens); ++t) {
    p.OnBeginIteration(1, Phase::kDecode);
    for (int l = 0; l < layers; ++l) {
      std::vector<ExpertDemand> d;
      for (int32_t e : r.experts[t][l]) d.push_back({e, 1});
      p.OnRoute(1, l, Phase::kDecode, d);
    }
  }
}

trace::Trace SmallTrace(int layers, int experts, int requests, uint64_t seed) {
  trace::SynthOptions o;
  o.num_layers = layers;
  o.num_experts = experts;
  o.top_k = 2;
  o.requests = requests;
  o.prefill_tokens = 8;
  o.decode_tokens = 12;
  o.groups = 3;
  o.seed = seed;
  auto t = trace::GenerateSyntheticTrace(o);
  EXPECT_TRUE(t.ok()) << t.status();
  return *t;
}

std::unique_ptr<CachePolicy> Trained(const trace::Trace& t, int requests) {
  const auto& h = t.header;
  auto p =
      *MakePolicy("moe-infinity", Config(h.num_layers, h.num_experts, h.top_k));
  for (int i = 0; i < requests; ++i) {
    p->OnBeginRequest(1);
    Feed(*p, t.requests[i], h.num_layers, 1000);
    p->OnEndRequest(1);
  }
  return p;
}

LearnedState Export(const CachePolicy& p, int layers, int experts) {
  LearnedState s;
  s.num_layers = layers;
  s.num_experts = experts;
  p.ExportLearned(&s);
  return s;
}

// A small valid file's bytes (EAMC + reuse + affinity + popularity sections).
std::string SmallFileBytes() {
  trace::Trace t = SmallTrace(kLayers, kExperts, 4, 11);
  auto p = Trained(t, 4);
  LearnedState s = Export(*p, kLayers, kExperts);
  s.affinity_lags = 1;
  s.affinity.assign(kLayers * kExperts * kExperts, 1.0f);
  s.affinity_from.assign(kLayers * kExperts, 2.0f);
  s.popularity.assign(kLayers * kExperts, 3.0);
  auto bytes = EncodeLearnedState(s);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  return *bytes;
}

TEST(EamcStoreTest, RoundTripPredictsTheSame) {
  trace::Trace t = SmallTrace(8, 16, 30, 5);
  const auto& h = t.header;
  auto trained = Trained(t, 25);
  const std::string path = TempPath("state.eamc");
  ASSERT_TRUE(
      SaveLearnedState(path, Export(*trained, h.num_layers, h.num_experts))
          .ok());
  auto loaded = LoadLearnedState(path, h.num_layers, h.num_experts);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->records.size(), 25u);
  auto fresh =
      *MakePolicy("moe-infinity", Config(h.num_layers, h.num_experts, h.top_k));
  auto cold =
      *MakePolicy("moe-infinity", Config(h.num_layers, h.num_experts, h.top_k));
  fresh->ImportLearned(*loaded);
  // The same unseen request prefix on all three.
  int differ_cold = 0;
  for (auto* p : {trained.get(), fresh.get(), cold.get()}) {
    p->OnBeginRequest(1);
    Feed(*p, t.requests[27], h.num_layers, 5);
  }
  const auto& a = *static_cast<MoeInfinityPolicy&>(*trained).ActivityForTest(1);
  const auto& b = *static_cast<MoeInfinityPolicy&>(*fresh).ActivityForTest(1);
  const auto& c = *static_cast<MoeInfinityPolicy&>(*cold).ActivityForTest(1);
  ASSERT_TRUE(a.has_prediction);
  ASSERT_TRUE(b.has_prediction);
  EXPECT_FALSE(c.has_prediction);  // the test can tell a load from no load
  EXPECT_DOUBLE_EQ(a.confidence, b.confidence);
  for (int l = 0; l < h.num_layers; ++l) {
    for (int e = 0; e < h.num_experts; ++e) {
      EXPECT_EQ(a.Predicted(l, e), b.Predicted(l, e)) << l << "," << e;
      EXPECT_DOUBLE_EQ(trained->RetentionValue({l, e}),
                       fresh->RetentionValue({l, e}));
      differ_cold +=
          trained->RetentionValue({l, e}) != cold->RetentionValue({l, e});
    }
  }
  EXPECT_GT(differ_cold, 0);
}

// A well-formed file (magic, header, checksum) of the given shape whose
// payload is `payload`.
std::string FileWithPayload(uint32_t layers, uint32_t experts, const std::string& payload) {
  auto put = [](std::string* s, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) s->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  };
  std::string out("MOEEAMC", 8);
  put(&out, kEamcFormatVersion, 4);
  put(&out, layers, 4);
  put(&out, experts, 4);
  put(&out, 0, 4);
  put(&out, payload.size(), 8);
  put(&out, Fnv1a64(payload), 8);
  return out + payload;
}

// An affinity section of `lags` and no counts: at 65536 layers x 2^31-1
// experts and 2^15 lags its byte count, 4 lags L E (E + 1), is 0 modulo
// 2^64. The shape is refused before any size is computed, and sizes are
// computed with overflow checks.
TEST(EamcStoreTest, SizesThatWrapAreRejected) {
  std::string section;
  auto put = [&](uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) section.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  };
  put(3, 4);  // affinity
  put(4, 8);
  put(32768, 4);
  const std::string wraps = FileWithPayload(65536, 2147483647, section);
  auto s = DecodeLearnedState(wraps, 65536, 2147483647);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << s.status();
  EXPECT_NE(s.status().message().find("num_experts"), std::string::npos) << s.status();
  EXPECT_EQ(DecodeLearnedState(wraps, -1, 4).status().code(),
            absl::StatusCode::kInvalidArgument);
  // The largest shape allowed, with as many lags as layers, is a size
  // mismatch, not a wrap.
  section.clear();
  put(3, 4);
  put(4, 8);
  put(65536, 4);
  auto big = DecodeLearnedState(FileWithPayload(65536, 65536, section), 65536, 65536);
  EXPECT_EQ(big.status().code(), absl::StatusCode::kDataLoss) << big.status();
}

TEST(EamcStoreTest, EveryTruncationIsRejected) {
  const std::string bytes = SmallFileBytes();
  ASSERT_TRUE(DecodeLearnedState(bytes, kLayers, kExperts).ok());
  for (size_t n = 0; n < bytes.size(); ++n) {
    auto s = DecodeLearnedState(bytes.substr(0, n), kLayers, kExperts);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kDataLoss) << "length " << n;
  }
  // And through the file system for a few lengths.
  const std::string path = TempPath("trunc.eamc");
  for (size_t n : {size_t{0}, size_t{7}, size_t{39}, size_t{40},
                   bytes.size() / 2, bytes.size() - 1}) {
    WriteRaw(path, bytes.substr(0, n));
    EXPECT_EQ(LoadLearnedState(path, kLayers, kExperts).status().code(),
              absl::StatusCode::kDataLoss);
  }
}

TEST(EamcStoreTest, EveryBitFlipIsRejected) {
  const std::string bytes = SmallFileBytes();
  std::mt19937 rng(3);
  for (int i = 0; i < 3000; ++i) {
    std::string b = bytes;
    const size_t at =
        i < 320 ? i / 8 : rng() % b.size();  // all header bits, then random
    b[at] ^= static_cast<char>(1 << (i < 320 ? i % 8 : rng() % 8));
    auto s = DecodeLearnedState(b, kLayers, kExperts);
    EXPECT_FALSE(s.ok()) << "flip at byte " << at;
  }
  // Several flips at once, and garbage.
  for (int i = 0; i < 200; ++i) {
    std::string b = bytes;
    for (int j = 0; j < 1 + i % 7; ++j)
      b[rng() % b.size()] ^= static_cast<char>(1 + rng() % 255);
    if (b == bytes) continue;
    EXPECT_FALSE(DecodeLearnedState(b, kLayers, kExperts).ok());
  }
  std::string garbage(500, '\0');
  for (char& c : garbage) c = static_cast<char>(rng());
  EXPECT_EQ(DecodeLearnedState(garbage, kLayers, kExperts).status().code(),
            absl::StatusCode::kDataLoss);
}

TEST(EamcStoreTest, WrongShapeAndVersionAreRefusedWithClearErrors) {
  const std::string bytes = SmallFileBytes();
  auto s = DecodeLearnedState(bytes, kLayers, kExperts + 1);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.status().message().find("4x6"), std::string::npos) << s.status();
  EXPECT_EQ(DecodeLearnedState(bytes, kLayers + 1, kExperts).status().code(),
            absl::StatusCode::kFailedPrecondition);
  std::string v2 = bytes;
  v2[8] = 2;  // version, little-endian u32 after the magic
  s = DecodeLearnedState(v2, kLayers, kExperts);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.status().message().find("version 2"), std::string::npos)
      << s.status();
}

TEST(EamcStoreTest, SavedFileIsPrivateAndReplacesAtomically) {
  const std::string path = TempPath("mode.eamc");
  WriteRaw(path, "old");
  ::chmod(path.c_str(), 0644);
  LearnedState s;
  s.num_layers = kLayers;
  s.num_experts = kExperts;
  ASSERT_TRUE(SaveLearnedState(path, s).ok());
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto back = LoadLearnedState(path, kLayers, kExperts);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->empty());
  // A 0600 file written elsewhere loads too.
  const std::string other = TempPath("other.eamc");
  WriteRaw(other, SmallFileBytes());
  ::chmod(other.c_str(), 0600);
  EXPECT_TRUE(LoadLearnedState(other, kLayers, kExperts).ok());
  // Saving into a missing directory fails cleanly.
  EXPECT_FALSE(SaveLearnedState(path + ".d/x", s).ok());
}

TEST(EamcStoreTest, StaleTemporaryFromACrashIsIgnoredAndRemoved) {
  const std::string path = TempPath("crash.eamc");
  const std::string good = SmallFileBytes();
  WriteRaw(path, good);
  // A writer that died: its pid no longer exists.
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ::waitpid(child, nullptr, 0);
  const std::string stale = path + ".tmp." + std::to_string(child) + ".0";
  WriteRaw(stale, good.substr(0, 17));
  const std::string mine = path + ".tmp." + std::to_string(::getpid()) + ".99";
  WriteRaw(mine, "in progress");
  auto s = LoadLearnedState(path, kLayers, kExperts);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_FALSE(s->records.empty());
  EXPECT_FALSE(IsRegularFile(stale));
  EXPECT_TRUE(IsRegularFile(mine));  // a live writer's temporary is left alone
  ::unlink(mine.c_str());
  // A temporary without the file itself: still "no file".
  ::unlink(path.c_str());
  WriteRaw(stale, good);
  EXPECT_EQ(LoadLearnedState(path, kLayers, kExperts).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(EamcStoreTest, BadFilesGetErrorsNamingTheFileAndTheProblem) {
  const std::string path = TempPath("named.eamc");
  const std::string good = SmallFileBytes();
  struct Case {
    std::string bytes;
    const char* says;
  };
  std::string flipped = good;
  flipped[good.size() - 3] ^= 0x10;
  for (const Case& c : {Case{good.substr(0, good.size() / 3), "payload size"},
                        Case{good.substr(0, 12), "shorter than its header"},
                        Case{std::string(200, 'x'), "bad magic"},
                        Case{flipped, "checksum"}}) {
    WriteRaw(path, c.bytes);
    auto s = LoadLearnedState(path, kLayers, kExperts);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kDataLoss) << c.says;
    EXPECT_NE(s.status().message().find(path), std::string::npos) << s.status();
    EXPECT_NE(s.status().message().find("corrupt"), std::string::npos) << s.status();
    EXPECT_NE(s.status().message().find(c.says), std::string::npos) << s.status();
  }
}

TEST(EamcStoreTest, TornTemporaryBesideAGoodFileIsNeverRead) {
  // What a SIGKILL in the middle of a save leaves: the previous file intact
  // and a half-written temporary of a dead writer. The load gives the
  // previous file's contents exactly.
  const std::string path = TempPath("torn.eamc");
  const std::string old_bytes = SmallFileBytes();
  ASSERT_TRUE(WriteFileDurably(path, old_bytes).ok());
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ::waitpid(child, nullptr, 0);
  trace::Trace t = SmallTrace(kLayers, kExperts, 9, 4);
  auto newer = EncodeLearnedState(Export(*Trained(t, 9), kLayers, kExperts));
  ASSERT_TRUE(newer.ok());
  const std::string torn = path + ".tmp." + std::to_string(child) + ".3";
  WriteRaw(torn, newer->substr(0, newer->size() - 5));
  auto s = LoadLearnedState(path, kLayers, kExperts);
  ASSERT_TRUE(s.ok()) << s.status();
  auto expected = DecodeLearnedState(old_bytes, kLayers, kExperts);
  ASSERT_TRUE(expected.ok());
  EXPECT_EQ(s->records.size(), expected->records.size());
  auto again = EncodeLearnedState(*s);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, old_bytes);
  EXPECT_FALSE(IsRegularFile(torn));
}

// Drives a cache through a few decode requests.
void Drive(ExpertCache& cache, FakeCopyEngine& engine, const trace::Trace& t,
           int from, int to) {
  for (int r = from; r < to; ++r) {
    cache.BeginRequest(1);
    const auto& req = t.requests[r];
    for (int tok = req.num_prefill_tokens(); tok < req.num_tokens(); ++tok) {
      for (int l = 0; l < t.header.num_layers; ++l) {
        std::vector<ExpertDemand> d;
        for (int32_t e : req.experts[tok][l]) d.push_back({e, 1});
        auto tk = cache.StartAcquire(1, {.layer = l, .demands = d});
        ASSERT_TRUE(tk.ok()) << tk.status();
        while (!*cache.IsReady(*tk))
          engine.AdvanceTo(*engine.NextCompletionTime());
        auto leases = cache.FinishAcquire(*tk);
        ASSERT_TRUE(leases.ok());
        engine.AdvanceTo(engine.now_ns() + 1000000);
        ASSERT_TRUE(cache.Release(1, leases->leases).ok());
      }
    }
    cache.EndRequest(1);
  }
}

std::unique_ptr<ExpertCache> MakeCache(FakeCopyEngine* engine,
                                       const std::string& policy = "moe-infinity") {
  ExpertCacheOptions o;
  o.num_layers = kLayers;
  o.num_experts = kExperts;
  o.top_k = 2;
  o.capacity = 12;
  o.expert_bytes = 1000000;
  o.prefetch = true;
  o.link_bytes_per_sec = 1e9;
  o.layer_seconds = 1e-3;
  return *ExpertCache::Create(
      o, *MakePolicy(policy, Config(kLayers, kExperts, 2)), engine);
}

std::set<ExpertKey> Resident(const ExpertCache& cache) {
  std::set<ExpertKey> keys;
  for (const SlotInfo& s : cache.SlotsForTest()) {
    if (s.state == SlotState::kReady) keys.insert(s.key);
  }
  return keys;
}

void RunLink(FakeCopyEngine& engine) {
  while (auto t = engine.NextCompletionTime()) engine.AdvanceTo(*t);
}

TEST(EamcStoreTest, ExpertCacheSaveLoadState) {
  trace::Trace t = SmallTrace(kLayers, kExperts, 8, 21);
  auto e1 = *FakeCopyEngine::Create({1000000000, 1000000, 0, 0, nullptr});
  auto e2 = *FakeCopyEngine::Create({1000000000, 1000000, 0, 0, nullptr});
  auto a = MakeCache(e1.get());
  auto b = MakeCache(e2.get());
  const std::string pa = TempPath("a.eamc"), pb = TempPath("b.eamc");
  EXPECT_TRUE(b->LoadState(pa).ok());  // missing: OK, empty
  Drive(*a, *e1, t, 0, 6);
  ASSERT_TRUE(a->SaveState(pa).ok());
  ASSERT_TRUE(b->LoadState(pa).ok());
  ASSERT_TRUE(b->SaveState(pb).ok());
  // Everything learned came back: saving again gives the same bytes.
  auto ba = ReadFileToString(pa), bb = ReadFileToString(pb);
  ASSERT_TRUE(ba.ok() && bb.ok());
  EXPECT_GT(ba->size(), 200u);
  EXPECT_EQ(*ba, *bb);
  // A corrupt file: an error to report, and the cache keeps working.
  std::string bad = *ba;
  bad[bad.size() / 2] ^= 0x40;
  WriteRaw(pb, bad);
  EXPECT_EQ(b->LoadState(pb).code(), absl::StatusCode::kDataLoss);
  Drive(*b, *e2, t, 6, 8);
  b->CheckInvariantsForTest();
}

// static-popular's counts persist; a restarted cache places the most
// popular experts before any traffic (the first wave while a layer's demand
// still fits, 12 - 6 slots, the rest at the next acquire). static-layers
// places its layers with nothing learned.
TEST(EamcStoreTest, StaticPlacementsPersistAndWarmUpBeforeTheFirstToken) {
  trace::Trace t = SmallTrace(kLayers, kExperts, 8, 33);
  auto e1 = *FakeCopyEngine::Create({1000000000, 1000000, 0, 0, nullptr});
  auto e2 = *FakeCopyEngine::Create({1000000000, 1000000, 0, 0, nullptr});
  auto a = MakeCache(e1.get(), "static-popular");
  Drive(*a, *e1, t, 0, 6);
  const std::string pa = TempPath("popular.eamc");
  ASSERT_TRUE(a->SaveState(pa).ok());
  auto saved = LoadLearnedState(pa, kLayers, kExperts);
  ASSERT_TRUE(saved.ok()) << saved.status();
  ASSERT_EQ(saved->popularity.size(), static_cast<size_t>(kLayers * kExperts));
  // The most popular cells, best first (ties by cell order, as WarmSet).
  std::vector<int> cells(kLayers * kExperts);
  std::iota(cells.begin(), cells.end(), 0);
  std::stable_sort(cells.begin(), cells.end(), [&](int x, int y) {
    return saved->popularity[x] > saved->popularity[y];
  });
  ASSERT_GT(saved->popularity[cells[5]], 0);
  std::set<ExpertKey> top6;
  for (int i = 0; i < 6; ++i) top6.insert({cells[i] / kExperts, cells[i] % kExperts});

  auto b = MakeCache(e2.get(), "static-popular");
  EXPECT_EQ(b->WarmUp(), 0);  // nothing learned yet: nothing to place
  ASSERT_TRUE(b->LoadState(pa).ok());
  EXPECT_EQ(b->WarmUp(), 12);
  RunLink(*e2);
  EXPECT_EQ(Resident(*b), top6);
  b->CheckInvariantsForTest();

  auto e3 = *FakeCopyEngine::Create({1000000000, 1000000, 0, 0, nullptr});
  auto c = MakeCache(e3.get(), "static-layers");
  EXPECT_EQ(c->WarmUp(), 12);  // 12 slots / 6 experts: layers 0 and 1
  RunLink(*e3);
  for (const ExpertKey& k : Resident(*c)) EXPECT_EQ(k.layer, 0) << k.ToString();
  EXPECT_EQ(Resident(*c).size(), 6u);
  c->CheckInvariantsForTest();
}

}  // namespace
}  // namespace moe::cache
