// The project's trained model (deploy/models/kjv-moe, made by
// scripts/train-small-moe.py): it loads like any Hugging Face checkpoint, our
// tokenizer reads the text as the training script's tokenizer did, the
// engine's teacher-forced perplexity equals the float64 reference's, and the
// learned weights beat a unigram model on the held-out books.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/file_util.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "nlohmann/json.hpp"
#include "services/engine/generator.h"
#include "services/engine/in_memory_provider.h"
#include "services/engine/moe_model.h"
#include "services/engine/session.h"
#include "services/engine/tokenizer.h"

namespace moe {
namespace {

const std::string kDir = absl::StrCat(MOE_SOURCE_DIR, "/deploy/models/kjv-moe");

std::string RunCommand(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int rc = pclose(p);
  if (rc != 0) ADD_FAILURE() << cmd << " exited with " << rc << "\n" << out;
  return out;
}

nlohmann::json Report() {
  auto text = ReadFileToString(JoinPath(kDir, "train-report.json"));
  EXPECT_TRUE(text.ok()) << text.status();
  return nlohmann::json::parse(text.ok() ? *text : std::string("{}"));
}

std::string HeldOut() {
  auto text = ReadFileToString(JoinPath(kDir, "heldout.txt"));
  EXPECT_TRUE(text.ok()) << text.status();
  return text.ok() ? *text : std::string();
}

class TrainedModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto backend = CreateBackend("cpu");
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = std::move(*backend);
    auto model = MoeModel::Load(kDir, backend_.get());
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(*model);
    auto tok = Tokenizer::FromFile(JoinPath(kDir, "tokenizer.json"));
    ASSERT_TRUE(tok.ok()) << tok.status();
    tok_ = std::move(*tok);
    auto experts = InMemoryExpertProvider::Create(*model_);
    ASSERT_TRUE(experts.ok()) << experts.status();
    experts_ = std::move(*experts);
  }

  // Teacher-forced next-token NLLs, one decode step per token (as
  // `moectl perplexity` runs them).
  std::vector<double> Nll(const std::vector<int32_t>& ids) {
    Session s(*model_, experts_.get(), static_cast<int64_t>(ids.size()));
    std::vector<double> nll;
    for (size_t i = 0; i + 1 < ids.size(); ++i) {
      auto logits = s.Forward(absl::MakeConstSpan(&ids[i], 1), i == 0);
      EXPECT_TRUE(logits.ok()) << logits.status();
      if (!logits.ok()) return nll;
      double mx = -INFINITY, sum = 0;
      for (float v : *logits) mx = std::max(mx, double(v));
      for (float v : *logits) sum += std::exp(double(v) - mx);
      nll.push_back(mx + std::log(sum) - double((*logits)[ids[i + 1]]));
    }
    return nll;
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<MoeModel> model_;
  std::unique_ptr<Tokenizer> tok_;
  std::unique_ptr<InMemoryExpertProvider> experts_;
};

TEST_F(TrainedModelTest, IsAMixtralCheckpointWithLearnedRouting) {
  const ModelConfig& c = model_->config();
  EXPECT_EQ(c.family, ModelFamily::kMixtral);
  EXPECT_EQ(c.num_hidden_layers, 6);
  EXPECT_EQ(c.num_experts, 16);
  EXPECT_EQ(c.top_k, 2);
  // Routing learned with the load-balancing loss: on the held-out books no
  // layer is collapsed onto a few experts, and none is uniform.
  const nlohmann::json report = Report();
  ASSERT_TRUE(report.contains("routing"));
  for (const auto& layer : report["routing"]) {
    const double ent = layer["entropy_bits"].get<double>();
    EXPECT_GT(ent, 2.5) << layer.dump();  // of log2(16) = 4
    EXPECT_LT(layer["top_share"].get<double>(), 0.5) << layer.dump();
  }
}

TEST_F(TrainedModelTest, TokenizerReadsTextAsTheTrainingScriptDid) {
  const std::string text = HeldOut();
  ASSERT_FALSE(text.empty());
  const std::vector<int32_t> ids = tok_->Encode(text);
  EXPECT_EQ(tok_->Decode(ids), text);
  const nlohmann::json report = Report();
  ASSERT_TRUE(report.contains("heldout_first_ids"));
  const auto want = report["heldout_first_ids"].get<std::vector<int32_t>>();
  ASSERT_GE(ids.size(), want.size());
  EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.begin() + want.size()), want);
}

