#include "services/cache/trace.h"

#include <algorithm>
#include <sstream>

#include "gtest/gtest.h"
#include "services/cache/synth_trace.h"

namespace moe::trace {
namespace {

constexpr char kHeader[] =
    R"({"format":"moe-trace/1","model":"m","num_layers":2,"num_experts":4,"top_k":2})";

absl::StatusOr<Trace> Parse(const std::string& text) {
  std::istringstream in(text);
  return ReadTrace(in, "t.jsonl");
}

TEST(TraceTest, ParsesHeaderAndRequestsAndIgnoresUnknownFields) {
  std::string text = std::string(kHeader) + "\n" +
      R"({"id":"a","extra":{"x":1},"phase":["prefill","decode"],)"
      R"("experts":[[[0,1],[2,3]],[[1,2],[0,3]]],"weights":[[[0.5,0.5],[0.7,0.3]],[[1,0],[0.2,0.8]]]})"
      "\n\n" R"({"id":7,"phase":["decode"],"experts":[[[3,0],[1,2]]],"hints":[[[3],[1,2,0]]]})" "\n";
  auto t = Parse(text);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->header.model, "m");
  EXPECT_EQ(t->header.num_layers, 2);
  ASSERT_EQ(t->requests.size(), 2u);
  EXPECT_EQ(t->requests[0].num_prefill_tokens(), 1);
  EXPECT_EQ(t->requests[0].experts[1][1], (std::vector<int32_t>{0, 3}));
  EXPECT_FLOAT_EQ(t->requests[0].weights[0][1][0], 0.7f);
  EXPECT_EQ(t->requests[1].id, "7");
  EXPECT_EQ(t->requests[1].hints[0][1].size(), 3u);
}

struct BadCase {
  std::string line;
  std::string expect;  // substring of the error
};

TEST(TraceTest, RejectsBadRequestsWithLineNumbers) {
  const BadCase cases[] = {
      {R"({"phase":["decode"],"experts":[[[0,4],[1,2]]]})", "not in [0, 4)"},
      {R"({"phase":["decode"],"experts":[[[0,0],[1,2]]]})", "duplicate expert 0"},
      {R"({"phase":["decode"],"experts":[[[0],[1,2]]]})", "expected 2"},
      {R"({"phase":["decode"],"experts":[[[0,1]]]})", "must list 2 layers"},
      {R"({"phase":["decode","prefill"],"experts":[[[0,1],[1,2]],[[0,1],[1,2]]]})",
       "after a decode token"},
      {R"({"phase":["decode"],"experts":[[[0,1],[1,2]]],"weights":[[[1],[1,1]]]})", "expected 2"},
      {R"({"phase":["sample"],"experts":[[[0,1],[1,2]]]})", "unknown phase"},
      {R"({"phase":["decode"]})", "missing \"experts\""},
      {R"({"phase":["decode"],"experts":[[["a",1],[1,2]]]})", "integers"},
      {R"({"phase":[],"experts":[]})", "no tokens"},
      {R"({"phase":["decode"],"experts":[[[0,1],[1,2]]],"hints":[[[9],[1]]]})", "not in [0, 4)"},
      {R"({"phase":["decode"],"experts":)", "not valid JSON"},
  };
  for (const auto& c : cases) {
    auto t = Parse(std::string(kHeader) + "\n" + c.line + "\n");
    ASSERT_FALSE(t.ok()) << c.line;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(t.status().message().find("t.jsonl:2:"), std::string::npos) << t.status();
    EXPECT_NE(t.status().message().find(c.expect), std::string::npos)
        << c.line << " -> " << t.status();
  }
}

TEST(TraceTest, RejectsBadHeaders) {
  EXPECT_FALSE(Parse("").ok());
  EXPECT_FALSE(Parse(R"({"format":"moe-trace/2","num_layers":1,"num_experts":2,"top_k":1})").ok());
  EXPECT_FALSE(Parse(R"({"format":"moe-trace/1","num_layers":1,"num_experts":2,"top_k":3})").ok());
  EXPECT_FALSE(Parse(R"({"format":"moe-trace/1","num_layers":0,"num_experts":2,"top_k":1})").ok());
  EXPECT_FALSE(Parse(R"({"format":"moe-trace/1","num_experts":2,"top_k":1})").ok());
  EXPECT_FALSE(Parse("[1,2]").ok());
}

// Numbers outside their type's range are refused by name, never converted
// (a double beyond float's range, an integer beyond int64's).
TEST(TraceTest, OutOfRangeNumbersAreRefusedNotConverted) {
  const BadCase cases[] = {
      {R"({"phase":["decode"],"experts":[[[0,1],[1,2]]],"weights":[[[1e300,0],[1,1]]]})",
       "weights must be finite"},
      {R"({"phase":["decode"],"experts":[[[0,18446744073709551615],[1,2]]]})",
       "bad expert id 18446744073709551615"},
      {R"({"phase":["decode"],"experts":[[[0,1],[1,2]]],"hints":[[[-9223372036854775808],[1]]]})",
       "bad expert id -9223372036854775808"},
  };
  for (const auto& c : cases) {
    auto t = Parse(std::string(kHeader) + "\n" + c.line + "\n");
    ASSERT_FALSE(t.ok()) << c.line;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(t.status().message().find(c.expect), std::string::npos)
        << c.line << " -> " << t.status();
  }
  auto h = Parse(R"({"format":"moe-trace/1","num_layers":18446744073709551615,)"
                 R"("num_experts":2,"top_k":1})");
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.status().message().find("\"num_layers\" out of range: 18446744073709551615"),
            std::string::npos)
      << h.status();
  // An integer id is kept as written, not wrapped through int64.
  auto t = Parse(std::string(kHeader) + "\n" +
                 R"({"id":18446744073709551615,"phase":["decode"],"experts":[[[0,1],[1,2]]]})" +
                 "\n");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->requests[0].id, "18446744073709551615");
}

