// What the real binaries tell an operator (issue 18, points 4, 6, 7, 8): the
// start-up line, the metrics beside the cache's, clear answers from the
// wrong endpoint, and moectl's rough edges (make-model, simulate, generate).
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/model_config.h"
#include "common/model_maker.h"
#include "common/quant.h"
#include "gmock/gmock.h"
#include "nlohmann/json.hpp"
#include "gtest/gtest.h"
#include "kernels/cpu_gguf_quant.h"
#include "kernels/cpu_matmul.h"
#include "tests/common/test_util.h"
#include "services/rpc/startup_log.h"
#include "tests/moe_worker/worker_process.h"
#include "tests/moe_worker/worker_test_util.h"

namespace moe::worker {
namespace {

using testing::CachedBinary;
using ::testing::HasSubstr;
using testing::MetricValue;
using ::testing::Not;
using testing::PortFromFile;
using testing::RunShell;
using testing::ScrapeMetrics;
using testing::WaitFor;
using testing::WorkerProcess;

const std::string kMoectl = MOE_BINARY_DIR "/bin/moectl";

// The JSON lines of moectl's output (its closing error line on stderr is
// not one and is left out).
std::vector<nlohmann::json> JsonLines(const std::string& out) {
  std::vector<nlohmann::json> lines;
  for (absl::string_view l : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    nlohmann::json j = nlohmann::json::parse(l, nullptr, false);
    if (!j.is_discarded()) lines.push_back(std::move(j));
  }
  return lines;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

class OpsReportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(moe::testing::MakeTinyModel(dir_.Sub("tiny")).ok());
    cache_ = "unix:" + dir_.Sub("c.sock");
    worker_sock_ = "unix:" + dir_.Sub("w.sock");
  }

  void StartDaemon(const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {
        "--model", dir_.Sub("tiny"),  "--listen", cache_,     "--metrics-addr",
        "",        "--cache-experts", "16",       "--policy", "lru"};
    args = moe::testing::WithFlags(std::move(args), extra, {"--model"});  // moe-cached
    ASSERT_TRUE(daemon_.Spawn(args, dir_.Sub("c.log"), CachedBinary()));
    ASSERT_TRUE(daemon_.WaitServing(cache_)) << daemon_.Log();
  }

  // A worker on worker_sock_ with /metrics on a free port (metrics_port_).
  void StartWorker(const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {"--model",        dir_.Sub("tiny"),
                                     "--listen",       worker_sock_,
                                     "--backend",      "cpu",
                                     "--metrics-addr", "127.0.0.1:0",
                                     "--port-file",    dir_.Sub("ports.json")};
    args = moe::testing::WithFlags(std::move(args), extra);
    ASSERT_TRUE(worker_.Spawn(args, dir_.Sub("w.log")));
    ASSERT_TRUE(worker_.WaitServing(worker_sock_)) << worker_.Log();
    metrics_port_ = PortFromFile(dir_.Sub("ports.json"), "metrics_port");
    ASSERT_GT(metrics_port_, 0);
  }

  // moectl with `args`; stdout and stderr together.
  static std::string Moectl(const std::string& args, int* code) {
    return RunShell(kMoectl + " " + args, code);
  }

