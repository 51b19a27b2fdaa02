#include "common/model_config.h"

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/test_util.h"

namespace moe {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Shaped like the config.json files published with the real checkpoints.
constexpr char kMixtral8x7B[] = R"({
  "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0,
  "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
  "max_position_embeddings": 32768, "model_type": "mixtral",
  "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32,
  "num_key_value_heads": 8, "num_local_experts": 8, "output_router_logits": false,
  "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02,
  "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.36.0.dev0", "use_cache": true, "vocab_size": 32000})";

constexpr char kQwen15MoE[] = R"({
  "architectures": ["Qwen2MoeForCausalLM"], "bos_token_id": 151643,
  "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 2048,
  "intermediate_size": 5632, "max_position_embeddings": 8192,
  "max_window_layers": 21, "model_type": "qwen2_moe", "num_attention_heads": 16,
  "num_hidden_layers": 24, "num_key_value_heads": 16, "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "use_cache": true, "use_sliding_window": false,
  "vocab_size": 151936, "decoder_sparse_step": 1, "moe_intermediate_size": 1408,
  "shared_expert_intermediate_size": 5632, "num_experts_per_tok": 4,
  "num_experts": 60, "norm_topk_prob": false, "router_aux_loss_coef": 0.001})";

constexpr char kQwen3_30B[] = R"({
  "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false,
  "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645,
  "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048,
  "intermediate_size": 6144, "max_position_embeddings": 40960,
  "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
  "norm_topk_prob": true, "num_attention_heads": 32, "num_experts": 128,
  "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000.0,
  "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "use_sliding_window": false, "vocab_size": 151936})";

constexpr char kOlmoe1B7B[] = R"({
  "architectures": ["OlmoeForCausalLM"], "attention_bias": false,
  "clip_qkv": null, "eos_token_id": 50279, "hidden_act": "silu",
  "hidden_size": 2048, "intermediate_size": 1024, "max_position_embeddings": 4096,
  "model_type": "olmoe", "norm_topk_prob": false, "num_attention_heads": 16,
  "num_experts": 64, "num_experts_per_tok": 8, "num_hidden_layers": 16,
  "num_key_value_heads": 16, "pad_token_id": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": null, "rope_theta": 10000.0, "tie_word_embeddings": false,
  "vocab_size": 50304})";

ModelConfig MustParse(const std::string& text) {
  auto c = ParseModelConfig(text);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : ModelConfig{};
}

std::string ErrorOf(const std::string& text) {
  auto c = ParseModelConfig(text);
  EXPECT_FALSE(c.ok()) << text;
  return std::string(c.status().message());
}

TEST(ModelConfigTest, Mixtral8x7B) {
  ModelConfig c = MustParse(kMixtral8x7B);
  EXPECT_EQ(c.family, ModelFamily::kMixtral);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.num_experts, 8);
  EXPECT_EQ(c.top_k, 2);
  EXPECT_EQ(c.moe_intermediate_size, 14336);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.num_moe_layers(), 32);
  EXPECT_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_EQ(c.qk_norm, QkNorm::kNone);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_FALSE(c.has_shared_expert());
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_THAT(c.eos_token_ids, ElementsAre(2));
  EXPECT_THAT(c.architectures, ElementsAre("MixtralForCausalLM"));
}

TEST(ModelConfigTest, Qwen15MoE) {
  ModelConfig c = MustParse(kQwen15MoE);
  EXPECT_EQ(c.family, ModelFamily::kQwen2Moe);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.num_experts, 60);
  EXPECT_EQ(c.top_k, 4);
  EXPECT_EQ(c.moe_intermediate_size, 1408);
  EXPECT_EQ(c.intermediate_size, 5632);
  EXPECT_EQ(c.shared_expert_intermediate_size, 5632);
  EXPECT_TRUE(c.has_shared_expert());
  EXPECT_TRUE(c.qkv_bias);  // transformers' default: Qwen2-MoE has qkv bias
  EXPECT_FALSE(c.o_bias);
  EXPECT_FALSE(c.norm_topk_prob);
  EXPECT_EQ(c.sliding_window, 0);  // use_sliding_window is false
  EXPECT_EQ(c.num_moe_layers(), 24);
}

