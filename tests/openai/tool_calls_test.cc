// Tools and structured output in the OpenAI layer (issue 27): what a
// request's tools / tool_choice / response_format become (the mode, the
// schema decoding is constrained to, the template's `tools`), the errors
// naming the parameter, and how the text comes back as tool_calls,
// streamed and not.
#include "services/openai/tool_calls.h"

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "services/engine/tokenizer.h"
#include "services/openai/chat_template.h"
#include "services/openai/openai_api.h"
#include "tests/common/test_util.h"
#include "tests/common/tiny_model.h"

namespace moe::openai {
namespace {

TEST(ToolCallTextTest, ForcedCalls) {
  auto named = ForcedToolCall(" {\"city\": \"Paris\"}", "weather");
  ASSERT_TRUE(named.has_value());
  EXPECT_EQ(named->name, "weather");
  EXPECT_EQ(named->arguments, " {\"city\": \"Paris\"}");  // as written (and streamed)
  EXPECT_FALSE(ForcedToolCall("{\"city\": \"Par", "weather").has_value());  // cut short
  EXPECT_FALSE(ForcedToolCall("[1]", "weather").has_value());
  auto required = ForcedToolCall("{\"arguments\": {\"n\": 1}, \"name\": \"count\"}", "");
  ASSERT_TRUE(required.has_value());
  EXPECT_EQ(required->name, "count");
  EXPECT_EQ(required->arguments, "{\"n\":1}");
}

TEST(ToolCallTextTest, BlocksNamingOfferedToolsBecomeCalls) {
  const std::vector<std::string> tools = {"a", "b"};
  ParsedText p = ParseToolCallBlocks(
      "Sure.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n</tool_call>\n"
      "<tool_call>{\"name\": \"zzz\", \"arguments\": {}}</tool_call>"
      "<tool_call>{\"name\": \"b\", \"arguments\": \"{\\\"y\\\": [2]}\"}</tool_call> done",
      tools);
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].name, "a");
  EXPECT_EQ(p.calls[0].arguments, "{\"x\":1}");
  EXPECT_EQ(p.calls[1].name, "b");
  EXPECT_EQ(p.calls[1].arguments, "{\"y\":[2]}");  // a string of JSON, parsed
  // The unknown tool's block stays content, in place.
  EXPECT_EQ(p.content,
            "Sure.\n\n<tool_call>{\"name\": \"zzz\", \"arguments\": {}}</tool_call> done");
  EXPECT_TRUE(ParseToolCallBlocks("no calls <tool_call>{\"name\":\"a\"", tools).calls.empty());
  EXPECT_TRUE(ParseToolCallBlocks("<tool_call>not json</tool_call>", tools).calls.empty());
  EXPECT_TRUE(
      ParseToolCallBlocks("<tool_call>{\"name\":\"a\",\"arguments\":[1]}</tool_call>", tools)
          .calls.empty());
}

TEST(ToolCallTextTest, StreamingHoldsBackWhatMayBeginACall) {
  EXPECT_EQ(StreamableContent("plain text"), 10u);
  EXPECT_EQ(StreamableContent("text <tool"), 5u);
  EXPECT_EQ(StreamableContent("text <"), 5u);
  EXPECT_EQ(StreamableContent("a <b> c"), 7u);
  EXPECT_EQ(StreamableContent("x<tool_call>{"), 1u);
}

class ToolRequestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(moe::testing::MakeTinyModel(dir_.path()).ok());
    auto tok = Tokenizer::FromFile(dir_.Sub("tokenizer.json"));
    ASSERT_TRUE(tok.ok());
    tokenizer_ = std::move(*tok);
    bool fallback = false;
    std::string origin;
    auto t = ChatTemplate::Resolve("chatml", dir_.path(), &fallback, &origin);
    ASSERT_TRUE(t.ok()) << t.status();
    template_ = std::move(*t);
    model_.name = "tiny";
    model_.tokenizer = tokenizer_.get();
    model_.chat_template = template_.get();
    model_.context_length = 4096;
    model_.max_new_tokens_limit = 1000;
  }

  static Json Tool(const std::string& name, Json parameters = nullptr) {
    Json fn = {{"name", name}, {"description", "d"}};
    if (!parameters.is_null()) fn["parameters"] = parameters;
    return {{"type", "function"}, {"function", fn}};
  }
  static Json Body(Json extra) {
    Json b = {{"messages", Json::array({{{"role", "user"}, {"content", "Hi"}}})},
              {"max_tokens", 8}};
    for (auto& [k, v] : extra.items()) b[k] = v;
    return b;
  }
  std::optional<ApiRequest> Parse(const Json& body, ApiError* e) {
    return ParseApiRequest(body, /*chat=*/true, model_, e);
  }
  std::string Param(const Json& extra) {
    ApiError e;
    EXPECT_FALSE(Parse(Body(extra), &e).has_value()) << extra.dump();
    return e.param;
  }
  std::string Prompt(const ApiRequest& r) {
    std::vector<int32_t> ids(r.generate.prompt_token_ids().begin(),
                             r.generate.prompt_token_ids().end());
    return tokenizer_->Decode(ids);
  }

  moe::testing::TempDir dir_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<ChatTemplate> template_;
  ModelInfo model_;
};

const Json kArgs = {{"type", "object"},
                    {"properties", {{"n", {{"type", "integer"}}}}},
                    {"required", {"n"}},
                    {"additionalProperties", false}};

TEST_F(ToolRequestTest, ModesSchemasAndTheTemplatesTools) {
  const Json tools = Json::array({Tool("count", kArgs), Tool("ping")});
  ApiError e;
  auto automatic = Parse(Body({{"tools", tools}}), &e);
  ASSERT_TRUE(automatic.has_value()) << e.message;
  EXPECT_EQ(automatic->tool_mode, ToolMode::kAuto);
  EXPECT_EQ(automatic->generate.json_schema(), "");  // unconstrained
  EXPECT_EQ(automatic->tool_names, (std::vector<std::string>{"count", "ping"}));
  const std::string prompt = Prompt(*automatic);
  // Each tool as Jinja's tojson writes it (Python's separators).
  EXPECT_NE(prompt.find("<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"count\", "
                        "\"description\": \"d\", \"parameters\": {\"type\": \"object\""),
            std::string::npos)
      << prompt;
  EXPECT_NE(prompt.find("<tool_call>"), std::string::npos) << prompt;

  auto none = Parse(Body({{"tools", tools}, {"tool_choice", "none"}}), &e);
  ASSERT_TRUE(none.has_value());
  EXPECT_EQ(none->tool_mode, ToolMode::kNone);
  EXPECT_EQ(Prompt(*none).find("<tools>"), std::string::npos);

  auto named = Parse(Body({{"tools", tools},
                           {"tool_choice", {{"type", "function"}, {"function", {{"name", "count"}}}}}}),
                     &e);
  ASSERT_TRUE(named.has_value()) << e.message;
  EXPECT_EQ(named->tool_mode, ToolMode::kNamed);
  EXPECT_EQ(named->tool_name, "count");
  EXPECT_EQ(Json::parse(named->generate.json_schema()), kArgs);

  auto required = Parse(Body({{"tools", tools}, {"tool_choice", "required"}}), &e);
  ASSERT_TRUE(required.has_value()) << e.message;
  EXPECT_EQ(required->tool_mode, ToolMode::kRequired);
  const Json schema = Json::parse(required->generate.json_schema());
  ASSERT_EQ(schema["anyOf"].size(), 2u) << schema;
  EXPECT_EQ(schema["anyOf"][0]["properties"]["name"]["const"], "count");
  EXPECT_EQ(schema["anyOf"][0]["properties"]["arguments"], kArgs);

  auto object = Parse(Body({{"response_format", {{"type", "json_object"}}}}), &e);
  ASSERT_TRUE(object.has_value());
  EXPECT_EQ(Json::parse(object->generate.json_schema()), (Json{{"type", "object"}}));
  auto js = Parse(Body({{"response_format",
                         {{"type", "json_schema"},
                          {"json_schema", {{"name", "n"}, {"schema", kArgs}, {"strict", true}}}}}}),
                  &e);
  ASSERT_TRUE(js.has_value()) << e.message;
  EXPECT_EQ(Json::parse(js->generate.json_schema()), kArgs);

  // A conversation with a call and its result is rendered as the template says.
  const Json messages = Json::array(
      {{{"role", "user"}, {"content", "Count"}},
       {{"role", "assistant"},
        {"content", nullptr},
        {"tool_calls",
         Json::array({{{"id", "call_1"},
                       {"type", "function"},
                       {"function", {{"name", "count"}, {"arguments", "{\"n\": 3}"}}}}})}},
       {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "three"}}});
  auto turn = Parse({{"messages", messages}, {"tools", tools}, {"max_tokens", 4}}, &e);
  ASSERT_TRUE(turn.has_value()) << e.message;
  EXPECT_NE(Prompt(*turn).find("<|im_start|>assistant\n\n<tool_call>\n{\"name\": \"count\", "
                               "\"arguments\": {\"n\": 3}}\n</tool_call><|im_end|>\n"
                               "<|im_start|>user\n<tool_response>\nthree\n</tool_response>"),
            std::string::npos)
      << Prompt(*turn);
}

