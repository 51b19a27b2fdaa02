// deepseek_v2 / deepseek_v3 configs as published (DeepSeek-V2-Lite and
// DeepSeek-V3 config.json), their tensor names, the YaRN and router
// parameters the engine derives, the presets and moectl make-model/inspect.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model_config.h"
#include "common/model_desc.h"
#include "common/model_maker.h"
#include "common/model_presets.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/engine/mla_attention.h"
#include "tests/common/test_util.h"

namespace moe {
namespace {

using ::testing::HasSubstr;

constexpr char kV2Lite[] = R"({
  "architectures": ["DeepseekV2ForCausalLM"], "attention_bias": false,
  "attention_dropout": 0.0, "aux_loss_alpha": 0.001, "bos_token_id": 100000,
  "eos_token_id": 100001, "first_k_dense_replace": 1, "hidden_act": "silu",
  "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 10944,
  "kv_lora_rank": 512, "max_position_embeddings": 163840,
  "model_type": "deepseek_v2", "moe_intermediate_size": 1408,
  "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 64,
  "n_shared_experts": 2, "norm_topk_prob": false, "num_attention_heads": 16,
  "num_experts_per_tok": 6, "num_hidden_layers": 27, "num_key_value_heads": 16,
  "pretraining_tp": 1, "q_lora_rank": null, "qk_nope_head_dim": 128,
  "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40,
    "mscale": 0.707, "mscale_all_dim": 0.707,
    "original_max_position_embeddings": 4096, "type": "yarn"},
  "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax",
  "seq_aux": true, "tie_word_embeddings": false, "topk_group": 1,
  "topk_method": "greedy", "torch_dtype": "bfloat16", "use_cache": true,
  "v_head_dim": 128, "vocab_size": 102400})";

constexpr char kV3[] = R"({
  "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": false,
  "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1,
  "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168,
  "intermediate_size": 18432, "kv_lora_rank": 512,
  "max_position_embeddings": 163840, "model_type": "deepseek_v3",
  "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8,
  "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": true,
  "num_attention_heads": 128, "num_experts_per_tok": 8,
  "num_hidden_layers": 61, "num_key_value_heads": 128,
  "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
  "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40,
    "mscale": 1.0, "mscale_all_dim": 1.0,
    "original_max_position_embeddings": 4096, "type": "yarn"},
  "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
  "tie_word_embeddings": false, "topk_group": 4, "topk_method": "noaux_tc",
  "torch_dtype": "bfloat16", "v_head_dim": 128, "vocab_size": 129280})";

ModelConfig MustParse(const std::string& text) {
  auto c = ParseModelConfig(text);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : ModelConfig{};
}

std::string ErrorOf(const std::string& text) {
  auto c = ParseModelConfig(text);
  EXPECT_FALSE(c.ok());
  return c.ok() ? "" : std::string(c.status().message());
}

TEST(DeepseekConfigTest, V2Lite) {
  ModelConfig c = MustParse(kV2Lite);
  EXPECT_EQ(c.family, ModelFamily::kDeepseekV2);
  EXPECT_TRUE(c.is_mla());
  EXPECT_EQ(c.mla.q_lora_rank, 0);
  EXPECT_EQ(c.mla.kv_lora_rank, 512);
  EXPECT_EQ(c.mla.qk_head_dim(), 192);
  EXPECT_EQ(c.num_experts, 64);
  EXPECT_EQ(c.top_k, 6);
  EXPECT_EQ(c.n_shared_experts, 2);
  EXPECT_EQ(c.shared_expert_intermediate_size, 2 * 1408);
  EXPECT_TRUE(c.has_shared_expert());
  EXPECT_FALSE(c.has_shared_expert_gate());
  EXPECT_FALSE(c.has_score_correction_bias());
  EXPECT_EQ(c.num_moe_layers(), 26);  // layer 0 dense
  EXPECT_EQ(c.MoeLayerIndex(0), -1);
  EXPECT_EQ(c.LayerOfMoeLayer(0), 1);
  EXPECT_EQ(c.topk_method, TopkMethod::kGreedy);
  EXPECT_EQ(c.scoring_func, ScoringFunc::kSoftmax);
  ASSERT_TRUE(c.yarn.has_value());
  EXPECT_EQ(c.yarn->factor, 40);
  EXPECT_EQ(c.yarn->mscale_all_dim, 0.707);
  // softmax scale = 192^-0.5 * (0.1 * 0.707 * ln 40 + 1)^2; cos/sin x 1.
  MlaRope rope = MlaRopeFor(c);
  const double m = 0.1 * 0.707 * std::log(40.0) + 1.0;
  EXPECT_NEAR(rope.softmax_scale, m * m / std::sqrt(192.0), 1e-7);
  EXPECT_FLOAT_EQ(rope.mscale, 1.0f);
  ASSERT_EQ(rope.inv_freq.size(), 32u);
  // YaRN keeps the fastest frequencies and divides the slowest by factor.
  EXPECT_FLOAT_EQ(rope.inv_freq[0], 1.0f);
  EXPECT_NEAR(rope.inv_freq[31], std::pow(1e4, -62.0 / 64) / 40, 1e-12);
  RouterSpec s = RouterSpecFor(c);
  EXPECT_EQ(s.selection, RouterSelection::kGreedy);
  EXPECT_FALSE(s.renormalize);
  EXPECT_EQ(s.scale, 1.0f);
}