  moe::testing::TempDir dir_;
  std::string cache_, worker_sock_;
  WorkerProcess daemon_, worker_;
  int metrics_port_ = 0;
};

// Point 4 (and 8: no "grpc port 0" on a Unix socket): one line says what the
// worker serves and that, without --cache, every expert is in its memory.
TEST_F(OpsReportTest, WorkerStartLineSaysWhereTheExpertsAre) {
  int code = -1;
  const std::string help = RunShell(testing::WorkerBinary() + " --help", &code);
  EXPECT_EQ(code, 0);
  EXPECT_THAT(help, HasSubstr("in this process's memory (as --expert-format;"));

  StartWorker();
  ASSERT_TRUE(WaitFor(
      [&] { return worker_.Log().find("experts:") != std::string::npos; }));
  const std::string log = worker_.Log();
  EXPECT_THAT(log, HasSubstr("moe-worker 0.1.0 (git "));
  EXPECT_THAT(
      log, HasSubstr("serving model tiny (mixtral, dense bf16, experts bf16, "
                     "4 MoE layers x 8 experts of "));
  EXPECT_THAT(log, HasSubstr(" on " + worker_sock_ +
                             ", backend cpu, metrics 127.0.0.1:" +
                             std::to_string(metrics_port_)));
  EXPECT_THAT(log, HasSubstr("; experts: in-process, 0.00 GiB (--cache none)"));
  EXPECT_THAT(log, Not(HasSubstr("grpc port 0")));
}

// Point 4: the daemon's line names the cache size, the policy and prefetch;
// a worker with --cache names the daemon.
TEST_F(OpsReportTest, DaemonStartLineNamesCacheAndPolicy) {
  StartDaemon();
  const std::string log = daemon_.Log();
  EXPECT_THAT(log, HasSubstr("moe-cached 0.1.0 (git "));
  EXPECT_THAT(log, HasSubstr("serving on " + cache_ +
                             ", metrics off: model tiny (mixtral, "));
  EXPECT_THAT(log, HasSubstr("cache 16 slots = "));
  EXPECT_THAT(log, HasSubstr("(50% of the experts) on cpu, policy lru, "
                             "prefetch on, link unpaced, misses fetch"));
  StartWorker({"--cache", cache_});
  ASSERT_TRUE(WaitFor(
      [&] { return worker_.Log().find("experts:") != std::string::npos; }));
  EXPECT_THAT(worker_.Log(), HasSubstr("; experts: moe-cached at " + cache_ +
                                       " (model 'tiny')"));
}

// The start line counts the experts as held: with --expert-format q8 the
// cache is 16 q8 blocks (the size the arena line gives), not 16 bf16 ones.
TEST_F(OpsReportTest, DaemonStartLineSizesTheHeldFormat) {
  StartDaemon({"--expert-format", "q8"});
  const std::string log = daemon_.Log();
  // (q8x16: q8 with 16 rows interleaved, where this CPU prefers it.)
  const std::string held = absl::AsciiStrToLower(
      ExpertFormatName(CpuPrefersRows16(DetectSimdLevel()) ? DType::kQ8R16 : DType::kQ8));
  EXPECT_THAT(log, HasSubstr("(mixtral, dense bf16, experts " + held + " (stored bf16), "
                             "4 MoE layers x 8 experts of "));
  const size_t at = log.find("16 slots of ");
  ASSERT_NE(at, std::string::npos) << log;
  const uint64_t block = std::stoull(log.substr(at + 12));
  const uint64_t bf16 = 3 * 64 * 128 * 2;  // tiny mixtral: hidden 64, width 128
  EXPECT_LT(block, bf16);
  EXPECT_THAT(log, HasSubstr("cache 16 slots = " + rpc::HumanBytes(16 * block) +
                             " (50% of the experts)"));
}

// Point 6: prompt tokens, requests running and waiting, KV memory, process
// memory and the build, on the worker's own registry.
TEST_F(OpsReportTest, WorkerExportsTheMetricsOperatorsExpect) {
  StartWorker();
  int code = -1;
  const std::string out =
      Moectl("generate --target " + worker_sock_ +
                 " --prompt-ids 5,6,7 --max-new-tokens 4 --ignore-eos --json",
             &code);
  ASSERT_EQ(code, 0) << out;
  const std::string m = ScrapeMetrics(metrics_port_);
  EXPECT_EQ(MetricValue(m, "moe_worker_prompt_tokens_total"), 3) << m;
  EXPECT_EQ(MetricValue(m, "moe_worker_requests_running"), 0);
  EXPECT_EQ(MetricValue(m, "moe_worker_requests_waiting"), 0);
  EXPECT_EQ(MetricValue(m, "moe_worker_kv_cache_bytes"), 0);  // nothing running
  EXPECT_EQ(MetricValue(m, "moe_worker_kv_cache_usage_ratio"), 0);
  EXPECT_GT(MetricValue(m, "process_resident_memory_bytes"), 1e6);
  EXPECT_GT(MetricValue(m, "process_virtual_memory_bytes"), 1e6);
  EXPECT_GT(MetricValue(m, "process_open_fds"), 3);
  EXPECT_GT(MetricValue(m, "process_start_time_seconds"), 1.6e9);
  EXPECT_THAT(m,
              HasSubstr("moe_build_info{program=\"moe-worker\",revision=\""));
  EXPECT_THAT(m, HasSubstr("\",version=\"0.1.0\"} 1"));
}

// moectl generate --prompts-file: every line a request, --concurrency at a
// time, answered in the file's order with the same texts as one at a time.
TEST_F(OpsReportTest, GenerateSendsAPromptsFileConcurrently) {
  StartWorker();
  const std::vector<std::string> prompts = {"In the beginning", "And God said", "Let there be",
                                            "light", "and there was"};
  std::string file;
  for (const std::string& p : prompts) file += p + "\n";
  moe::testing::WriteText(dir_.Sub("prompts.txt"), file + "\n");  // a blank line is skipped
  int code = -1;
  const std::string out = Moectl("generate --target " + worker_sock_ + " --prompts-file " +
                                     dir_.Sub("prompts.txt") +
                                     " --concurrency 3 --max-new-tokens 4 --ignore-eos",
                                 &code);
  ASSERT_EQ(code, 0) << out;
  const std::vector<nlohmann::json> lines = JsonLines(out);
  ASSERT_EQ(lines.size(), prompts.size() + 1) << out;
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(lines[i]["index"], i);
    EXPECT_EQ(lines[i]["finish_reason"], "length");
    EXPECT_EQ(lines[i]["usage"]["generated_tokens"], 4);
    const std::string one = Moectl("generate --target " + worker_sock_ + " --prompt '" +
                                       prompts[i] + "' --max-new-tokens 4 --ignore-eos --json",
                                   &code);
    ASSERT_EQ(code, 0) << one;
    const std::vector<std::string> rows = absl::StrSplit(one, '\n', absl::SkipEmpty());
    EXPECT_EQ(lines[i]["text"], nlohmann::json::parse(rows.back())["text"]) << prompts[i];
  }
  const nlohmann::json& totals = lines.back();
  EXPECT_EQ(totals["requests"], prompts.size());
  EXPECT_EQ(totals["failed"], 0);
  EXPECT_EQ(totals["generated_tokens"], 20);
  EXPECT_GT(totals["tokens_per_second"].get<double>(), 0);
  // A stream that fails (a prompt longer than the model's context) says
  // why on its line, and the streams after it still run.
  std::string words;
  for (int i = 0; i < 5000; ++i) words += "light ";
  moe::testing::WriteText(dir_.Sub("mixed.txt"),
                          prompts[0] + "\n" + words + "\n" + prompts[1] + "\n" + prompts[2] + "\n");
  const std::string mixed = Moectl("generate --target " + worker_sock_ + " --prompts-file " +
                                       dir_.Sub("mixed.txt") +
                                       " --concurrency 2 --max-new-tokens 4 --ignore-eos",
                                   &code);
  EXPECT_EQ(code, 2) << mixed;  // the first failure was INVALID_ARGUMENT
  const std::vector<nlohmann::json> rows = JsonLines(mixed);
  ASSERT_EQ(rows.size(), 5u) << mixed;
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(rows[i]["index"], i);
    EXPECT_EQ(rows[i].contains("error"), i == 1) << mixed;
    if (i != 1) {
      EXPECT_EQ(rows[i]["usage"]["generated_tokens"], 4) << mixed;
    }
  }
  EXPECT_EQ(rows.back()["failed"], 1);
  EXPECT_EQ(rows.back()["generated_tokens"], 12);

  moe::testing::WriteText(dir_.Sub("empty.txt"), "\n\n");
  const std::string empty = Moectl("generate --target " + worker_sock_ + " --prompts-file " +
                                       dir_.Sub("empty.txt"),
                                   &code);
  EXPECT_EQ(code, 2) << empty;
  EXPECT_THAT(empty, HasSubstr("has no prompt"));
  EXPECT_THAT(Moectl("generate --target " + worker_sock_ + " --prompt x --prompts-file " +
                         dir_.Sub("prompts.txt"),
                     &code),
              HasSubstr("exactly one of --prompt, --prompt-ids and --prompts-file"));
  EXPECT_EQ(code, 2);
}

