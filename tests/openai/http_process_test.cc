// The OpenAI-compatible HTTP API of a live moe-worker (served through a live
// moe-cached) driven by real clients: curl and the official OpenAI Node
// client (tests/openai_node, installed by scripts/setup-deps.sh). Tokens must
// equal the gRPC path's for the same request.
#include <signal.h>

#include <fstream>
#include <thread>

#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"
#include "services/rpc/rpc_util.h"
#include "services/engine/tokenizer.h"
#include "services/openai/chat_template.h"
#include "tests/moe_worker/worker_process.h"
#include "tests/moe_worker/worker_test_util.h"
#include "tests/rpc/test_certs.h"

namespace moe::worker {
namespace {

using Json = nlohmann::ordered_json;
using testing::RunShell;
using testing::WorkerProcess;

constexpr char kChatMl[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}";

class HttpProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string model = dir_.Sub("tiny");
    ASSERT_TRUE(moe::testing::MakeTinyModel(model).ok());
    Json config = Json::parse(moe::testing::ReadText(model + "/tokenizer_config.json"));
    config["chat_template"] = kChatMl;
    moe::testing::WriteText(model + "/tokenizer_config.json", config.dump(2));
    const std::string cache = "unix:" + dir_.Sub("c.sock");
    ASSERT_TRUE(daemon_.Spawn({"--model", model, "--listen", cache, "--metrics-addr", "",
                               "--cache-experts", "16"},
                              dir_.Sub("daemon.log"), testing::CachedBinary()));
    ASSERT_TRUE(daemon_.WaitServing(cache)) << daemon_.Log();
    auto tok = Tokenizer::FromFile(model + "/tokenizer.json");
    ASSERT_TRUE(tok.ok());
    tokenizer_ = *std::move(tok);
    const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    if (test != "TlsAndBearerTokenAsForGrpc" && test != "RequestTimeoutIsA504" &&
        test != "ApiKeyOnLoopbackAndTokenizeRoundTrip" &&
        test != "AFullQueueAnswers429WithRetryAfter") {
      StartWorker({});
    }
  }

  void StartWorker(const std::vector<std::string>& extra, const std::string& scheme = "http") {
    worker_sock_ = "unix:" + dir_.Sub("w.sock");
    std::vector<std::string> args = {
        "--model", dir_.Sub("tiny"), "--listen", worker_sock_, "--backend", "cpu",
        "--metrics-addr", "", "--cache", "unix:" + dir_.Sub("c.sock"), "--http-listen",
        "127.0.0.1:0", "--http-max-body-bytes", "4096", "--port-file", dir_.Sub("ports.json")};
    args = moe::testing::WithFlags(std::move(args), extra);
    ASSERT_TRUE(worker_.Spawn(args, dir_.Sub("worker.log")));
    ASSERT_TRUE(worker_.WaitServing(worker_sock_)) << worker_.Log();
    port_ = testing::PortFromFile(dir_.Sub("ports.json"), "http_port");
    ASSERT_GT(port_, 0);
    base_ = scheme + "://127.0.0.1:" + std::to_string(port_);
  }

  // curl; the body, and the HTTP status in *status.
  std::string Curl(const std::string& path, const std::string& body, int* status,
                   const std::string& extra = "") {
    moe::testing::WriteText(dir_.Sub("body.json"), body);
    int code = 0;
    std::string out = RunShell("curl -sS -N -w '\\n%{http_code}' " + extra +
                                   " -H 'Content-Type: application/json' --data-binary @" +
                                   dir_.Sub("body.json") + " " + base_ + path,
                               &code, /*with_stderr=*/false);
    EXPECT_EQ(code, 0) << out;
    const size_t nl = out.rfind('\n');
    *status = std::atoi(out.substr(nl + 1).c_str());
    return out.substr(0, nl);
  }