TEST(DeepseekConfigTest, V3) {
  ModelConfig c = MustParse(kV3);
  EXPECT_EQ(c.family, ModelFamily::kDeepseekV3);
  EXPECT_EQ(c.mla.q_lora_rank, 1536);
  EXPECT_EQ(c.num_moe_layers(), 58);  // layers 0-2 dense
  EXPECT_TRUE(c.has_score_correction_bias());
  EXPECT_EQ(c.n_group, 8);
  EXPECT_EQ(c.topk_group, 4);
  RouterSpec s = RouterSpecFor(c);
  EXPECT_EQ(s.scoring, RouterScoring::kSigmoid);
  EXPECT_EQ(s.selection, RouterSelection::kBiasedGroupLimited);
  EXPECT_TRUE(s.renormalize);
  EXPECT_EQ(s.scale, 2.5f);  // v3 scales after renormalising
  MlaRope rope = MlaRopeFor(c);
  const double m = 0.1 * std::log(40.0) + 1.0;
  EXPECT_NEAR(rope.softmax_scale, m * m / std::sqrt(192.0), 1e-7);
}

TEST(DeepseekConfigTest, V2RenormalisesInsteadOfScaling) {
  std::string text = kV2Lite;
  text.replace(text.find("\"norm_topk_prob\": false"), 23,
               "\"norm_topk_prob\": true");
  text.replace(text.find("\"routed_scaling_factor\": 1.0"), 28,
               "\"routed_scaling_factor\": 16.0");
  RouterSpec s = RouterSpecFor(MustParse(text));
  EXPECT_TRUE(s.renormalize);
  EXPECT_EQ(s.scale, 1.0f);
}

TEST(DeepseekConfigTest, Defaults) {
  // transformers' DeepseekV2Config: greedy softmax, q_lora_rank 1536, two
  // shared experts, no dense layers.
  ModelConfig v2 = MustParse(
      R"({"model_type":"deepseek_v2","num_experts_per_tok":6,
          "vocab_size":1000})");
  EXPECT_EQ(v2.mla.q_lora_rank, 1536);
  EXPECT_EQ(v2.mla.kv_lora_rank, 512);
  EXPECT_EQ(v2.num_experts, 64);
  EXPECT_EQ(v2.moe_intermediate_size, 1407);
  EXPECT_EQ(v2.n_shared_experts, 2);
  EXPECT_EQ(v2.num_moe_layers(), 32);
  EXPECT_FALSE(v2.yarn.has_value());
  ModelConfig v3 = MustParse(R"({"model_type":"deepseek_v3"})");
  EXPECT_EQ(v3.num_experts, 256);
  EXPECT_EQ(v3.top_k, 8);
  EXPECT_EQ(v3.first_k_dense_replace, 3);
  EXPECT_EQ(v3.topk_method, TopkMethod::kNoauxTc);
  EXPECT_EQ(v3.routed_scaling_factor, 2.5);
  // moe_layer_freq (DeepSeek's code): layers >= first_k_dense_replace with
  // i % freq == 0.
  ModelConfig f = MustParse(
      R"({"model_type":"deepseek_v2","num_experts_per_tok":2,
          "num_hidden_layers":6,"first_k_dense_replace":1,
          "moe_layer_freq":2,"n_shared_experts":null})");
  EXPECT_EQ(f.moe_layers, (std::vector<int>{2, 4}));
  EXPECT_FALSE(f.has_shared_expert());
}

