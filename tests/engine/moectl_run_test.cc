// `moectl run` end to end: the real binary on tiny models.
#include <sys/wait.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file_util.h"
#include "common/model_maker.h"
#include "common/quant.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "nlohmann/json.hpp"
#include "services/cache/trace.h"
#include "services/engine/generator.h"
#include "services/engine/in_memory_provider.h"

namespace moe {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

struct Result {
  int code = -1;
  std::string out;
  std::string err;
};

// `moectl COMMAND ARGS` with stdout and stderr captured.
Result RunMoectlCommand(const std::string& command, const std::string& args) {
  static int counter = 0;
  const std::string base =
      absl::StrCat(::testing::TempDir(), "/moectl_run_", ++counter);
  const std::string cmd = absl::StrCat(MOE_BINARY_DIR, "/bin/moectl ", command, " ", args,
                                       " >", base, ".out 2>", base, ".err");
  Result r;
  const int status = std::system(cmd.c_str());
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = ReadFileToString(base + ".out").value_or("");
  r.err = ReadFileToString(base + ".err").value_or("");
  return r;
}

Result RunMoectl(const std::string& args) { return RunMoectlCommand("run", args); }

std::vector<json> JsonLines(const std::string& text) {
  std::vector<json> lines;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    EXPECT_FALSE(j.is_discarded()) << line;
    lines.push_back(j);
  }
  return lines;
}

std::vector<int> TokenIds(const std::vector<json>& lines) {
  std::vector<int> ids;
  for (size_t i = 0; i + 1 < lines.size(); ++i) {
    ids.push_back(lines[i]["token_id"].get<int>());
  }
  return ids;
}

class MoectlRunTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    MakeModelOptions o = TinyPreset(ModelFamily::kQwen2Moe);
    o.seed = 5;
    dir_ = new std::string(absl::StrCat(::testing::TempDir(), "/run_qwen2"));
    ASSERT_TRUE(MakeModel(o, *dir_).ok());
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::string Model() { return absl::StrCat("--model ", *dir_); }
  static std::string* dir_;
};
std::string* MoectlRunTest::dir_ = nullptr;

TEST_F(MoectlRunTest, JsonShapeAndGreedyMatchesEngine) {
  Result r = RunMoectl(absl::StrCat(
      Model(), " --prompt-ids 3,17,250,9 --max-new-tokens 6 --ignore-eos",
      " --top-logprobs 3 --backend cpu --json"));
  ASSERT_EQ(r.code, 0) << r.err;
  std::vector<json> lines = JsonLines(r.out);
  ASSERT_EQ(lines.size(), 7u) << r.out;
  for (int i = 0; i < 6; ++i) {
    const json& t = lines[i];
    ASSERT_TRUE(t["token_id"].is_number_integer()) << t;
    ASSERT_TRUE(t["text"].is_string()) << t;
    ASSERT_TRUE(t["logprob"].is_number()) << t;
    EXPECT_LE(t["logprob"].get<double>(), 0.0);
    ASSERT_EQ(t["top_logprobs"].size(), 3u) << t;
    // Greedy: the chosen token is the most likely alternative.
    EXPECT_EQ(t["top_logprobs"][0]["token_id"], t["token_id"]);
    EXPECT_DOUBLE_EQ(t["top_logprobs"][0]["logprob"].get<double>(),
                     t["logprob"].get<double>());
    EXPECT_GE(t["top_logprobs"][1]["logprob"].get<double>(),
              t["top_logprobs"][2]["logprob"].get<double>());
  }
  const json& s = lines.back();
  EXPECT_EQ(s["finish_reason"], "length");
  const json& u = s["usage"];
  EXPECT_EQ(u["prompt_tokens"], 4);
  EXPECT_EQ(u["generated_tokens"], 6);
  EXPECT_GT(u["time_to_first_token_seconds"].get<double>(), 0.0);
  EXPECT_GT(u["time_per_output_token_seconds"].get<double>(), 0.0);
  EXPECT_GT(u["expert_hits"].get<int64_t>(), 0);
  EXPECT_EQ(u["expert_misses"], 0);
  EXPECT_EQ(u["expert_stall_seconds"], 0.0);

  // The same request in process gives the same tokens and log-probs.
  auto backend = CreateBackend("cpu");
  ASSERT_TRUE(backend.ok());
  auto model = MoeModel::Load(*dir_, backend->get());
  ASSERT_TRUE(model.ok()) << model.status();
  auto experts = InMemoryExpertProvider::Create(**model);
  ASSERT_TRUE(experts.ok());
  GenerateOptions opts;
  opts.prompt = {3, 17, 250, 9};
  opts.max_new_tokens = 6;
  opts.stop_at_eos = false;
  std::vector<SampledToken> want;
  auto summary =
      Generate(**model, experts->get(), opts, [&](const SampledToken& t) {
        want.push_back(t);
        return true;
      });
  ASSERT_TRUE(summary.ok()) << summary.status();
  ASSERT_EQ(want.size(), 6u);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(lines[i]["token_id"].get<int>(), want[i].token) << i;
    EXPECT_FLOAT_EQ(lines[i]["logprob"].get<float>(), want[i].logprob) << i;
  }
}

