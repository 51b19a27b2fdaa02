// GGUF metadata and tensor names of deepseek2 (DeepSeek-V2/V3: latent
// attention, scored router) and gpt-oss (sinks, biased split experts):
// common/gguf_model.h.
#include <string>
#include <utility>

#include "common/gguf_model.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/gguf_metadata_builder.h"

namespace moe {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::GgufTensors;
using testing::MetadataBuilder;

// DeepSeek-V2-Lite-like, as llama.cpp's converter writes it: no q_lora,
// the MQA view in key/value_length, the heads' sizes in *_mla.
MetadataBuilder DeepseekV2() {
  MetadataBuilder b;
  b.Str("general.architecture", "deepseek2")
      .U32("deepseek2.embedding_length", 64)
      .U32("deepseek2.block_count", 4)
      .U32("deepseek2.attention.head_count", 4)
      .U32("deepseek2.attention.head_count_kv", 1)
      .U32("deepseek2.leading_dense_block_count", 1)
      .U32("deepseek2.feed_forward_length", 128)
      .U32("deepseek2.expert_feed_forward_length", 32)
      .U32("deepseek2.expert_count", 8)
      .U32("deepseek2.expert_used_count", 2)
      .U32("deepseek2.expert_shared_count", 2)
      .F32("deepseek2.expert_weights_scale", 2.0)
      .Bool("deepseek2.expert_weights_norm", false)
      .U32("deepseek2.expert_gating_func", 1)
      .U32("deepseek2.expert_group_count", 4)
      .U32("deepseek2.expert_group_used_count", 2)
      .U32("deepseek2.attention.kv_lora_rank", 32)
      .U32("deepseek2.attention.key_length", 40)
      .U32("deepseek2.attention.value_length", 32)
      .U32("deepseek2.attention.key_length_mla", 24)
      .U32("deepseek2.attention.value_length_mla", 16)
      .U32("deepseek2.rope.dimension_count", 8)
      .U32("deepseek2.vocab_size", 300)
      .F32("deepseek2.attention.layer_norm_rms_epsilon", 1e-6)
      .F32("deepseek2.rope.freq_base", 1e4);
  return b;
}

// DeepSeek-V3-like: sigmoid scores (with exp_probs_b), q_lora.
MetadataBuilder DeepseekV3() {
  MetadataBuilder b = DeepseekV2();
  b.Drop("deepseek2.expert_gating_func")
      .U32("deepseek2.expert_gating_func", 2)
      .Drop("deepseek2.expert_weights_norm")
      .Bool("deepseek2.expert_weights_norm", true)
      .Drop("deepseek2.expert_weights_scale")
      .F32("deepseek2.expert_weights_scale", 2.5)
      .U32("deepseek2.attention.q_lora_rank", 32);
  return b;
}

MetadataBuilder GptOss() {
  MetadataBuilder b;
  b.Str("general.architecture", "gpt-oss")
      .U32("gpt-oss.embedding_length", 64)
      .U32("gpt-oss.block_count", 4)
      .U32("gpt-oss.attention.head_count", 4)
      .U32("gpt-oss.attention.head_count_kv", 2)
      .U32("gpt-oss.attention.key_length", 16)
      .U32("gpt-oss.attention.value_length", 16)
      .U32("gpt-oss.attention.sliding_window", 8)
      .U32("gpt-oss.expert_count", 8)
      .U32("gpt-oss.expert_used_count", 2)
      .U32("gpt-oss.feed_forward_length", 64)
      .U32("gpt-oss.expert_feed_forward_length", 64)
      .U32("gpt-oss.context_length", 4096)
      .U32("gpt-oss.vocab_size", 300)
      .F32("gpt-oss.attention.layer_norm_rms_epsilon", 1e-5)
      .F32("gpt-oss.rope.freq_base", 150000)
      .Str("gpt-oss.rope.scaling.type", "yarn")
      .F32("gpt-oss.rope.scaling.factor", 4)
      .U32("gpt-oss.rope.scaling.original_context_length", 1024);
  return b;
}

std::string Message(const MetadataBuilder& b) {
  GgufMetadata m = b.Build();
  return std::string(
      ModelConfigFromGguf(m, GgufTensors({"blk.0.attn_q.bias"})).status().message());
}

// `b` with `key` set to `value`.
MetadataBuilder With(MetadataBuilder b, const std::string& key, uint64_t value) {
  b.Drop(key).U32(key, value);
  return b;
}

TEST(GgufArchTest, DeepseekV2Config) {
  const MetadataBuilder b = DeepseekV2();
  GgufMetadata m = b.Build();
  auto c = ModelConfigFromGguf(m, GgufTensors({"token_embd.weight", "output.weight"}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->family, ModelFamily::kDeepseekV2);
  EXPECT_TRUE(c->is_mla());
  EXPECT_EQ(c->num_key_value_heads, 4);  // not llama.cpp's MQA 1
  EXPECT_EQ(c->mla.q_lora_rank, 0);
  EXPECT_EQ(c->mla.kv_lora_rank, 32);
  EXPECT_EQ(c->mla.qk_nope_head_dim, 16);
  EXPECT_EQ(c->mla.qk_rope_head_dim, 8);
  EXPECT_EQ(c->mla.v_head_dim, 16);
  EXPECT_EQ(c->head_dim, 24);
  EXPECT_EQ(c->scoring_func, ScoringFunc::kSoftmax);
  EXPECT_EQ(c->topk_method, TopkMethod::kGroupLimitedGreedy);  // 4 groups
  EXPECT_EQ(c->n_group, 4);
  EXPECT_EQ(c->topk_group, 2);
  EXPECT_EQ(c->routed_scaling_factor, 2.0);
  EXPECT_FALSE(c->norm_topk_prob);
  EXPECT_EQ(c->n_shared_experts, 2);
  EXPECT_EQ(c->shared_expert_intermediate_size, 64);
  EXPECT_THAT(c->moe_layers, ElementsAre(1, 2, 3));
  EXPECT_FALSE(c->yarn.has_value());
  // One group: plain greedy selection; an older file without the *_mla
  // keys holds the heads' sizes in key/value_length; no gating func reads
  // as softmax (llama.cpp's reading of older files).
  MetadataBuilder old = DeepseekV2();
  old.Drop("deepseek2.expert_group_count")
      .Drop("deepseek2.expert_group_used_count")
      .Drop("deepseek2.attention.key_length_mla")
      .Drop("deepseek2.attention.value_length_mla")
      .Drop("deepseek2.expert_gating_func");
  old = With(With(std::move(old), "deepseek2.attention.key_length", 24), "deepseek2.attention.value_length",
             16);
  GgufMetadata om = old.Build();
  auto o = ModelConfigFromGguf(om, {});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->family, ModelFamily::kDeepseekV2);
  EXPECT_EQ(o->topk_method, TopkMethod::kGreedy);
  EXPECT_EQ(o->mla.qk_nope_head_dim, 16);
  EXPECT_EQ(o->mla.v_head_dim, 16);
}

TEST(GgufArchTest, DeepseekV3ConfigAndYarn) {
  MetadataBuilder b = DeepseekV3();
  b.Str("deepseek2.rope.scaling.type", "yarn")
      .F32("deepseek2.rope.scaling.factor", 40)
      .U32("deepseek2.rope.scaling.original_context_length", 4096)
      .F32("deepseek2.rope.scaling.yarn_log_multiplier", 0.1f);
  GgufMetadata m = b.Build();
  auto c = ModelConfigFromGguf(m, {});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->family, ModelFamily::kDeepseekV3);
  EXPECT_EQ(c->scoring_func, ScoringFunc::kSigmoid);
  EXPECT_EQ(c->topk_method, TopkMethod::kNoauxTc);
  EXPECT_TRUE(c->has_score_correction_bias());
  EXPECT_TRUE(c->norm_topk_prob);
  EXPECT_EQ(c->routed_scaling_factor, 2.5);
  EXPECT_EQ(c->mla.q_lora_rank, 32);
  ASSERT_TRUE(c->yarn.has_value());
  EXPECT_EQ(c->yarn->factor, 40);
  EXPECT_EQ(c->yarn->original_max_position_embeddings, 4096);
  // 0.1 * mscale_all_dim is stored as an f32.
  EXPECT_NEAR(c->yarn->mscale_all_dim, 1.0, 1e-6);
  EXPECT_EQ(c->yarn->mscale, c->yarn->mscale_all_dim);
  EXPECT_EQ(c->yarn->beta_fast, 32);
  EXPECT_EQ(c->yarn->beta_slow, 1);
}

