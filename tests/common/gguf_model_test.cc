// ModelConfig and tensor names from GGUF metadata (common/gguf_model.h).
#include "common/gguf_model.h"

#include <cstdint>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/gguf_metadata_builder.h"

namespace moe {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::GgufTensors;
using testing::MetadataBuilder;

MetadataBuilder Qwen3Moe() {
  MetadataBuilder b;
  b.Str("general.architecture", "qwen3moe")
      .U32("qwen3moe.embedding_length", 64)
      .U32("qwen3moe.block_count", 2)
      .U32("qwen3moe.attention.head_count", 4)
      .U32("qwen3moe.attention.head_count_kv", 2)
      .U32("qwen3moe.attention.key_length", 32)
      .U32("qwen3moe.expert_count", 8)
      .U32("qwen3moe.expert_used_count", 2)
      .U32("qwen3moe.expert_feed_forward_length", 24)
      .U32("qwen3moe.feed_forward_length", 128)
      .U32("qwen3moe.context_length", 4096)
      .U32("qwen3moe.vocab_size", 300)
      .F32("qwen3moe.attention.layer_norm_rms_epsilon", 1e-6)
      .F32("qwen3moe.rope.freq_base", 1e6)
      .U32("tokenizer.ggml.eos_token_id", 299);
  return b;
}

MetadataBuilder Mixtral() {
  MetadataBuilder b;
  b.Str("general.architecture", "llama")
      .U32("llama.embedding_length", 64)
      .U32("llama.block_count", 3)
      .U32("llama.attention.head_count", 4)
      .U32("llama.attention.head_count_kv", 1)
      .U32("llama.rope.dimension_count", 16)
      .U32("llama.expert_count", 4)
      .U32("llama.expert_used_count", 2)
      .U32("llama.feed_forward_length", 96)
      .U32("llama.vocab_size", 320)
      .F32("llama.attention.layer_norm_rms_epsilon", 1e-5)
      .F32("llama.rope.freq_base", 1e6)
      .U32("tokenizer.ggml.bos_token_id", 1);
  return b;
}

// As llama.cpp's converter writes Qwen1.5-MoE-A2.7B, scaled down.
MetadataBuilder Qwen2Moe() {
  MetadataBuilder b;
  b.Str("general.architecture", "qwen2moe")
      .U32("qwen2moe.embedding_length", 64)
      .U32("qwen2moe.block_count", 2)
      .U32("qwen2moe.attention.head_count", 4)
      .U32("qwen2moe.attention.head_count_kv", 4)
      .U32("qwen2moe.expert_count", 6)
      .U32("qwen2moe.expert_used_count", 2)
      .U32("qwen2moe.feed_forward_length", 128)
      .U32("qwen2moe.expert_feed_forward_length", 32)
      .U32("qwen2moe.expert_shared_feed_forward_length", 96)
      .U32("qwen2moe.vocab_size", 300)
      .F32("qwen2moe.attention.layer_norm_rms_epsilon", 1e-6)
      .F32("qwen2moe.rope.freq_base", 1e6);
  return b;
}

MetadataBuilder Olmoe() {
  MetadataBuilder b;
  b.Str("general.architecture", "olmoe")
      .U32("olmoe.embedding_length", 64)
      .U32("olmoe.block_count", 2)
      .U32("olmoe.attention.head_count", 4)
      .U32("olmoe.attention.head_count_kv", 4)
      .U32("olmoe.expert_count", 8)
      .U32("olmoe.expert_used_count", 2)
      .U32("olmoe.feed_forward_length", 48)
      .U32("olmoe.vocab_size", 300)
      .F32("olmoe.attention.layer_norm_rms_epsilon", 1e-5)
      .F32("olmoe.rope.freq_base", 1e4)
      .U32("tokenizer.ggml.eos_token_id", 299);
  return b;
}

// GLM-4.5-like: 3 decoder layers (the first dense) and one nextn layer.
MetadataBuilder Glm4Moe() {
  MetadataBuilder b;
  b.Str("general.architecture", "glm4moe")
      .U32("glm4moe.embedding_length", 64)
      .U32("glm4moe.block_count", 4)
      .U32("glm4moe.nextn_predict_layers", 1)
      .U32("glm4moe.attention.head_count", 4)
      .U32("glm4moe.attention.head_count_kv", 2)
      .U32("glm4moe.attention.key_length", 32)
      .U32("glm4moe.attention.value_length", 32)
      .U32("glm4moe.rope.dimension_count", 16)
      .U32("glm4moe.expert_count", 8)
      .U32("glm4moe.expert_used_count", 2)
      .U32("glm4moe.expert_shared_count", 1)
      .U32("glm4moe.leading_dense_block_count", 1)
      .U32("glm4moe.feed_forward_length", 128)
      .U32("glm4moe.expert_feed_forward_length", 24)
      .U32("glm4moe.expert_gating_func", 2)
      .F32("glm4moe.expert_weights_scale", 2.5)
      .Bool("glm4moe.expert_weights_norm", true)
      .U32("glm4moe.expert_group_count", 2)
      .U32("glm4moe.expert_group_used_count", 1)
      .U32("glm4moe.vocab_size", 300)
      .F32("glm4moe.attention.layer_norm_rms_epsilon", 1e-5)
      .F32("glm4moe.rope.freq_base", 1e6);
  return b;
}

TEST(GgufModelTest, Qwen3MoeConfig) {
  const MetadataBuilder b = Qwen3Moe();  // owns the strings m views
  GgufMetadata m = b.Build();
  auto c = ModelConfigFromGguf(m, GgufTensors({"token_embd.weight"}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->family, ModelFamily::kQwen3Moe);
  EXPECT_EQ(c->hidden_size, 64);
  EXPECT_EQ(c->num_hidden_layers, 2);
  EXPECT_EQ(c->num_attention_heads, 4);
  EXPECT_EQ(c->num_key_value_heads, 2);
  EXPECT_EQ(c->head_dim, 32);
  EXPECT_EQ(c->num_experts, 8);
  EXPECT_EQ(c->top_k, 2);
  EXPECT_EQ(c->moe_intermediate_size, 24);
  EXPECT_EQ(c->intermediate_size, 128);
  EXPECT_EQ(c->vocab_size, 300);
  EXPECT_EQ(c->max_position_embeddings, 4096);
  EXPECT_TRUE(c->norm_topk_prob);
  EXPECT_EQ(c->qk_norm, QkNorm::kPerHead);
  EXPECT_FLOAT_EQ(c->rms_norm_eps, 1e-6);
  EXPECT_EQ(c->rope_theta, 1e6);
  EXPECT_THAT(c->eos_token_ids, ElementsAre(299));
  EXPECT_TRUE(c->tie_word_embeddings);  // no output.weight
  EXPECT_EQ(c->num_moe_layers(), 2);
}

TEST(GgufModelTest, MixtralConfig) {
  const MetadataBuilder b = Mixtral();
  GgufMetadata m = b.Build();
  auto c = ModelConfigFromGguf(m, GgufTensors({"token_embd.weight", "output.weight"}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->family, ModelFamily::kMixtral);
  EXPECT_EQ(c->num_experts, 4);
  EXPECT_EQ(c->top_k, 2);
  EXPECT_EQ(c->moe_intermediate_size, 96);  // mixtral experts: intermediate_size
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->num_key_value_heads, 1);
  EXPECT_EQ(c->vocab_size, 320);
  EXPECT_EQ(c->bos_token_id, 1);
  EXPECT_TRUE(c->norm_topk_prob);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_EQ(c->qk_norm, QkNorm::kNone);
}

// Heads of another width than hidden / heads (a zero-padded hidden, as the
// peer benchmark writes the trained model): llama.cpp's key_length.
TEST(GgufModelTest, MixtralHeadWidthFromKeyLength) {
  MetadataBuilder b = Mixtral();
  b.Drop("llama.embedding_length").U32("llama.embedding_length", 80);
  GgufMetadata without = b.Build();
  auto refused = ModelConfigFromGguf(without, GgufTensors({"token_embd.weight"}));
  EXPECT_FALSE(refused.ok());  // 80 / 4 = 20 != rope.dimension_count 16
  b.U32("llama.attention.key_length", 16).U32("llama.attention.value_length", 16);
  GgufMetadata with = b.Build();
  auto c = ModelConfigFromGguf(with, GgufTensors({"token_embd.weight"}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->hidden_size, 80);
  EXPECT_EQ(c->head_dim, 16);
}

TEST(GgufModelTest, VocabDefaultsWithoutVocabKeyOrTokens) {
  MetadataBuilder b = Qwen3Moe();
  b.Drop("qwen3moe.vocab_size");
  GgufMetadata no_vocab = b.Build();
  auto c = ModelConfigFromGguf(no_vocab, {});
  // Without tokens either, the family default applies; eos 299 still fits.
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_GT(c->vocab_size, 299);
}

TEST(GgufModelTest, ErrorsNameTheKey) {
  auto msg = [](const MetadataBuilder& b) {
    GgufMetadata m = b.Build();
    return std::string(ModelConfigFromGguf(m, {}).status().message());
  };
  EXPECT_THAT(msg(Mixtral().Drop("llama.expert_count")),
              HasSubstr("without llama.expert_count is a dense model"));
  EXPECT_THAT(msg(MetadataBuilder().Str("general.architecture", "gpt2")),
              HasSubstr("GGUF architecture 'gpt2' is not supported"));
  EXPECT_THAT(msg(Qwen3Moe().Drop("qwen3moe.expert_used_count")),
              HasSubstr("lacks qwen3moe.expert_used_count (num_experts_per_tok)"));
  EXPECT_THAT(msg(Qwen3Moe().Drop("qwen3moe.block_count").Str("qwen3moe.block_count", "2")),
              HasSubstr("'qwen3moe.block_count' is STRING, expected an integer"));
  EXPECT_THAT(msg(Mixtral().Drop("llama.rope.dimension_count").U32("llama.rope.dimension_count", 8)),
              HasSubstr("llama.rope.dimension_count is 8 but heads are 16 wide"));
  EXPECT_THAT(msg(Mixtral().Drop("llama.expert_used_count").U32("llama.expert_used_count", 5)),
              HasSubstr("GGUF metadata (as config.json fields): "));
  EXPECT_THAT(msg(Qwen3Moe().Str("qwen3moe.rope.scaling.type", "yarn")),
              HasSubstr("qwen3moe.rope.scaling.type 'yarn' is not supported yet"));
}

TEST(GgufModelTest, MixtralTensorNames) {
  auto gate = MapGgufTensorName(ModelFamily::kMixtral, "blk.3.ffn_gate_exps.weight");
  ASSERT_TRUE(gate.ok()) << gate.status();
  EXPECT_TRUE(gate->stacked_experts);
  EXPECT_EQ(gate->layer, 3);
  EXPECT_EQ(gate->ForExpert(5), "model.layers.3.block_sparse_moe.experts.5.w1.weight");
  EXPECT_EQ(MapGgufTensorName(ModelFamily::kMixtral, "blk.0.ffn_down_exps.weight")
                ->ForExpert(0),
            "model.layers.0.block_sparse_moe.experts.0.w2.weight");
  auto up7 = MapGgufTensorName(ModelFamily::kMixtral, "blk.1.ffn_up.7.weight");
  ASSERT_TRUE(up7.ok()) << up7.status();
  EXPECT_FALSE(up7->stacked_experts);
  EXPECT_EQ(up7->ours, "model.layers.1.block_sparse_moe.experts.7.w3.weight");
  EXPECT_EQ(MapGgufTensorName(ModelFamily::kMixtral, "blk.2.ffn_gate_inp.weight")->ours,
            "model.layers.2.block_sparse_moe.gate.weight");
  auto q = MapGgufTensorName(ModelFamily::kMixtral, "blk.0.attn_q.weight");
  EXPECT_EQ(q->ours, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_TRUE(q->rope_permuted);
  EXPECT_FALSE(MapGgufTensorName(ModelFamily::kMixtral, "blk.0.attn_v.weight")->rope_permuted);
  EXPECT_EQ(MapGgufTensorName(ModelFamily::kMixtral, "blk.0.ffn_norm.weight")->ours,
            "model.layers.0.post_attention_layernorm.weight");
  EXPECT_EQ(MapGgufTensorName(ModelFamily::kMixtral, "output.weight")->ours, "lm_head.weight");
  EXPECT_EQ(MapGgufTensorName(ModelFamily::kMixtral, "token_embd.weight")->layer, -1);
  EXPECT_THAT(std::string(MapGgufTensorName(ModelFamily::kMixtral, "blk.0.attn_q_norm.weight")
                              .status()
                              .message()),
              HasSubstr("no counterpart in a mixtral model"));
  EXPECT_FALSE(MapGgufTensorName(ModelFamily::kMixtral, "rope_freqs.weight").ok());
  EXPECT_FALSE(MapGgufTensorName(ModelFamily::kMixtral, "blk.x.attn_q.weight").ok());
}

TEST(GgufModelTest, Qwen3MoeTensorNames) {
  auto q = MapGgufTensorName(ModelFamily::kQwen3Moe, "blk.1.attn_q.weight");
  ASSERT_TRUE(q.ok());
  EXPECT_FALSE(q->rope_permuted);  // NEOX rope: stored as in HF
  EXPECT_EQ(MapGgufTensorName(ModelFamily::kQwen3Moe, "blk.1.attn_k_norm.weight")->ours,
            "model.layers.1.self_attn.k_norm.weight");
  EXPECT_EQ(MapGgufTensorName(ModelFamily::kQwen3Moe, "blk.0.ffn_up_exps.weight")->ForExpert(2),
            "model.layers.0.mlp.experts.2.up_proj.weight");
  EXPECT_EQ(MapGgufTensorName(ModelFamily::kQwen3Moe, "blk.0.ffn_gate_inp.weight")->ours,
            "model.layers.0.mlp.gate.weight");
}

TEST(GgufModelTest, Qwen2MoeConfig) {
  const MetadataBuilder b = Qwen2Moe();
  GgufMetadata m = b.Build();
  auto c = ModelConfigFromGguf(
      m, GgufTensors({"token_embd.weight", "output.weight", "blk.0.attn_q.bias"}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->family, ModelFamily::kQwen2Moe);
  EXPECT_EQ(c->num_experts, 6);
  EXPECT_EQ(c->moe_intermediate_size, 32);
  EXPECT_EQ(c->shared_expert_intermediate_size, 96);
  EXPECT_TRUE(c->has_shared_expert());
  EXPECT_TRUE(c->has_shared_expert_gate());
  EXPECT_FALSE(c->norm_topk_prob);  // llama.cpp's qwen2moe graph
  EXPECT_TRUE(c->qkv_bias);         // the file holds the biases
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_FALSE(c->tie_word_embeddings);
  // Without bias tensors: no biases (transformers' default is true).
  auto unbiased = ModelConfigFromGguf(m, GgufTensors({"token_embd.weight"}));
  ASSERT_TRUE(unbiased.ok()) << unbiased.status();
  EXPECT_FALSE(unbiased->qkv_bias);
}

TEST(GgufModelTest, OlmoeConfig) {
  MetadataBuilder b = Olmoe();
  b.F32("olmoe.attention.clamp_kqv", 8.0);
  GgufMetadata m = b.Build();
  auto c = ModelConfigFromGguf(m, GgufTensors({"token_embd.weight", "output.weight"}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->family, ModelFamily::kOlmoe);
  EXPECT_EQ(c->num_experts, 8);
  EXPECT_EQ(c->moe_intermediate_size, 48);  // feed_forward_length
  EXPECT_EQ(c->qk_norm, QkNorm::kFull);
  EXPECT_FALSE(c->norm_topk_prob);
  ASSERT_TRUE(c->clip_qkv.has_value());
  EXPECT_EQ(*c->clip_qkv, 8.0);
}

TEST(GgufModelTest, Glm4MoeConfig) {
  const MetadataBuilder b = Glm4Moe();
  GgufMetadata m = b.Build();
  auto c = ModelConfigFromGguf(m, GgufTensors({"token_embd.weight", "output.weight",
                                           "blk.0.attn_q.bias", "blk.0.attn_q_norm.weight"}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->family, ModelFamily::kGlm4Moe);
  EXPECT_EQ(c->num_hidden_layers, 3);  // block_count less the nextn layer
  EXPECT_EQ(c->num_nextn_predict_layers, 1);
  EXPECT_EQ(c->first_k_dense_replace, 1);
  EXPECT_THAT(c->moe_layers, ElementsAre(1, 2));
  EXPECT_EQ(c->num_experts, 8);
  EXPECT_EQ(c->moe_intermediate_size, 24);
  EXPECT_EQ(c->intermediate_size, 128);
  EXPECT_EQ(c->n_shared_experts, 1);
  EXPECT_EQ(c->shared_expert_intermediate_size, 24);
  EXPECT_EQ(c->routed_scaling_factor, 2.5);
  EXPECT_TRUE(c->norm_topk_prob);
  EXPECT_EQ(c->n_group, 2);
  EXPECT_EQ(c->topk_group, 1);
  EXPECT_EQ(c->scoring_func, ScoringFunc::kSigmoid);
  EXPECT_EQ(c->head_dim, 32);
  EXPECT_EQ(c->rotary_dim, 16);
  EXPECT_TRUE(c->qkv_bias);
  EXPECT_EQ(c->qk_norm, QkNorm::kPerHead);
  // Without the optional tensors and keys: llama.cpp's defaults.
  MetadataBuilder plain = Glm4Moe();
  plain.Drop("glm4moe.leading_dense_block_count")
      .Drop("glm4moe.nextn_predict_layers")
      .Drop("glm4moe.expert_group_count")
      .Drop("glm4moe.expert_group_used_count")
      .Drop("glm4moe.rope.dimension_count");
  GgufMetadata pm = plain.Build();
  auto p = ModelConfigFromGguf(pm, GgufTensors({"token_embd.weight"}));
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->num_hidden_layers, 4);
  EXPECT_EQ(p->first_k_dense_replace, 0);
  EXPECT_EQ(p->n_group, 1);
  EXPECT_EQ(p->rotary_dim, 32);
  EXPECT_FALSE(p->qkv_bias);
  EXPECT_EQ(p->qk_norm, QkNorm::kNone);
}

TEST(GgufModelTest, NewArchitectureErrorsNameTheKey) {
  auto msg = [](const MetadataBuilder& b) {
    GgufMetadata m = b.Build();
    return std::string(ModelConfigFromGguf(m, {}).status().message());
  };
  EXPECT_THAT(msg(Qwen2Moe().Drop("qwen2moe.expert_shared_feed_forward_length")),
              HasSubstr("lacks qwen2moe.expert_shared_feed_forward_length "
                        "(shared_expert_intermediate_size)"));
  EXPECT_THAT(msg(Qwen2Moe().Drop("qwen2moe.expert_feed_forward_length")),
              HasSubstr("lacks qwen2moe.expert_feed_forward_length (moe_intermediate_size)"));
  EXPECT_THAT(msg(Olmoe().Drop("olmoe.expert_count")),
              HasSubstr("lacks olmoe.expert_count (num_experts)"));
  EXPECT_THAT(msg(Olmoe().Str("olmoe.attention.clamp_kqv", "8")),
              HasSubstr("'olmoe.attention.clamp_kqv' is STRING"));
  EXPECT_THAT(msg(Olmoe().U32("olmoe.rope.dimension_count", 8)),
              HasSubstr("olmoe.rope.dimension_count is 8 but heads are 16 wide"));
  EXPECT_THAT(msg(Glm4Moe().Drop("glm4moe.expert_weights_scale")),
              HasSubstr("lacks glm4moe.expert_weights_scale (routed_scaling_factor)"));
  // GLM-4.5's metadata with `key` set to `value`.
  auto glm = [](const std::string& key, uint64_t value) {
    MetadataBuilder b = Glm4Moe();
    b.Drop(key).U32(key, value);
    return b;
  };
  EXPECT_THAT(msg(glm("glm4moe.expert_gating_func", 1)),
              HasSubstr("glm4moe.expert_gating_func is 1; glm4moe runs 2 (sigmoid) only"));
  EXPECT_THAT(msg(glm("glm4moe.nextn_predict_layers", 4)),
              HasSubstr("glm4moe.nextn_predict_layers is 4, leaving no decoder layers"));
  EXPECT_THAT(msg(glm("glm4moe.rope.dimension_count", 40)),
              HasSubstr("glm4moe.rope.dimension_count is 40 but heads are 32 wide"));
  EXPECT_THAT(msg(glm("glm4moe.rope.dimension_count", 15)),
              HasSubstr("GGUF metadata (as config.json fields): head_dim * partial_rotary_factor"));
  EXPECT_THAT(msg(glm("glm4moe.expert_group_count", 3)),
              HasSubstr("not a multiple of n_group"));
  EXPECT_THAT(msg(MetadataBuilder().Str("general.architecture", "mamba")),
              HasSubstr("'mamba' is not supported (llama with experts, qwen2moe, qwen3moe, "
                        "olmoe, glm4moe, deepseek2, gpt-oss)"));
}

TEST(GgufModelTest, NewArchitectureTensorNames) {
  auto ours = [](ModelFamily f, const char* name) {
    absl::StatusOr<GgufName> n = MapGgufTensorName(f, name);
    return n.ok() ? n->ours : std::string(n.status().message());
  };
  const ModelFamily q2 = ModelFamily::kQwen2Moe, ol = ModelFamily::kOlmoe,
                    glm = ModelFamily::kGlm4Moe;
  EXPECT_EQ(ours(q2, "blk.1.attn_k.bias"), "model.layers.1.self_attn.k_proj.bias");
  EXPECT_EQ(ours(q2, "blk.1.ffn_gate_inp_shexp.weight"),
            "model.layers.1.mlp.shared_expert_gate.weight");
  EXPECT_EQ(ours(q2, "blk.0.ffn_down_shexp.weight"),
            "model.layers.0.mlp.shared_expert.down_proj.weight");
  EXPECT_EQ(MapGgufTensorName(q2, "blk.0.ffn_up_exps.weight")->ForExpert(3),
            "model.layers.0.mlp.experts.3.up_proj.weight");
  EXPECT_THAT(ours(q2, "blk.0.attn_q_norm.weight"), HasSubstr("no counterpart in a qwen2_moe"));
  EXPECT_EQ(ours(ol, "blk.2.attn_q_norm.weight"), "model.layers.2.self_attn.q_norm.weight");
  EXPECT_FALSE(MapGgufTensorName(ol, "blk.2.attn_q.weight")->rope_permuted);
  EXPECT_THAT(ours(ol, "blk.0.attn_q.bias"), HasSubstr("no counterpart in a olmoe"));
  EXPECT_EQ(ours(glm, "blk.0.ffn_gate.weight"), "model.layers.0.mlp.gate_proj.weight");
  EXPECT_EQ(ours(glm, "blk.1.ffn_up_shexp.weight"),
            "model.layers.1.mlp.shared_experts.up_proj.weight");
  EXPECT_EQ(ours(glm, "blk.1.exp_probs_b.bias"),
            "model.layers.1.mlp.gate.e_score_correction_bias");
  EXPECT_THAT(ours(glm, "blk.1.ffn_gate_inp_shexp.weight"), HasSubstr("no counterpart"));
  auto eh = MapGgufTensorName(glm, "blk.3.nextn.eh_proj.weight");
  ASSERT_TRUE(eh.ok()) << eh.status();
  EXPECT_TRUE(eh->nextn);
  EXPECT_EQ(eh->ours, "model.layers.3.eh_proj.weight");
  EXPECT_EQ(ours(glm, "blk.3.nextn.shared_head_norm.weight"),
            "model.layers.3.shared_head.norm.weight");
  EXPECT_FALSE(MapGgufTensorName(glm, "blk.3.attn_q.weight")->nextn);
  EXPECT_THAT(ours(glm, "blk.0.attn_kv_b.weight"), HasSubstr("no counterpart in a glm4_moe"));
}

// llama.cpp's converter: rows viewed as [heads, 2, head_dim / 2] and the
// last two axes swapped. Undoing it must give the HF rows back.
TEST(GgufModelTest, UndoesTheLlamaRopePermutation) {
  const uint8_t gguf_rows[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  uint8_t hf[8];
  UndoLlamaRopePermutation(gguf_rows, 2, 4, 1, hf);
  EXPECT_THAT(hf, ElementsAre(0, 2, 1, 3, 4, 6, 5, 7));

  const int64_t heads = 3, head_dim = 8, half = 4, row_bytes = 2;
  std::vector<uint8_t> original(heads * head_dim * row_bytes), permuted(original.size()),
      back(original.size());
  for (size_t k = 0; k < original.size(); ++k) original[k] = static_cast<uint8_t>(k * 7 + 1);
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t j = 0; j < 2; ++j) {
      for (int64_t i = 0; i < half; ++i) {
        for (int64_t b = 0; b < row_bytes; ++b) {
          permuted[((h * half + i) * 2 + j) * row_bytes + b] =
              original[((h * 2 + j) * half + i) * row_bytes + b];
        }
      }
    }
  }
  UndoLlamaRopePermutation(permuted.data(), heads, head_dim, row_bytes, back.data());
  EXPECT_EQ(back, original);
}

}  // namespace
}  // namespace moe
