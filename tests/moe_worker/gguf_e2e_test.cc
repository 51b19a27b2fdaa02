// A GGUF file with quantized experts served by the real moe-cached +
// moe-worker with partial caches (issue 30): the daemon holds and moves
// the experts as the file's blocks (bytes copied per miss = the GGUF
// blocks' bytes, page-padded; per layer where a file mixes types, as
// llama.cpp's Q4_K_M does), the worker computes on them, and the greedy
// tokens and logprobs equal `moectl run` on the same file, for every capacity
// and policy (design invariant 4).
#include <algorithm>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/model_desc.h"
#include "gtest/gtest.h"
#include "services/moe_cached/expert_store.h"  // kTensorAlign, kBlockAlign
#include "tests/common/tiny_model.h"
#include "tests/moe_worker/served_e2e.h"

namespace moe::worker {
namespace {

const std::vector<int32_t> kPrompt = {11, 22, 33, 44, 55, 66, 77};
constexpr int kNew = 10;

struct Case {
  const char* name;
  ModelFamily family;
  const char* experts;  // ggml type of the routed experts
  const char* dense;    // of the other 2-D weights ("": F32)
  DType held;           // the widest where `overrides` mix types
  const char* overrides = "";  // hf_to_gguf.py --tensor-type NAME=TYPE, space-separated
};

// One expert's block in the daemon (ExpertStore's layout): gate, up and
// down, each at a kTensorAlign offset, padded to a page.
uint64_t BlockBytes(const ExpertDTypes& t, int64_t rows, int64_t cols) {
  uint64_t block = 0;
  for (DType d : {t.gate, t.up, t.down}) {
    block = (block + cached::kTensorAlign - 1) / cached::kTensorAlign * cached::kTensorAlign +
            static_cast<uint64_t>(WeightBytes(d, rows, cols));
  }
  return (block + cached::kBlockAlign - 1) / cached::kBlockAlign * cached::kBlockAlign;
}

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class GgufE2eTest : public ServedE2eTest<Case> {
 protected:
  std::string model_dir() override { return dir_.Sub("model.gguf"); }

  void SetUp() override {
    const Case& c = GetParam();
    // 2 layers x 4 experts of [256, 256]: K-quant blocks fit every row.
    const MakeModelOptions o = moe::testing::KQuantableModel(c.family, 23);
    ASSERT_TRUE(MakeModel(o, dir_.Sub("hf")).ok());
    std::string cmd = absl::StrCat(
        "/usr/bin/python3 ", MOE_SOURCE_DIR, "/tests/reference/hf_to_gguf.py ",
        dir_.Sub("hf"), " ", model_dir(), " --experts ", c.experts);
    if (*c.dense != '\0') absl::StrAppend(&cmd, " --dense ", c.dense);
    for (absl::string_view o : absl::StrSplit(c.overrides, ' ', absl::SkipEmpty())) {
      absl::StrAppend(&cmd, " --tensor-type ", o);
    }
    RunCommandForTest(cmd);
  }

  // Greedy tokens and logprobs of `moectl run` on the file.
  void RunMoectl(std::vector<int32_t>* tokens, std::vector<double>* logprobs) {
    const std::string out = RunCommandForTest(absl::StrCat(
        MOE_BINARY_DIR, "/bin/moectl run --model ", model_dir(),
        " --prompt-ids ", absl::StrJoin(kPrompt, ","), " --max-new-tokens ",
        kNew, " --ignore-eos --backend cpu --json"));
    for (absl::string_view line :
         absl::StrSplit(out, '\n', absl::SkipEmpty())) {
      auto j = nlohmann::json::parse(line, nullptr, false);
      ASSERT_FALSE(j.is_discarded()) << line;
      if (!j.contains("token_id")) continue;  // the summary line
      tokens->push_back(j["token_id"].get<int32_t>());
      logprobs->push_back(j["logprob"].get<double>());
    }
  }
};

TEST_P(GgufE2eTest, ServedTokensEqualMoectlRunOnTheSameFile) {
  const Case& c = GetParam();
  auto desc = ModelDescription::Open(model_dir());
  ASSERT_TRUE(desc.ok()) << desc.status();
  ASSERT_EQ(desc->expert_dtype(), c.held);
  ASSERT_EQ(desc->mixed_expert_dtypes(), *c.overrides != '\0');
  // Each layer's blocks (the GGUF blocks of its types, page-padded).
  uint64_t smallest = ~uint64_t{0}, largest = 0;
  for (int l = 0; l < desc->config().num_moe_layers(); ++l) {
    const ExpertDTypes t = desc->expert_dtypes(l);
    EXPECT_EQ(desc->expert_bytes(l), static_cast<uint64_t>(WeightBytes(t.gate, 256, 256) +
                                                           WeightBytes(t.up, 256, 256) +
                                                           WeightBytes(t.down, 256, 256)));
    smallest = std::min(smallest, BlockBytes(t, 256, 256));
    largest = std::max(largest, BlockBytes(t, 256, 256));
  }
  if (*c.overrides == '\0') {
    EXPECT_EQ(desc->bytes_per_expert(), 3 * static_cast<uint64_t>(WeightBytes(c.held, 256, 256)));
  } else {
    ASSERT_LT(smallest, largest) << "the layers' blocks should differ in size";
  }

  std::vector<int32_t> want;
  std::vector<double> want_lp;
  ASSERT_NO_FATAL_FAILURE(RunMoectl(&want, &want_lp));
  ASSERT_EQ(want.size(), static_cast<size_t>(kNew));
  // 8 experts in all: a layer's worth (4) and more, never all of them.
  for (const auto& [experts, policy] :
       std::vector<std::pair<int, std::string>>{{4, "lru"}, {6, "lfu"}}) {
    SCOPED_TRACE(::testing::Message() << policy << " capacity " << experts);
    Served run;
    ASSERT_NO_FATAL_FAILURE(Serve(experts, policy, {}, kPrompt, kNew, &run));
    EXPECT_EQ(run.tokens, want);
    ASSERT_EQ(run.logprobs.size(), want_lp.size());
    for (size_t i = 0; i < want_lp.size(); ++i) {
      EXPECT_FLOAT_EQ(run.logprobs[i], static_cast<float>(want_lp[i])) << i;
    }
    const nlohmann::json& stats = run.stats;
    EXPECT_GT(stats["misses"].get<int64_t>(), 0) << stats.dump();
    if (stats["host_runs"].get<int64_t>() == 0) {
      // A miss copies its expert's block: the three tensors' GGUF blocks,
      // each at a kTensorAlign offset, padded to a page (kBlockAlign); with
      // mixed types a smaller layer's copies move less than a slot.
      const uint64_t misses = stats["misses"].get<uint64_t>();
      const uint64_t copied = stats["bytes_copied"].get<uint64_t>();
      if (smallest == largest) {
        EXPECT_EQ(copied, misses * largest) << stats.dump();
      } else {
        EXPECT_GT(copied, misses * smallest) << stats.dump();
        EXPECT_LT(copied, misses * largest) << stats.dump();
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Types, GgufE2eTest,
    ::testing::Values(
        Case{"MixtralQ4_KDenseQ8_0", ModelFamily::kMixtral, "Q4_K", "Q8_0",
             DType::kQ4K},
        Case{"Qwen3MoeQ6_K", ModelFamily::kQwen3Moe, "Q6_K", "", DType::kQ6K},
        Case{"MixtralQ8_0", ModelFamily::kMixtral, "Q8_0", "", DType::kQ8},
        Case{"Qwen3MoeMxfp4", ModelFamily::kQwen3Moe, "MXFP4", "",
             DType::kMxfp4},
        // llama.cpp's Q4_K_M keeps some layers' down in Q6_K; here also a
        // layer whose gate and up differ.
        Case{"MixtralQ4_K_M", ModelFamily::kMixtral, "Q4_K", "Q8_0", DType::kQ6K,
             "blk.1.ffn_down_exps.weight=Q6_K blk.0.ffn_up_exps.weight=Q5_K"}),
    [](const ::testing::TestParamInfo<Case>& i) {
      return std::string(i.param.name);
    });

}  // namespace
}  // namespace moe::worker
