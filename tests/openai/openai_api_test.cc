// The OpenAI request parser's sampler parameters (issue 27): every one the
// chain has, with serving::Request's defaults when absent, and errors whose
// "param" is the field the client sent.
#include "services/openai/openai_api.h"

#include "gtest/gtest.h"
#include "services/serving/request_proto.h"

namespace moe::openai {
namespace {

ModelInfo Tiny() {
  ModelInfo model;
  model.name = "tiny";
  model.context_length = 64;
  model.max_new_tokens_limit = 1000;
  return model;
}

serving::Request Parsed(Json body) {
  body["prompt"] = Json::array({1, 2, 3});
  ApiError e;
  std::optional<ApiRequest> r = ParseApiRequest(body, /*chat=*/false, Tiny(), &e);
  EXPECT_TRUE(r.has_value()) << body.dump() << ": " << e.message;
  return r.has_value() ? serving::FromProto(r->generate, serving::Transport::kHttp)
                       : serving::Request();
}

ApiError Refused(Json body) {
  if (!body.contains("prompt")) body["prompt"] = Json::array({1, 2, 3});
  ApiError e;
  EXPECT_FALSE(ParseApiRequest(body, /*chat=*/false, Tiny(), &e).has_value()) << body.dump();
  return e;
}

TEST(OpenAiSamplingTest, AbsentParametersTakeTheServingDefaults) {
  const serving::Request r = Parsed(Json::object());
  const serving::Request d;
  EXPECT_EQ(r.temperature, d.temperature);
  EXPECT_EQ(r.top_k, d.top_k);
  EXPECT_EQ(r.top_p, d.top_p);
  EXPECT_EQ(r.min_p, d.min_p);
  EXPECT_EQ(r.repetition_penalty, d.repetition_penalty);
  EXPECT_EQ(r.presence_penalty, d.presence_penalty);
  EXPECT_EQ(r.frequency_penalty, d.frequency_penalty);
  EXPECT_TRUE(r.logit_bias.empty());
  EXPECT_FALSE(r.seed.has_value());
  EXPECT_FALSE(r.ignore_eos);
}

TEST(OpenAiSamplingTest, EverySamplerParameterIsTaken) {
  const serving::Request r =
      Parsed({{"temperature", 0.5}, {"top_k", 40}, {"top_p", 0.75}, {"min_p", 0.125},
              {"repetition_penalty", 1.25}, {"presence_penalty", 0.5},
              {"frequency_penalty", -0.5}, {"logit_bias", {{"7", -100}, {"2", 3.5}}},
              {"seed", 12}, {"ignore_eos", true}});
  EXPECT_EQ(r.temperature, 0.5);
  EXPECT_EQ(r.top_k, 40);
  EXPECT_EQ(r.top_p, 0.75);
  EXPECT_EQ(r.min_p, 0.125);
  EXPECT_EQ(r.repetition_penalty, 1.25);
  EXPECT_EQ(r.presence_penalty, 0.5);
  EXPECT_EQ(r.frequency_penalty, -0.5);
  const std::vector<std::pair<int32_t, double>> bias = {{2, 3.5}, {7, -100}};
  EXPECT_EQ(r.logit_bias, bias);
  EXPECT_EQ(r.seed, 12u);
  EXPECT_TRUE(r.ignore_eos);
}

TEST(OpenAiSamplingTest, SeedMinusOneIsRandom) {
  EXPECT_FALSE(Parsed({{"seed", -1}}).seed.has_value());
  EXPECT_EQ(Parsed({{"seed", 0}}).seed, 0u);
  EXPECT_EQ(Refused({{"seed", -2}}).param, "seed");
  EXPECT_EQ(Refused({{"seed", 1.5}}).param, "seed");
}

TEST(OpenAiSamplingTest, BadValuesNameTheirParameter) {
  for (const char* p : {"top_k", "min_p", "repetition_penalty", "presence_penalty",
                        "frequency_penalty"}) {
    const ApiError e = Refused({{p, 1e6}});
    EXPECT_EQ(e.http_status, 400) << p;
    EXPECT_EQ(e.param, p) << e.message;
  }
  EXPECT_EQ(Refused({{"top_k", "x"}}).param, "top_k");
  EXPECT_EQ(Refused({{"ignore_eos", 1}}).param, "ignore_eos");
  EXPECT_EQ(Refused({{"logit_bias", {{"abc", 1}}}}).param, "logit_bias");
  EXPECT_EQ(Refused({{"logit_bias", {{"5", 101}}}}).param, "logit_bias");
  EXPECT_EQ(Refused({{"logit_bias", Json::array({1})}}).param, "logit_bias");
}

TEST(OpenAiErrorsTest, NameTheFieldTheClientSent) {
  // prompt + max_tokens past the context: OpenAI's name, never the gRPC one.
  ApiError e = Refused({{"max_tokens", 62}});
  EXPECT_EQ(e.param, "max_tokens");
  EXPECT_NE(e.message.find("max_tokens"), std::string::npos) << e.message;
  EXPECT_EQ(e.message.find("max_new_tokens"), std::string::npos) << e.message;
  e = Refused({{"prompt", "hello"}});  // text, but no tokenizer
  EXPECT_EQ(e.param, "prompt");
  EXPECT_EQ(e.message.find("prompt_token_ids"), std::string::npos) << e.message;
  const Json body = ErrorBody(Refused({{"temperature", 9}}));
  EXPECT_EQ(body["error"]["param"], "temperature");
  // The runner's errors carry the field too (the vocabulary is its to check).
  serving::Request r;
  r.transport = serving::Transport::kHttp;
  r.prompt_ids = {500};
  serving::Limits l;
  l.vocab_size = 100;
  EXPECT_EQ(ErrorFromStatus(serving::Validate(r, l)).param, "prompt");
  r.prompt_ids = {1};
  r.logit_bias = {{100, 1}};
  EXPECT_EQ(ErrorFromStatus(serving::Validate(r, l)).param, "logit_bias");
}

}  // namespace
}  // namespace moe::openai