TEST_F(TrainedModelTest, PerplexityEqualsTheFloat64Reference) {
  std::vector<int32_t> ids = tok_->Encode(HeldOut());
  ASSERT_GE(ids.size(), 96u);
  ids.resize(96);
  const std::vector<double> nll = Nll(ids);
  ASSERT_EQ(nll.size(), ids.size() - 1);
  const std::string out = RunCommand(
      absl::StrCat("/usr/bin/python3 ", MOE_SOURCE_DIR,
                   "/tests/reference/moe_reference.py --model ", kDir,
                   " --score --prompt-ids ", absl::StrJoin(ids, ",")));
  const auto ref = nlohmann::json::parse(out, nullptr, false);
  ASSERT_FALSE(ref.is_discarded()) << out;
  const auto ref_nll = ref["nll"].get<std::vector<double>>();
  ASSERT_EQ(ref_nll.size(), nll.size());
  double sum = 0, ref_sum = 0, max_diff = 0;
  for (size_t i = 0; i < nll.size(); ++i) {
    sum += nll[i];
    ref_sum += ref_nll[i];
    max_diff = std::max(max_diff, std::abs(nll[i] - ref_nll[i]));
  }
  const double rel = std::abs(sum - ref_sum) / ref_sum;
  std::printf(
      "mean NLL engine %.6f reference %.6f (relative %.2g), max per-token diff "
      "%.3g\n",
      sum / nll.size(), ref_sum / nll.size(), rel, max_diff);
  EXPECT_LE(rel, 1e-3);
  EXPECT_LE(max_diff, 2e-2);
}

TEST_F(TrainedModelTest, HeldOutPerplexityIsFarBelowAUnigramModels) {
  std::vector<int32_t> ids = tok_->Encode(HeldOut());
  ASSERT_GE(ids.size(), 512u);
  ids.resize(512);
  const std::vector<double> nll = Nll(ids);
  ASSERT_FALSE(nll.empty());
  double sum = 0;
  for (double v : nll) sum += v;
  const double ppl = std::exp(sum / nll.size());
  const double unigram = Report()["unigram_ppl"].get<double>();
  std::printf("held-out perplexity %.2f, unigram %.2f\n", ppl, unigram);
  EXPECT_LT(ppl, 0.5 * unigram);
}

TEST_F(TrainedModelTest, GreedyTokensEqualTheFloat64References) {
  const std::vector<int32_t> prompt = tok_->Encode("And the LORD said unto");
  ASSERT_FALSE(prompt.empty());
  const int kNew = 12;
  GenerateOptions opts;
  opts.prompt = prompt;
  opts.max_new_tokens = kNew;
  opts.stop_at_eos = false;
  std::vector<SampledToken> got;
  auto summary =
      Generate(*model_, experts_.get(), opts, [&](const SampledToken& t) {
        got.push_back(t);
        return true;
      });
  ASSERT_TRUE(summary.ok()) << summary.status();
  const std::string out = RunCommand(absl::StrCat(
      "/usr/bin/python3 ", MOE_SOURCE_DIR,
      "/tests/reference/moe_reference.py --model ", kDir, " --prompt-ids ",
      absl::StrJoin(prompt, ","), " --max-new-tokens ", kNew));
  const auto ref = nlohmann::json::parse(out, nullptr, false);
  ASSERT_FALSE(ref.is_discarded()) << out;
  ASSERT_EQ(got.size(), static_cast<size_t>(kNew));
  std::vector<int32_t> ids;
  for (int i = 0; i < kNew; ++i) {
    ids.push_back(got[i].token);
    EXPECT_EQ(got[i].token, ref["tokens"][i].get<int>()) << "token " << i;
    EXPECT_NEAR(got[i].logprob, ref["logprobs"][i].get<double>(), 2e-2)
        << "token " << i;
  }
  std::printf("greedy: \"And the LORD said unto%s\"\n",
              tok_->Decode(ids).c_str());
}

}  // namespace
}  // namespace moe