TEST_F(MoectlRunTest, GreedyIsDeterministic) {
  const std::string args = absl::StrCat(
      Model(),
      " --prompt-ids 1,2,3,4,5 --max-new-tokens 10 --ignore-eos --json");
  Result a = RunMoectl(args);
  Result b = RunMoectl(args);
  ASSERT_EQ(a.code, 0) << a.err;
  ASSERT_EQ(b.code, 0) << b.err;
  std::vector<int> ta = TokenIds(JsonLines(a.out));
  EXPECT_EQ(ta.size(), 10u);
  EXPECT_EQ(ta, TokenIds(JsonLines(b.out)));
}

TEST_F(MoectlRunTest, SeededSamplingIsReproducible) {
  auto args = [](int seed) {
    return absl::StrCat(Model(),
                        " --prompt-ids 7,8,9 --max-new-tokens 16 --ignore-eos"
                        " --temperature 1.5 --top-p 0.95 --json --seed ",
                        seed);
  };
  Result a = RunMoectl(args(7));
  Result b = RunMoectl(args(7));
  Result c = RunMoectl(args(8));
  ASSERT_EQ(a.code, 0) << a.err;
  ASSERT_EQ(b.code, 0) << b.err;
  ASSERT_EQ(c.code, 0) << c.err;
  std::vector<int> ta = TokenIds(JsonLines(a.out));
  ASSERT_EQ(ta.size(), 16u);
  EXPECT_EQ(ta, TokenIds(JsonLines(b.out)));
  EXPECT_NE(ta, TokenIds(JsonLines(c.out)));
}

TEST_F(MoectlRunTest, TextModeStreamsTheSameTextAsJson) {
  const std::string common = absl::StrCat(
      Model(), " --prompt 'hello world' --max-new-tokens 8 --ignore-eos");
  Result text = RunMoectl(common);
  Result js = RunMoectl(common + " --json");
  ASSERT_EQ(text.code, 0) << text.err;
  ASSERT_EQ(js.code, 0) << js.err;
  std::string joined;
  for (const json& j : JsonLines(js.out))
    joined += j["text"].get<std::string>();
  EXPECT_FALSE(joined.empty());
  EXPECT_EQ(text.out, joined + "\n");
  // One summary line on stderr.
  EXPECT_THAT(text.err, HasSubstr("8 tokens"));
  EXPECT_THAT(text.err, HasSubstr("TTFT"));
  EXPECT_EQ(std::count(text.err.begin(), text.err.end(), '\n'), 1) << text.err;
}

TEST_F(MoectlRunTest, RecordsTrace) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/run.jsonl");
  Result r = RunMoectl(absl::StrCat(Model(),
                                    " --prompt-ids 4,5,6 --max-new-tokens 5 "
                                    "--ignore-eos --json --record-trace ",
                                    path));
  ASSERT_EQ(r.code, 0) << r.err;
  auto trace = trace::ReadTraceFile(path);
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_EQ(trace->header.model, "run_qwen2");
  EXPECT_EQ(trace->header.num_layers, 4);
  EXPECT_EQ(trace->header.num_experts, 8);
  EXPECT_EQ(trace->header.top_k, 2);
  ASSERT_EQ(trace->requests.size(), 1u);
  EXPECT_EQ(trace->requests[0].num_prefill_tokens(), 3);
  EXPECT_EQ(trace->requests[0].num_decode_tokens(), 4);
}

