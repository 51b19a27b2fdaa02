// Chat templates on live workers (issue 27): the trained model
// deploy/models/kjv-moe chats with its own template through the official
// OpenAI Node client, streamed and not, with the gRPC path's tokens; a model
// without a template falls back to ChatML with a warning; --chat-template
// picks a built-in or refuses what it cannot use.
#include <fstream>

#include "absl/strings/ascii.h"
#include "gtest/gtest.h"
#include "services/engine/tokenizer.h"
#include "services/openai/chat_template.h"
#include "services/rpc/rpc_util.h"
#include "tests/common/test_util.h"
#include "tests/common/tiny_model.h"
#include "tests/moe_worker/worker_process.h"
#include "tests/moe_worker/worker_test_util.h"

namespace moe::worker {
namespace {

using Json = nlohmann::ordered_json;
using testing::RunShell;
using testing::WorkerProcess;

class TrainedChatTest : public ::testing::Test {
 protected:
  // A worker on `model` with every expert in memory; false if it does not
  // serve.
  bool Start(const std::string& model, const std::vector<std::string>& extra = {}) {
    sock_ = "unix:" + dir_.Sub("w.sock");
    std::vector<std::string> args = {"--model", model, "--listen", sock_, "--backend", "cpu",
                                     "--metrics-addr", "", "--cache", "none", "--http-listen",
                                     "127.0.0.1:0", "--port-file", dir_.Sub("ports.json")};
    args.insert(args.end(), extra.begin(), extra.end());
    if (!worker_.Spawn(args, dir_.Sub("worker.log")) || !worker_.WaitServing(sock_)) return false;
    base_ = "http://127.0.0.1:" +
            std::to_string(testing::PortFromFile(dir_.Sub("ports.json"), "http_port"));
    return true;
  }

  // POSTs `body` to /v1/chat/completions; the HTTP status in *status.
  Json Chat(const Json& body, int* status) {
    moe::testing::WriteText(dir_.Sub("body.json"), body.dump());
    int code = 0;
    const std::string out = RunShell("curl -sS -w '\\n%{http_code}' -H 'Content-Type: "
                                     "application/json' --data-binary @" +
                                         dir_.Sub("body.json") + " " + base_ +
                                         "/v1/chat/completions",
                                     &code, /*with_stderr=*/false);
    EXPECT_EQ(code, 0) << out;
    const size_t nl = out.rfind('\n');
    *status = std::atoi(out.substr(nl + 1).c_str());
    return Json::parse(out.substr(0, nl), nullptr, false);
  }

  // Greedy tokens over gRPC for `prompt`, decoded.
  std::string GrpcText(const std::vector<int32_t>& prompt, int n) {
    auto stub = v1::Inference::NewStub(rpc::MakeChannel(*rpc::ParseListenAddress(sock_)));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    v1::GenerateRequest r;
    for (int32_t id : prompt) r.add_prompt_token_ids(id);
    r.set_max_new_tokens(n);
    auto reader = stub->Generate(&ctx, r);
    std::string text;
    v1::GenerateResponse resp;
    while (reader->Read(&resp)) text += resp.text();
    EXPECT_TRUE(reader->Finish().ok());
    return text;
  }

