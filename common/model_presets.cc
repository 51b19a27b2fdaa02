#include "common/model_presets.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace moe {
namespace {

// A published model's shape at 2 decoder layers (from its config.json).
struct RealShape {
  const char* name;
  ModelFamily family;
  int64_t hidden, heads, kv_heads, head_dim, experts, top_k, intermediate,
      moe_intermediate, shared_intermediate, vocab;
  bool norm_topk_prob;
};

constexpr RealShape kRealShapes[] = {
    // Mixtral-8x7B-v0.1: 32 layers in the original.
    {"mixtral-8x7b-2l", ModelFamily::kMixtral, 4096, 32, 8, 0, 8, 2, 14336, 0,
     0, 32000, true},
    // Qwen1.5-MoE-A2.7B: 24 layers, a shared expert of 5632.
    {"qwen1.5-moe-a2.7b-2l", ModelFamily::kQwen2Moe, 2048, 16, 16, 0, 60, 4,
     5632, 1408, 5632, 151936, false},
    // Qwen3-30B-A3B: 48 layers, head_dim 128 != hidden / heads.
    {"qwen3-30b-a3b-2l", ModelFamily::kQwen3Moe, 2048, 32, 4, 128, 128, 8, 6144,
     768, 0, 151936, true},
    // OLMoE-1B-7B-0924: 16 layers.
    {"olmoe-1b-7b-2l", ModelFamily::kOlmoe, 2048, 16, 16, 0, 64, 8, 1024, 0, 0,
     50304, false},
};

// DeepSeek shapes at 2 decoder layers, the first dense (their
// first_k_dense_replace, 1 for V2-Lite, 3 for V3, is cut to 1 so that the
// second layer is MoE). From the published config.json files.
struct DeepseekShape {
  const char* name;
  ModelFamily family;
  int64_t hidden, heads, experts, top_k, intermediate, moe_intermediate,
      n_shared, vocab, n_group, topk_group;
  MlaConfig mla;
  TopkMethod method;
  double routed_scaling_factor;
  bool norm_topk_prob;
  YarnConfig yarn;
  int64_t max_position_embeddings;
};

const DeepseekShape kDeepseekShapes[] = {
    // DeepSeek-V2-Lite: 27 layers; 64 experts, 6 per token, 2 shared.
    {"deepseek-v2-lite-2l", ModelFamily::kDeepseekV2, 2048, 16, 64, 6, 10944,
     1408, 2, 102400, 1, 1, {0, 512, 128, 64, 128}, TopkMethod::kGreedy, 1.0,
     false, {40, 4096, 32, 1, 0.707, 0.707}, 163840},
    // DeepSeek-V3: 61 layers; 256 experts (22 GB per MoE layer in bf16: a
    // shape for sizing, not for writing on a workstation).
    {"deepseek-v3-2l", ModelFamily::kDeepseekV3, 7168, 128, 256, 8, 18432,
     2048, 1, 129280, 8, 4, {1536, 512, 128, 64, 128}, TopkMethod::kNoauxTc,
     2.5, true, {40, 4096, 32, 1, 1.0, 1.0}, 163840},
};

MakeModelOptions DeepseekPreset(const DeepseekShape& r) {
  MakeModelOptions o;
  o.arch = r.family;
  o.layers = 2;
  o.hidden = r.hidden;
  o.heads = o.kv_heads = r.heads;
  o.experts = r.experts;
  o.top_k = r.top_k;
  o.intermediate = r.intermediate;
  o.moe_intermediate = r.moe_intermediate;
  o.vocab = r.vocab;
  o.mla = r.mla;
  o.n_shared_experts = r.n_shared;
  o.first_k_dense_replace = 1;
  o.topk_method = r.method;
  o.n_group = r.n_group;
  o.topk_group = r.topk_group;
  o.routed_scaling_factor = r.routed_scaling_factor;
  o.norm_topk_prob = r.norm_topk_prob;
  o.yarn = r.yarn;
  o.max_position_embeddings = r.max_position_embeddings;
  return o;
}

// openai/gpt-oss-20b and -120b (config.json) at 2 layers, MXFP4 experts.
struct GptOssShape {
  const char* name;
  int64_t experts;
};
constexpr GptOssShape kGptOssShapes[] = {{"gpt-oss-20b-2l", 32}, {"gpt-oss-120b-2l", 128}};

MakeModelOptions GptOssPreset(const GptOssShape& r) {
  MakeModelOptions o = TinyPreset(ModelFamily::kGptOss);
  o.layers = 2;
  o.hidden = 2880;
  o.heads = 64;
  o.kv_heads = 8;
  o.head_dim = 64;
  o.experts = r.experts;
  o.top_k = 4;
  o.intermediate = 2880;
  o.vocab = 201088;
  o.sliding_window = 128;
  o.swiglu_limit = 7.0;
  o.rms_norm_eps = 1e-5;
  o.yarn->factor = 32.0;
  o.yarn->original_max_position_embeddings = 4096;
  o.max_position_embeddings = 131072;
  o.mxfp4 = true;
  return o;
}

// zai-org/GLM-4.5-Air and GLM-4.5 (config.json) at 2 layers, the first
// dense (first_k_dense_replace is 1 and 3 there), bf16.
struct GlmShape {
  const char* name;
  int64_t hidden, experts, intermediate, moe_intermediate;
  bool use_qk_norm;
  double routed_scaling_factor;
};
constexpr GlmShape kGlmShapes[] = {
    {"glm-4.5-air-2l", 4096, 128, 10944, 1408, false, 1.0},
    {"glm-4.5-2l", 5120, 160, 12288, 1536, true, 2.5},
};

MakeModelOptions GlmPreset(const GlmShape& r) {
  MakeModelOptions o = TinyPreset(ModelFamily::kGlm4Moe);
  o.layers = 2;
  o.hidden = r.hidden;
  o.heads = 96;
  o.kv_heads = 8;
  o.head_dim = 128;
  o.experts = r.experts;
  o.top_k = 8;
  o.intermediate = r.intermediate;
  o.moe_intermediate = r.moe_intermediate;
  o.n_shared_experts = 1;
  o.first_k_dense_replace = 1;
  o.n_group = 1;
  o.topk_group = 1;
  o.routed_scaling_factor = r.routed_scaling_factor;
  o.use_qk_norm = r.use_qk_norm;
  o.vocab = 151552;
  o.rope_theta = 1e6;
  o.max_position_embeddings = 131072;
  return o;
}

// Bigger than tiny, still seconds to write: 6 layers x 16 experts.
MakeModelOptions SmallPreset(ModelFamily family) {
  MakeModelOptions o = TinyPreset(family);
  o.layers = family == ModelFamily::kQwen3Moe ? 7 : 6;
  o.hidden = 128;
  o.heads = 4;
  o.kv_heads = 2;
  o.head_dim = family == ModelFamily::kQwen3Moe ? 64 : 0;
  o.experts = 16;
  o.top_k = 2;
  o.intermediate = 256;
  if (o.moe_intermediate > 0) o.moe_intermediate = 128;
  if (o.shared_intermediate > 0) o.shared_intermediate = 256;
  o.vocab = 1024;
  return o;
}

}  // namespace