TEST(ModelConfigTest, Qwen3_30B) {
  ModelConfig c = MustParse(kQwen3_30B);
  EXPECT_EQ(c.family, ModelFamily::kQwen3Moe);
  EXPECT_EQ(c.head_dim, 128);  // explicit, not 2048/32
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.qk_norm, QkNorm::kPerHead);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_EQ(c.num_moe_layers(), 48);
  EXPECT_THAT(c.eos_token_ids, ElementsAre(151645));
}

TEST(ModelConfigTest, Olmoe1B7B) {
  ModelConfig c = MustParse(kOlmoe1B7B);
  EXPECT_EQ(c.family, ModelFamily::kOlmoe);
  EXPECT_EQ(c.qk_norm, QkNorm::kFull);
  EXPECT_EQ(c.moe_intermediate_size, 1024);
  EXPECT_FALSE(c.clip_qkv.has_value());
  EXPECT_FALSE(c.bos_token_id.has_value());
  EXPECT_EQ(c.pad_token_id, 1);
  EXPECT_FALSE(c.norm_topk_prob);
}

TEST(ModelConfigTest, FamilyDefaults) {
  ModelConfig m = MustParse(R"({"model_type":"mixtral"})");
  EXPECT_EQ(m.vocab_size, 32000);
  EXPECT_EQ(m.num_key_value_heads, 8);
  EXPECT_EQ(m.num_experts, 8);
  EXPECT_EQ(m.rope_theta, 1e6);
  EXPECT_EQ(m.max_position_embeddings, 131072);
  EXPECT_EQ(m.bos_token_id, 1);

  ModelConfig q2 = MustParse(R"({"model_type":"qwen2_moe"})");
  EXPECT_EQ(q2.num_experts, 60);
  EXPECT_EQ(q2.top_k, 4);
  EXPECT_EQ(q2.num_key_value_heads, 16);
  EXPECT_EQ(q2.shared_expert_intermediate_size, 5632);
  EXPECT_EQ(q2.rope_theta, 10000.0);
  EXPECT_TRUE(q2.qkv_bias);
  EXPECT_FALSE(q2.bos_token_id.has_value());
  EXPECT_TRUE(q2.eos_token_ids.empty());

  ModelConfig q3 = MustParse(R"({"model_type":"qwen3_moe"})");
  EXPECT_EQ(q3.num_experts, 128);
  EXPECT_EQ(q3.top_k, 8);
  EXPECT_EQ(q3.num_key_value_heads, 4);
  EXPECT_EQ(q3.head_dim, 2048 / 32);
  EXPECT_EQ(q3.moe_intermediate_size, 768);
  EXPECT_FALSE(q3.norm_topk_prob);

  ModelConfig o =
      MustParse(R"({"model_type":"olmoe","num_attention_heads":8})");
  EXPECT_EQ(o.num_key_value_heads, 8);  // defaults to the head count
  EXPECT_EQ(o.num_experts, 64);
  EXPECT_EQ(o.top_k, 8);
  EXPECT_EQ(o.rms_norm_eps, 1e-5);
  EXPECT_THAT(o.eos_token_ids, ElementsAre(50279));
}

TEST(ModelConfigTest, ExplicitNullTokenIdsMeanNone) {
  ModelConfig c = MustParse(
      R"({"model_type":"mixtral","bos_token_id":null,"eos_token_id":null})");
  EXPECT_FALSE(c.bos_token_id.has_value());
  EXPECT_TRUE(c.eos_token_ids.empty());
  ModelConfig back = MustParse(ModelConfigToJson(c));
  EXPECT_FALSE(back.bos_token_id.has_value());
  EXPECT_TRUE(back.eos_token_ids.empty());
}

TEST(ModelConfigTest, MixtralAlwaysRenormalisesTopK) {
  ModelConfig c =
      MustParse(R"({"model_type":"mixtral","norm_topk_prob":false})");
  EXPECT_TRUE(c.norm_topk_prob);
}