// "expert_params" is optional: written when known, read back, refused by
// name when it is not a positive integer up to 2^40.
TEST(TraceTest, ExpertParamsRoundTripsAndIsRangeChecked) {
  auto plain = Parse(std::string(kHeader) + "\n");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->header.expert_params, 0);
  EXPECT_EQ(SerializeHeader(plain->header).find("expert_params"), std::string::npos);

  TraceHeader h = plain->header;
  h.expert_params = 176160768;  // one Mixtral-8x7B expert: 3 x 4096 x 14336
  auto back = Parse(SerializeHeader(h) + "\n");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->header.expert_params, 176160768);

  const std::string head = R"({"format":"moe-trace/1","num_layers":1,"num_experts":2,"top_k":1,)";
  for (const char* bad : {"0", "-1", "1099511627777", "18446744073709551615", "1.5", "\"7\"",
                          "null", "1e30"}) {
    auto t = Parse(head + "\"expert_params\":" + bad + "}\n");
    ASSERT_FALSE(t.ok()) << bad;
    EXPECT_NE(t.status().message().find("\"expert_params\" must be an integer in [1, 2^40]"),
              std::string::npos)
        << bad << " -> " << t.status();
  }
  auto top = Parse(head + "\"expert_params\":1099511627776}\n");
  ASSERT_TRUE(top.ok()) << top.status();
  h.expert_params = -5;
  EXPECT_FALSE(TraceWriter::Open("/dev/null", h).ok());
}

TEST(TraceTest, WriterRoundTripsASyntheticTrace) {
  SynthOptions o;
  o.num_layers = 3;
  o.num_experts = 16;
  o.top_k = 2;
  o.requests = 5;
  o.prefill_tokens = 4;
  o.decode_tokens = 6;
  o.hint_accuracy = 0.5;
  auto t = GenerateSyntheticTrace(o);
  ASSERT_TRUE(t.ok()) << t.status();
  std::ostringstream out;
  TraceWriter w(&out, t->header);
  for (const auto& r : t->requests) ASSERT_TRUE(w.Write(r).ok());
  auto back = Parse(out.str());
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->requests.size(), t->requests.size());
  for (size_t i = 0; i < t->requests.size(); ++i) {
    EXPECT_EQ(back->requests[i].id, t->requests[i].id);
    EXPECT_EQ(back->requests[i].phase, t->requests[i].phase);
    EXPECT_EQ(back->requests[i].experts, t->requests[i].experts);
    EXPECT_EQ(back->requests[i].hints, t->requests[i].hints);
  }
  // The writer validates too.
  TraceRequest bad = t->requests[0];
  bad.experts[0][0][0] = 99;
  EXPECT_FALSE(w.Write(bad).ok());
}