struct ErrorCase {
  std::string args;  // after the model flag ("" model flag when no_model)
  bool with_model;
  int code;
  std::string message;
};

TEST_F(MoectlRunTest, ErrorsAreOneLineWithNonZeroExit) {
  const std::vector<ErrorCase> cases = {
      {"--prompt-ids 1,2", false, 2, "--model is required"},
      {"--max-new-tokens 3", true, 2, "exactly one of --prompt"},
      {"--prompt hi --prompt-ids 1", true, 2, "exactly one of --prompt"},
      {"--prompt-ids 1,x", true, 2, "x"},
      {"--prompt-ids 1,100000", true, 2, "outside the vocabulary"},
      {"--prompt-ids -5", true, 2, "out of range"},
      {"--prompt-ids 1 --max-new-tokens 0", true, 2, "--max-new-tokens"},
      {"--prompt-ids 1 --top-p 2", true, 2, "top_p"},
      {"--prompt-ids 1 --top-logprobs 50", true, 2, "--top-logprobs"},
      {"--prompt-ids 1 --bogus", true, 2, "bogus"},
      {"--prompt-ids 1 --backend tpu", true, 2, "tpu"},  // a bad flag value: usage error
      {"--prompt-ids 1 --device tpu", true, 2, "--device expects cpu, cuda or auto"},
      {"--prompt-ids 1 --model /nonexistent/model", false, 1, "nonexistent"},
      {"--prompt-ids 1 --record-trace /nonexistent/dir/t.jsonl", true, 1,
       "nonexistent"},
  };
  for (const ErrorCase& c : cases) {
    Result r =
        RunMoectl(c.with_model ? absl::StrCat(Model(), " ", c.args) : c.args);
    EXPECT_EQ(r.code, c.code) << c.args << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr("moectl run: ")) << c.args;
    EXPECT_THAT(r.err, HasSubstr(c.message)) << c.args;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << c.args << "\n"
                                                               << r.err;
    EXPECT_EQ(r.out, "") << c.args;
  }
}

// --expert-format: the in-process run holds the experts converted (the tokens
// are those of the engine over the same converted experts); a bad name is a
// usage error.
TEST_F(MoectlRunTest, ExpertFormatMatchesTheEngineOverTheSameFormat) {
  for (const char* name : {"q8", "q4"}) {
    SCOPED_TRACE(name);
    Result r = RunMoectl(absl::StrCat(Model(), " --prompt-ids 3,17,250,9 --max-new-tokens 6",
                                      " --ignore-eos --backend cpu --json --expert-format ",
                                      name));
    ASSERT_EQ(r.code, 0) << r.err;
    auto backend = CreateBackend("cpu");
    auto model = MoeModel::Load(*dir_, backend->get());
    ASSERT_TRUE(model.ok()) << model.status();
    auto experts = InMemoryExpertProvider::Create(**model, *ParseExpertFormat(name));
    ASSERT_TRUE(experts.ok()) << experts.status();
    GenerateOptions o;
    o.prompt = {3, 17, 250, 9};
    o.max_new_tokens = 6;
    o.stop_at_eos = false;
    std::vector<int> want;
    ASSERT_TRUE(Generate(**model, experts->get(), o, [&](const SampledToken& t) {
                  want.push_back(t.token);
                  return true;
                }).ok());
    EXPECT_EQ(TokenIds(JsonLines(r.out)), want);
  }
  Result bad = RunMoectl(absl::StrCat(Model(), " --prompt-ids 1 --expert-format q5"));
  EXPECT_EQ(bad.code, 2);
  EXPECT_THAT(bad.err, HasSubstr("choose bf16, q8, q4 or mxfp4"));
}

// moectl perplexity: the checkpoint's own format has KL 0 against itself;
// q4 moves the distributions more than q8.
TEST_F(MoectlRunTest, PerplexityKlGrowsAsBitsShrink) {
  const std::string text = absl::StrCat(::testing::TempDir(), "/ppl.txt");
  ASSERT_TRUE(WriteFileAtomically(text, "the quick brown fox jumps over the lazy dog, "
                                        "and a tiny model scores every next token.\n")
                  .ok());
  auto kl = [&](const char* format) {
    Result r = RunMoectlCommand(
        "perplexity", absl::StrCat(Model(), " --text ", text, " --expert-format ", format));
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_THAT(r.out, HasSubstr("perplexity"));
    EXPECT_THAT(r.out, HasSubstr("mean nothing"));
    const size_t at = r.out.find("nats per token");
    const size_t colon = r.out.rfind(": ", at);
    EXPECT_NE(at, std::string::npos) << r.out;
    return at == std::string::npos ? -1.0 : std::stod(r.out.substr(colon + 2, at - colon - 2));
  };
  EXPECT_EQ(kl("bf16"), 0.0);
  const double q8 = kl("q8"), q4 = kl("q4");
  EXPECT_GT(q8, 0.0);
  EXPECT_GT(q4, q8);
}

