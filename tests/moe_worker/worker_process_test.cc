// The real moe-worker binary on a tiny model: serving, streaming, errors,
// queueing, cancellation, metrics and shutdown, seen from a gRPC client.
#include <signal.h>

#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "services/cache/trace.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"
#include "tests/moe_worker/worker_process.h"
#include "tests/moe_worker/worker_test_util.h"

namespace moe::worker {
namespace {

using testing::MetricValue;
using testing::PortFromFile;
using testing::ScrapeMetrics;
using testing::WorkerProcess;

struct Stream {
  grpc::Status status;
  std::vector<v1::GenerateResponse> responses;
  std::vector<int32_t> tokens() const {
    std::vector<int32_t> t;
    for (const auto& r : responses) t.push_back(r.token_id());
    return t;
  }
};

class WorkerProcessTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(moe::testing::MakeTinyModel(dir_.path()).ok()); }

  // Starts a worker on a temp Unix socket with metrics on a free port.
  void StartWorker(std::vector<std::string> extra = {}) {
    socket_ = "unix:" + dir_.Sub("w.sock");
    std::vector<std::string> args = {
        "--model", dir_.path(), "--listen", socket_, "--backend", "cpu",
        "--metrics-addr", "127.0.0.1:0", "--port-file", dir_.Sub("ports.json")};
    args = moe::testing::WithFlags(std::move(args), extra);
    ASSERT_TRUE(worker_.Spawn(args, dir_.Sub("worker.log")));
    ASSERT_TRUE(worker_.WaitServing(socket_)) << worker_.Log();
    metrics_port_ = PortFromFile(dir_.Sub("ports.json"), "metrics_port");
    ASSERT_GT(metrics_port_, 0);
    stub_ = NewStub(socket_);
  }

  static std::unique_ptr<v1::Inference::Stub> NewStub(const std::string& a) {
    auto parsed = rpc::ParseListenAddress(a);
    EXPECT_TRUE(parsed.ok());
    return v1::Inference::NewStub(rpc::MakeChannel(*parsed));
  }

  static v1::GenerateRequest IdsRequest(std::vector<int32_t> ids, int n) {
    v1::GenerateRequest r;
    for (int32_t id : ids) r.add_prompt_token_ids(id);
    r.set_max_new_tokens(n);
    r.set_ignore_eos(true);
    return r;
  }

  static Stream Call(v1::Inference::Stub& stub, const v1::GenerateRequest& r) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(60));
    auto reader = stub.Generate(&ctx, r);
    Stream s;
    v1::GenerateResponse resp;
    while (reader->Read(&resp)) s.responses.push_back(resp);
    s.status = reader->Finish();
    return s;
  }

  double Metric(const std::string& series) {
    return MetricValue(ScrapeMetrics(metrics_port_), series);
  }

  moe::testing::TempDir dir_;
  WorkerProcess worker_;
  std::string socket_;
  int metrics_port_ = 0;
  std::unique_ptr<v1::Inference::Stub> stub_;
};

TEST_F(WorkerProcessTest, GreedyTokensEqualInProcessGenerateAndAreCounted) {
  StartWorker();
  Stream s = Call(*stub_, IdsRequest({7, 8, 9, 100}, 16));
  ASSERT_TRUE(s.status.ok()) << s.status.error_message();

  auto backend = CreateBackend("cpu");
  ASSERT_TRUE(backend.ok());
  auto model = MoeModel::Load(dir_.path(), backend->get());
  ASSERT_TRUE(model.ok());
  GenerateOptions ref;
  ref.prompt = {7, 8, 9, 100};
  ref.max_new_tokens = 16;
  ref.stop_at_eos = false;
  EXPECT_EQ(s.tokens(), testing::ReferenceTokens(**model, ref));
  ASSERT_EQ(s.responses.size(), 16u);
  EXPECT_EQ(s.responses.back().finish_reason(), "length");
  EXPECT_EQ(s.responses.back().usage().generated_tokens(), 16);
  EXPECT_EQ(s.responses.back().usage().prompt_tokens(), 4);

  const std::string text = ScrapeMetrics(metrics_port_);
  EXPECT_EQ(MetricValue(text, "moe_worker_requests_total{status=\"ok\"}"), 1);
  EXPECT_EQ(MetricValue(text, "moe_worker_tokens_generated_total"), 16);
  EXPECT_EQ(MetricValue(text, "moe_worker_ttft_seconds_count"), 1);
  EXPECT_EQ(MetricValue(text, "moe_worker_tpot_seconds_count"), 1);
  EXPECT_GT(MetricValue(text, "moe_worker_expert_wait_seconds_total"), 0);
}

TEST_F(WorkerProcessTest, TcpAndUnixServeTheSameTokens) {
  StartWorker({"--listen", "127.0.0.1:0"});
  const int port = PortFromFile(dir_.Sub("ports.json"), "grpc_port");
  ASSERT_GT(port, 0);
  auto tcp = NewStub("127.0.0.1:" + std::to_string(port));
  v1::GenerateRequest r;
  r.set_prompt("the cache");
  r.set_max_new_tokens(8);
  r.set_temperature(0.8f);
  r.set_seed(3);
  Stream a = Call(*stub_, r);
  Stream b = Call(*tcp, r);
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  ASSERT_TRUE(b.status.ok()) << b.status.error_message();
  EXPECT_EQ(a.tokens(), b.tokens());
  EXPECT_FALSE(a.tokens().empty());
}