TEST(ModelConfigTest, SparseStepAndMlpOnlyLayers) {
  ModelConfig c = MustParse(R"({"model_type":"qwen2_moe","num_hidden_layers":6,
      "decoder_sparse_step":2,"mlp_only_layers":[3]})");
  EXPECT_THAT(c.moe_layer, ElementsAre(false, true, false, false, false, true));
  EXPECT_EQ(c.num_moe_layers(), 2);
  EXPECT_EQ(c.MoeLayerIndex(1), 0);
  EXPECT_EQ(c.MoeLayerIndex(5), 1);
  EXPECT_EQ(c.MoeLayerIndex(3), -1);
  EXPECT_EQ(c.MoeLayerIndex(0), -1);
  EXPECT_EQ(c.MoeLayerIndex(99), -1);
  EXPECT_EQ(c.LayerOfMoeLayer(0), 1);
  EXPECT_EQ(c.LayerOfMoeLayer(1), 5);
}

TEST(ModelConfigTest, EosListNumExpertsAliasAndRope) {
  ModelConfig c =
      MustParse(R"({"model_type":"qwen3_moe","eos_token_id":[151645,151643],
      "num_local_experts":16,"num_experts_per_tok":2,
      "rope_parameters":{"rope_theta":500000.0,"rope_type":"default"}})");
  EXPECT_THAT(c.eos_token_ids, ElementsAre(151645, 151643));
  EXPECT_EQ(c.num_experts, 16);
  EXPECT_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.rope_scaling_type, "");
  ModelConfig y =
      MustParse(R"({"model_type":"olmoe","rope_scaling":{"type":"yarn"},
      "clip_qkv":8.0})");
  EXPECT_EQ(y.rope_scaling_type, "yarn");
  EXPECT_EQ(y.clip_qkv, 8.0);
}

TEST(ModelConfigTest, RefusesInvalidConfigsWithClearErrors) {
  EXPECT_THAT(ErrorOf(R"({"model_type":"llama"})"), HasSubstr("'llama'"));
  EXPECT_THAT(ErrorOf(R"({"hidden_size":8})"), HasSubstr("model_type"));
  EXPECT_THAT(ErrorOf("{"), HasSubstr("not valid JSON"));
  EXPECT_THAT(ErrorOf("[]"), HasSubstr("not a JSON object"));
  EXPECT_THAT(ErrorOf(R"({"model_type":7})"),
              HasSubstr("model_type must be a string"));
  EXPECT_THAT(ErrorOf(R"({"model_type":"mixtral","hidden_size":0})"),
              HasSubstr("hidden_size must be positive, got 0"));
  EXPECT_THAT(ErrorOf(R"({"model_type":"mixtral","num_hidden_layers":-3})"),
              HasSubstr("num_hidden_layers must be positive, got -3"));
  EXPECT_THAT(ErrorOf(R"({"model_type":"mixtral","vocab_size":64.5})"),
              HasSubstr("vocab_size must be an integer"));
  EXPECT_THAT(ErrorOf(R"({"model_type":"mixtral","vocab_size":"big"})"),
              HasSubstr("vocab_size must be an integer"));
  EXPECT_THAT(ErrorOf(R"({"model_type":"mixtral","num_key_value_heads":5})"),
              HasSubstr("not a multiple of num_key_value_heads"));
  EXPECT_THAT(ErrorOf(R"({"model_type":"mixtral","num_experts_per_tok":9})"),
              HasSubstr("exceeds the number of experts"));
  EXPECT_THAT(ErrorOf(R"({"model_type":"olmoe","num_experts":0})"),
              HasSubstr("num_experts must be positive"));
  EXPECT_THAT(
      ErrorOf(R"({"model_type":"qwen3_moe","moe_intermediate_size":0})"),
      HasSubstr("moe_intermediate_size must be positive"));
  EXPECT_THAT(
      ErrorOf(
          R"({"model_type":"qwen2_moe","shared_expert_intermediate_size":-1})"),
      HasSubstr("shared_expert_intermediate_size must be positive"));
  EXPECT_THAT(ErrorOf(R"({"model_type":"qwen2_moe","decoder_sparse_step":0})"),
              HasSubstr("decoder_sparse_step must be positive"));
  EXPECT_THAT(
      ErrorOf(
          R"({"model_type":"qwen2_moe","num_hidden_layers":2,"mlp_only_layers":[2]})"),
      HasSubstr("mlp_only_layers names layer 2"));
  EXPECT_THAT(
      ErrorOf(
          R"({"model_type":"qwen2_moe","num_hidden_layers":2,"mlp_only_layers":[0,1]})"),
      HasSubstr("no MoE layers"));
  EXPECT_THAT(ErrorOf(R"({"model_type":"qwen2_moe","mlp_only_layers":3})"),
              HasSubstr("mlp_only_layers must be a list"));
  EXPECT_THAT(
      ErrorOf(
          R"({"model_type":"mixtral","vocab_size":100,"eos_token_id":100})"),
      HasSubstr("eos_token_id 100 is outside the vocabulary"));
  EXPECT_THAT(ErrorOf(R"({"model_type":"mixtral","hidden_act":"gelu"})"),
              HasSubstr("hidden_act 'gelu'"));
  EXPECT_THAT(ErrorOf(R"({"model_type":"mixtral","rms_norm_eps":0})"),
              HasSubstr("rms_norm_eps"));
  EXPECT_THAT(
      ErrorOf(
          R"({"model_type":"mixtral","hidden_size":100,"num_attention_heads":3})"),
      HasSubstr("no usable head_dim is given"));
  EXPECT_THAT(
      ErrorOf(R"({"model_type":"mixtral","hidden_size":1099511627776})"),
      HasSubstr("more than the supported"));
  EXPECT_THAT(ErrorOf(R"({"model_type":"mixtral","tie_word_embeddings":1})"),
              HasSubstr("tie_word_embeddings must be true or false"));
  EXPECT_THAT(ErrorOf(R"({"model_type":"olmoe","clip_qkv":-1})"),
              HasSubstr("clip_qkv"));
  // OLMoE in transformers always uses hidden_size / heads.
  EXPECT_THAT(ErrorOf(R"({"model_type":"olmoe","head_dim":256})"),
              HasSubstr("olmoe requires head_dim"));
  EXPECT_EQ(MustParse(R"({"model_type":"olmoe","head_dim":128})").head_dim,
            128);
}