// --warmup runs the prompt untimed first: the tokens and their logprobs
// are those of a run without it; out-of-range counts are refused.
TEST_F(MoectlRunTest, WarmupLeavesTheTokensAsTheyAre) {
  const std::string args = absl::StrCat(Model(), " --prompt-ids 3,17,250,9 --max-new-tokens 5",
                                        " --ignore-eos --backend cpu --json");
  Result plain = RunMoectl(args);
  Result warm = RunMoectl(args + " --warmup 2");
  ASSERT_EQ(plain.code, 0) << plain.err;
  ASSERT_EQ(warm.code, 0) << warm.err;
  std::vector<json> a = JsonLines(plain.out), b = JsonLines(warm.out);
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), a.size());
  for (size_t i = 0; i + 1 < a.size(); ++i) {
    EXPECT_EQ(b[i]["token_id"], a[i]["token_id"]) << i;
    EXPECT_EQ(b[i]["logprob"], a[i]["logprob"]) << i;
  }
  EXPECT_EQ(b.back()["usage"]["prompt_tokens"], 4);
  Result bad = RunMoectl(args + " --warmup 9");
  EXPECT_EQ(bad.code, 2);
  EXPECT_THAT(bad.err, HasSubstr("--warmup must be 0 to 8"));
}

// --token-ids scores ids as given: the NLL of the one scored token is minus
// the log-probability `moectl run` gives the same token after the same
// one-token prompt; a bad id is refused by position, and --text and
// --token-ids exclude each other.
TEST_F(MoectlRunTest, PerplexityOfTokenIdsMatchesRunsLogprob) {
  Result run = RunMoectl(absl::StrCat(Model(), " --prompt-ids 17 --max-new-tokens 1",
                                      " --ignore-eos --backend cpu --json"));
  ASSERT_EQ(run.code, 0) << run.err;
  std::vector<json> lines = JsonLines(run.out);
  ASSERT_GE(lines.size(), 1u) << run.out;
  const int next = lines[0]["token_id"].get<int>();
  const double logprob = lines[0]["logprob"].get<double>();

  const std::string ids = absl::StrCat(::testing::TempDir(), "/ppl_ids.txt");
  ASSERT_TRUE(WriteFileAtomically(ids, absl::StrCat(" 17,\n", next, "\n")).ok());
  Result r = RunMoectlCommand("perplexity", absl::StrCat(Model(), " --token-ids ", ids,
                                                         " --expert-format bf16"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("tokens scored: 1 "));
  const size_t at = r.out.find("NLL ");
  ASSERT_NE(at, std::string::npos) << r.out;
  EXPECT_NEAR(std::stod(r.out.substr(at + 4)), -logprob, 2e-6) << r.out;

  ASSERT_TRUE(WriteFileAtomically(ids, "17 5 999999999").ok());
  Result bad = RunMoectlCommand("perplexity", absl::StrCat(Model(), " --token-ids ", ids));
  EXPECT_EQ(bad.code, 2);
  EXPECT_THAT(bad.err, HasSubstr("token 2 is 999999999, outside the vocabulary"));
  ASSERT_TRUE(WriteFileAtomically(ids, "17 five").ok());
  bad = RunMoectlCommand("perplexity", absl::StrCat(Model(), " --token-ids ", ids));
  EXPECT_EQ(bad.code, 2);
  EXPECT_THAT(bad.err, HasSubstr("'five' (token 1) is not an integer"));
  bad = RunMoectlCommand("perplexity",
                         absl::StrCat(Model(), " --token-ids ", ids, " --text ", ids));
  EXPECT_EQ(bad.code, 2);
  EXPECT_THAT(bad.err, HasSubstr("exactly one of --text and --token-ids"));
}

}  // namespace
}  // namespace moe