  // The gRPC path for the same prompt ids: each generated token's bytes, and
  // in *text the streamed text.
  std::vector<std::string> GrpcTokens(const std::vector<int32_t>& prompt, int n,
                                      std::string* text = nullptr) {
    auto stub = v1::Inference::NewStub(rpc::MakeChannel(*rpc::ParseListenAddress(worker_sock_)));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    v1::GenerateRequest r;
    for (int32_t id : prompt) r.add_prompt_token_ids(id);
    r.set_max_new_tokens(n);
    auto reader = stub->Generate(&ctx, r);
    std::vector<std::string> tokens;
    v1::GenerateResponse resp;
    while (reader->Read(&resp)) {
      tokens.push_back(tokenizer_->Decode(std::vector<int32_t>{resp.token_id()}));
      if (text != nullptr) *text += resp.text();
    }
    EXPECT_TRUE(reader->Finish().ok());
    return tokens;
  }

  std::vector<int32_t> ChatPrompt(const Json& messages) {
    auto t = openai::ChatTemplate::Create(kChatMl, "", "");
    EXPECT_TRUE(t.ok());
    auto text = (*t)->Apply(messages, true);
    EXPECT_TRUE(text.ok());
    return tokenizer_->Encode(*text, false);
  }

  moe::testing::TempDir dir_;
  WorkerProcess daemon_, worker_;
  std::string worker_sock_, base_;
  int port_ = 0;
  std::unique_ptr<Tokenizer> tokenizer_;
};

// Each token's bytes (exact: `token` itself is JSON text, so a token that
// is part of a UTF-8 character shows as U+FFFD there, as with OpenAI).
std::string BytesOf(const Json& bytes) {
  std::string s;
  for (const Json& b : bytes) s += static_cast<char>(b.get<int>());
  return s;
}

std::vector<std::string> LogprobTokens(const Json& logprobs) {
  std::vector<std::string> out;
  for (const Json& t : logprobs["content"]) out.push_back(BytesOf(t["bytes"]));
  return out;
}