TEST(ModelConfigTest, JsonRoundTripPerFamily) {
  for (const char* text : {kMixtral8x7B, kQwen15MoE, kQwen3_30B, kOlmoe1B7B}) {
    ModelConfig a = MustParse(text);
    a.tie_word_embeddings = true;
    a.eos_token_ids = {2, 3};
    if (a.family != ModelFamily::kMixtral) a.norm_topk_prob = !a.norm_topk_prob;
    if (a.family == ModelFamily::kQwen2Moe) {
      a.decoder_sparse_step = 2;
      a.mlp_only_layers = {1, 5};
      a.qkv_bias = false;
    }
    if (a.family == ModelFamily::kOlmoe) a.clip_qkv = 4.0;
    ASSERT_TRUE(ValidateModelConfig(&a).ok());
    std::string json = ModelConfigToJson(a);
    EXPECT_THAT(json, HasSubstr(std::string("\"model_type\": \"") +
                                std::string(ModelFamilyName(a.family)) + "\""));
    ModelConfig b = MustParse(json);
    EXPECT_EQ(b.family, a.family);
    EXPECT_EQ(b.hidden_size, a.hidden_size);
    EXPECT_EQ(b.head_dim, a.head_dim);
    EXPECT_EQ(b.num_key_value_heads, a.num_key_value_heads);
    EXPECT_EQ(b.num_experts, a.num_experts);
    EXPECT_EQ(b.moe_intermediate_size, a.moe_intermediate_size);
    EXPECT_EQ(b.shared_expert_intermediate_size,
              a.shared_expert_intermediate_size);
    EXPECT_EQ(b.norm_topk_prob, a.norm_topk_prob);
    EXPECT_EQ(b.qkv_bias, a.qkv_bias);
    EXPECT_EQ(b.qk_norm, a.qk_norm);
    EXPECT_EQ(b.clip_qkv, a.clip_qkv);
    EXPECT_EQ(b.moe_layer, a.moe_layer);
    EXPECT_EQ(b.eos_token_ids, a.eos_token_ids);
    EXPECT_EQ(b.bos_token_id, a.bos_token_id);
    EXPECT_EQ(b.tie_word_embeddings, a.tie_word_embeddings);
    EXPECT_EQ(b.rope_theta, a.rope_theta);
    EXPECT_EQ(b.rms_norm_eps, a.rms_norm_eps);
  }
  // Mixtral's expert count is spelled num_local_experts, as transformers does.
  EXPECT_THAT(ModelConfigToJson(MustParse(kMixtral8x7B)),
              HasSubstr("\"num_local_experts\": 8"));
}