// Point 7: each command pointed at the other service says so, and
// `stats --worker` takes the worker's gRPC address too.
TEST_F(OpsReportTest, WrongEndpointGetsAClearAnswer) {
  StartDaemon();
  StartWorker({"--cache", cache_, "--listen", "127.0.0.1:0"});
  int code = -1;
  std::string out =
      Moectl("generate --target " + cache_ + " --prompt-ids 1,2", &code);
  EXPECT_EQ(code, 1) << out;
  EXPECT_THAT(out, HasSubstr(cache_ + " is moe-cached, not a worker"));
  EXPECT_THAT(out, HasSubstr("--target wants moe-worker's address"));
  EXPECT_THAT(out, Not(HasSubstr("UNIMPLEMENTED")));

  out = Moectl("stats --cache " + worker_sock_, &code);
  EXPECT_EQ(code, 1) << out;
  EXPECT_THAT(out, HasSubstr(worker_sock_ + " is moe-worker, not moe-cached"));
  EXPECT_THAT(out, Not(HasSubstr("malformed request")));

  out = Moectl("stats --worker " + cache_, &code);
  EXPECT_EQ(code, 1) << out;
  EXPECT_THAT(out, HasSubstr("is moe-cached, not a worker"));

  out = Moectl("generate --target " + worker_sock_ +
                   " --prompt-ids 1,2 --max-new-tokens 3 --json",
               &code);
  ASSERT_EQ(code, 0) << out;
  const int grpc_port = PortFromFile(dir_.Sub("ports.json"), "grpc_port");
  ASSERT_GT(grpc_port, 0);
  for (const std::string& worker :
       {worker_sock_, "127.0.0.1:" + std::to_string(grpc_port),
        "127.0.0.1:" + std::to_string(metrics_port_)}) {
    SCOPED_TRACE(worker);
    out = Moectl("stats --json --worker " + worker, &code);
    ASSERT_EQ(code, 0) << out;
    auto j = nlohmann::json::parse(out, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << out;
    EXPECT_EQ(j["worker"]["tokens_generated"].get<double>(), 3);
    EXPECT_EQ(j["worker"]["requests"]["ok"].get<double>(), 1);
  }
}

// Point 8: the --json summary line carries the whole text.
TEST_F(OpsReportTest, GenerateJsonSummaryCarriesTheWholeText) {
  StartWorker();
  int code = -1;
  const std::string out = RunShell(
      kMoectl + " generate --target " + worker_sock_ +
          " --prompt-ids 7,8,9 --max-new-tokens 12 --ignore-eos --json",
      &code, /*with_stderr=*/false);
  ASSERT_EQ(code, 0) << out;
  std::vector<nlohmann::json> lines;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    lines.push_back(nlohmann::json::parse(line));
  }
  ASSERT_EQ(lines.size(), 13u) << out;
  std::string text;
  for (size_t i = 0; i < 12; ++i) text += lines[i]["text"].get<std::string>();
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(lines[12]["text"].get<std::string>(), text);
}