TEST_F(HttpProcessTest, CurlChatMatchesGrpcStreamingAndNot) {
  const Json messages = Json::array({{{"role", "user"}, {"content", "Hello"}}});
  std::string grpc_text;
  const std::vector<std::string> grpc = GrpcTokens(ChatPrompt(messages), 6, &grpc_text);
  ASSERT_EQ(grpc.size(), 6u);
  int status = 0;
  const Json req = {{"model", "tiny"}, {"messages", messages}, {"max_tokens", 6},
                    {"temperature", 0}, {"logprobs", true}, {"top_logprobs", 2}};
  Json whole = Json::parse(Curl("/v1/chat/completions", req.dump(), &status));
  ASSERT_EQ(status, 200) << whole.dump();
  EXPECT_EQ(whole["object"], "chat.completion");
  EXPECT_EQ(whole["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(LogprobTokens(whole["choices"][0]["logprobs"]), grpc);
  EXPECT_EQ(whole["choices"][0]["message"]["content"], grpc_text);
  EXPECT_EQ(whole["choices"][0]["logprobs"]["content"][0]["top_logprobs"].size(), 2u);
  EXPECT_EQ(whole["usage"]["completion_tokens"], 6);
  EXPECT_TRUE(whole["usage"]["moe_cache"].contains("expert_misses"));

  Json sreq = req;
  sreq["stream"] = true;
  sreq["stream_options"] = {{"include_usage", true}};
  const std::string sse = Curl("/v1/chat/completions", sreq.dump(), &status);
  ASSERT_EQ(status, 200) << sse;
  std::vector<std::string> tokens;
  std::string text, finish;
  bool done = false, usage = false;
  for (absl::string_view line : absl::StrSplit(sse, "\n\n", absl::SkipEmpty())) {
    ASSERT_TRUE(absl::StartsWith(line, "data: ")) << line;
    ASSERT_FALSE(done) << "data after [DONE]";
    if (line == "data: [DONE]") {
      done = true;
      continue;
    }
    Json chunk = Json::parse(line.substr(6));
    EXPECT_EQ(chunk["object"], "chat.completion.chunk");
    if (chunk["choices"].empty()) {
      usage = chunk["usage"]["completion_tokens"] == 6;
      continue;
    }
    const Json& c = chunk["choices"][0];
    text += c["delta"]["content"].get<std::string>();
    for (const std::string& t : LogprobTokens(c["logprobs"])) tokens.push_back(t);
    if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
  }
  EXPECT_TRUE(done && usage);
  EXPECT_EQ(tokens, grpc);
  EXPECT_EQ(text, whole["choices"][0]["message"]["content"]);
  EXPECT_EQ(finish, "length");
}

TEST_F(HttpProcessTest, CurlCompletionStopStringCutsTheText) {
  int status = 0;
  const Json req = {{"prompt", Json::array({11, 22, 33, 44, 55})}, {"max_tokens", 12},
                    {"temperature", 0}};
  Json full = Json::parse(Curl("/v1/completions", req.dump(), &status));
  ASSERT_EQ(status, 200) << full.dump();
  const std::string text = full["choices"][0]["text"];
  ASSERT_GE(text.size(), 4u);
  const std::string stop = text.substr(text.size() / 2, 2);
  Json sreq = req;
  sreq["stop"] = Json::array({stop});
  Json cut = Json::parse(Curl("/v1/completions", sreq.dump(), &status));
  ASSERT_EQ(status, 200) << cut.dump();
  EXPECT_EQ(cut["choices"][0]["text"], text.substr(0, text.find(stop)));
  EXPECT_EQ(cut["choices"][0]["finish_reason"], "stop");
}

TEST_F(HttpProcessTest, BadRequestsGetOpenAiShapedErrors) {
  struct Case {
    std::string path, body;
    int status;
    std::string param;
  } cases[] = {
      {"/v1/completions", R"({"prompt": [1, 2], "n": 2})", 400, "n"},
      {"/v1/completions", R"({"prompt": [1, 2], "model": "gpt-4"})", 404, "model"},
      {"/v1/completions", "{not json", 400, ""},
      {"/v1/chat/completions",
       R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]})",
       400, "messages[0].content"},
      {"/v1/chat/completions",
       R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})", 400,
       "tools[0]"},
      {"/v1/completions", R"({"prompt": [1, 2], "max_tokens": 100000})", 400, "max_tokens"},
      {"/v1/completions", R"({"prompt": ")" + std::string(5000, 'a') + R"("})", 413, ""},
  };
  for (const Case& c : cases) {
    int status = 0;
    const std::string out = Curl(c.path, c.body, &status);
    EXPECT_EQ(status, c.status) << c.body.substr(0, 100) << " -> " << out;
    Json j = Json::parse(out, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << out;
    EXPECT_TRUE(j["error"]["message"].is_string()) << out;
    EXPECT_FALSE(j["error"]["message"].get<std::string>().empty()) << out;
    if (!c.param.empty()) {
      EXPECT_EQ(j["error"]["param"], c.param) << out;
    }
  }
  int status = 0;
  Curl("/health", "", &status, "-X GET");
  EXPECT_EQ(status, 200);
  // A second worker on the live HTTP port stops at start, naming the flag.
  WorkerProcess second;
  ASSERT_TRUE(second.Spawn({"--model", dir_.Sub("tiny"), "--listen", "unix:" + dir_.Sub("s.sock"),
                            "--backend", "cpu", "--metrics-addr", "", "--http-listen",
                            std::to_string(port_)},
                           dir_.Sub("second.log")));
  EXPECT_EQ(second.Wait(), 1);
  EXPECT_NE(second.Log().find("--http-listen " + std::to_string(port_)), std::string::npos)
      << second.Log();
}