TEST(ModelConfigTest, LoadNamesThePath) {
  moe::testing::TempDir dir;
  auto missing = LoadModelConfig(dir.path());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  moe::testing::WriteText(dir.Sub("config.json"), R"({"model_type":"gpt2"})");
  auto bad = LoadModelConfig(dir.path());
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr(dir.Sub("config.json") + ": "));
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("'gpt2'"));
  moe::testing::WriteText(dir.Sub("config.json"), kOlmoe1B7B);
  EXPECT_TRUE(LoadModelConfig(dir.path()).ok());
}

// Issue 31: every integer a config.json sets is range-checked before any
// arithmetic uses it. For each family's valid corpus config and every key
// the parser reads as an integer, 2^63-1, -1 and 1e30 must give an error
// naming that key (under UBSan: no overflow on the way there).
TEST(ModelConfigTest, AbsurdIntegersAreRefusedByNameInEveryFamily) {
  const std::string dir = std::string(MOE_SOURCE_DIR) + "/tests/fuzz/corpus/config";
  int families = 0, cases = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("valid_", 0) != 0) continue;
    const std::string text = moe::testing::ReadText(entry.path().string());
    ASSERT_TRUE(ParseModelConfig(text).ok()) << name;
    ++families;
    const std::vector<std::string> keys = IntKeysReadForTest(text);
    EXPECT_GE(keys.size(), 8u) << name;
    for (const std::string& key : keys) {
      for (const char* bad : {"9223372036854775807", "-1", "1e30",
                              "18446744073709551615"}) {
        nlohmann::json j = nlohmann::json::parse(text);
        j[key] = nlohmann::json::parse(bad);
        auto c = ParseModelConfig(j.dump());
        ASSERT_FALSE(c.ok()) << name << ": " << key << " = " << bad;
        EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
        EXPECT_THAT(std::string(c.status().message()), HasSubstr(key))
            << name << ": " << key << " = " << bad;
        ++cases;
      }
    }
  }
  EXPECT_GE(families, 7);
  EXPECT_GE(cases, 7 * 8 * 4);
}

// The regression input of issue 31: qk_nope_head_dim + qk_rope_head_dim
// overflowed int64 before the range check ran.
TEST(ModelConfigTest, DeepseekHeadDimSumIsCheckedBeforeItIsComputed) {
  const std::string dir = std::string(MOE_SOURCE_DIR) + "/tests/fuzz/corpus/config";
  nlohmann::json j = nlohmann::json::parse(
      moe::testing::ReadText(dir + "/valid_deepseek_v3.json"));
  j["qk_nope_head_dim"] = INT64_MAX;
  j["qk_rope_head_dim"] = 8;
  auto c = ParseModelConfig(j.dump());
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()),
              HasSubstr("qk_nope_head_dim is 9223372036854775807, more than "
                        "the supported"));
  // A nested integer written as a double is checked before its conversion.
  for (const char* fam : {"valid_deepseek_v2.json", "valid_gpt_oss.json"}) {
    nlohmann::json y = nlohmann::json::parse(moe::testing::ReadText(dir + "/" + fam));
    for (double bad : {1e30, -1.0, 0.5}) {
      y["rope_scaling"]["original_max_position_embeddings"] = bad;
      auto r = ParseModelConfig(y.dump());
      ASSERT_FALSE(r.ok()) << fam << " " << bad;
      EXPECT_THAT(std::string(r.status().message()),
                  HasSubstr("rope_scaling.original_max_position_embeddings"));
    }
    y["rope_scaling"]["original_max_position_embeddings"] = 64.0;
    EXPECT_TRUE(ParseModelConfig(y.dump()).ok()) << fam;
  }
}