// Point 8: make-model does not overwrite a non-empty directory without
// --force, and knows more presets than tiny.
TEST_F(OpsReportTest, MakeModelNeedsForceForANonEmptyDirectory) {
  const std::string out_dir = dir_.Sub("tiny");  // holds the tiny model
  int code = -1;
  std::string out = Moectl("make-model --preset small --out " + out_dir, &code);
  EXPECT_EQ(code, 1) << out;
  EXPECT_THAT(out,
              HasSubstr("--out " + out_dir + " is not empty; give --force"));
  out = Moectl("inspect " + out_dir, &code);
  EXPECT_THAT(out, HasSubstr("experts: 8"));  // untouched

  out = Moectl("make-model --preset small --force --out " + out_dir, &code);
  EXPECT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr("6 layers (6 MoE), 16 experts, top-2"));

  out = Moectl("make-model --preset nope --out " + dir_.Sub("n"), &code);
  EXPECT_EQ(code, 1) << out;
  EXPECT_THAT(out, HasSubstr("tiny, small, mixtral-8x7b-2l"));
  out = Moectl(
      "make-model --preset mixtral-8x7b-2l --arch olmoe --out " + dir_.Sub("n"),
      &code);
  EXPECT_EQ(code, 1) << out;
  EXPECT_THAT(
      out, HasSubstr("preset mixtral-8x7b-2l is a mixtral model, not olmoe"));
}