TEST(GgufArchTest, DeepseekErrorsNameTheKey) {
  EXPECT_THAT(Message(DeepseekV2().Drop("deepseek2.attention.kv_lora_rank")),
              HasSubstr("lacks deepseek2.attention.kv_lora_rank (kv_lora_rank)"));
  EXPECT_THAT(Message(DeepseekV2().Drop("deepseek2.rope.dimension_count")),
              HasSubstr("lacks deepseek2.rope.dimension_count (qk_rope_head_dim)"));
  EXPECT_THAT(Message(DeepseekV2().Drop("deepseek2.leading_dense_block_count")),
              HasSubstr("lacks deepseek2.leading_dense_block_count (first_k_dense_replace)"));
  EXPECT_THAT(Message(DeepseekV2().Drop("deepseek2.expert_weights_scale")),
              HasSubstr("lacks deepseek2.expert_weights_scale (routed_scaling_factor)"));
  EXPECT_THAT(Message(DeepseekV2()
                          .Drop("deepseek2.attention.key_length")
                          .Drop("deepseek2.attention.key_length_mla")),
              HasSubstr("lacks deepseek2.attention.key_length_mla / key_length"));
  EXPECT_THAT(Message(With(DeepseekV2(), "deepseek2.attention.key_length_mla", 8)),
              HasSubstr("deepseek2.attention.key_length(_mla) is 8, not more than "
                        "deepseek2.rope.dimension_count 8"));
  EXPECT_THAT(Message(With(DeepseekV2(), "deepseek2.expert_gating_func", 3)),
              HasSubstr("deepseek2.expert_gating_func is 3; deepseek2 runs 1 (softmax: "
                        "deepseek_v2) or 2 (sigmoid: deepseek_v3) only"));
  EXPECT_THAT(Message(DeepseekV2().Str("deepseek2.attention.q_lora_rank", "32")),
              HasSubstr("'deepseek2.attention.q_lora_rank' is STRING"));
  EXPECT_THAT(Message(With(DeepseekV2(), "deepseek2.expert_group_count", 3)),
              HasSubstr("not a multiple of n_group"));
  EXPECT_THAT(Message(DeepseekV2().Str("deepseek2.rope.scaling.type", "linear")),
              HasSubstr("deepseek2.rope.scaling.type 'linear' is not supported yet "
                        "(deepseek2: none or yarn)"));
  EXPECT_THAT(Message(DeepseekV2().Str("deepseek2.rope.scaling.type", "yarn")),
              HasSubstr("lacks deepseek2.rope.scaling.factor (factor)"));
  EXPECT_THAT(Message(DeepseekV2()
                          .Str("deepseek2.rope.scaling.type", "yarn")
                          .F32("deepseek2.rope.scaling.factor", 4)
                          .U32("deepseek2.rope.scaling.original_context_length", 4096)
                          .F32("deepseek2.rope.scaling.yarn_attn_factor", 0.5)),
              HasSubstr("deepseek2.rope.scaling.yarn_attn_factor is 0.5; only 1 is supported"));
}

