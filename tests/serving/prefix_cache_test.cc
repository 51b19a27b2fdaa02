// serving::PrefixCache: what it finds (whole blocks, never the whole
// prompt, tokens compared), what it keeps (whole blocks of what a session
// ran), and its memory bound (least recently used first, nothing larger
// than the bound, superseded entries dropped).
#include "services/serving/prefix_cache.h"

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

namespace moe::serving {
namespace {

class PrefixCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MakeModelOptions o = TinyPreset(ModelFamily::kMixtral);
    const std::string dir = absl::StrCat(::testing::TempDir(), "/prefix_cache_model");
    ASSERT_TRUE(MakeModel(o, dir).ok());
    auto backend = CreateBackend("cpu");
    ASSERT_TRUE(backend.ok());
    backend_ = std::move(*backend);
    auto model = MoeModel::Load(dir, backend_.get());
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(*model);
    auto experts = InMemoryExpertProvider::Create(*model_);
    ASSERT_TRUE(experts.ok());
    experts_ = std::move(*experts);
    per_position_ = Session::KvCacheBytes(*model_, 1);
  }

  std::vector<int32_t> Tokens(int n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(model_->config().vocab_size) - 1);
    std::vector<int32_t> t(n);
    for (int32_t& x : t) x = tok(rng);
    return t;
  }

  // A session that ran `tokens`.
  std::unique_ptr<Session> Ran(const std::vector<int32_t>& tokens) {
    auto s = std::make_unique<Session>(*model_, experts_.get(), 64);
    EXPECT_TRUE(s->Forward(tokens, /*prefill=*/true).ok());
    return s;
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<MoeModel> model_;
  std::unique_ptr<InMemoryExpertProvider> experts_;
  int64_t per_position_ = 0;
};

TEST_F(PrefixCacheTest, OffKeepsAndFindsNothing) {
  PrefixCache cache(0, 4);
  const std::vector<int32_t> t = Tokens(14, 1);
  EXPECT_TRUE(cache.Insert(t, *Ran(t)).ok());
  EXPECT_FALSE(cache.Lookup(t).has_value());
  EXPECT_EQ(cache.entries(), 0);
  EXPECT_EQ(cache.bytes(), 0);
}

TEST_F(PrefixCacheTest, FindsTheLongestWholeBlocksAndLeavesATokenToRun) {
  PrefixCache cache(int64_t{64} << 20, 4);
  const std::vector<int32_t> t = Tokens(14, 2);
  std::unique_ptr<Session> s = Ran(t);
  ASSERT_TRUE(cache.Insert(t, *s).ok());  // 14 ran: 3 whole blocks kept
  const std::vector<int32_t> ran(t.begin(), t.begin() + 13);
  EXPECT_EQ(cache.entries(), 1);
  EXPECT_EQ(cache.bytes(), 12 * per_position_);

  auto positions = [&](const std::vector<int32_t>& prompt) {
    std::optional<PrefixCache::Hit> hit = cache.Lookup(prompt);
    if (!hit.has_value()) return int64_t{0};
    EXPECT_GE(hit->snapshot->positions, hit->positions);
    return hit->positions;
  };
  EXPECT_EQ(positions(t), 12);
  EXPECT_EQ(positions(ran), 12);  // 13 tokens: 12 leave one
  EXPECT_EQ(positions(std::vector<int32_t>(t.begin(), t.begin() + 12)), 8);  // never all
  EXPECT_EQ(positions(std::vector<int32_t>(t.begin(), t.begin() + 5)), 4);
  EXPECT_EQ(positions(std::vector<int32_t>(t.begin(), t.begin() + 4)), 0);
  std::vector<int32_t> branch(t.begin(), t.begin() + 9);
  branch.push_back(t[9] == 0 ? 1 : 0);  // differs inside the third block
  branch.push_back(7);
  EXPECT_EQ(positions(branch), 8);
  std::vector<int32_t> other = t;
  other[0] = t[0] == 0 ? 1 : 0;  // differs in the first token
  EXPECT_EQ(positions(other), 0);
  EXPECT_EQ(positions({}), 0);
  EXPECT_EQ(positions({t[0]}), 0);
}

TEST_F(PrefixCacheTest, BoundedLeastRecentlyUsedFirst) {
  // Room for 20 positions: two entries of 8, not three.
  PrefixCache cache(20 * per_position_, 4);
  const std::vector<int32_t> a = Tokens(9, 3), b = Tokens(9, 4), c = Tokens(9, 5),
                             d = Tokens(9, 6);
  ASSERT_TRUE(cache.Insert(a, *Ran(a)).ok());
  ASSERT_TRUE(cache.Insert(b, *Ran(b)).ok());
  EXPECT_EQ(cache.bytes(), 16 * per_position_);
  ASSERT_TRUE(cache.Insert(c, *Ran(c)).ok());  // a goes
  EXPECT_EQ(cache.entries(), 2);
  EXPECT_LE(cache.bytes(), 20 * per_position_);
  EXPECT_FALSE(cache.Lookup(a).has_value());
  EXPECT_TRUE(cache.Lookup(b).has_value());  // b is now the most recently used
  ASSERT_TRUE(cache.Insert(d, *Ran(d)).ok());  // so c goes
  EXPECT_TRUE(cache.Lookup(b).has_value());
  EXPECT_FALSE(cache.Lookup(c).has_value());
  EXPECT_TRUE(cache.Lookup(d).has_value());
  // Larger than the whole bound: not kept, nothing evicted for it.
  const std::vector<int32_t> big = Tokens(24, 7);
  ASSERT_TRUE(cache.Insert(big, *Ran(big)).ok());
  EXPECT_FALSE(cache.Lookup(big).has_value());
  EXPECT_EQ(cache.entries(), 2);
}

TEST_F(PrefixCacheTest, ALongerRunSupersedesItsPrefixAndARepeatIsKeptOnce) {
  PrefixCache cache(int64_t{64} << 20, 4);
  const std::vector<int32_t> turn2 = Tokens(21, 8);
  const std::vector<int32_t> turn1(turn2.begin(), turn2.begin() + 9);
  ASSERT_TRUE(cache.Insert(turn1, *Ran(turn1)).ok());
  EXPECT_EQ(cache.bytes(), 8 * per_position_);
  ASSERT_TRUE(cache.Insert(turn2, *Ran(turn2)).ok());
  EXPECT_EQ(cache.entries(), 1);  // turn 1's blocks are turn 2's first two
  EXPECT_EQ(cache.bytes(), 20 * per_position_);
  ASSERT_TRUE(cache.Insert(turn2, *Ran(turn2)).ok());
  EXPECT_EQ(cache.entries(), 1);
  EXPECT_EQ(cache.bytes(), 20 * per_position_);
  // A run that shares two blocks then branches is kept beside it, and each
  // finds its own.
  std::vector<int32_t> branch(turn2.begin(), turn2.begin() + 8);
  for (int32_t x : Tokens(8, 9)) branch.push_back(x);
  ASSERT_TRUE(cache.Insert(branch, *Ran(branch)).ok());
  EXPECT_EQ(cache.entries(), 2);
  EXPECT_EQ(cache.Lookup(turn2)->positions, 20);
  EXPECT_EQ(cache.Lookup(branch)->positions, 12);
}

}  // namespace
}  // namespace moe::serving