// Issue 12: make-model writes FP8 checkpoints in the published layout (and
// says why it does not write q8/q4), inspect shows the format, the scales'
// block and the bytes per expert stored and as each held format.
TEST_F(OpsReportTest, MakeModelWritesFp8AndInspectShowsTheFormats) {
  int code = -1;
  const std::string fp8 = dir_.Sub("fp8");
  std::string out = Moectl(
      "make-model --expert-format fp8 --fp8-block 32 --out " + fp8, &code);
  EXPECT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr("F8_E4M3"));
  out = Moectl("inspect " + fp8, &code);
  EXPECT_EQ(code, 0) << out;
  // Tiny mixtral: 3 x [128, 64] per expert, 2 x 4 scales of 32 x 32 each.
  EXPECT_THAT(out, HasSubstr("expert dtype: F8_E4M3"));
  EXPECT_THAT(out, HasSubstr("fp8 block scales: 32 x 32 weights per scale"));
  EXPECT_THAT(out, HasSubstr("experts held as (no --expert-format): q8"));
  EXPECT_THAT(out, HasSubstr("bytes per expert: 24672 "));
  EXPECT_THAT(
      out, HasSubstr("bytes per expert as bf16: 49152 (48.0 KiB, 1.99x more)"));
  EXPECT_THAT(out, HasSubstr("bytes per expert as q8: 26112 "));
  out = Moectl("inspect --json " + fp8, &code);
  EXPECT_THAT(out, HasSubstr("\"fp8_block_size\":[32,32]"));
  EXPECT_THAT(out, HasSubstr("\"expert_held_format\":\"q8\""));
  out = Moectl("make-model --expert-format q4 --out " + dir_.Sub("q4"), &code);
  EXPECT_EQ(code, 1) << out;
  EXPECT_THAT(out, HasSubstr("no published safetensors layout for q4"));
}

// Point 8: simulate checks every policy and the sweep's output before it
// prints anything, and shows progress when asked (auto: on a terminal).
TEST_F(OpsReportTest, SimulateChecksEverythingFirstAndShowsProgress) {
  const std::string trace = dir_.Sub("t.jsonl");
  int code = -1;
  std::string out =
      Moectl("synth-trace --out " + trace +
                 " --layers 4 --experts 8 --requests 4 --decode-tokens 8",
             &code);
  ASSERT_EQ(code, 0) << out;
  const std::string sim = kMoectl + " simulate --trace " + trace;
  out = RunShell(sim + " --policy lru,nope --capacity 16 2>/dev/null", &code,
                 false);
  EXPECT_EQ(code, 2);
  EXPECT_EQ(out, "");  // not even the table's header
  out = RunShell(sim + " --policy lru,nope --capacity 16", &code);
  EXPECT_THAT(out, HasSubstr("nope"));
  out = RunShell(
      sim + " --policy lru --sweep 0.5,1 --out /nonexistent/dir/s 2>/dev/null",
      &code, false);
  EXPECT_EQ(code, 2);
  EXPECT_EQ(out, "");
  out = RunShell(sim + " --policy lru --capacity 4", &code);
  EXPECT_EQ(code, 2);
  EXPECT_THAT(out, HasSubstr("below one layer's experts"));

  out = RunShell(
      sim + " --policy lru --capacity 16 --progress on 2>&1 >/dev/null", &code,
      false);
  EXPECT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr("simulate: run 1/2 (belady at 16 slots) 100%"));
  EXPECT_THAT(out, HasSubstr("simulate: run 2/2 (lru at 16 slots) 100%"));
  EXPECT_THAT(out, HasSubstr(" s left"));  // an ETA once some of the runs are done
  // The table says what it assumes and the unit of each column.
  out = RunShell(sim + " --policy lru --capacity 16", &code, false);
  EXPECT_EQ(code, 0) << out;
  EXPECT_THAT(out,
              HasSubstr("MB per expert (the default: give --expert-mb or --model for your model)"));
  EXPECT_THAT(out, HasSubstr("stall_ms/t"));
  out = RunShell(sim + " --policy lru --capacity 16 --expert-mb 0.072", &code, false);
  EXPECT_THAT(out, HasSubstr("assuming 0.072 MB per expert (--expert-mb)"));
  out = RunShell(sim + " --policy lru --capacity 16 2>&1 >/dev/null", &code,
                 false);
  EXPECT_EQ(out, "");  // auto: stderr is not a terminal here
}