TEST(GgufArchTest, GptOssConfig) {
  const MetadataBuilder b = GptOss();
  GgufMetadata m = b.Build();
  auto c = ModelConfigFromGguf(m, GgufTensors({"token_embd.weight", "blk.0.attn_q.bias"}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->family, ModelFamily::kGptOss);
  EXPECT_TRUE(c->has_expert_biases());
  EXPECT_EQ(c->num_experts, 8);
  EXPECT_EQ(c->moe_intermediate_size, 64);
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->sliding_window, 8);
  EXPECT_THAT(c->sliding_layers, ElementsAre(true, false, true, false));
  EXPECT_EQ(c->swiglu_limit, 7.0);  // llama.cpp's graph
  EXPECT_EQ(c->swiglu_alpha, 1.702);
  EXPECT_TRUE(c->qkv_bias);
  EXPECT_TRUE(c->o_bias);
  ASSERT_TRUE(c->yarn.has_value());
  EXPECT_EQ(c->yarn->factor, 4);
  EXPECT_EQ(c->yarn->original_max_position_embeddings, 1024);
  EXPECT_FALSE(c->yarn->truncate);
  // swiglu_clamp_exp sets the clamp; without rope.scaling.type: plain rope
  // (not gpt_oss's config.json default, YaRN).
  MetadataBuilder plain = GptOss();
  plain.Drop("gpt-oss.rope.scaling.type").F32("gpt-oss.swiglu_clamp_exp", 1.5);
  GgufMetadata pm = plain.Build();
  auto p = ModelConfigFromGguf(pm, GgufTensors({"blk.0.attn_q.bias"}));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->yarn.has_value());
  EXPECT_EQ(p->swiglu_limit, 1.5);
}

