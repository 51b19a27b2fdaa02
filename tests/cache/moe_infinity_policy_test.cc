// The moe-infinity policy alone (services/cache/moe_infinity_policy.h):
// per-request activations, the fair share, and predictions matched only
// when read. Through the cache: tests/cache/expert_cache_test.cc.
#include "services/cache/moe_infinity_policy.h"

#include <vector>

#include "gtest/gtest.h"
#include "tests/cache/cache_test_options.h"

namespace moe::cache {
namespace {

using testing::Config;
using testing::kExperts;
using testing::kLayers;

// moe-infinity keeps each request's activation matrix apart: what one
// request routes does not enter another's, and each ends into the EAMC.
TEST(MoeInfinityTest, RequestsKeepTheirOwnActivations) {
  MoeInfinityPolicy p(MoeInfinityOptions::Improved(), "moe-infinity");
  p.Configure(Config(8));
  const RequestOwner a{1, 1}, b{1, 2};
  p.OnBeginRequest(a);
  p.OnBeginRequest(b);
  p.OnBeginIteration(a, Phase::kDecode);
  p.OnBeginIteration(b, Phase::kDecode);
  p.OnRoute(a, 0, Phase::kDecode, std::vector<ExpertDemand>{{1, 1}, {2, 1}});
  p.OnRoute(b, 0, Phase::kDecode, std::vector<ExpertDemand>{{4, 1}, {5, 1}});
  ASSERT_NE(p.ActivityForTest(a), nullptr);
  ASSERT_NE(p.ActivityForTest(b), nullptr);
  EXPECT_EQ(p.live_requests(), 2);
  for (int e = 0; e < kExperts; ++e) {
    EXPECT_EQ(p.ActivityForTest(a)->decode.at(0, e), (e == 1 || e == 2) ? 1.0f : 0.0f) << e;
    EXPECT_EQ(p.ActivityForTest(b)->decode.at(0, e), (e == 4 || e == 5) ? 1.0f : 0.0f) << e;
  }
  // Either request's experts are worth keeping: the best value over owners.
  EXPECT_GT(p.RetentionValue({0, 1}), p.RetentionValue({0, 3}));
  EXPECT_GT(p.RetentionValue({0, 4}), p.RetentionValue({0, 3}));
  p.OnEndRequest(a);
  EXPECT_EQ(p.ActivityForTest(a), nullptr);
  EXPECT_EQ(p.EamcEntries(), 1);
  p.OnEndRequest(b);
  EXPECT_EQ(p.EamcEntries(), 2);
  EXPECT_EQ(p.live_requests(), 0);
}

TEST(MoeInfinityTest, FairShareEvictsFromTheLayerOverItsShare) {
  MoeInfinityPolicy p(MoeInfinityOptions::Improved(), "moe-infinity");
  p.Configure(Config(8));  // share 2 per layer
  p.OnBeginRequest(1);
  p.OnBeginIteration(1, Phase::kDecode);
  // Layer 0 holds 4 experts, layer 1 holds 2, layer 2 holds 2.
  for (int e = 0; e < 4; ++e) p.OnInsert({0, e}, false);
  for (int e = 0; e < 2; ++e) p.OnInsert({1, e}, false);
  for (int e = 0; e < 2; ++e) p.OnInsert({2, e}, false);
  std::vector<ExpertKey> cands = {{0, 0}, {0, 1}, {0, 2}, {0, 3}, {1, 0}, {1, 1}, {2, 0}, {2, 1}};
  const size_t v = p.ChooseVictim(cands, {1, 3, Phase::kDecode});
  EXPECT_EQ(cands[v].layer, 0);
  // The routed layer may borrow: routing layer 0 takes from another layer.
  const size_t w = p.ChooseVictim(cands, {1, 0, Phase::kDecode});
  EXPECT_NE(cands[w].layer, 0);
}

// A prediction asked for at an iteration's start and read later is the one
// of that start, though a request ended in between and its matrix entered
// the EAMC (the lazy policy resolves pending matches first): the same
// predicted matrix and confidence as the policy that matches at once.
TEST(MoeInfinityTest, APendingPredictionSeesTheEamcItWasAskedOf) {
  MoeInfinityOptions eager_options = MoeInfinityOptions::Improved();
  eager_options.lazy_prediction = false;
  MoeInfinityPolicy lazy(MoeInfinityOptions::Improved(), "moe-infinity");
  MoeInfinityPolicy eager(eager_options, "moe-infinity:lazy_prediction=0");
  const RequestOwner a{1, 1}, b{1, 2}, c{1, 3};
  auto route = [](MoeInfinityPolicy& p, const RequestOwner& o, int layer,
                  std::vector<ExpertDemand> d) { p.OnRoute(o, layer, Phase::kDecode, d); };
  for (MoeInfinityPolicy* p : {&lazy, &eager}) {
    p->Configure(Config(8));
    // a: layers 0 and 1, into the EAMC.
    p->OnBeginRequest(a);
    p->OnBeginIteration(a, Phase::kDecode);
    route(*p, a, 0, {{1, 1}, {3, 1}});
    route(*p, a, 1, {{0, 1}, {4, 1}});
    p->OnEndRequest(a);
    // b: one token, then the next iteration begins (its match is asked).
    p->OnBeginRequest(b);
    p->OnBeginIteration(b, Phase::kDecode);
    route(*p, b, 0, {{1, 1}, {2, 1}});
    p->OnBeginIteration(b, Phase::kDecode);
    // c, like b at layer 0 but on to expert 5 at layer 1, ends meanwhile.
    p->OnBeginRequest(c);
    p->OnBeginIteration(c, Phase::kDecode);
    route(*p, c, 0, {{1, 1}, {2, 1}});
    route(*p, c, 1, {{5, 1}});
    p->OnEndRequest(c);
  }
  ASSERT_EQ(lazy.EamcEntries(), 2);
  const Predictor::Activity* got = lazy.ActivityForTest(b);
  const Predictor::Activity* want = eager.ActivityForTest(b);
  ASSERT_TRUE(got != nullptr && want != nullptr);
  ASSERT_TRUE(want->has_prediction);
  EXPECT_EQ(got->has_prediction, want->has_prediction);
  EXPECT_EQ(got->confidence, want->confidence);
  EXPECT_EQ(got->predicted, want->predicted);
  EXPECT_EQ(want->Predicted(1, 5), 0.0f);  // c's matrix came after b asked
  // b's next iteration sees c.
  for (MoeInfinityPolicy* p : {&lazy, &eager}) p->OnBeginIteration(b, Phase::kDecode);
  EXPECT_GT(lazy.ActivityForTest(b)->Predicted(1, 5), 0.0f);
  EXPECT_EQ(lazy.ActivityForTest(b)->predicted, eager.ActivityForTest(b)->predicted);
}

}  // namespace
}  // namespace moe::cache
