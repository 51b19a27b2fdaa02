// glm4_moe (GLM-4.5, GLM-4.5-Air) end to end through moectl: its tensor
// names as published, the presets, make-model --arch glm4_moe, inspect, and
// `moectl run` giving the greedy tokens of the float64 reference
// (tests/reference/glm4_moe_reference.py).
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/model_config.h"
#include "common/model_desc.h"
#include "common/model_maker.h"
#include "common/model_presets.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/test_util.h"

namespace moe {
namespace {

using ::testing::HasSubstr;

std::string Output(const std::string& cmd, int* rc) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  *rc = ::pclose(p);
  return out;
}

TEST(Glm4MoeConfigTest, TensorNamesAsPublished) {
  auto c = ConfigFromOptions(TinyPreset(ModelFamily::kGlm4Moe));
  ASSERT_TRUE(c.ok()) << c.status();
  std::vector<TensorSpec> specs = ExpectedTensors(*c);
  EXPECT_EQ(specs.size(), ExpectedTensorCount(*c));
  std::set<std::string> names;
  for (const TensorSpec& s : specs) names.insert(s.name);
  const std::string a = "model.layers.1.self_attn.";
  for (const char* n : {"q_proj.weight", "k_proj.weight", "v_proj.weight",
                        "o_proj.weight", "q_proj.bias", "k_proj.bias",
                        "v_proj.bias", "q_norm.weight", "k_norm.weight"}) {
    EXPECT_EQ(names.count(a + n), 1u) << n;
  }
  EXPECT_EQ(names.count(a + "o_proj.bias"), 0u);
  const std::string m = "model.layers.1.mlp.";
  for (const char* n :
       {"gate.weight", "gate.e_score_correction_bias",
        "experts.7.gate_proj.weight", "experts.0.down_proj.weight",
        "shared_experts.up_proj.weight"}) {
    EXPECT_EQ(names.count(m + n), 1u) << n;
  }
  EXPECT_EQ(names.count("model.layers.0.mlp.gate_proj.weight"), 1u);
  EXPECT_EQ(names.count("model.layers.0.mlp.gate.weight"), 0u);
  for (const TensorSpec& s : specs) {
    if (s.name == a + "q_norm.weight") {
      EXPECT_EQ(s.shape, (std::vector<int64_t>{32}));  // per head
    }
  }
}

TEST(Glm4MoeConfigTest, Presets) {
  for (const char* name : {"glm-4.5-air-2l", "glm-4.5-2l"}) {
    auto o = PresetOptions(name, std::nullopt);
    ASSERT_TRUE(o.ok()) << o.status();
    auto c = ConfigFromOptions(*o);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->family, ModelFamily::kGlm4Moe);
    EXPECT_EQ(c->num_moe_layers(), 1);
    EXPECT_EQ(c->rotary_dim, 64);
    EXPECT_EQ(c->head_dim, 128);
  }
  EXPECT_FALSE(PresetOptions("glm-4.5-air-2l", ModelFamily::kMixtral).ok());
}

// make-model, inspect and run through the CLI; run's greedy tokens equal the
// float64 reference's.
TEST(Glm4MoeConfigTest, MoectlMakeInspectRunMatchesTheReference) {
  moe::testing::TempDir dir;
  const std::string moectl = std::string(MOE_BINARY_DIR) + "/bin/moectl";
  const std::string out = dir.Sub("glm");
  int rc = -1;
  Output(absl::StrCat(moectl, " make-model --arch glm4_moe --seed 5 --out ",
                      out, " 2>&1"),
         &rc);
  ASSERT_EQ(rc, 0);
  const std::string text = Output(absl::StrCat(moectl, " inspect ", out), &rc);
  EXPECT_EQ(rc, 0);
  EXPECT_THAT(text, HasSubstr("family: glm4_moe"));
  EXPECT_THAT(text, HasSubstr("rotary: first 16 of 32 values per head"));
  EXPECT_THAT(text, HasSubstr("routing: sigmoid, noaux_tc"));
  EXPECT_THAT(text, HasSubstr("moe layers: 3"));

  const std::string prompt = "3,14,15,92,65,35";
  const std::string ref_out =
      Output(absl::StrCat("/usr/bin/python3 ", MOE_SOURCE_DIR,
                          "/tests/reference/moe_reference.py --model ", out,
                          " --prompt-ids ", prompt, " --max-new-tokens 8"),
             &rc);
  ASSERT_EQ(rc, 0) << ref_out;
  auto ref = nlohmann::json::parse(ref_out);
  const std::string run =
      Output(absl::StrCat(moectl, " run --model ", out, " --prompt-ids ",
                          prompt, " --max-new-tokens 8 --json 2>/dev/null"),
             &rc);
  ASSERT_EQ(rc, 0) << run;
  std::vector<int64_t> tokens;
  std::vector<double> logprobs;
  for (absl::string_view line : absl::StrSplit(run, '\n', absl::SkipEmpty())) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << line;
    if (j.contains("token_id")) {
      tokens.push_back(j["token_id"].get<int64_t>());
      logprobs.push_back(j["logprob"].get<double>());
    }
  }
  EXPECT_EQ(tokens, ref["tokens"].get<std::vector<int64_t>>()) << run;
  ASSERT_EQ(logprobs.size(), ref["logprobs"].size());
  for (size_t i = 0; i < logprobs.size(); ++i) {
    // bf16 weights, f32 compute against float64: within 2e-2.
    EXPECT_NEAR(logprobs[i], ref["logprobs"][i].get<double>(), 2e-2) << i;
  }
}

}  // namespace
}  // namespace moe