// Item 8 of issue 28: the expert size comes from the model when given
// (--model: as moe-cached holds it), else the trace's header (a recording
// says it), else --expert-mb or the default; every output says which.
TEST_F(OpsReportTest, SimulateSizesExpertsFromTheModelOrTheTrace) {
  // A recording of the tiny model carries its expert's weights.
  StartDaemon();
  const std::string trace = dir_.Sub("rec.jsonl");
  StartWorker({"--cache", cache_, "--record-trace", trace});
  int code = -1;
  std::string out = Moectl("generate --target " + worker_sock_ +
                               " --prompt-ids 1,2,3 --max-new-tokens 4",
                           &code);
  ASSERT_EQ(code, 0) << out;
  worker_.Signal(SIGTERM);  // the recording is whole once the worker has exited
  worker_.Wait();
  auto config = LoadModelConfig(dir_.Sub("tiny"));
  ASSERT_TRUE(config.ok()) << config.status();
  const int64_t params = 3 * config->hidden_size * config->moe_intermediate_size;
  const int64_t slots = config->num_experts;  // one layer's worth
  const std::string sim = kMoectl + " simulate --trace " + trace + " --policy lru --capacity " +
                          std::to_string(slots);

  out = RunShell(sim, &code, false);
  ASSERT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr(absl::StrFormat("assuming %.3f MB per expert (the trace's header: "
                                             "%d weights as bf16)",
                                             2.0 * params / 1e6, params)));
  out = RunShell(sim + " --expert-format q8", &code, false);
  EXPECT_THAT(out, HasSubstr(absl::StrFormat("assuming %.3f MB per expert (the trace's header: "
                                             "%d weights as q8)",
                                             params * 68.0 / 64 / 1e6, params)));
  // --model: sized as moe-cached holds it (the tiny model's experts are
  // BF16 and held so), and in the format asked for.
  out = RunShell(sim + " --model " + dir_.Sub("tiny"), &code, false);
  ASSERT_EQ(code, 0) << out;
  EXPECT_THAT(out, HasSubstr(absl::StrFormat("assuming %.3f MB per expert (--model %s, held as "
                                             "bf16)",
                                             2.0 * params / 1e6, dir_.Sub("tiny"))));
  out = RunShell(sim + " --model " + dir_.Sub("tiny") + " --expert-format q4", &code, false);
  EXPECT_THAT(out, HasSubstr(absl::StrFormat("assuming %.3f MB per expert (--model %s, held as "
                                             "q4)",
                                             params * 36.0 / 64 / 1e6, dir_.Sub("tiny"))));
  // --expert-mb wins over both.
  out = RunShell(sim + " --model " + dir_.Sub("tiny") + " --expert-mb 3", &code, false);
  EXPECT_THAT(out, HasSubstr("assuming 3.000 MB per expert (--expert-mb)"));
  // A model of another shape is refused before anything runs.
  MakeModelOptions other = TinyPreset(ModelFamily::kMixtral);
  other.experts = 4;
  ASSERT_TRUE(MakeModel(other, dir_.Sub("other")).ok());
  out = RunShell(sim + " --model " + dir_.Sub("other") + " 2>&1", &code, false);
  EXPECT_EQ(code, 2);
  EXPECT_THAT(out, HasSubstr("give the checkpoint the trace was recorded on"));
  EXPECT_THAT(out, Not(HasSubstr("assuming")));

  // --json rows and a sweep's CSV carry the assumption.
  out = RunShell(sim + " --json", &code, false);
  ASSERT_EQ(code, 0) << out;
  // One object per line: the last run's (lru).
  std::vector<std::string> lines = absl::StrSplit(out, '\n', absl::SkipEmpty());
  ASSERT_FALSE(lines.empty());
  const nlohmann::json row = nlohmann::json::parse(lines.back());
  EXPECT_EQ(row["policy"], "lru");
  EXPECT_NEAR(row["expert_mb"].get<double>(), 2.0 * params / 1e6, 1e-9);
  EXPECT_THAT(row["expert_mb_from"].get<std::string>(), HasSubstr("trace's header"));
  EXPECT_EQ(row["link_gbps"].get<double>(), 25);
  out = RunShell(kMoectl + " simulate --trace " + trace + " --policy lru --sweep 1 --out " +
                     dir_.Sub("sw") + " --expert-mb 2",
                 &code, false);
  ASSERT_EQ(code, 0) << out;
  const std::string csv = ReadAll(dir_.Sub("sw.csv"));
  EXPECT_THAT(csv, HasSubstr(",expert_mb,expert_mb_from,link_gbps,layer_ms\n"));
  EXPECT_THAT(csv, HasSubstr(",2,\"--expert-mb\",25,"));
}