// zai-org/GLM-4.5-Air's config.json (fields as published).
constexpr char kGlm45Air[] = R"({
  "architectures": ["Glm4MoeForCausalLM"], "attention_bias": true,
  "attention_dropout": 0.0, "pad_token_id": 151329,
  "eos_token_id": [151329, 151336, 151338], "head_dim": 128,
  "hidden_act": "silu", "hidden_size": 4096, "partial_rotary_factor": 0.5,
  "initializer_range": 0.02, "intermediate_size": 10944,
  "max_position_embeddings": 131072, "model_type": "glm4_moe",
  "moe_intermediate_size": 1408, "norm_topk_prob": true,
  "num_attention_heads": 96, "n_group": 1, "topk_group": 1,
  "n_routed_experts": 128, "n_shared_experts": 1,
  "routed_scaling_factor": 1.0, "num_experts_per_tok": 8,
  "first_k_dense_replace": 1, "num_hidden_layers": 46,
  "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_scaling": null,
  "rope_theta": 1000000, "num_nextn_predict_layers": 1,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.54.0", "use_cache": true, "use_qk_norm": false,
  "vocab_size": 151552})";

TEST(ModelConfigTest, ParsesGlm45Air) {
  ModelConfig c = MustParse(kGlm45Air);
  EXPECT_EQ(c.family, ModelFamily::kGlm4Moe);
  EXPECT_EQ(c.head_dim, 128);  // not hidden / heads (42)
  EXPECT_EQ(c.rotary_dim, 64);
  EXPECT_TRUE(c.has_partial_rotary());
  EXPECT_TRUE(c.has_scored_router());
  EXPECT_FALSE(c.is_mla());
  EXPECT_EQ(c.scoring_func, ScoringFunc::kSigmoid);
  EXPECT_EQ(c.topk_method, TopkMethod::kNoauxTc);
  EXPECT_TRUE(c.has_score_correction_bias());
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.o_bias);
  EXPECT_EQ(c.qk_norm, QkNorm::kNone);
  EXPECT_EQ(c.num_experts, 128);
  EXPECT_EQ(c.top_k, 8);
  EXPECT_EQ(c.shared_expert_intermediate_size, 1408);
  EXPECT_TRUE(c.has_shared_expert());
  EXPECT_FALSE(c.has_shared_expert_gate());
  EXPECT_EQ(c.num_moe_layers(), 45);  // layer 0 dense
  EXPECT_EQ(c.MoeLayerIndex(0), -1);
  EXPECT_EQ(c.num_nextn_predict_layers, 1);
  EXPECT_THAT(c.eos_token_ids, ElementsAre(151329, 151336, 151338));
  // Round trip through the writer.
  ModelConfig again = MustParse(ModelConfigToJson(c));
  EXPECT_EQ(again.rotary_dim, 64);
  EXPECT_EQ(again.qkv_bias, true);
  EXPECT_EQ(again.moe_layer, c.moe_layer);
  EXPECT_EQ(again.num_nextn_predict_layers, 1);
  EXPECT_DOUBLE_EQ(again.routed_scaling_factor, 1.0);
  // GLM-4.5: per-head q/k norm, routed_scaling_factor 2.5, 3 dense layers.
  nlohmann::json big = nlohmann::json::parse(kGlm45Air);
  big["use_qk_norm"] = true;
  big["routed_scaling_factor"] = 2.5;
  big["first_k_dense_replace"] = 3;
  ModelConfig g = MustParse(big.dump());
  EXPECT_EQ(g.qk_norm, QkNorm::kPerHead);
  EXPECT_EQ(g.num_moe_layers(), 43);
  EXPECT_EQ(MustParse(ModelConfigToJson(g)).qk_norm, QkNorm::kPerHead);
  // transformers' defaults when the fields are absent.
  ModelConfig d = MustParse(R"({"model_type": "glm4_moe", "head_dim": 128})");
  EXPECT_EQ(d.hidden_size, 4096);
  EXPECT_EQ(d.num_hidden_layers, 46);
  EXPECT_EQ(d.rotary_dim, 64);
  EXPECT_FALSE(d.qkv_bias);
  EXPECT_EQ(d.n_group, 1);
  EXPECT_DOUBLE_EQ(d.rope_theta, 1e4);
  EXPECT_EQ(d.first_k_dense_replace, 1);
}

}  // namespace
}  // namespace moe
