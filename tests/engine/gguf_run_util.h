// Helpers shared by the GGUF engine tests (gguf_load_test,
// gguf_make_model_test): one model run on the CPU, and the config fields a
// GGUF's keys must carry over from the folder it was written from.
#ifndef MOECACHE_TESTS_ENGINE_GGUF_RUN_UTIL_H_
#define MOECACHE_TESTS_ENGINE_GGUF_RUN_UTIL_H_

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/model_config.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "services/engine/generator.h"
#include "services/engine/in_memory_provider.h"
#include "services/engine/moe_model.h"
#include "services/engine/session.h"
#include "tests/common/test_util.h"

namespace moe::gguf_test {

struct ModelRun {
  std::vector<float> logits;  // of the prompt's last position
  std::vector<int32_t> tokens;
};

// The model at `path` (a folder or a GGUF) on the CPU backend with every
// expert in memory: the logits after a fixed 7-token prompt, then
// `new_tokens` greedy tokens; in the engine's reference arithmetic
// (tests/common/test_util.h), so that checkpoints whose weights are held in
// different dtypes (a GGUF's F32 router, the folder's bf16 one; MXFP4 as
// kMxfp4 and as q8) can be compared bit for bit.
inline ModelRun RunModel(const std::string& path, int new_tokens = 16) {
  ModelRun r;
  moe::testing::ReferenceArithmetic reference;
  auto backend = CreateBackend("cpu");
  EXPECT_TRUE(backend.ok());
  auto model = MoeModel::Load(path, backend->get());
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return r;
  auto experts = InMemoryExpertProvider::Create(**model);
  EXPECT_TRUE(experts.ok());
  const std::vector<int32_t> prompt = {5, 17, 300, 42, 7, 99, 3};
  {
    Session s(**model, experts->get(), 64);
    auto logits = s.Forward(prompt, /*prefill=*/true);
    EXPECT_TRUE(logits.ok()) << logits.status();
    if (logits.ok()) r.logits.assign(logits->begin(), logits->end());
  }
  GenerateOptions o;
  o.prompt = prompt;
  o.max_new_tokens = new_tokens;
  o.stop_at_eos = false;
  auto s = Generate(**model, experts->get(), o, [&](const SampledToken& t) {
    r.tokens.push_back(t.token);
    return true;
  });
  EXPECT_TRUE(s.ok()) << s.status();
  return r;
}

// What a GGUF's keys carry (and its tensors decide), compared with the
// folder's config: the same model.
inline void ExpectSameKeyedConfig(const ModelConfig& g, const ModelConfig& f) {
  EXPECT_EQ(g.head_dim, f.head_dim);
  EXPECT_EQ(g.rotary_dim, f.rotary_dim);
  EXPECT_EQ(g.moe_intermediate_size, f.moe_intermediate_size);
  EXPECT_EQ(g.shared_expert_intermediate_size, f.shared_expert_intermediate_size);
  EXPECT_EQ(g.moe_layers, f.moe_layers);
  EXPECT_EQ(g.norm_topk_prob, f.norm_topk_prob);
  EXPECT_EQ(g.routed_scaling_factor, f.routed_scaling_factor);
  EXPECT_EQ(g.n_group, f.n_group);
  EXPECT_EQ(g.topk_group, f.topk_group);
  EXPECT_EQ(g.qkv_bias, f.qkv_bias);
  EXPECT_EQ(g.qk_norm, f.qk_norm);
  EXPECT_EQ(g.num_key_value_heads, f.num_key_value_heads);
  EXPECT_EQ(g.mla.q_lora_rank, f.mla.q_lora_rank);
  EXPECT_EQ(g.mla.kv_lora_rank, f.mla.kv_lora_rank);
  EXPECT_EQ(g.mla.qk_nope_head_dim, f.mla.qk_nope_head_dim);
  EXPECT_EQ(g.mla.qk_rope_head_dim, f.mla.qk_rope_head_dim);
  EXPECT_EQ(g.mla.v_head_dim, f.mla.v_head_dim);
  EXPECT_EQ(g.scoring_func, f.scoring_func);
  EXPECT_EQ(g.topk_method, f.topk_method);
  EXPECT_EQ(g.n_shared_experts, f.n_shared_experts);
  EXPECT_EQ(g.first_k_dense_replace, f.first_k_dense_replace);
  EXPECT_EQ(g.sliding_window, f.sliding_window);
  EXPECT_EQ(g.sliding_layers, f.sliding_layers);
  EXPECT_EQ(g.swiglu_limit, f.swiglu_limit);
  EXPECT_EQ(g.yarn.has_value(), f.yarn.has_value());
  if (g.yarn.has_value() && f.yarn.has_value()) {
    EXPECT_EQ(g.yarn->factor, f.yarn->factor);
    EXPECT_EQ(g.yarn->original_max_position_embeddings, f.yarn->original_max_position_embeddings);
    EXPECT_EQ(g.yarn->truncate, f.yarn->truncate);
  }
}

}  // namespace moe::gguf_test

#endif  // MOECACHE_TESTS_ENGINE_GGUF_RUN_UTIL_H_