TEST_F(HttpProcessTest, OfficialOpenAiNodeClientStreamsAChat) {
  const std::string dir = std::string(MOE_SOURCE_DIR) + "/tests/openai_node";
  ASSERT_TRUE(std::ifstream(dir + "/node_modules/openai/package.json").good())
      << "the openai npm package is not installed: run scripts/setup-deps.sh "
         "(npm ci in tests/openai_node)";
  int code = 0;
  const std::string out = RunShell("BASE_URL=" + base_ + "/v1 MODEL=tiny node " + dir +
                                       "/client_test.mjs",
                                   &code, /*with_stderr=*/false);
  ASSERT_EQ(code, 0) << out << worker_.Log();
  Json j = Json::parse(out);
  const Json messages = Json::array({{{"role", "system"}, {"content", "You are terse."}},
                                     {{"role", "user"}, {"content", "Hello there"}}});
  std::string grpc_text;
  const std::vector<std::string> grpc = GrpcTokens(ChatPrompt(messages), 8, &grpc_text);
  std::vector<std::string> node_tokens;
  for (const Json& bytes : j["tokens"]) node_tokens.push_back(BytesOf(bytes));
  EXPECT_EQ(node_tokens, grpc);
  EXPECT_EQ(j["text"], grpc_text);
  EXPECT_EQ(j["nonstream_text"], j["text"]);
  // The prefix cache: the first request found nothing, the repeat found all
  // but the last block of its prompt, and answered the same.
  EXPECT_EQ(j["cached_first"], 0) << out;
  EXPECT_GT(j["cached_repeat"].get<int>(), 0) << out;
  EXPECT_GE(j["cached_repeat"].get<int>() + 16, j["usage"]["prompt_tokens"].get<int>()) << out;
  EXPECT_EQ(j["finish"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 8);
  EXPECT_GE(j["chunks"].get<int>(), 9);
  EXPECT_TRUE(j["completion_text"].is_string());
  EXPECT_EQ(j["error"]["status"], 400);
  EXPECT_EQ(j["error"]["param"], "n");
  EXPECT_EQ(j["models"], Json::array({"tiny"}));
}

TEST_F(HttpProcessTest, MoectlChatHoldsAConversation) {
  moe::testing::WriteText(dir_.Sub("turns.txt"), "Hello\nAgain\n");
  int code = 0;
  const std::string out =
      RunShell(std::string(MOE_BINARY_DIR) + "/bin/moectl chat --url " + base_ +
                   " --temperature 0 --max-tokens 4 < " + dir_.Sub("turns.txt"),
               &code, /*with_stderr=*/false);
  ASSERT_EQ(code, 0) << out;
  const std::vector<std::string> lines = absl::StrSplit(out, '\n');
  ASSERT_GE(lines.size(), 2u) << out;
  // The first reply is the greedy reply to the first turn alone.
  std::string first;
  GrpcTokens(ChatPrompt(Json::array({{{"role", "user"}, {"content", "Hello"}}})), 4, &first);
  EXPECT_EQ(out.substr(0, first.size() + 1), first + "\n");
  // The second turn was sent with the whole conversation.
  EXPECT_NE(worker_.Log().find("request 2 finished"), std::string::npos);
}

TEST_F(HttpProcessTest, TlsAndBearerTokenAsForGrpc) {
  moe::testing::TestCerts certs;
  ASSERT_TRUE(moe::testing::MakeTestCerts(dir_.path(), &certs));
  moe::testing::WriteTokenFile(dir_.Sub("token"), "s3cret-token");
  // A key on plaintext HTTP on a non-loopback address is refused at start
  // (exit 78: a configuration error), naming the flag and the way out.
  WorkerProcess plain;
  ASSERT_TRUE(plain.Spawn({"--model", dir_.Sub("tiny"), "--listen", "unix:" + dir_.Sub("p.sock"),
                           "--backend", "cpu", "--metrics-addr", "", "--http-listen",
                           "0.0.0.0:0", "--auth-token-file", dir_.Sub("token")},
                          dir_.Sub("plain.log")));
  EXPECT_EQ(plain.Wait(), rpc::kExitConfig);
  EXPECT_NE(plain.Log().find("--http-listen 0.0.0.0:0 with --auth-token-file: an API key is "
                             "accepted over plaintext HTTP on a loopback address only"),
            std::string::npos)
      << plain.Log();
  EXPECT_NE(plain.Log().find("--allow-plaintext-auth"), std::string::npos) << plain.Log();

  StartWorker({"--tls-cert", certs.server_cert(), "--tls-key", certs.server_key(),
               "--auth-token-file", dir_.Sub("token")},
              "https");
  const std::string tls = "--cacert " + certs.ca();
  const std::string body = R"({"prompt": [1, 2, 3], "max_tokens": 2, "temperature": 0})";
  int status = 0;
  Json j = Json::parse(Curl("/v1/completions", body, &status, tls));
  EXPECT_EQ(status, 401);
  EXPECT_EQ(j["error"]["code"], "invalid_api_key");
  Curl("/v1/completions", body, &status, tls + " -H 'Authorization: Bearer wrong'");
  EXPECT_EQ(status, 401);
  j = Json::parse(Curl("/v1/completions", body, &status,
                       tls + " -H 'Authorization: Bearer s3cret-token'"));
  EXPECT_EQ(status, 200) << j.dump();
  EXPECT_EQ(j["usage"]["completion_tokens"], 2);
  Curl("/health", "", &status, tls + " -X GET");
  EXPECT_EQ(status, 200);
}

TEST_F(HttpProcessTest, RequestTimeoutIsA504) {
  // A deadline of a microsecond has passed by the first token at the latest.
  StartWorker({"--http-request-timeout-s", "0.000001"});
  int status = 0;
  Json j = Json::parse(Curl("/v1/completions",
                            R"({"prompt": [1, 2, 3], "max_tokens": 50, "temperature": 0})",
                            &status));
  EXPECT_EQ(status, 504) << j.dump();
  EXPECT_EQ(j["error"]["type"], "timeout");
}

TEST_F(HttpProcessTest, AClientThatGoesAwayCancelsItsGeneration) {
  // Read the first event, then hang up; the worker must log the request as
  // cancelled long before its 4000 tokens.
  const std::string req =
      R"({"prompt": [1, 2, 3], "max_tokens": 4000, "temperature": 0, "stream": true})";
  moe::testing::WriteText(dir_.Sub("body.json"), req);
  int code = 0;
  RunShell("curl -sS -N --data-binary @" + dir_.Sub("body.json") + " " + base_ +
               "/v1/completions | head -c 10 >/dev/null",
           &code);
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  std::string log;
  while (std::chrono::steady_clock::now() < end) {
    log = worker_.Log();
    if (log.find("finish=cancelled") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // polling a log file
  }
  EXPECT_NE(log.find("finish=cancelled"), std::string::npos) << log;
  EXPECT_EQ(log.find("generated_tokens=4000"), std::string::npos) << log;
}

// llama-server's habit: --api-key on a loopback plaintext listener works
// (here from the environment); /tokenize and /detokenize are llama-server's
// shapes and need the key like every route but /health.
TEST_F(HttpProcessTest, ApiKeyOnLoopbackAndTokenizeRoundTrip) {
  ASSERT_EQ(setenv("MOE_TEST_HTTP_KEY", "k3y-from-env", 1), 0);
  StartWorker({"--api-key-env", "MOE_TEST_HTTP_KEY"});
  const std::string auth = "-H 'Authorization: Bearer k3y-from-env'";
  int status = 0;
  Json j = Json::parse(Curl("/tokenize", R"({"content": "Hello there"})", &status));
  EXPECT_EQ(status, 401) << j.dump();
  Curl("/health", "", &status, "-X GET");
  EXPECT_EQ(status, 200);

  j = Json::parse(Curl("/tokenize", R"({"content": "Hello there"})", &status, auth));
  ASSERT_EQ(status, 200) << j.dump();
  std::vector<int32_t> ids;
  for (const Json& t : j["tokens"]) ids.push_back(t.get<int32_t>());
  EXPECT_EQ(ids, tokenizer_->Encode("Hello there", /*add_special=*/false));
  Json back = Json::parse(Curl("/detokenize", Json({{"tokens", j["tokens"]}}).dump(), &status, auth));
  ASSERT_EQ(status, 200) << back.dump();
  EXPECT_EQ(back["content"], "Hello there");
  j = Json::parse(Curl("/tokenize", R"({"content": "Hi", "with_pieces": true})", &status, auth));
  ASSERT_EQ(status, 200) << j.dump();
  ASSERT_FALSE(j["tokens"].empty());
  EXPECT_TRUE(j["tokens"][0].contains("piece")) << j.dump();

  // Bad input: a clear 400 naming the field.
  j = Json::parse(Curl("/detokenize", R"({"tokens": [4294967301]})", &status, auth));
  EXPECT_EQ(status, 400);
  EXPECT_EQ(j["error"]["param"], "tokens") << j.dump();
  j = Json::parse(Curl("/tokenize", R"({"text": "x"})", &status, auth));
  EXPECT_EQ(status, 400);
  EXPECT_EQ(j["error"]["param"], "text") << j.dump();
  j = Json::parse(Curl("/tokenize", R"({"content": 5})", &status, auth));
  EXPECT_EQ(status, 400);
  EXPECT_EQ(j["error"]["param"], "content") << j.dump();
  unsetenv("MOE_TEST_HTTP_KEY");
}

// A full queue is a 429 with Retry-After (clients back off and retry). The
// daemon is stopped (SIGSTOP) so that the first request holds the only place
// deterministically, waiting for its experts.
TEST_F(HttpProcessTest, AFullQueueAnswers429WithRetryAfter) {
  StartWorker({"--max-queue", "0", "--max-batch", "1", "--metrics-addr", "127.0.0.1:0"});
  const int metrics_port = testing::PortFromFile(dir_.Sub("ports.json"), "metrics_port");
  ASSERT_GT(metrics_port, 0);
  daemon_.Signal(SIGSTOP);
  moe::testing::WriteText(dir_.Sub("first.json"),
                          R"({"prompt": [1, 2, 3], "max_tokens": 4, "temperature": 0})");
  int code = 0;
  RunShell("curl -sS -o " + dir_.Sub("first.out") + " --data-binary @" + dir_.Sub("first.json") +
               " " + base_ + "/v1/completions >/dev/null 2>&1 &",
           &code);
  const bool running = testing::WaitFor([&] {
    return testing::MetricValue(testing::ScrapeMetrics(metrics_port),
                                "moe_worker_requests_running") == 1;
  });
  int status = 0;
  std::string out;
  if (running) {
    out = Curl("/v1/completions", R"({"prompt": [4, 5], "max_tokens": 2})", &status,
               "-D " + dir_.Sub("headers.txt"));
  }
  daemon_.Signal(SIGCONT);
  ASSERT_TRUE(running) << worker_.Log();
  EXPECT_EQ(status, 429) << out;
  Json j = Json::parse(out, nullptr, false);
  EXPECT_EQ(j["error"]["type"], "rate_limit_error") << out;
  EXPECT_NE(moe::testing::ReadText(dir_.Sub("headers.txt")).find("Retry-After: 1"),
            std::string::npos)
      << moe::testing::ReadText(dir_.Sub("headers.txt"));
  // The held request completes once the daemon runs again.
  EXPECT_TRUE(testing::WaitFor([&] {
    return moe::testing::ReadText(dir_.Sub("first.out")).find("\"completion_tokens\":4") !=
           std::string::npos;
  })) << moe::testing::ReadText(dir_.Sub("first.out"));
}

// More short requests in a row than the library has threads, each on its
// own connection (as curl and many clients make them): none waits for an
// earlier connection's keep-alive to run out (it used to: every ~20th
// request took 4.4 s), and answers say `Connection: close`.
TEST_F(HttpProcessTest, RequestsInARowNeverWaitForAnEarlierConnection) {
  moe::testing::WriteText(dir_.Sub("short.json"),
                          R"({"prompt": [1, 2, 3], "max_tokens": 2, "temperature": 0})");
  int code = 0;
  const std::string out = RunShell(
      "for i in $(seq 45); do curl -sS -o /dev/null -w '%{http_code} %{time_total}\\n' "
      "--data-binary @" + dir_.Sub("short.json") + " " + base_ + "/v1/completions; done",
      &code, /*with_stderr=*/false);
  ASSERT_EQ(code, 0) << out;
  const std::vector<std::string> lines = absl::StrSplit(out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 45u) << out;
  for (const std::string& line : lines) {
    EXPECT_EQ(line.substr(0, 4), "200 ") << out;
    // A stall is the 5 s keep-alive timeout; a request itself takes ms.
    EXPECT_LT(std::atof(line.c_str() + 4), 2.0) << out;
  }
  const std::string head =
      RunShell("curl -sS -D - -o /dev/null --data-binary @" + dir_.Sub("short.json") + " " +
                   base_ + "/v1/completions",
               &code, /*with_stderr=*/false);
  EXPECT_NE(head.find("Connection: close"), std::string::npos) << head;
}

}  // namespace
}  // namespace moe::worker
