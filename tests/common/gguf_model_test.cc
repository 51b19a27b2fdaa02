// ModelConfig and tensor names from GGUF metadata (common/gguf_model.h).
#include "common/gguf_model.h"

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace moe {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Builds metadata the way the parser would. The metadata view the builder's
// strings: keep the builder alive while they are used.
class MetadataBuilder {
 public:
  MetadataBuilder& Str(const std::string& key, const std::string& value) {
    GgufValue v;
    v.type = GgufValueType::kString;
    v.str = strings_.emplace_back(value);
    entries_.push_back({key, v});
    return *this;
  }
  MetadataBuilder& U32(const std::string& key, uint64_t value) {
    GgufValue v;
    v.type = GgufValueType::kUint32;
    v.u = value;
    entries_.push_back({key, v});
    return *this;
  }
  MetadataBuilder& F32(const std::string& key, double value) {
    GgufValue v;
    v.type = GgufValueType::kFloat32;
    v.f = value;
    entries_.push_back({key, v});
    return *this;
  }
  MetadataBuilder& Drop(const std::string& key) {
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->key == key) {
        entries_.erase(it);
        break;
      }
    }
    return *this;
  }
  GgufMetadata Build() const { return GgufMetadata("test.gguf", entries_); }

 private:
  std::deque<std::string> strings_;  // stable addresses for the views
  std::vector<GgufKeyValue> entries_;
};

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

std::vector<GgufTensorInfo> Tensors(std::vector<std::string> names) {
  std::vector<GgufTensorInfo> out;
  for (auto& n : names) {
    GgufTensorInfo t;
    t.name = n;
    out.push_back(t);
  }
  return out;
}

TEST(GgufModelTest, Qwen3MoeConfig) {
  const MetadataBuilder b = Qwen3Moe();  // owns the strings m views
  GgufMetadata m = b.Build();
  auto c = ModelConfigFromGguf(m, Tensors({"token_embd.weight"}));
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
  auto c = ModelConfigFromGguf(m, Tensors({"token_embd.weight", "output.weight"}));
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