TEST(GgufArchTest, GptOssErrorsNameTheKey) {
  EXPECT_THAT(Message(GptOss().Drop("gpt-oss.attention.sliding_window")),
              HasSubstr("lacks gpt-oss.attention.sliding_window (sliding_window)"));
  EXPECT_THAT(Message(GptOss().Drop("gpt-oss.expert_feed_forward_length")),
              HasSubstr("lacks gpt-oss.expert_feed_forward_length (intermediate_size)"));
  EXPECT_THAT(Message(GptOss().Drop("gpt-oss.expert_count")),
              HasSubstr("lacks gpt-oss.expert_count (num_local_experts)"));
  EXPECT_THAT(Message(GptOss().Drop("gpt-oss.rope.scaling.factor")),
              HasSubstr("lacks gpt-oss.rope.scaling.factor (factor)"));
  EXPECT_THAT(Message(With(GptOss(), "gpt-oss.expert_gating_func", 1)),
              HasSubstr("gpt-oss.expert_gating_func is 1; gpt-oss runs 3 (softmax over the "
                        "top-k logits) only"));
  EXPECT_THAT(Message(GptOss().F32("gpt-oss.rope.scaling.yarn_ext_factor", 0.5)),
              HasSubstr("gpt-oss.rope.scaling.yarn_ext_factor is 0.5; only 1 is supported"));
  EXPECT_THAT(Message(GptOss().Drop("gpt-oss.rope.scaling.type")
                          .Str("gpt-oss.rope.scaling.type", "longrope")),
              HasSubstr("gpt-oss.rope.scaling.type 'longrope' is not supported yet"));
  const MetadataBuilder b = GptOss();  // alive while `m` views its strings
  GgufMetadata m = b.Build();
  EXPECT_THAT(std::string(ModelConfigFromGguf(m, {}).status().message()),
              HasSubstr("gpt_oss without attention_bias is not supported"));
}