TEST_F(ToolRequestTest, BadToolsAndFormatsNameTheirParameter) {
  const Json tools = Json::array({Tool("count", kArgs)});
  EXPECT_EQ(Param({{"tools", Json::array({Tool("bad name!")})}}), "tools[0].function.name");
  EXPECT_EQ(Param({{"tools", Json::array({Tool("a"), Tool("a")})}}), "tools[1].function.name");
  EXPECT_EQ(Param({{"tools", Json::array({Tool("a", {{"type", "string"}, {"pattern", "x"}})})}}),
            "tools[0].function.parameters");
  EXPECT_EQ(Param({{"tools", "x"}}), "tools");
  EXPECT_EQ(Param({{"tool_choice", "required"}}), "tool_choice");
  EXPECT_EQ(Param({{"tools", tools},
                   {"tool_choice", {{"type", "function"}, {"function", {{"name", "nope"}}}}}}),
            "tool_choice");
  EXPECT_EQ(Param({{"tools", tools}, {"tool_choice", "sometimes"}}), "tool_choice");
  EXPECT_EQ(Param({{"tools", tools},
                   {"tool_choice", "required"},
                   {"response_format", {{"type", "json_object"}}}}),
            "tool_choice");
  EXPECT_EQ(Param({{"response_format", {{"type", "xml"}}}}), "response_format");
  EXPECT_EQ(Param({{"response_format",
                    {{"type", "json_schema"}, {"json_schema", {{"schema", {{"type", "string"},
                                                                          {"format", "date"}}}}}}}}),
            "response_format");
  EXPECT_EQ(Param({{"response_format", {{"type", "json_schema"}, {"json_schema", {{"x", 1}}}}}}),
            "response_format");
  EXPECT_EQ(Param({{"functions", Json::array({{{"name", "f"}}})}}), "functions");
  EXPECT_EQ(Param({{"parallel_tool_calls", 1}}), "parallel_tool_calls");
  const Json bad_call = {{"role", "assistant"}, {"tool_calls", Json::array({1})}};
  EXPECT_EQ(Param({{"messages", Json::array({bad_call})}}), "messages[0].tool_calls");
}

v1::GenerateResponse Token(const std::string& text, const std::string& finish = "") {
  v1::GenerateResponse r;
  r.set_text(text);
  r.set_finish_reason(finish);
  return r;
}