TEST_F(WorkerProcessTest, BadRequestsGetInvalidArgument) {
  StartWorker({"--max-prompt-tokens", "6"});
  std::vector<v1::GenerateRequest> bad = {
      IdsRequest({}, 4), IdsRequest({1, 600000}, 4), IdsRequest({1}, 0),
      IdsRequest({1}, 4096), IdsRequest({1, 2, 3, 4, 5, 6, 7}, 4)};
  v1::GenerateRequest r = IdsRequest({1}, 4);
  r.set_top_p(-0.5f);
  bad.push_back(r);
  for (const auto& request : bad) {
    Stream s = Call(*stub_, request);
    EXPECT_EQ(s.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << request.ShortDebugString() << ": " << s.status.error_message();
    EXPECT_TRUE(s.responses.empty());
  }
  EXPECT_EQ(Metric("moe_worker_requests_total{status=\"invalid_argument\"}"),
            static_cast<double>(bad.size()));
}

TEST_F(WorkerProcessTest, FullQueueIsResourceExhausted) {
  StartWorker({"--max-queue", "0", "--max-batch", "1"});  // one running, none waiting
  // A long request holds the engine: its first token proves it is running.
  grpc::ClientContext ctx;
  auto reader = stub_->Generate(&ctx, IdsRequest({1, 2}, 4000));
  v1::GenerateResponse first;
  ASSERT_TRUE(reader->Read(&first));
  Stream refused = Call(*stub_, IdsRequest({3}, 2));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << refused.status.error_message();
  ctx.TryCancel();
  v1::GenerateResponse r;
  while (reader->Read(&r)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
}

TEST_F(WorkerProcessTest, CancellingMidStreamStopsTheRequest) {
  StartWorker();
  {
    grpc::ClientContext ctx;
    auto reader = stub_->Generate(&ctx, IdsRequest({1, 2}, 4000));
    v1::GenerateResponse r;
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(reader->Read(&r));
    ctx.TryCancel();
    while (reader->Read(&r)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  // The engine is released: a new request is served (it waited behind the
  // cancelled one, which stops at its next token).
  Stream next = Call(*stub_, IdsRequest({4, 5}, 3));
  ASSERT_TRUE(next.status.ok()) << next.status.error_message();
  EXPECT_EQ(next.responses.size(), 3u);
  EXPECT_EQ(Metric("moe_worker_requests_total{status=\"cancelled\"}"), 1);
  EXPECT_LT(Metric("moe_worker_tokens_generated_total"), 4000);
}

TEST_F(WorkerProcessTest, DeadlineIsHonoured) {
  StartWorker();
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(300));
  auto reader = stub_->Generate(&ctx, IdsRequest({1, 2}, 4000));
  v1::GenerateResponse r;
  while (reader->Read(&r)) {
  }
  EXPECT_EQ(reader->Finish().error_code(),
            grpc::StatusCode::DEADLINE_EXCEEDED);
  Stream next = Call(*stub_, IdsRequest({4, 5}, 2));
  EXPECT_TRUE(next.status.ok()) << next.status.error_message();
}

TEST_F(WorkerProcessTest, SigtermExitsZeroAndRemovesTheSocket) {
  StartWorker({"--shutdown-grace-s", "0"});
  grpc::ClientContext ctx;
  auto reader = stub_->Generate(&ctx, IdsRequest({1, 2}, 4000));
  v1::GenerateResponse r;
  ASSERT_TRUE(reader->Read(&r));
  worker_.Signal(SIGTERM);
  while (reader->Read(&r)) {
  }
  // With no grace the running request is cut short.
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(worker_.Wait(), 0) << worker_.Log();
  EXPECT_FALSE(std::filesystem::exists(dir_.Sub("w.sock")));
}

// Its stdout only (the JSON lines), and its exit code in `*code`.
std::string RunCommand(const std::string& cmd, int* code) {
  return testing::RunShell(cmd, code, /*with_stderr=*/false);
}

std::vector<nlohmann::json> JsonLines(const std::string& text) {
  std::vector<nlohmann::json> lines;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    lines.push_back(nlohmann::json::parse(line, nullptr, false));
  }
  return lines;
}

TEST_F(WorkerProcessTest, MoectlGenerateMatchesMoectlRunAndStatsSeeIt) {
  StartWorker();
  const std::string moectl = MOE_BINARY_DIR "/bin/moectl";
  const std::string req =
      " --prompt-ids 7,8,9 --max-new-tokens 10 --ignore-eos --json"
      " --top-logprobs 2";
  int code = -1;
  const std::string run = RunCommand(
      moectl + " run --backend cpu --model " + dir_.path() + req, &code);
  ASSERT_EQ(code, 0) << run;
  const std::string gen =
      RunCommand(moectl + " generate --target " + socket_ + req, &code);
  ASSERT_EQ(code, 0) << gen;
  std::vector<nlohmann::json> a = JsonLines(run), b = JsonLines(gen);
  ASSERT_EQ(a.size(), 11u) << run;
  ASSERT_EQ(b.size(), 11u) << gen;
  std::string text_a, text_b;
  for (size_t i = 0; i < 10; ++i) {
    EXPECT_EQ(a[i]["token_id"], b[i]["token_id"]) << i;
    EXPECT_EQ(a[i]["top_logprobs"].size(), b[i]["top_logprobs"].size());
    EXPECT_EQ(a[i]["logprob"].get<double>(), b[i]["logprob"].get<double>());
    text_a += a[i]["text"].get<std::string>();
    text_b += b[i]["text"].get<std::string>();
  }
  EXPECT_EQ(text_a + a[10]["text"].get<std::string>(), text_b);
  EXPECT_EQ(a[10]["finish_reason"], b[10]["finish_reason"]);
  EXPECT_EQ(b[10]["usage"]["generated_tokens"], 10);

  const std::string stats = RunCommand(
      moectl + " stats --json --worker 127.0.0.1:" +
          std::to_string(metrics_port_), &code);
  ASSERT_EQ(code, 0) << stats;
  auto j = nlohmann::json::parse(stats, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << stats;
  EXPECT_EQ(j["worker"]["tokens_generated"].get<double>(), 10);
  EXPECT_EQ(j["worker"]["requests"]["ok"].get<double>(), 1);
  EXPECT_GT(j["worker"]["ttft_mean_seconds"].get<double>(), 0);
  EXPECT_GT(j["worker"]["tpot_mean_seconds"].get<double>(), 0);
  EXPECT_EQ(j["worker"]["expert_hit_rate"].get<double>(), 1.0);
  EXPECT_EQ(j["worker"]["kv_cache_bytes"].get<double>(), 0);  // idle again
  EXPECT_EQ(j["worker"]["kv_preemptions"].get<double>(), 0);  // one request, room for it
  // Ten tokens: the first from the prompt's step, then nine decode steps of one.
  EXPECT_EQ(j["worker"]["decode_steps"].get<double>(), 9);
  EXPECT_EQ(j["worker"]["decode_step_sequences"].get<double>(), 9);
  EXPECT_GT(j["worker"]["decode_step_seconds"].get<double>(), 0);

  // A refused request exits 2 with the worker's message.
  RunCommand(moectl + " generate --target " + socket_ +
                 " --prompt-ids 1 --max-new-tokens 0 2>/dev/null",
             &code);
  EXPECT_EQ(code, 2);
}

TEST_F(WorkerProcessTest, RecordsLiveRoutingAsMoeTrace) {
  const std::string path = dir_.Sub("live.trace");
  StartWorker({"--record-trace", path});
  ASSERT_TRUE(Call(*stub_, IdsRequest({1, 2, 3}, 5)).status.ok());
  ASSERT_TRUE(Call(*stub_, IdsRequest({9, 8}, 3)).status.ok());
  worker_.Signal(SIGTERM);
  ASSERT_EQ(worker_.Wait(), 0) << worker_.Log();
  auto trace = trace::ReadTraceFile(path);
  ASSERT_TRUE(trace.ok()) << trace.status();
  const ModelConfig expect = *ConfigFromOptions(TinyPreset(ModelFamily::kMixtral));
  EXPECT_EQ(trace->header.num_layers, expect.num_hidden_layers);
  EXPECT_EQ(trace->header.num_experts, expect.num_experts);
  ASSERT_EQ(trace->requests.size(), 2u);
  // Prompt tokens plus every generated token but the last.
  EXPECT_EQ(trace->requests[0].num_prefill_tokens(), 3);
  EXPECT_EQ(trace->requests[0].num_decode_tokens(), 4);
  EXPECT_EQ(trace->requests[1].num_prefill_tokens(), 2);
  EXPECT_EQ(trace->requests[1].num_decode_tokens(), 2);
}

TEST_F(WorkerProcessTest, UnreachableCacheDaemonFailsAtStartup) {
  WorkerProcess w;
  ASSERT_TRUE(w.Spawn({"--model", dir_.path(), "--listen",
                       "unix:" + dir_.Sub("c.sock"), "--metrics-addr", "",
                       "--cache", "unix:" + dir_.Sub("cached.sock"),
                       "--cache-wait", "0"},
                      dir_.Sub("c.log")));
  EXPECT_EQ(w.Wait(), 1);
  EXPECT_THAT(w.Log(), ::testing::HasSubstr("cached.sock"));
}

TEST_F(WorkerProcessTest, BadFlagsExitTwo) {
  WorkerProcess w;
  ASSERT_TRUE(w.Spawn({"--model", dir_.path(), "--bogus", "1"},
                      dir_.Sub("f.log")));
  EXPECT_EQ(w.Wait(), 2);
  EXPECT_THAT(w.Log(), ::testing::HasSubstr("unknown flag --bogus"));
}

}  // namespace
}  // namespace moe::worker