TEST(GgufArchTest, DeepseekTensorNames) {
  auto ours = [](ModelFamily f, const char* name) {
    absl::StatusOr<GgufName> n = MapGgufTensorName(f, name);
    return n.ok() ? n->ours : std::string(n.status().message());
  };
  const ModelFamily v2 = ModelFamily::kDeepseekV2, v3 = ModelFamily::kDeepseekV3;
  EXPECT_EQ(ours(v2, "blk.1.attn_q.weight"), "model.layers.1.self_attn.q_proj.weight");
  EXPECT_FALSE(MapGgufTensorName(v2, "blk.1.attn_q.weight")->rope_permuted);
  EXPECT_EQ(ours(v3, "blk.1.attn_q_a.weight"), "model.layers.1.self_attn.q_a_proj.weight");
  EXPECT_EQ(ours(v3, "blk.1.attn_q_a_norm.weight"),
            "model.layers.1.self_attn.q_a_layernorm.weight");
  EXPECT_EQ(ours(v3, "blk.1.attn_q_b.weight"), "model.layers.1.self_attn.q_b_proj.weight");
  EXPECT_EQ(ours(v2, "blk.2.attn_kv_a_mqa.weight"),
            "model.layers.2.self_attn.kv_a_proj_with_mqa.weight");
  EXPECT_EQ(ours(v2, "blk.2.attn_kv_a_norm.weight"),
            "model.layers.2.self_attn.kv_a_layernorm.weight");
  EXPECT_EQ(ours(v2, "blk.2.attn_kv_b.weight"), "model.layers.2.self_attn.kv_b_proj.weight");
  EXPECT_EQ(ours(v2, "blk.0.ffn_up.weight"), "model.layers.0.mlp.up_proj.weight");
  EXPECT_EQ(ours(v2, "blk.1.ffn_down_shexp.weight"),
            "model.layers.1.mlp.shared_experts.down_proj.weight");
  EXPECT_EQ(MapGgufTensorName(v2, "blk.1.ffn_gate_exps.weight")->ForExpert(4),
            "model.layers.1.mlp.experts.4.gate_proj.weight");
  EXPECT_EQ(ours(v3, "blk.1.exp_probs_b.bias"),
            "model.layers.1.mlp.gate.e_score_correction_bias");
  EXPECT_THAT(ours(v2, "blk.1.exp_probs_b.bias"), HasSubstr("no counterpart in a deepseek_v2"));
  EXPECT_THAT(ours(v2, "blk.1.ffn_gate_exps.bias"), HasSubstr("no counterpart"));
  auto k_b = MapGgufTensorName(v3, "blk.1.attn_k_b.weight");
  ASSERT_TRUE(k_b.ok()) << k_b.status();
  EXPECT_EQ(k_b->stands_in_for, "model.layers.1.self_attn.kv_b_proj.weight");
  EXPECT_THAT(k_b->why, HasSubstr("needs both attn_k_b and attn_v_b"));
  EXPECT_EQ(k_b->kv_b_half, 1);
  EXPECT_EQ(MapGgufTensorName(v2, "blk.1.attn_v_b.weight")->kv_b_half, 2);
  EXPECT_EQ(MapGgufTensorName(v3, "blk.1.attn_kv_b.weight")->kv_b_half, 0);
}

// JoinKvB undoes llama.cpp's split: head h's rows are k_b[h] transposed,
// then v_b[h] (2 heads, nope 3, v 2, rank 4; values name their place).
TEST(GgufArchTest, JoinKvBUndoesTheSplit) {
  const int64_t heads = 2, nope = 3, v = 2, rank = 4;
  std::vector<float> kv_b(heads * (nope + v) * rank);
  for (size_t i = 0; i < kv_b.size(); ++i) kv_b[i] = static_cast<float>(i);
  // The converter: kv_b viewed [heads, nope + v, rank], split on axis 1,
  // k_b transposed to [heads, rank, nope].
  std::vector<float> k_b(heads * rank * nope), v_b(heads * v * rank);
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t r = 0; r < rank; ++r) {
      for (int64_t i = 0; i < nope; ++i) {
        k_b[(h * rank + r) * nope + i] = kv_b[(h * (nope + v) + i) * rank + r];
      }
    }
    for (int64_t j = 0; j < v; ++j) {
      for (int64_t r = 0; r < rank; ++r) {
        v_b[(h * v + j) * rank + r] = kv_b[(h * (nope + v) + nope + j) * rank + r];
      }
    }
  }
  std::vector<float> joined(kv_b.size(), -1.0f);
  JoinKvB(k_b.data(), v_b.data(), heads, nope, v, rank, joined.data());
  EXPECT_EQ(joined, kv_b);
}