TEST_F(ToolRequestTest, CallsComeBackInOpenAisShapeStreamedAndNot) {
  const Json tools = Json::array({Tool("count", kArgs), Tool("ping")});
  ApiError e;
  // Named: arguments stream as tool_calls deltas.
  auto named = Parse(Body({{"tools", tools},
                           {"tool_choice", {{"type", "function"}, {"function", {{"name", "count"}}}}}}),
                     &e);
  ASSERT_TRUE(named.has_value());
  {
    ResponseAssembler stream(*named, model_, "chatcmpl-7", 1);
    Json a = stream.Chunk(Token("{\"n\""));
    Json b = stream.Chunk(Token(": 4}", "stop"));
    EXPECT_EQ(a["choices"][0]["delta"]["role"], "assistant");
    const Json& first = a["choices"][0]["delta"]["tool_calls"][0];
    EXPECT_EQ(first["index"], 0);
    EXPECT_EQ(first["id"], "call_7_0");
    EXPECT_EQ(first["function"]["name"], "count");
    EXPECT_EQ(first["function"]["arguments"], "{\"n\"");
    EXPECT_FALSE(a["choices"][0]["delta"].contains("content"));
    EXPECT_EQ(b["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"], ": 4}");
    EXPECT_EQ(b["choices"][0]["finish_reason"], "tool_calls");
    ResponseAssembler whole(*named, model_, "chatcmpl-7", 1);
    whole.Add(Token("{\"n\""));
    whole.Add(Token(": 4}", "stop"));
    const Json f = whole.Final();
    EXPECT_TRUE(f["choices"][0]["message"]["content"].is_null());
    EXPECT_EQ(f["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"], "{\"n\": 4}");
    EXPECT_EQ(f["choices"][0]["finish_reason"], "tool_calls");
    // Cut short: text, finish "length".
    ResponseAssembler cut(*named, model_, "chatcmpl-7", 1);
    cut.Add(Token("{\"n\"", "length"));
    EXPECT_EQ(cut.Final()["choices"][0]["message"]["content"], "{\"n\"");
    EXPECT_EQ(cut.Final()["choices"][0]["finish_reason"], "length");
  }
  // Auto: content streams until a call may begin; the calls come last.
  auto automatic = Parse(Body({{"tools", tools}}), &e);
  ASSERT_TRUE(automatic.has_value());
  {
    ResponseAssembler stream(*automatic, model_, "chatcmpl-8", 1);
    Json a = stream.Chunk(Token("Let me <tool"));
    Json b = stream.Chunk(Token("_call>{\"name\": \"ping\", \"arguments\": {}}"));
    Json c = stream.Chunk(Token("</tool_call>", "stop"));
    EXPECT_EQ(a["choices"][0]["delta"]["content"], "Let me ");
    EXPECT_FALSE(b["choices"][0]["delta"].contains("content"));
    EXPECT_TRUE(b["choices"][0]["finish_reason"].is_null());
    EXPECT_EQ(c["choices"][0]["delta"]["tool_calls"][0]["function"]["name"], "ping");
    EXPECT_EQ(c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"], "{}");
    EXPECT_EQ(c["choices"][0]["finish_reason"], "tool_calls");
    ResponseAssembler plain(*automatic, model_, "chatcmpl-9", 1);
    Json p = plain.Chunk(Token("a < b", "length"));
    EXPECT_EQ(p["choices"][0]["delta"]["content"], "a < b");  // nothing held back at the end
    EXPECT_EQ(p["choices"][0]["finish_reason"], "length");
  }
  // Required: the call goes out whole with the last chunk.
  auto required = Parse(Body({{"tools", tools}, {"tool_choice", "required"}}), &e);
  ASSERT_TRUE(required.has_value());
  ResponseAssembler stream(*required, model_, "chatcmpl-10", 1);
  Json a = stream.Chunk(Token("{\"name\": \"count\", "));
  Json b = stream.Chunk(Token("\"arguments\": {\"n\": 2}}", "stop"));
  EXPECT_FALSE(a["choices"][0]["delta"].contains("tool_calls"));
  EXPECT_EQ(b["choices"][0]["delta"]["tool_calls"][0]["function"]["name"], "count");
  EXPECT_EQ(b["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"], "{\"n\":2}");
  EXPECT_EQ(b["choices"][0]["finish_reason"], "tool_calls");
}

}  // namespace
}  // namespace moe::openai