std::string PresetNames() {
  std::string names = "tiny, small";
  for (const RealShape& r : kRealShapes) absl::StrAppend(&names, ", ", r.name);
  for (const DeepseekShape& r : kDeepseekShapes) {
    absl::StrAppend(&names, ", ", r.name);
  }
  for (const GptOssShape& r : kGptOssShapes) absl::StrAppend(&names, ", ", r.name);
  for (const GlmShape& r : kGlmShapes) absl::StrAppend(&names, ", ", r.name);
  return names;
}

absl::StatusOr<MakeModelOptions> PresetOptions(
    const std::string& name, std::optional<ModelFamily> family) {
  if (name == "tiny") return TinyPreset(family.value_or(ModelFamily::kMixtral));
  if (name == "small")
    return SmallPreset(family.value_or(ModelFamily::kMixtral));
  for (const RealShape& r : kRealShapes) {
    if (name != r.name) continue;
    if (family.has_value() && *family != r.family) {
      return absl::InvalidArgumentError(
          absl::StrCat("preset ", name, " is a ", ModelFamilyName(r.family),
                       " model, not ", ModelFamilyName(*family)));
    }
    MakeModelOptions o;
    o.arch = r.family;
    o.layers = 2;
    o.hidden = r.hidden;
    o.heads = r.heads;
    o.kv_heads = r.kv_heads;
    o.head_dim = r.head_dim;
    o.experts = r.experts;
    o.top_k = r.top_k;
    o.intermediate = r.intermediate;
    o.moe_intermediate = r.moe_intermediate;
    o.shared_intermediate = r.shared_intermediate;
    o.vocab = r.vocab;
    o.norm_topk_prob = r.norm_topk_prob;
    o.max_position_embeddings = 32768;
    return o;
  }
  for (const DeepseekShape& r : kDeepseekShapes) {
    if (name != r.name) continue;
    if (family.has_value() && *family != r.family) {
      return absl::InvalidArgumentError(
          absl::StrCat("preset ", name, " is a ", ModelFamilyName(r.family),
                       " model, not ", ModelFamilyName(*family)));
    }
    return DeepseekPreset(r);
  }
  for (const GptOssShape& r : kGptOssShapes) {
    if (name != r.name) continue;
    if (family.has_value() && *family != ModelFamily::kGptOss) {
      return absl::InvalidArgumentError(absl::StrCat("preset ", name, " is a gpt_oss model, not ",
                                                     ModelFamilyName(*family)));
    }
    return GptOssPreset(r);
  }
  for (const GlmShape& r : kGlmShapes) {
    if (name != r.name) continue;
    if (family.has_value() && *family != ModelFamily::kGlm4Moe) {
      return absl::InvalidArgumentError(absl::StrCat(
          "preset ", name, " is a glm4_moe model, not ",
          ModelFamilyName(*family)));
    }
    return GlmPreset(r);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown preset '", name, "' (known: ", PresetNames(), ")"));
}

}  // namespace moe
