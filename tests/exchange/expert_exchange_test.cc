// The exchange vocabulary: the one set of wire rules, and the two transport
// converters (shared-memory ring, gRPC messages) round-tripping every field.
#include "services/exchange/expert_exchange.h"

#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "services/channel/shm_channel.h"
#include "services/exchange/exchange_proto.h"

namespace moe {
namespace {

constexpr ExchangeShape kShape{4, 8};

TEST(ValidateDemandsTest, AcceptsTheRuleAndNamesEachViolation) {
  using V = std::vector<ExpertDemand>;
  EXPECT_TRUE(ValidateDemands(kShape, 0, V{{0, 1}}).ok());
  EXPECT_TRUE(ValidateDemands(kShape, 3, V{{7, kMaxDemandTokens}, {0, 2}}).ok());
  struct Case {
    int layer;
    V demands;
    const char* message;
  };
  const Case bad[] = {
      {-1, V{{0, 1}}, "layer -1 out of range"},
      {4, V{{0, 1}}, "layer 4 out of range"},
      {0, V{}, "1 to 8 experts, got 0"},
      {0, V(9, ExpertDemand{0, 1}), "1 to 8 experts, got 9"},
      {0, V{{8, 1}}, "expert 8 out of range"},
      {0, V{{-1, 1}}, "expert -1 out of range"},
      {0, V{{1, 1}, {1, 2}}, "expert 1 demanded twice"},
      {0, V{{1, 0}}, "token count 0"},
      {0, V{{1, kMaxDemandTokens + 1}}, "not in [1, 2^24]"},
  };
  for (const Case& c : bad) {
    absl::Status s = ValidateDemands(kShape, c.layer, c.demands);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_NE(s.message().find(c.message), absl::string_view::npos) << s;
  }
}

TEST(ValidateHintsTest, RangesProbabilitiesAndLength) {
  using V = std::vector<ExpertHint>;
  EXPECT_TRUE(ValidateHints(kShape, V{}).ok());
  EXPECT_TRUE(ValidateHints(kShape, V{{3, 7, 0.0f}, {0, 0, 1.0f}}).ok());
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const V& v : {V{{4, 0, 0.5f}}, V{{0, 8, 0.5f}}, V{{-1, 0, 0.5f}}, V{{0, 0, -0.1f}},
                     V{{0, 0, 1.5f}}, V{{0, 0, nan}}, V(kMaxHintsPerCall + 1, ExpertHint{})}) {
    EXPECT_EQ(ValidateHints(kShape, v).code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(ValidatePartsTest, PartInRangeAndAContinueCarriesNothingElse) {
  const std::vector<ExpertDemand> d = {{1, 2}, {3, 1}, {5, 1}};
  const std::vector<ExpertHint> hint = {{1, 1, 0.5f}};
  const std::vector<MemberDemands> members = {{7, false, d}};
  EXPECT_TRUE(ValidateParts(kShape, {.demands = d}).ok());
  EXPECT_TRUE(ValidateParts(kShape, {.demands = d, .part = 8}).ok());
  EXPECT_TRUE(ValidateParts(kShape, {.demands = d, .continues = true}).ok());
  EXPECT_TRUE(ValidateParts(kShape, {.demands = d, .members = members, .hints = hint,
                                     .part = 2}).ok());
  for (const AcquireCall& c : {AcquireCall{.demands = d, .part = -1},
                               AcquireCall{.demands = d, .part = 9},
                               AcquireCall{.demands = d, .part = WirePart(0x80000000u)},
                               AcquireCall{.demands = d, .part = 2, .continues = true},
                               AcquireCall{.demands = d, .members = members, .continues = true},
                               AcquireCall{.demands = d, .hints = hint, .continues = true}}) {
    EXPECT_EQ(ValidateParts(kShape, c).code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(ValidateMembersTest, RowsMustAddUpToTheUnion) {
  using V = std::vector<ExpertDemand>;
  using M = std::vector<MemberDemands>;
  const V uni = {{1, 3}, {5, 1}};
  EXPECT_TRUE(ValidateMembers(kShape, 2, uni, M{{7, false, {{1, 2}}}, {9, true, {{1, 1}, {5, 1}}}})
                  .ok());
  EXPECT_TRUE(ValidateMembers(kShape, 2, uni, M{{7, false, uni}}).ok());
  struct Case {
    M members;
    const char* message;
  };
  const Case bad[] = {
      {M{}, "1 to 64 members, got 0"},
      {M(65, MemberDemands{1, false, uni}), "1 to 64 members, got 65"},
      {M{{7, false, {{1, 3}}}, {7, false, {{5, 1}}}}, "request 7 is a member of the acquire twice"},
      {M{{7, false, {}}, {9, false, uni}}, "member request 7: an acquire names 1 to 8"},
      {M{{7, false, {{1, 3}, {1, 1}}}}, "member request 7: expert 1 demanded twice"},
      {M{{7, false, {{1, 3}, {5, 1}, {2, 1}}}}, "names expert 2 outside the acquire"},
      {M{{7, false, {{1, 2}, {5, 1}}}}, "expert 1: the members' tokens add up to 2, the acquire names 3"},
      {M{{7, false, {{1, 3}}}}, "expert 5: the members' tokens add up to 0"},
      {M{{7, false, {{1, 3}, {5, 2}}}}, "expert 5: the members' tokens add up to 2"},
  };
  for (const Case& c : bad) {
    absl::Status s = ValidateMembers(kShape, 2, uni, c.members);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_NE(s.message().find(c.message), absl::string_view::npos) << s;
  }
}

TEST(ShmConverterTest, RoundTripsEveryField) {
  const std::vector<ExpertDemand> demands = {{3, 7}, {0, 1}};
  const std::vector<ExpertHint> hints = {{2, 5, 0.25f, HintSource::kHint}};
  const std::vector<SlotLease> leases = {{{1, 6}, 11, 0x123456789abcull}, {{3, 0}, 0, 1}};
  auto req = std::make_unique<channel::RequestMsg>();
  auto reply = std::make_unique<channel::ResponseMsg>();

  channel::ToWire(demands, req->demands);
  std::vector<ExpertDemand> d(demands.size());
  channel::FromWire(req->demands, d.size(), d.data());
  for (size_t i = 0; i < d.size(); ++i) {
    EXPECT_EQ(d[i].expert, demands[i].expert);
    EXPECT_EQ(d[i].tokens, demands[i].tokens);
  }
  channel::ToWire(hints, req->hints);
  std::vector<ExpertHint> h(1);
  channel::FromWire(req->hints, 1, h.data());
  EXPECT_EQ(h[0].layer, 2);
  EXPECT_EQ(h[0].expert, 5);
  EXPECT_EQ(h[0].probability, 0.25f);
  EXPECT_EQ(h[0].source, HintSource::kHint);
  channel::ToWire(leases, reply->leases);
  std::vector<SlotLease> l(leases.size());
  channel::FromWire(reply->leases, l.size(), l.data());
  for (size_t i = 0; i < l.size(); ++i) {
    EXPECT_EQ(l[i].key, leases[i].key);
    EXPECT_EQ(l[i].slot, leases[i].slot);
    EXPECT_EQ(l[i].generation, leases[i].generation);
  }
  // A slot id an int32 cannot hold becomes -1, which SlotTable refuses.
  reply->leases[0].slot = 0x80000000u;
  channel::FromWire(reply->leases, 1, l.data());
  EXPECT_EQ(l[0].slot, -1);

  // A whole answer: leases, then host answers, and the usage.
  AcquireResult answer;
  answer.leases = leases;
  answer.host = {{1, 4}, {1, 0}};
  answer.usage = {3, 4, 2, 5000};
  channel::ToWire(answer, reply.get());
  EXPECT_EQ(reply->count, 4u);
  const AcquireResult back = channel::AcquireResultFromWire(*reply);
  ASSERT_EQ(back.leases.size(), 2u);
  EXPECT_EQ(back.leases[1].key, leases[1].key);
  EXPECT_EQ(back.leases[1].generation, leases[1].generation);
  ASSERT_EQ(back.host.size(), 2u);
  EXPECT_EQ(back.host[0], (ExpertKey{1, 4}));
  EXPECT_EQ(back.host[1], (ExpertKey{1, 0}));
  EXPECT_EQ(back.usage.hits, 3);
  EXPECT_EQ(back.usage.misses, 4);
  EXPECT_EQ(back.usage.host, 2);
  EXPECT_EQ(back.usage.stall_ns, 5000);
}

TEST(ProtoConverterTest, RoundTripsEveryField) {
  v1::AcquireRequest req;
  const std::vector<ExpertDemand> demands = {{3, 7}, {0, 1}};
  const std::vector<ExpertHint> hints = {{2, 5, 0.25f, HintSource::kHint}};
  ToProtoList<ExpertDemand>(demands, req.mutable_experts());
  ToProtoList<ExpertHint>(hints, req.mutable_hints());
  const auto d = FromProtoList<ExpertDemand>(req.experts());
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].expert, 3);
  EXPECT_EQ(d[0].tokens, 7);
  const std::vector<MemberDemands> members = {{41, true, {{3, 5}}}, {42, false, {{3, 2}, {0, 1}}}};
  ToProtoList<MemberDemands>(members, req.mutable_members());
  const auto m = FromProtoList<MemberDemands>(req.members());
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0].request, 41u);
  EXPECT_TRUE(m[0].prefill);
  ASSERT_EQ(m[1].demands.size(), 2u);
  EXPECT_EQ(m[1].request, 42u);
  EXPECT_FALSE(m[1].prefill);
  EXPECT_EQ(m[1].demands[1].expert, 0);
  EXPECT_EQ(m[1].demands[0].tokens, 2);
  const auto h = FromProtoList<ExpertHint>(req.hints());
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(h[0].layer, 2);
  EXPECT_EQ(h[0].expert, 5);
  EXPECT_EQ(h[0].probability, 0.25f);

  v1::AcquireResponse resp;
  AcquireResult answer;
  answer.leases = {{{1, 6}, 11, 0x123456789abcull}};
  answer.host = {{1, 2}};
  answer.usage = {3, 4, 1, 5000};
  ToProto(answer, &resp);
  const AcquireResult r = AcquireResultFromProto(resp, 1);
  ASSERT_EQ(r.leases.size(), 1u);
  EXPECT_EQ(r.leases[0].key, (ExpertKey{1, 6}));
  EXPECT_EQ(r.leases[0].slot, 11);
  EXPECT_EQ(r.leases[0].generation, 0x123456789abcull);
  ASSERT_EQ(r.host.size(), 1u);
  EXPECT_EQ(r.host[0], (ExpertKey{1, 2}));
  EXPECT_EQ(r.usage.hits, 3);
  EXPECT_EQ(r.usage.misses, 4);
  EXPECT_EQ(r.usage.host, 1);
  EXPECT_EQ(r.usage.stall_ns, 5000);
  resp.mutable_leases(0)->set_slot(0xffffffffu);
  EXPECT_EQ(FromProto(resp.leases(0)).slot, -1);
  resp.set_stall_seconds(std::nan(""));
  EXPECT_EQ(AcquireResultFromProto(resp, 1).usage.stall_ns, 0);
}

// A stall reported by the daemon is clamped to [0, 10^12 ns] by both
// converters: an absurd value must neither wrap (1e300 s through llround)
// nor saturate at INT64_MAX, where the worker's sums overflow.
TEST(PeerUsageTest, AStallFromThePeerIsClampedNotWrapped) {
  constexpr int64_t kCap = 1000000000000;
  v1::AcquireResponse resp;
  std::vector<AcquireUsage> got;
  for (double s : {1e300, std::numeric_limits<double>::infinity(), 9.3e18, -5.0}) {
    resp.set_stall_seconds(s);
    got.push_back(AcquireResultFromProto(resp, 0).usage);
  }
  auto reply = std::make_unique<channel::ResponseMsg>();
  *reply = {};
  for (uint64_t ns : {~uint64_t{0}, uint64_t{1} << 63, uint64_t{kCap} + 1}) {
    reply->stall_ns = ns;
    got.push_back(channel::AcquireResultFromWire(*reply).usage);
  }
  AcquireUsage sum;
  for (size_t i = 0; i < got.size(); ++i) {
    const int64_t want = i == 3 ? 0 : kCap;
    EXPECT_EQ(got[i].stall_ns, want) << "value " << i;
    sum += got[i];
  }
  EXPECT_EQ(sum.stall_ns, 6 * kCap);
  // Values in range pass unchanged.
  resp.set_stall_seconds(2.5);
  EXPECT_EQ(AcquireResultFromProto(resp, 0).usage.stall_ns, 2500000000);
  reply->stall_ns = 12345;
  EXPECT_EQ(channel::AcquireResultFromWire(*reply).usage.stall_ns, 12345);
}

}  // namespace
}  // namespace moe
