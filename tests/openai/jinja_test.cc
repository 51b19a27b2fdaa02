// The Jinja subset against Python's jinja2 (goldens made by
// make_template_goldens.py from templates/ in the style of the published
// ChatML/Qwen2, Qwen3, Mistral/Mixtral, OLMoE/Tulu and DeepSeek templates),
// its errors, the chat template loader, stop strings and the OpenAI
// request rules.
#include "services/openai/jinja.h"

#include <fstream>

#include "gtest/gtest.h"
#include "services/serving/stop_strings.h"
#include "services/openai/chat_template.h"
#include "services/openai/openai_api.h"
#include "tests/common/test_util.h"

namespace moe {
namespace {

using Json = nlohmann::ordered_json;

std::string Source(const std::string& rel) {
  return moe::testing::ReadText(std::string(MOE_SOURCE_DIR) + "/tests/openai/" + rel);
}

TEST(JinjaTest, EveryGoldenRendersAsPythonJinja2Does) {
  Json cases = Json::parse(Source("template_goldens.json"));
  ASSERT_GE(cases.size(), 40u);
  int errors = 0;
  for (const Json& c : cases) {
    const std::string name = c["template"].get<std::string>();
    absl::StatusOr<jinja::JinjaTemplate> t = jinja::JinjaTemplate::Parse(Source("templates/" + name));
    ASSERT_TRUE(t.ok()) << name << ": " << t.status();
    Json context = c["extra"];
    context["messages"] = c["messages"];
    context["add_generation_prompt"] = c["add_generation_prompt"];
    context["bos_token"] = "<s>";
    context["eos_token"] = "</s>";
    absl::StatusOr<std::string> out = t->Render(context);
    const std::string what = name + " on " + c["messages"].dump();
    if (c.contains("error")) {
      ++errors;
      ASSERT_FALSE(out.ok()) << what;
      EXPECT_EQ(out.status().code(), absl::StatusCode::kFailedPrecondition) << what;
      EXPECT_EQ(out.status().message(), c["error"].get<std::string>()) << what;
    } else {
      ASSERT_TRUE(out.ok()) << what << ": " << out.status();
      EXPECT_EQ(*out, c["output"].get<std::string>()) << what;
    }
  }
  EXPECT_GT(errors, 0);  // Mistral's raise_exception is exercised
}

TEST(JinjaTest, SyntaxErrorsNameTheLine) {
  auto t = jinja::JinjaTemplate::Parse("a\n{% if x %}\nb");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("endif"), std::string::npos) << t.status();
  t = jinja::JinjaTemplate::Parse("a\n\n{% macro m() %}{% endmacro %}");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("line 3"), std::string::npos) << t.status();
  EXPECT_NE(t.status().message().find("macro"), std::string::npos) << t.status();
  EXPECT_FALSE(jinja::JinjaTemplate::Parse("{{ 'open }}").ok());
  EXPECT_FALSE(jinja::JinjaTemplate::Parse("{{ a + }}").ok());
}

TEST(JinjaTest, RenderErrorsAreStatuses) {
  // Unknown filters and tests are found when parsing, not when rendering.
  auto t = jinja::JinjaTemplate::Parse("{{ x | nosuchfilter }}");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("nosuchfilter"), std::string::npos);
  EXPECT_FALSE(jinja::JinjaTemplate::Parse("{{ x is nosuchtest }}").ok());
  t = jinja::JinjaTemplate::Parse("{{ x.nomethod() }}");
  ASSERT_TRUE(t.ok());
  auto out = t->Render(Json{{"x", "s"}});
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(out.status().message().find("nomethod"), std::string::npos);
  t = jinja::JinjaTemplate::Parse("{{ 1 / 0 }}");
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE(t->Render(Json::object()).ok());
}

TEST(JinjaTest, PythonJsonDumps) {
  Json j = Json::parse(R"({"a": [1, 2.5, "x\u00e9"], "b": null})");
  EXPECT_EQ(jinja::PythonJsonDumps(j), "{\"a\": [1, 2.5, \"x\xc3\xa9\"], \"b\": null}");
}

TEST(ChatTemplateTest, LoadsFromTokenizerConfigAndFailsAtStartWhenUnrenderable) {
  moe::testing::TempDir dir;
  Json config = {{"bos_token", "<s>"}, {"eos_token", {{"content", "</s>"}}},
                 {"chat_template", Source("templates/mistral.jinja")}};
  moe::testing::WriteText(dir.Sub("tokenizer_config.json"), config.dump());
  auto t = openai::ChatTemplate::FromModelDir(dir.path());
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_NE(*t, nullptr);
  auto out = (*t)->Apply(Json::array({{{"role", "user"}, {"content", "Hi"}}}), true);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "<s> [INST] Hi [/INST]");

  config["chat_template"] = "{{ messages[0].content.nomethod() }}";
  moe::testing::WriteText(dir.Sub("tokenizer_config.json"), config.dump());
  t = openai::ChatTemplate::FromModelDir(dir.path());
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("cannot render"), std::string::npos) << t.status();

  config.erase("chat_template");
  moe::testing::WriteText(dir.Sub("tokenizer_config.json"), config.dump());
  t = openai::ChatTemplate::FromModelDir(dir.path());
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*t, nullptr);
}