// The "mixtral-uniform" regime has what the real one has: no prompt,
// consecutive decode tokens sharing about half of a layer's experts, and no
// expert of a layer favoured across requests.
TEST(SynthTraceTest, MixtralUniformRegimeHasItsShape) {
  auto o = SynthRegime("mixtral-uniform");
  ASSERT_TRUE(o.ok());
  auto t = GenerateSyntheticTrace(*o);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->header.num_layers, 32);
  EXPECT_EQ(t->header.num_experts, 8);
  EXPECT_EQ(t->requests.size(), 4u);
  double shared = 0, pairs = 0;
  std::vector<double> uses(32 * 8, 0);
  for (const TraceRequest& r : t->requests) {
    EXPECT_EQ(r.num_prefill_tokens(), 0);
    for (int tok = 0; tok < r.num_tokens(); ++tok) {
      for (int l = 0; l < 32; ++l) {
        for (int32_t e : r.experts[tok][l]) uses[l * 8 + e] += 1;
        if (tok == 0) continue;
        for (int32_t e : r.experts[tok][l]) {
          const auto& prev = r.experts[tok - 1][l];
          shared += std::count(prev.begin(), prev.end(), e);
        }
        pairs += 2;
      }
    }
  }
  EXPECT_GT(shared / pairs, 0.35);
  EXPECT_LT(shared / pairs, 0.6);
  // The most used expert of a layer is used at most ~2x the mean, on average.
  double ratio = 0;
  for (int l = 0; l < 32; ++l) {
    double sum = 0, top = 0;
    for (int e = 0; e < 8; ++e) {
      sum += uses[l * 8 + e];
      top = std::max(top, uses[l * 8 + e]);
    }
    ratio += top / (sum / 8) / 32;
  }
  EXPECT_LT(ratio, 2.2);
  EXPECT_FALSE(SynthRegime("nope").ok());
  EXPECT_TRUE(SynthRegime("wide-256").ok());
}

TEST(SynthTraceTest, IsDeterministicAndShaped) {
  SynthOptions o;
  o.requests = 6;
  auto a = GenerateSyntheticTrace(o);
  auto b = GenerateSyntheticTrace(o);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->requests.size(), 6u);
  for (size_t i = 0; i < a->requests.size(); ++i) {
    EXPECT_EQ(a->requests[i].experts, b->requests[i].experts);
  }
  o.seed = 2;
  auto c = GenerateSyntheticTrace(o);
  ASSERT_TRUE(c.ok());
  EXPECT_NE(a->requests[0].experts, c->requests[0].experts);
  // Decode reuse: the most used expert at a layer covers far more than
  // 1/E of the request's decode choices.
  const auto& r = a->requests[0];
  std::vector<int> counts(o.num_experts, 0);
  int total = 0;
  for (int t = r.num_prefill_tokens(); t < r.num_tokens(); ++t) {
    for (int32_t e : r.experts[t][5]) ++counts[e], ++total;
  }
  int top = *std::max_element(counts.begin(), counts.end());
  EXPECT_GT(top, 2 * total / o.num_experts);
  o.requests = 0;
  EXPECT_FALSE(GenerateSyntheticTrace(o).ok());
  o.requests = 1;
  o.repeat = 1.5;
  EXPECT_FALSE(GenerateSyntheticTrace(o).ok());
}

// Absurd sizes are refused by name before any arithmetic or allocation.
TEST(SynthTraceTest, RefusesSizesThatOverflowOrExhaustMemory) {
  struct Case {
    void (*set)(SynthOptions*);
    const char* field;
  };
  const Case cases[] = {
      {[](SynthOptions* o) { o->prefill_tokens = 2147483647; }, "prefill_tokens"},
      {[](SynthOptions* o) { o->decode_tokens = 2147483647; }, "decode_tokens"},
      {[](SynthOptions* o) { o->requests = 2147483647; }, "requests"},
      {[](SynthOptions* o) { o->groups = 2147483647; }, "groups"},
      // Each bound alone is met, their product is not.
      {[](SynthOptions* o) {
         o->num_layers = 4096;
         o->num_experts = 4096;
         o->top_k = 256;
         o->requests = 1000;
       },
       "expert choices"},
  };
  for (const Case& c : cases) {
    SynthOptions o;
    c.set(&o);
    absl::Status s = ValidateSynthOptions(o);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_NE(s.message().find(c.field), std::string::npos) << s;
  }
}

// A working set of every expert under a steep popularity skew: drawing its
// rarest members by rejection would practically never end; it must.
TEST(SynthTraceTest, FullWorkingSetUnderSteepSkewTerminates) {
  SynthOptions o;
  o.num_layers = 1;
  o.num_experts = 4096;
  o.working_set = 4096;
  o.popularity_skew = 4;
  o.groups = 1;
  o.requests = 1;
  o.prefill_tokens = 0;
  o.decode_tokens = 2;
  auto t = GenerateSyntheticTrace(o);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->requests.size(), 1u);
}

}  // namespace
}  // namespace moe::trace