TEST(DeepseekConfigTest, RefusesInvalidConfigs) {
  EXPECT_THAT(ErrorOf(R"({"model_type":"deepseek_v2"})"),
              HasSubstr("num_experts_per_tok must be positive"));
  EXPECT_THAT(ErrorOf(R"({"model_type":"deepseek_v3","n_group":7})"),
              HasSubstr("not a multiple of n_group"));
  EXPECT_THAT(ErrorOf(R"({"model_type":"deepseek_v3","topk_group":9})"),
              HasSubstr("topk_group"));
  EXPECT_THAT(
      ErrorOf(R"({"model_type":"deepseek_v3","scoring_func":"softmax"})"),
      HasSubstr("deepseek_v3 routes with scoring_func sigmoid"));
  EXPECT_THAT(ErrorOf(R"({"model_type":"deepseek_v2","num_experts_per_tok":2,
                  "topk_method":"noaux_tc"})"),
              HasSubstr("deepseek_v2 routes with scoring_func softmax"));
  EXPECT_THAT(ErrorOf(R"({"model_type":"deepseek_v2","num_experts_per_tok":2,
                  "topk_method":"best"})"),
              HasSubstr("topk_method 'best'"));
  EXPECT_THAT(ErrorOf(R"({"model_type":"deepseek_v3","qk_rope_head_dim":7})"),
              HasSubstr("qk_rope_head_dim must be even"));
  EXPECT_THAT(ErrorOf(R"({"model_type":"deepseek_v3","kv_lora_rank":0})"),
              HasSubstr("kv_lora_rank must be positive"));
  EXPECT_THAT(ErrorOf(R"({"model_type":"deepseek_v3","n_routed_experts":8,
                  "n_group":8,"topk_group":2,"num_experts_per_tok":1})"),
              HasSubstr("at least 2 experts per group"));
  EXPECT_THAT(
      ErrorOf(R"({"model_type":"deepseek_v3","routed_scaling_factor":0})"),
      HasSubstr("routed_scaling_factor"));
  EXPECT_THAT(
      ErrorOf(R"({"model_type":"deepseek_v3","rope_scaling":{"type":"yarn",
                  "factor":0.5}})"),
      HasSubstr("rope_scaling.factor"));
  EXPECT_THAT(ErrorOf(R"({"model_type":"deepseek_v3","n_group":8,
                          "topk_group":1,"num_experts_per_tok":40})"),
              HasSubstr("exceeds the 32 experts"));
}