TEST(StopStringsTest, HoldsBackPrefixesAndCutsAtTheMatch) {
  serving::StopStringMatcher m({"END", "\n\n"});
  EXPECT_EQ(m.Push("abc E"), "abc ");
  EXPECT_EQ(m.Push("N"), "");
  EXPECT_EQ(m.Push("x"), "ENx");
  EXPECT_FALSE(m.matched());
  EXPECT_EQ(m.Push("yz\n"), "yz");
  EXPECT_EQ(m.Push("\nmore"), "");
  EXPECT_TRUE(m.matched());
  EXPECT_EQ(m.Flush(), "");
  serving::StopStringMatcher n({"STOP"});
  EXPECT_EQ(n.Push("aST"), "a");
  EXPECT_EQ(n.Flush(), "ST");
}

openai::ApiError Refusal(const Json& body, bool chat) {
  openai::ModelInfo model;
  model.name = "tiny";
  model.context_length = 64;
  model.max_new_tokens_limit = 1000;
  openai::ApiError e;
  EXPECT_FALSE(openai::ParseApiRequest(body, chat, model, &e).has_value()) << body.dump();
  return e;
}

// A token id beyond int32 is refused, not truncated to another (valid) id:
// 2^32 + 5 must not become token 5.
TEST(OpenAiApiTest, PromptTokenIdsOutsideInt32AreRefused) {
  for (const Json& id : {Json(4294967301LL), Json(2147483648LL), Json(-1), Json(18446744073709551615ULL),
                         Json(-9223372036854775807LL - 1)}) {
    openai::ApiError e = Refusal({{"prompt", Json::array({1, id})}}, false);
    EXPECT_EQ(e.param, "prompt") << id.dump();
    EXPECT_NE(e.message.find(id.dump()), std::string::npos) << e.message;
  }
}

TEST(OpenAiApiTest, RefusesWhatItDoesNotSupportByName) {
  const Json ids = Json::array({1, 2, 3});
  EXPECT_EQ(Refusal({{"prompt", ids}, {"n", 2}}, false).param, "n");
  EXPECT_EQ(Refusal({{"prompt", ids}, {"bogus", 1}}, false).param, "bogus");
  EXPECT_EQ(Refusal({{"prompt", ids}, {"temperature", 3}}, false).param, "temperature");
  EXPECT_EQ(Refusal({{"prompt", ids}, {"max_tokens", 0}}, false).param, "max_tokens");
  EXPECT_EQ(Refusal({{"prompt", ids}, {"stop", Json::array({"a", "b", "c", "d", "e"})}}, false).param,
            "stop");
  EXPECT_EQ(Refusal({{"prompt", Json::array({"a", "b"})}}, false).param, "prompt");
  EXPECT_EQ(Refusal({{"prompt", ids}, {"stream_options", {{"include_usage", true}}}}, false).param,
            "stream_options");
  openai::ApiError model = Refusal({{"prompt", ids}, {"model", "gpt-4"}}, false);
  EXPECT_EQ(model.http_status, 404);
  EXPECT_EQ(model.code, "model_not_found");
  const Json image = {{"role", "user"},
                      {"content", Json::array({{{"type", "image_url"}, {"image_url", "x"}}})}};
  EXPECT_EQ(Refusal({{"messages", Json::array({image})}}, true).param, "messages[0].content");
  EXPECT_EQ(Refusal({{"messages", Json::array()}}, true).param, "messages");
  EXPECT_EQ(Refusal({{"messages", Json::array({{{"role", "user"}, {"content", "x"}}})},
                     {"tools", Json::array({{{"type", "function"}}})}},
                    true)
                .param,
            "tools[0]");
  Json body = openai::ErrorBody(Refusal({{"prompt", ids}, {"n", 3}}, false));
  EXPECT_TRUE(body["error"]["message"].is_string());
  EXPECT_EQ(body["error"]["type"], "invalid_request_error");
  EXPECT_EQ(body["error"]["param"], "n");
  EXPECT_TRUE(body["error"]["code"].is_null());
}

TEST(OpenAiApiTest, TranslatesACompletion) {
  openai::ModelInfo model;
  model.name = "tiny";
  model.context_length = 64;
  model.max_new_tokens_limit = 1000;
  openai::ApiError e;
  auto r = openai::ParseApiRequest(
      {{"model", "tiny"}, {"prompt", Json::array({Json::array({5, 6})})}, {"max_tokens", 7},
       {"temperature", 0}, {"seed", 9}, {"stop", "x"}, {"logprobs", 2}, {"stream", true},
       {"stream_options", {{"include_usage", true}}}},
      false, model, &e);
  ASSERT_TRUE(r.has_value()) << e.message;
  EXPECT_EQ(r->generate.prompt_token_ids_size(), 2);
  EXPECT_EQ(r->generate.max_new_tokens(), 7);
  EXPECT_EQ(r->generate.seed(), 9u);
  EXPECT_EQ(r->generate.top_logprobs(), 2);
  ASSERT_EQ(r->generate.stop_size(), 1);
  EXPECT_TRUE(r->stream && r->include_usage && r->logprobs);
}

}  // namespace
}  // namespace moe