TEST(GgufArchTest, GptOssTensorNames) {
  auto ours = [](const char* name) {
    absl::StatusOr<GgufName> n = MapGgufTensorName(ModelFamily::kGptOss, name);
    return n.ok() ? n->ours : std::string(n.status().message());
  };
  EXPECT_EQ(ours("blk.0.attn_sinks.weight"), "model.layers.0.self_attn.sinks");
  EXPECT_EQ(ours("blk.0.post_attention_norm.weight"),
            "model.layers.0.post_attention_layernorm.weight");
  EXPECT_EQ(ours("blk.0.attn_output.bias"), "model.layers.0.self_attn.o_proj.bias");
  EXPECT_EQ(ours("blk.0.attn_v.bias"), "model.layers.0.self_attn.v_proj.bias");
  EXPECT_EQ(ours("blk.0.ffn_gate_inp.weight"), "model.layers.0.mlp.router.weight");
  EXPECT_EQ(ours("blk.0.ffn_gate_inp.bias"), "model.layers.0.mlp.router.bias");
  auto up = MapGgufTensorName(ModelFamily::kGptOss, "blk.3.ffn_up_exps.weight");
  ASSERT_TRUE(up.ok()) << up.status();
  EXPECT_TRUE(up->stacked_experts);
  EXPECT_EQ(up->ForExpert(7), "model.layers.3.mlp.experts.7.up_proj.weight");
  auto bias = MapGgufTensorName(ModelFamily::kGptOss, "blk.3.ffn_down_exps.bias");
  ASSERT_TRUE(bias.ok()) << bias.status();
  EXPECT_TRUE(bias->stacked_experts);
  EXPECT_EQ(bias->ForExpert(1), "model.layers.3.mlp.experts.1.down_proj.bias");
  EXPECT_THAT(ours("blk.0.ffn_norm.weight"), HasSubstr("no counterpart in a gpt_oss"));
  auto fused = MapGgufTensorName(ModelFamily::kGptOss, "blk.0.ffn_gate_up_exps.bias");
  ASSERT_TRUE(fused.ok()) << fused.status();
  EXPECT_TRUE(fused->stacked_experts && fused->fused.size() == 2);
  EXPECT_EQ(fused->ForExpert(2), "model.layers.0.mlp.experts.2.gate_proj.bias");
  EXPECT_EQ(fused->ForExpert(2, 1), "model.layers.0.mlp.experts.2.up_proj.bias");
}

// llama.cpp's --fuse-gate-up-exps: gate and up of each expert from one
// stacked tensor (gate's rows first); a family without expert biases has no
// fused bias.
TEST(GgufArchTest, FusedGateUpExpertsMapToBoth) {
  auto w = MapGgufTensorName(ModelFamily::kQwen3Moe, "blk.1.ffn_gate_up_exps.weight");
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->fused.size(), 2u);
  EXPECT_EQ(w->ForExpert(0), "model.layers.1.mlp.experts.0.gate_proj.weight");
  EXPECT_EQ(w->ForExpert(0, 1), "model.layers.1.mlp.experts.0.up_proj.weight");
  EXPECT_FALSE(MapGgufTensorName(ModelFamily::kQwen3Moe, "blk.1.ffn_gate_up_exps.bias").ok());
  EXPECT_FALSE(MapGgufTensorName(ModelFamily::kQwen3Moe, "blk.1.ffn_up_gate_exps.weight").ok());
}

// llama.cpp's --fuse-qkv: q, k, v from one tensor; llama's is
// rope-permuted, a bias only where the family has q/k/v biases, none for
// latent attention.
TEST(GgufArchTest, FusedQkvMapsToThree) {
  auto w = MapGgufTensorName(ModelFamily::kMixtral, "blk.2.attn_qkv.weight");
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_EQ(w->fused.size(), 3u);
  EXPECT_EQ(w->fused[1], "model.layers.2.self_attn.k_proj.weight");
  EXPECT_TRUE(w->rope_permuted);
  EXPECT_FALSE(w->stacked_experts);
  EXPECT_FALSE(MapGgufTensorName(ModelFamily::kMixtral, "blk.2.attn_qkv.bias").ok());
  auto b = MapGgufTensorName(ModelFamily::kQwen2Moe, "blk.0.attn_qkv.bias");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->fused[2], "model.layers.0.self_attn.v_proj.bias");
  EXPECT_FALSE(b->rope_permuted);
  EXPECT_FALSE(MapGgufTensorName(ModelFamily::kQwen3Moe, "blk.0.attn_qkv.weight")->rope_permuted);
  EXPECT_FALSE(MapGgufTensorName(ModelFamily::kDeepseekV3, "blk.0.attn_qkv.weight").ok());
}

}  // namespace
}  // namespace moe