TEST(DeepseekConfigTest, TensorNamesAsPublished) {
  for (bool q_lora : {false, true}) {
    MakeModelOptions o = TinyPreset(q_lora ? ModelFamily::kDeepseekV3
                                           : ModelFamily::kDeepseekV2);
    auto c = ConfigFromOptions(o);
    ASSERT_TRUE(c.ok()) << c.status();
    std::vector<TensorSpec> specs = ExpectedTensors(*c);
    EXPECT_EQ(specs.size(), ExpectedTensorCount(*c));
    std::set<std::string> names;
    for (const TensorSpec& s : specs) names.insert(s.name);
    const std::string a = "model.layers.1.self_attn.";
    for (const char* n : {"kv_a_proj_with_mqa.weight", "kv_a_layernorm.weight",
                          "kv_b_proj.weight", "o_proj.weight"}) {
      EXPECT_EQ(names.count(a + n), 1u) << n;
    }
    EXPECT_EQ(names.count(a + "q_proj.weight"), q_lora ? 0u : 1u);
    EXPECT_EQ(names.count(a + "q_a_proj.weight"), q_lora ? 1u : 0u);
    EXPECT_EQ(names.count(a + "q_a_layernorm.weight"), q_lora ? 1u : 0u);
    EXPECT_EQ(names.count(a + "q_b_proj.weight"), q_lora ? 1u : 0u);
    EXPECT_EQ(names.count(a + "k_proj.weight"), 0u);
    EXPECT_EQ(names.count("model.layers.0.mlp.gate_proj.weight"), 1u);
    EXPECT_EQ(names.count("model.layers.0.mlp.gate.weight"), 0u);
    EXPECT_EQ(names.count("model.layers.1.mlp.gate.weight"), 1u);
    EXPECT_EQ(names.count("model.layers.1.mlp.experts.7.down_proj.weight"), 1u);
    EXPECT_EQ(names.count("model.layers.1.mlp.shared_experts.up_proj.weight"),
              1u);
    EXPECT_EQ(names.count("model.layers.1.mlp.gate.e_score_correction_bias"),
              q_lora ? 1u : 0u);
    for (const TensorSpec& s : specs) {
      if (s.name == "model.layers.1.self_attn.kv_b_proj.weight") {
        EXPECT_EQ(s.shape, (std::vector<int64_t>{4 * (16 + 16), 32}));
      }
      if (s.name == "model.layers.1.mlp.shared_experts.gate_proj.weight") {
        EXPECT_EQ(s.shape[0], 32 * c->n_shared_experts);
      }
    }
    // Round trip through config.json.
    ModelConfig b = MustParse(ModelConfigToJson(*c));
    EXPECT_EQ(b.mla.q_lora_rank, c->mla.q_lora_rank);
    EXPECT_EQ(b.mla.kv_lora_rank, c->mla.kv_lora_rank);
    EXPECT_EQ(b.mla.v_head_dim, c->mla.v_head_dim);
    EXPECT_EQ(b.topk_method, c->topk_method);
    EXPECT_EQ(b.n_group, c->n_group);
    EXPECT_EQ(b.routed_scaling_factor, c->routed_scaling_factor);
    EXPECT_EQ(b.n_shared_experts, c->n_shared_experts);
    EXPECT_EQ(b.moe_layer, c->moe_layer);
    EXPECT_EQ(b.norm_topk_prob, c->norm_topk_prob);
  }
}

TEST(DeepseekConfigTest, PresetsAndMoectl) {
  for (const char* name : {"deepseek-v2-lite-2l", "deepseek-v3-2l"}) {
    auto o = PresetOptions(name, std::nullopt);
    ASSERT_TRUE(o.ok()) << o.status();
    auto c = ConfigFromOptions(*o);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->num_moe_layers(), 1);
    EXPECT_TRUE(c->yarn.has_value());
  }
  EXPECT_FALSE(PresetOptions("deepseek-v3-2l", ModelFamily::kMixtral).ok());
  moe::testing::TempDir dir;
  const std::string moectl = std::string(MOE_BINARY_DIR) + "/bin/moectl";
  for (const char* arch : {"deepseek_v2", "deepseek_v3"}) {
    const std::string out = dir.Sub(arch);
    ASSERT_EQ(std::system(absl::StrCat(moectl, " make-model --arch ", arch,
                                       " --out ", out,
                                       " --q-lora-rank 16 --yarn-factor 4 "
                                       "> /dev/null")
                              .c_str()),
              0);
    auto d = ModelDescription::Open(out);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ(d->config().mla.q_lora_rank, 16);
    ASSERT_TRUE(d->config().yarn.has_value());
    EXPECT_EQ(d->config().yarn->factor, 4);
    // bytes per expert: gate, up, down of [32, 64] in bf16.
    EXPECT_EQ(d->bytes_per_expert(), 3u * 32 * 64 * 2);
    FILE* p = ::popen(absl::StrCat(moectl, " inspect ", out).c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string text;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) text.append(buf, n);
    EXPECT_EQ(::pclose(p), 0);
    EXPECT_THAT(text, HasSubstr(absl::StrCat("family: ", arch)));
    EXPECT_THAT(text, HasSubstr("latent cache: 160 bytes per token per layer"));
    EXPECT_THAT(text, HasSubstr("moe layers: 3"));
  }
}

}  // namespace
}  // namespace moe
