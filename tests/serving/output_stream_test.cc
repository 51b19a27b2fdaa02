// serving::OutputStream: stop strings across token boundaries, stop tokens
// and eos, the length limit, usage on the last output, and the reasons a
// request is interrupted.
#include "services/serving/output_stream.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "common/tiny_tokenizer.h"
#include "gtest/gtest.h"

namespace moe::serving {
namespace {

constexpr int32_t kEos = 256;  // the one special token, after the 256 bytes

class OutputStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // No merges: every byte is one token, so a stop string spans tokens.
    absl::StatusOr<TinyTokenizer> t = MakeTinyTokenizer(257, {"<eos>"});
    ASSERT_TRUE(t.ok()) << t.status();
    auto tok = Tokenizer::FromJson(t->json);
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = std::move(*tok);
  }

  static int32_t Id(char c) {
    const std::vector<uint8_t>& order = ByteOrder();
    return static_cast<int32_t>(std::find(order.begin(), order.end(),
                                          static_cast<uint8_t>(c)) - order.begin());
  }

  static GenerateOptions Options(int max_new_tokens) {
    GenerateOptions o;
    o.prompt = {1, 2, 3};
    o.max_new_tokens = max_new_tokens;
    return o;
  }

  // Pushes `text` one byte-token at a time until the stream is done.
  std::vector<Output> Run(OutputStream& s, const std::string& text,
                          const ExpertCounters& experts = {}) {
    std::vector<Output> out;
    for (char c : text) {
      if (s.done()) break;
      SampledToken t;
      t.token = Id(c);
      out.push_back(s.Push(t, experts));
    }
    return out;
  }

  static std::string Text(const std::vector<Output>& outs) {
    std::string all;
    for (const Output& o : outs) all += o.text;
    return all;
  }

  std::unique_ptr<Tokenizer> tokenizer_;
};

TEST_F(OutputStreamTest, AStopStringAcrossTokensEndsBeforeIt) {
  OutputStream s(Options(20), {kEos}, tokenizer_.get(), {"END"}, absl::Now());
  const std::vector<Output> outs = Run(s, "abENDzz");
  ASSERT_EQ(outs.size(), 5u);  // a b E N D: stops at D
  EXPECT_EQ(outs[0].text, "a");
  EXPECT_EQ(outs[2].text, "");  // "E" held back: it could begin END
  EXPECT_EQ(outs[3].text, "");
  EXPECT_EQ(Text(outs), "ab");
  EXPECT_TRUE(s.done());
  EXPECT_TRUE(s.matched_stop_string());
  EXPECT_EQ(outs.back().finish_reason, "stop");
  ASSERT_TRUE(outs.back().usage.has_value());
  EXPECT_EQ(outs.back().usage->generated_tokens, 5);
  for (size_t i = 0; i + 1 < outs.size(); ++i) {
    EXPECT_EQ(outs[i].finish_reason, "");
    EXPECT_FALSE(outs[i].usage.has_value());
  }
}

TEST_F(OutputStreamTest, HeldBackTextIsReleasedWhenRuledOutOrAtTheEnd) {
  OutputStream s(Options(4), {kEos}, tokenizer_.get(), {"EX", "ENDS"}, absl::Now());
  const std::vector<Output> outs = Run(s, "ENDx");
  ASSERT_EQ(outs.size(), 4u);
  EXPECT_EQ(outs[0].text, "");     // "E" could begin either
  EXPECT_EQ(outs[1].text, "");     // "EN" could begin ENDS
  EXPECT_EQ(outs[2].text, "");     // "END" too
  EXPECT_EQ(outs[3].text, "ENDx");  // ruled out, and the length is reached
  EXPECT_EQ(outs[3].finish_reason, "length");
  EXPECT_FALSE(s.matched_stop_string());
  OutputStream t(Options(2), {kEos}, tokenizer_.get(), {"ENDS"}, absl::Now());
  EXPECT_EQ(Text(Run(t, "aE")), "aE");  // flushed at the length limit
  EXPECT_EQ(t.finish_reason(), "length");
}

TEST_F(OutputStreamTest, StopTokensAndEos) {
  GenerateOptions o = Options(10);
  o.stop_token_ids = {Id('q')};
  OutputStream s(o, {kEos}, tokenizer_.get(), {}, absl::Now());
  const std::vector<Output> outs = Run(s, "abqcd");
  ASSERT_EQ(outs.size(), 3u);
  EXPECT_EQ(outs.back().finish_reason, "stop");
  EXPECT_FALSE(s.matched_stop_string());

  OutputStream e(Options(10), {kEos}, tokenizer_.get(), {}, absl::Now());
  SampledToken eos;
  eos.token = kEos;
  EXPECT_EQ(e.Push(eos, {}).finish_reason, "stop");

  GenerateOptions ignore = Options(10);
  ignore.stop_at_eos = false;
  OutputStream i(ignore, {kEos}, tokenizer_.get(), {}, absl::Now());
  EXPECT_EQ(i.Push(eos, {}).finish_reason, "");
  EXPECT_FALSE(i.done());
}

TEST_F(OutputStreamTest, UsageOnTheLastOutput) {
  ExpertCounters experts;
  experts.hits = 7;
  experts.misses = 2;
  experts.stall_seconds = 0.5;
  const absl::Time submitted = absl::Now() - absl::Seconds(2);
  OutputStream s(Options(3), {kEos}, tokenizer_.get(), {}, submitted);
  const std::vector<Output> outs = Run(s, "xyz", experts);
  ASSERT_EQ(outs.size(), 3u);
  ASSERT_TRUE(outs.back().usage.has_value());
  const Usage& u = *outs.back().usage;
  EXPECT_EQ(u.prompt_tokens, 3);
  EXPECT_EQ(u.generated_tokens, 3);
  EXPECT_EQ(u.experts.hits, 7);
  EXPECT_EQ(u.experts.misses, 2);
  EXPECT_EQ(u.experts.stall_seconds, 0.5);
  EXPECT_GE(u.ttft_seconds, 2.0);  // counted from submission (queue time)
  EXPECT_GE(u.tpot_seconds, 0.0);
  EXPECT_EQ(s.generated(), 3);
  EXPECT_EQ(outs.back().finish_reason, "length");
}

TEST_F(OutputStreamTest, WithoutATokenizerThereIsNoText) {
  OutputStream s(Options(2), {kEos}, nullptr, {}, absl::Now());
  const std::vector<Output> outs = Run(s, "ab");
  ASSERT_EQ(outs.size(), 2u);
  EXPECT_EQ(Text(outs), "");
  EXPECT_EQ(outs[1].token_id, Id('b'));
}

TEST(InterruptionTest, EachReasonInOrder) {
  const absl::Time now = absl::FromUnixSeconds(1000);
  const absl::Time later = now + absl::Seconds(1);
  const absl::Time earlier = now - absl::Seconds(1);
  EXPECT_TRUE(Interruption(false, later, later, now).ok());
  EXPECT_EQ(Interruption(true, earlier, earlier, now).code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(Interruption(false, now, earlier, now).code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(Interruption(false, later, now, now).code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(Interruption(false, absl::InfiniteFuture(), absl::InfiniteFuture(), now).ok());
  EXPECT_TRUE(QueuedInterruption(false, later, now).ok());
  EXPECT_EQ(QueuedInterruption(true, later, now).code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(QueuedInterruption(false, now, now).code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(QueuedInterruption(false, now, now).message().find("queued"), std::string::npos);
}

}  // namespace
}  // namespace moe::serving
