// serving::Validate: every bound of the table, both sides, under each
// transport's names; the other checks (prompt, stops, context, limits);
// the proto round trip.
#include "services/serving/request.h"

#include <cmath>
#include <limits>
#include <string>

#include "gtest/gtest.h"
#include "services/serving/request_proto.h"

namespace moe::serving {
namespace {

Request Good() {
  Request r;
  r.prompt_ids = {1, 2, 3};
  r.max_new_tokens = 4;
  return r;
}

Limits Model() {
  Limits l;
  l.vocab_size = 100;
  l.context_window = 64;
  return l;
}

// Sets the field `b` describes.
void Set(Request& r, const FieldBound& b, double x) {
  const std::string name = b.grpc;
  if (name == "max_new_tokens") r.max_new_tokens = static_cast<int64_t>(x);
  if (name == "temperature") r.temperature = x;
  if (name == "top_p") r.top_p = x;
  if (name == "top_logprobs") r.top_logprobs = static_cast<int64_t>(x);
  if (name == "top_k") r.top_k = static_cast<int64_t>(x);
  if (name == "min_p") r.min_p = x;
  if (name == "repetition_penalty") r.repetition_penalty = x;
  if (name == "presence_penalty") r.presence_penalty = x;
  if (name == "frequency_penalty") r.frequency_penalty = x;
  if (name == "logit_bias") r.logit_bias = {{7, x}};
}

TEST(ValidateTest, EachBoundAcceptsItsEndsAndRefusesBeyondBothSides) {
  for (const FieldBound& b : kFieldBounds) {
    const bool integral = std::string(b.grpc) != "temperature" && std::string(b.grpc) != "top_p";
    const double step = integral ? 1 : 1e-3;
    for (double ok : {b.lo, b.hi}) {
      Request r = Good();
      Set(r, b, ok);
      EXPECT_TRUE(Validate(r, Limits{}).ok()) << b.grpc << " = " << ok;
    }
    for (double bad : {b.lo - step, b.hi + step}) {
      Request r = Good();
      Set(r, b, bad);
      absl::Status s = Validate(r, Limits{});
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << b.grpc << " = " << bad;
      EXPECT_EQ(FieldOf(s), b.grpc);
      EXPECT_NE(std::string(s.message()).find(b.grpc), std::string::npos) << s;
    }
  }
}

TEST(ValidateTest, TheBoundsTableIsWhatTheDocsSay) {
  EXPECT_EQ(kMaxNewTokensBound.lo, 1);
  EXPECT_EQ(kMaxNewTokensBound.hi, 65536);
  EXPECT_EQ(kTemperatureBound.lo, 0);
  EXPECT_EQ(kTemperatureBound.hi, 2);
  EXPECT_EQ(kTopPBound.lo, 0);
  EXPECT_EQ(kTopPBound.hi, 1);
  EXPECT_EQ(kTopLogprobsBound.lo, 0);
  EXPECT_EQ(kTopLogprobsBound.hi, 20);
  EXPECT_EQ(kMaxStopStrings, 4);
}

TEST(ValidateTest, ErrorsNameTheFieldAsTheTransportSpellsIt) {
  Request r = Good();
  r.temperature = 2.5;
  r.transport = Transport::kHttp;
  EXPECT_EQ(FieldOf(Validate(r, Limits{})), "temperature");
  r = Good();
  r.max_new_tokens = 0;
  r.transport = Transport::kHttp;
  EXPECT_EQ(FieldOf(Validate(r, Limits{})), "max_tokens");
  r.transport = Transport::kCli;
  absl::Status s = Validate(r, Limits{});
  EXPECT_EQ(FieldOf(s), "--max-new-tokens");
  EXPECT_EQ(s.message(), "--max-new-tokens (max_new_tokens) must be in [1, 65536], got 0");
  r.transport = Transport::kGrpc;
  EXPECT_EQ(Validate(r, Limits{}).message(), "max_new_tokens must be in [1, 65536], got 0");
}

TEST(ValidateTest, NotANumberIsRefused) {
  Request r = Good();
  r.temperature = std::nan("");
  EXPECT_EQ(FieldOf(Validate(r, Limits{})), "temperature");
  r = Good();
  r.top_p = std::numeric_limits<double>::infinity();
  EXPECT_EQ(FieldOf(Validate(r, Limits{})), "top_p");
}

TEST(ValidateTest, PromptIdsWithinTheVocabularyAndTheLimit) {
  Request r = Good();
  r.prompt_ids.clear();
  EXPECT_EQ(FieldOf(Validate(r, Model())), "prompt_token_ids");
  r.prompt_ids = {0, 99};
  EXPECT_TRUE(Validate(r, Model()).ok());
  r.prompt_ids = {100};
  EXPECT_EQ(Validate(r, Model()).code(), absl::StatusCode::kInvalidArgument);
  r.prompt_ids = {-1};
  EXPECT_EQ(Validate(r, Model()).code(), absl::StatusCode::kInvalidArgument);
  Limits l = Model();
  l.max_prompt_tokens = 3;
  r.prompt_ids = {1, 2, 3};
  EXPECT_TRUE(Validate(r, l).ok());
  r.prompt_ids = {1, 2, 3, 4};
  EXPECT_NE(Validate(r, l).message().find("--max-prompt-tokens 3"), std::string::npos);
}

TEST(ValidateTest, PromptPlusNewTokensWithinTheContext) {
  Request r = Good();  // 3 prompt tokens, context 64
  r.max_new_tokens = 61;
  EXPECT_TRUE(Validate(r, Model()).ok());
  r.max_new_tokens = 62;
  absl::Status s = Validate(r, Model());
  EXPECT_EQ(FieldOf(s), "max_new_tokens");
  EXPECT_NE(s.message().find("context window of 64"), std::string::npos) << s;
  // A lower ceiling than the table's (the OpenAI ModelInfo's).
  Limits l;
  l.max_new_tokens = 10;
  r.max_new_tokens = 10;
  EXPECT_TRUE(Validate(r, l).ok());
  r.max_new_tokens = 11;
  EXPECT_EQ(FieldOf(Validate(r, l)), "max_new_tokens");
}

TEST(ValidateTest, StopTokenIdsAndStopStrings) {
  Request r = Good();
  r.stop_token_ids = {0, 99};
  EXPECT_TRUE(Validate(r, Model()).ok());
  r.stop_token_ids = {100};
  EXPECT_EQ(FieldOf(Validate(r, Model())), "stop_token_ids");
  r.stop_token_ids = {-2};
  EXPECT_EQ(FieldOf(Validate(r, Limits{})), "stop_token_ids");
  r = Good();
  r.stop = {"a", "b", "c", "d"};
  EXPECT_TRUE(Validate(r, Model()).ok());
  r.stop.push_back("e");
  EXPECT_EQ(FieldOf(Validate(r, Model())), "stop");
  r.stop = {""};
  EXPECT_EQ(FieldOf(Validate(r, Model())), "stop");
  Limits no_tokenizer = Model();
  no_tokenizer.has_tokenizer = false;
  r.stop = {"x"};
  EXPECT_EQ(FieldOf(Validate(r, no_tokenizer)), "stop");
}

TEST(ValidateTest, ParametersWithoutThePrompt) {
  Request r = Good();
  r.prompt_ids.clear();
  EXPECT_TRUE(ValidateParameters(r, Limits{}).ok());
  r.top_p = 2;
  EXPECT_EQ(FieldOf(ValidateParameters(r, Limits{})), "top_p");
}

TEST(ValidateTest, EncodePromptNeedsATokenizerForText) {
  Request r;
  r.prompt_text = "hello";
  absl::Status s = EncodePrompt(&r, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FieldOf(s), "prompt");
  r.prompt_ids = {7};  // ids win: nothing to encode
  EXPECT_TRUE(EncodePrompt(&r, nullptr).ok());
}

TEST(ValidateTest, OtherErrorsNameNoField) {
  EXPECT_EQ(FieldOf(absl::InvalidArgumentError("x")), "");
  EXPECT_EQ(FieldOf(absl::OkStatus()), "");
}

TEST(RequestProtoTest, RoundTripsEveryField) {
  Request r = Good();
  r.prompt_text = "hi";
  r.temperature = 0.5;
  r.top_p = 0.25;
  r.seed = 42;
  r.top_logprobs = 3;
  r.stop_token_ids = {5};
  r.ignore_eos = true;
  r.stop = {"END"};
  v1::GenerateRequest m;
  ToProto(r, &m);
  const Request back = FromProto(m, Transport::kHttp);
  EXPECT_EQ(back.prompt_text, "hi");
  EXPECT_EQ(back.prompt_ids, r.prompt_ids);
  EXPECT_EQ(back.max_new_tokens, 4);
  EXPECT_EQ(back.temperature, 0.5);
  EXPECT_EQ(back.top_p, 0.25);
  EXPECT_EQ(back.seed, 42u);
  EXPECT_EQ(back.top_logprobs, 3);
  EXPECT_EQ(back.stop_token_ids, r.stop_token_ids);
  EXPECT_TRUE(back.ignore_eos);
  EXPECT_EQ(back.stop, r.stop);
  EXPECT_EQ(back.transport, Transport::kHttp);
}

TEST(ValidateTest, TheSamplerBoundsAreWhatTheDocsSay) {
  EXPECT_EQ(kTopKBound.lo, -1);
  EXPECT_EQ(kMinPBound.hi, 1);
  EXPECT_EQ(kRepetitionPenaltyBound.lo, 0.01);
  EXPECT_EQ(kRepetitionPenaltyBound.hi, 10);
  EXPECT_EQ(kPresencePenaltyBound.lo, -2);
  EXPECT_EQ(kFrequencyPenaltyBound.hi, 2);
  EXPECT_EQ(kLogitBiasBound.lo, -100);
  EXPECT_EQ(kLogitBiasBound.hi, 100);
}

TEST(ValidateTest, LogitBiasIdsAreInTheVocabulary) {
  Request r = Good();
  r.logit_bias = {{99, 1.0}};
  EXPECT_TRUE(Validate(r, Model()).ok());
  r.logit_bias = {{100, 1.0}};
  EXPECT_EQ(FieldOf(Validate(r, Model())), "logit_bias");
  r.logit_bias = {{-1, 1.0}};
  EXPECT_EQ(FieldOf(Validate(r, Limits{})), "logit_bias");
  r.logit_bias.assign(kMaxLogitBias + 1, {1, 1.0});
  EXPECT_EQ(FieldOf(Validate(r, Model())), "logit_bias");
}

TEST(ValidateTest, HttpMessagesNameTheOpenAiFields) {
  Request r = Good();
  r.transport = Transport::kHttp;
  r.max_new_tokens = 62;  // 3 + 62 > 64
  absl::Status s = Validate(r, Model());
  EXPECT_EQ(FieldOf(s), "max_tokens");
  EXPECT_NE(std::string(s.message()).find("max_tokens"), std::string::npos) << s;
  EXPECT_EQ(std::string(s.message()).find("max_new_tokens"), std::string::npos) << s;
  r = Good();
  r.transport = Transport::kHttp;
  r.prompt_ids.clear();
  s = Validate(r, Model());
  EXPECT_EQ(FieldOf(s), "prompt");
  EXPECT_EQ(std::string(s.message()).find("prompt_token_ids"), std::string::npos) << s;
  r = Good();
  r.transport = Transport::kHttp;
  r.prompt_ids.clear();
  r.prompt_text = "hello";
  s = EncodePrompt(&r, nullptr);
  EXPECT_EQ(FieldOf(s), "prompt");
  EXPECT_EQ(std::string(s.message()).find("prompt_token_ids"), std::string::npos) << s;
}

TEST(RequestProtoTest, RoundTripsTheSamplerChain) {
  Request r = Good();
  r.top_k = 40;
  r.min_p = 0.125;
  r.repetition_penalty = 1.5;
  r.presence_penalty = -0.5;
  r.frequency_penalty = 0.25;
  r.logit_bias = {{3, -100.0}, {9, 2.5}};
  v1::GenerateRequest m;
  ToProto(r, &m);
  const Request back = FromProto(m, Transport::kGrpc);
  EXPECT_EQ(back.top_k, 40);
  EXPECT_EQ(back.min_p, 0.125);
  EXPECT_EQ(back.repetition_penalty, 1.5);
  EXPECT_EQ(back.presence_penalty, -0.5);
  EXPECT_EQ(back.frequency_penalty, 0.25);
  EXPECT_EQ(back.logit_bias, r.logit_bias);
  EXPECT_FALSE(back.seed.has_value());
}

TEST(RequestProtoTest, AnEmptyMessageHasTheDefaults) {
  // The defaults of a gRPC request that sets nothing are the C++ struct's,
  // which are HTTP's and moectl's.
  const Request back = FromProto(v1::GenerateRequest(), Transport::kGrpc);
  const Request d;
  EXPECT_EQ(back.temperature, d.temperature);
  EXPECT_EQ(back.top_k, d.top_k);
  EXPECT_EQ(back.min_p, d.min_p);
  EXPECT_EQ(back.repetition_penalty, d.repetition_penalty);
  EXPECT_EQ(back.presence_penalty, d.presence_penalty);
  EXPECT_EQ(back.frequency_penalty, d.frequency_penalty);
  EXPECT_EQ(back.seed, d.seed);
  EXPECT_EQ(back.ignore_eos, d.ignore_eos);
  EXPECT_EQ(back.top_p == 0 ? 1.0 : back.top_p, d.top_p);  // proto 0 = off, as 1
}

TEST(ToGenerateOptionsTest, NoSeedIsARandomSeedEachTime) {
  Request r = Good();
  EXPECT_NE(ToGenerateOptions(r).sampling.seed, ToGenerateOptions(r).sampling.seed);
  r.seed = 5;
  EXPECT_EQ(ToGenerateOptions(r).sampling.seed, 5u);
  r.top_k = -1;  // vLLM's "off"
  EXPECT_EQ(ToGenerateOptions(r).sampling.top_k, 0);
}

}  // namespace
}  // namespace moe::serving