// docs/operations.md's "Simulate before you buy memory" commands run as
// written on a trace named as they name it.
TEST_F(OpsReportTest, OperationsGuideSimulateExamplesRunAsWritten) {
  const std::string doc =
      ReadAll(std::string(MOE_SOURCE_DIR) + "/docs/operations.md");
  const size_t at = doc.find("**Simulate before you buy memory.**");
  ASSERT_NE(at, std::string::npos);
  const size_t open = doc.find("```sh\n", at);
  const size_t close = doc.find("```", open + 6);
  ASSERT_NE(close, std::string::npos);
  // Commands: lines from "moectl simulate" on, with their continuations.
  std::vector<std::string> commands;
  bool continuing = false;
  for (absl::string_view line :
       absl::StrSplit(absl::string_view(doc).substr(open + 6, close - open - 6), '\n')) {
    if (!continuing && !absl::StartsWith(line, "moectl simulate")) continue;
    if (!continuing) commands.emplace_back();
    commands.back() += std::string(line) + "\n";
    continuing = absl::EndsWith(line, "\\");
  }
  ASSERT_GE(commands.size(), 2u) << doc.substr(open, close - open);
  int code = -1;
  // A trace of Mixtral's shape (32 layers x 8 experts) under the doc's name.
  std::string out = RunShell("cd " + dir_.path() + " && " + kMoectl +
                                 " synth-trace --out routing.jsonl --regime mixtral-uniform",
                             &code);
  ASSERT_EQ(code, 0) << out;
  const std::string bin = std::string(MOE_BINARY_DIR) + "/bin";
  for (const std::string& command : commands) {
    out = RunShell("cd " + dir_.path() + " && PATH=" + bin + ":$PATH " + command, &code);
    EXPECT_EQ(code, 0) << command << out;
    EXPECT_THAT(out, HasSubstr("assuming ")) << command;
    EXPECT_THAT(out, HasSubstr("moe-infinity")) << command;
  }
  EXPECT_FALSE(ReadAll(dir_.Sub("sweep.csv")).empty());
}

}  // namespace
}  // namespace moe::worker
