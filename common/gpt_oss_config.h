// The gpt_oss part of config.json (transformers' configuration_gpt_oss.py),
// for ParseModelConfig, ValidateModelConfig and ModelConfigToJson
// (model_config.cc). Internal to common/.
//
// Defaults as GptOssConfig: sliding_window 128, layer_types alternating
// sliding ("sliding_attention" on even layers) and full attention,
// attention_bias true, swiglu_limit 7.0, swiglu_alpha 1.702, rope_theta
// 150000 and, when config.json has neither rope_scaling nor
// rope_parameters, YaRN {factor 32, beta_fast 32, beta_slow 1,
// original_max_position_embeddings 4096, truncate false}.
#ifndef MOECACHE_COMMON_GPT_OSS_CONFIG_H_
#define MOECACHE_COMMON_GPT_OSS_CONFIG_H_

#include "absl/status/status.h"
#include "common/config_reader.h"
#include "common/model_config.h"

namespace moe::config_internal {

// Fills the gpt_oss fields of `c` (num_experts, widths, biases, layer
// types, YaRN, quantization_config "mxfp4"); errors go to r.status().
void ReadGptOssFields(FieldReader& r, ModelConfig* c);

// The gpt_oss invariants: layer_types has one entry per layer, the YaRN
// fields are in range, swiglu_limit positive, head_dim even, and for MXFP4
// hidden_size and intermediate_size are whole 32-weight groups.
absl::Status CheckGptOss(const ModelConfig& c);

// Writes the gpt_oss fields as the published config.json does.
void GptOssFieldsToJson(const ModelConfig& c, nlohmann::ordered_json& j);

}  // namespace moe::config_internal

#endif  // MOECACHE_COMMON_GPT_OSS_CONFIG_H_
