// Fuzz target: config.json parsing. Any input must give a status, never a
// crash; an accepted config must survive ModelConfigToJson -> parse
// unchanged and agree with ExpectedTensorCount.
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/logging.h"
#include "common/model_config.h"
#include "common/model_desc.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  auto config = moe::ParseModelConfig(text);
  if (!config.ok()) return 0;
  const moe::ModelConfig& c = *config;
  auto again = moe::ParseModelConfig(moe::ModelConfigToJson(c));
  MOE_CHECK(again.ok()) << again.status() << "\n" << moe::ModelConfigToJson(c);
  MOE_CHECK(again->family == c.family && again->hidden_size == c.hidden_size &&
            again->head_dim == c.head_dim &&
            again->num_key_value_heads == c.num_key_value_heads &&
            again->num_experts == c.num_experts && again->top_k == c.top_k &&
            again->moe_intermediate_size == c.moe_intermediate_size &&
            again->norm_topk_prob == c.norm_topk_prob &&
            again->qkv_bias == c.qkv_bias && again->o_bias == c.o_bias &&
            again->qk_norm == c.qk_norm && again->moe_layer == c.moe_layer &&
            again->eos_token_ids == c.eos_token_ids &&
            again->bos_token_id == c.bos_token_id &&
            again->shared_expert_intermediate_size ==
                c.shared_expert_intermediate_size)
      << "round trip changed the config:\n"
      << moe::ModelConfigToJson(c);
  uint64_t count = moe::ExpectedTensorCount(c);
  if (count <= 5000) {
    MOE_CHECK(moe::ExpectedTensors(c).size() == count);
  }
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    int m = c.MoeLayerIndex(i);
    if (m >= 0) MOE_CHECK(c.LayerOfMoeLayer(m) == i);
  }
  return 0;
}