  moe::testing::TempDir dir_;
  WorkerProcess worker_;
  std::string sock_, base_;
};

const std::string& TrainedModel() {
  static const std::string dir = std::string(MOE_SOURCE_DIR) + "/deploy/models/kjv-moe";
  return dir;
}

TEST_F(TrainedChatTest, OfficialNodeClientChatsWithTheTrainedModelsOwnTemplate) {
  const std::string node_dir = std::string(MOE_SOURCE_DIR) + "/tests/openai_node";
  ASSERT_TRUE(std::ifstream(node_dir + "/node_modules/openai/package.json").good())
      << "the openai npm package is not installed: run scripts/setup-deps.sh "
         "(npm ci in tests/openai_node)";
  ASSERT_TRUE(Start(TrainedModel())) << worker_.Log();
  EXPECT_NE(worker_.Log().find("chat template: " + TrainedModel() + "/tokenizer_config.json"),
            std::string::npos)
      << worker_.Log();
  EXPECT_EQ(worker_.Log().find("ChatML"), std::string::npos) << worker_.Log();
  int code = 0;
  const std::string out = RunShell("BASE_URL=" + base_ + "/v1 MODEL=kjv-moe node " + node_dir +
                                       "/trained_chat_test.mjs",
                                   &code, /*with_stderr=*/false);
  ASSERT_EQ(code, 0) << out << worker_.Log();
  const Json j = Json::parse(out);
  // The reply is the greedy continuation of the template's text, as gRPC
  // gives it for the same prompt.
  auto tmpl = openai::ChatTemplate::FromModelDir(TrainedModel());
  ASSERT_TRUE(tmpl.ok() && *tmpl != nullptr);
  const Json messages =
      Json::array({{{"role", "user"}, {"content", "Who made the heaven and the earth?"}}});
  auto text = (*tmpl)->Apply(messages, true);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "And he said unto him, Who made the heaven and the earth?\n"
                   "And he answered and said,");
  auto tok = Tokenizer::FromFile(TrainedModel() + "/tokenizer.json");
  ASSERT_TRUE(tok.ok());
  const std::string grpc = GrpcText((*tok)->Encode(*text, false), 16);
  EXPECT_EQ(j["text"], grpc);
  EXPECT_EQ(j["nonstream_text"], grpc);
  EXPECT_EQ(j["role"], "assistant");
  EXPECT_EQ(j["finish"], "length");
  EXPECT_EQ(j["nonstream_finish"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 16);
  EXPECT_EQ(j["usage"]["prompt_tokens"], static_cast<int>((*tok)->Encode(*text, false).size()));
  EXPECT_GE(j["chunks"].get<int>(), 17);
  // Text the model continues in kind: English words, not byte soup.
  const std::string reply = j["text"];
  int letters = 0;
  for (char c : reply) letters += absl::ascii_isalpha(static_cast<unsigned char>(c)) ? 1 : 0;
  EXPECT_GE(letters, static_cast<int>(reply.size()) / 2) << reply;
  // Seeded sampling repeats itself.
  ASSERT_EQ(j["sampled"].size(), 2u);
  EXPECT_EQ(j["sampled"][0], j["sampled"][1]);
}

// structured_test.mjs's `verse` schema, checked by hand on the parsed value.
bool IsVerse(const Json& v) {
  if (!v.is_object() || v.size() != 4) return false;
  for (const char* k : {"book", "chapter", "words", "names"}) {
    if (!v.contains(k)) return false;
  }
  const Json& book = v["book"];
  if (book != "Genesis" && book != "Exodus" && book != "Psalms") return false;
  if (!v["chapter"].is_number_integer() || v["chapter"].get<int64_t>() < 1 ||
      v["chapter"].get<int64_t>() > 150) {
    return false;
  }
  auto code_points = [](const std::string& s) {
    size_t n = 0;
    for (unsigned char c : s) n += (c & 0xC0) != 0x80;
    return n;
  };
  if (!v["words"].is_string() || code_points(v["words"].get<std::string>()) > 40) return false;
  if (!v["names"].is_array() || v["names"].size() > 3) return false;
  for (const Json& n : v["names"]) {
    if (!n.is_string() || code_points(n.get<std::string>()) > 12) return false;
  }
  return true;
}

Json ParsedOrNull(const Json& text) {
  return text.is_string() ? Json::parse(text.get<std::string>(), nullptr, false) : Json();
}

TEST_F(TrainedChatTest, OfficialNodeClientGetsStructuredOutputAndToolCalls) {
  const std::string node_dir = std::string(MOE_SOURCE_DIR) + "/tests/openai_node";
  ASSERT_TRUE(std::ifstream(node_dir + "/node_modules/openai/package.json").good())
      << "the openai npm package is not installed: run scripts/setup-deps.sh "
         "(npm ci in tests/openai_node)";
  ASSERT_TRUE(Start(TrainedModel())) << worker_.Log();
  int code = 0;
  const std::string out = RunShell("BASE_URL=" + base_ + "/v1 MODEL=kjv-moe node " + node_dir +
                                       "/structured_test.mjs",
                                   &code, /*with_stderr=*/true);
  ASSERT_EQ(code, 0) << out << worker_.Log();
  const Json j = Json::parse(out.substr(out.rfind('{', out.find("\"schema_content\""))), nullptr,
                             false);
  ASSERT_TRUE(j.is_object()) << out;
  // response_format json_schema: a value of the schema, ended by itself.
  EXPECT_TRUE(IsVerse(ParsedOrNull(j["schema_content"]))) << j["schema_content"];
  EXPECT_EQ(j["schema_finish"], "stop");
  const Json object = ParsedOrNull(j["object_content"]);
  EXPECT_TRUE(object.is_object()) << j["object_content"];
  EXPECT_EQ(j["object_finish"], "stop");
  // A forced call by name: OpenAI's shape, arguments of the schema.
  const Json& named = j["named"];
  EXPECT_TRUE(named["content"].is_null()) << named;
  ASSERT_EQ(named["tool_calls"].size(), 1u) << named;
  const Json& call = named["tool_calls"][0];
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["function"]["name"], "get_verse");
  EXPECT_TRUE(call["id"].is_string() && !call["id"].get<std::string>().empty()) << call;
  EXPECT_TRUE(IsVerse(ParsedOrNull(call["function"]["arguments"]))) << call;
  EXPECT_EQ(j["named_finish"], "tool_calls");
  // Streamed: the same call, arguments in pieces.
  const Json& streamed = j["named_streamed"];
  EXPECT_EQ(streamed["name"], "get_verse");
  EXPECT_EQ(streamed["arguments"], call["function"]["arguments"]);
  EXPECT_EQ(streamed["finish"], "tool_calls");
  EXPECT_EQ(streamed["content"], "");
  EXPECT_GT(j["streamed_usage"]["completion_tokens"].get<int>(), 3) << j["streamed_usage"];
  // The repeat of the same prompt found it in the prefix cache.
  EXPECT_GT(j["streamed_usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 0)
      << j["streamed_usage"];
  // "required": one of the tools, its arguments of its schema; streamed the same.
  const Json& required = j["required"];
  ASSERT_EQ(required["tool_calls"].size(), 1u) << required;
  const std::string name = required["tool_calls"][0]["function"]["name"];
  const Json args = ParsedOrNull(required["tool_calls"][0]["function"]["arguments"]);
  if (name == "get_verse") {
    EXPECT_TRUE(IsVerse(args)) << args;
  } else {
    EXPECT_EQ(name, "count_words");
    EXPECT_TRUE(args.is_object() && args.size() == 1 && args["n"].is_number_integer() &&
                args["n"].get<int>() >= 0 && args["n"].get<int>() <= 9)
        << args;
  }
  EXPECT_EQ(j["required_finish"], "tool_calls");
  EXPECT_EQ(j["required_streamed"]["name"], name);
  EXPECT_EQ(j["required_streamed"]["arguments"], required["tool_calls"][0]["function"]["arguments"]);
  EXPECT_EQ(j["required_streamed"]["finish"], "tool_calls");
  // The tool's result went back in and was answered.
  EXPECT_EQ(j["follow_up_finish"], "length") << j;
  EXPECT_EQ(j["follow_up_usage"]["completion_tokens"], 8);
  // An unsupported keyword: 400 naming response_format and the keyword.
  EXPECT_EQ(j["bad_schema"]["status"], 400) << j["bad_schema"];
  EXPECT_EQ(j["bad_schema"]["param"], "response_format") << j["bad_schema"];
  EXPECT_NE(j["bad_schema"]["message"].get<std::string>().find("pattern"), std::string::npos);
}

TEST_F(TrainedChatTest, AModelWithoutATemplateFallsBackToChatMlWithAWarning) {
  const std::string model = dir_.Sub("tiny");
  ASSERT_TRUE(moe::testing::MakeTinyModel(model).ok());
  ASSERT_TRUE(Start(model)) << worker_.Log();
  EXPECT_NE(worker_.Log().find("no chat_template in " + model), std::string::npos)
      << worker_.Log();
  EXPECT_NE(worker_.Log().find("built-in ChatML"), std::string::npos) << worker_.Log();
  int status = 0;
  const Json r = Chat({{"messages", Json::array({{{"role", "user"}, {"content", "Hi"}}})},
                       {"max_tokens", 3}},
                      &status);
  EXPECT_EQ(status, 200) << r.dump();
  EXPECT_EQ(r["usage"]["completion_tokens"], 3) << r.dump();
}

TEST_F(TrainedChatTest, ChatTemplateFlagPicksABuiltinOrRefusesAtStart) {
  const std::string model = dir_.Sub("tiny");
  ASSERT_TRUE(moe::testing::MakeTinyModel(model).ok());
  {
    WorkerProcess bad;
    ASSERT_TRUE(bad.Spawn({"--model", model, "--listen", "unix:" + dir_.Sub("b.sock"),
                           "--backend", "cpu", "--metrics-addr", "", "--cache", "none",
                           "--http-listen", "127.0.0.1:0", "--chat-template", "no-such-template"},
                          dir_.Sub("bad.log")));
    EXPECT_EQ(bad.Wait(), rpc::kExitConfig);
    EXPECT_NE(bad.Log().find("--chat-template no-such-template"), std::string::npos) << bad.Log();
    EXPECT_NE(bad.Log().find("chatml"), std::string::npos) << bad.Log();
  }
  ASSERT_TRUE(Start(model, {"--chat-template", "plain"})) << worker_.Log();
  EXPECT_NE(worker_.Log().find("chat template: built-in plain"), std::string::npos)
      << worker_.Log();
  EXPECT_EQ(worker_.Log().find("ChatML"), std::string::npos) << worker_.Log();
  int status = 0;
  const Json r = Chat({{"messages", Json::array({{{"role", "user"}, {"content", "Hi"}}})},
                       {"max_tokens", 2}},
                      &status);
  EXPECT_EQ(status, 200) << r.dump();
}

}  // namespace
}  // namespace moe::worker
