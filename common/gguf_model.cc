#include "common/gguf_model.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace moe {
namespace {

using nlohmann::json;

enum class Kind { kInt, kFloat, kBool };

// One `{arch}.<suffix>` key (or a key without the prefix) and the
// config.json field it becomes. A later row for the same field overrides
// an earlier one when both keys are present.
struct KeyMap {
  const char* gguf;    // "%s" stands for the architecture
  const char* config;  // Hugging Face config.json field
  Kind kind;
  bool required;
  double multiply = 1.0;  // kFloat: the field is the value times this
};

constexpr KeyMap kCommonKeys[] = {
    {"%s.embedding_length", "hidden_size", Kind::kInt, true},
    {"%s.block_count", "num_hidden_layers", Kind::kInt, true},
    {"%s.attention.head_count", "num_attention_heads", Kind::kInt, true},
    {"%s.attention.head_count_kv", "num_key_value_heads", Kind::kInt, false},
    {"%s.expert_used_count", "num_experts_per_tok", Kind::kInt, true},
    {"%s.feed_forward_length", "intermediate_size", Kind::kInt, false},
    {"%s.context_length", "max_position_embeddings", Kind::kInt, false},
    {"%s.attention.layer_norm_rms_epsilon", "rms_norm_eps", Kind::kFloat,
     false},
    {"%s.rope.freq_base", "rope_theta", Kind::kFloat, false},
    {"%s.vocab_size", "vocab_size", Kind::kInt, false},
    {"tokenizer.ggml.bos_token_id", "bos_token_id", Kind::kInt, false},
    {"tokenizer.ggml.eos_token_id", "eos_token_id", Kind::kInt, false},
    {"tokenizer.ggml.padding_token_id", "pad_token_id", Kind::kInt, false},
};

constexpr KeyMap kMixtralKeys[] = {
    {"%s.expert_count", "num_local_experts", Kind::kInt, true},
    // Heads need not be hidden / heads wide (llama.cpp: n_embd_head_k).
    {"%s.attention.key_length", "head_dim", Kind::kInt, false},
};

constexpr KeyMap kQwen2MoeKeys[] = {
    {"%s.expert_count", "num_experts", Kind::kInt, true},
    {"%s.expert_feed_forward_length", "moe_intermediate_size", Kind::kInt,
     true},
    {"%s.expert_shared_feed_forward_length", "shared_expert_intermediate_size",
     Kind::kInt, true},
    {"%s.attention.key_length", "head_dim", Kind::kInt, false},
};

constexpr KeyMap kQwen3MoeKeys[] = {
    {"%s.expert_count", "num_experts", Kind::kInt, true},
    {"%s.expert_feed_forward_length", "moe_intermediate_size", Kind::kInt,
     true},
    {"%s.attention.key_length", "head_dim", Kind::kInt, false},
    {"%s.expert_weights_norm", "norm_topk_prob", Kind::kBool, false},
};

// OLMoE's experts are feed_forward_length wide (intermediate_size).
constexpr KeyMap kOlmoeKeys[] = {
    {"%s.expert_count", "num_experts", Kind::kInt, true},
    {"%s.attention.clamp_kqv", "clip_qkv", Kind::kFloat, false},
};

constexpr KeyMap kGlm4MoeKeys[] = {
    {"%s.expert_count", "n_routed_experts", Kind::kInt, true},
    {"%s.expert_feed_forward_length", "moe_intermediate_size", Kind::kInt,
     true},
    {"%s.expert_shared_count", "n_shared_experts", Kind::kInt, false},
    {"%s.leading_dense_block_count", "first_k_dense_replace", Kind::kInt,
     false},
    {"%s.expert_weights_scale", "routed_scaling_factor", Kind::kFloat, true},
    {"%s.expert_weights_norm", "norm_topk_prob", Kind::kBool, false},
    {"%s.expert_group_count", "n_group", Kind::kInt, false},
    {"%s.expert_group_used_count", "topk_group", Kind::kInt, false},
    {"%s.attention.key_length", "head_dim", Kind::kInt, false},
    {"%s.nextn_predict_layers", "num_nextn_predict_layers", Kind::kInt, false},
};

// deepseek2 (DeepSeek-V2/V3): latent attention. llama.cpp's converter
// writes the MQA view of the latent cache as key_length (kv_lora_rank +
// rope) and value_length (kv_lora_rank), the heads' own sizes as
// key_length_mla / value_length_mla; older files wrote the heads' sizes
// as key_length / value_length. "qk_head_dim" is scratch: DeriveDeepseek2
// splits it into qk_nope_head_dim + qk_rope_head_dim.
constexpr KeyMap kDeepseek2Keys[] = {
    {"%s.expert_count", "n_routed_experts", Kind::kInt, true},
    {"%s.expert_feed_forward_length", "moe_intermediate_size", Kind::kInt,
     true},
    {"%s.expert_shared_count", "n_shared_experts", Kind::kInt, true},
    {"%s.leading_dense_block_count", "first_k_dense_replace", Kind::kInt,
     true},
    {"%s.expert_weights_scale", "routed_scaling_factor", Kind::kFloat, true},
    {"%s.expert_weights_norm", "norm_topk_prob", Kind::kBool, false},
    {"%s.expert_group_count", "n_group", Kind::kInt, false},
    {"%s.expert_group_used_count", "topk_group", Kind::kInt, false},
    {"%s.attention.q_lora_rank", "q_lora_rank", Kind::kInt, false},
    {"%s.attention.kv_lora_rank", "kv_lora_rank", Kind::kInt, true},
    {"%s.rope.dimension_count", "qk_rope_head_dim", Kind::kInt, true},
    {"%s.attention.key_length", "qk_head_dim", Kind::kInt, false},
    {"%s.attention.key_length_mla", "qk_head_dim", Kind::kInt, false},
    {"%s.attention.value_length", "v_head_dim", Kind::kInt, false},
    {"%s.attention.value_length_mla", "v_head_dim", Kind::kInt, false},
};

// gpt-oss: the experts are expert_feed_forward_length wide
// (intermediate_size in its config.json); swiglu_clamp_exp, when written,
// is the clamp of the experts' SwiGLU (llama.cpp's graph fixes 7).
constexpr KeyMap kGptOssKeys[] = {
    {"%s.expert_count", "num_local_experts", Kind::kInt, true},
    {"%s.expert_feed_forward_length", "intermediate_size", Kind::kInt, true},
    {"%s.attention.key_length", "head_dim", Kind::kInt, false},
    {"%s.attention.sliding_window", "sliding_window", Kind::kInt, true},
    {"%s.swiglu_clamp_exp", "swiglu_limit", Kind::kFloat, false},
};

// {arch}.rope.scaling.* of type "yarn" as config.json's rope_scaling.
struct RopeScalingMap {
  absl::Span<const KeyMap> keys;  // into the rope_scaling object
  const char* yarn;               // rope_scaling before the keys (JSON)
  const char* plain;  // rope_scaling without scaling (JSON; "null": none)
};

// DeepSeek's YaRN: llama.cpp keeps 0.1 * mscale_all_dim as
// yarn_log_multiplier and assumes mscale == mscale_all_dim (as DeepSeek's
// configs have it; DeriveDeepseek2 copies it).
constexpr KeyMap kDeepseekYarnKeys[] = {
    {"%s.rope.scaling.factor", "factor", Kind::kFloat, true},
    {"%s.rope.scaling.original_context_length",
     "original_max_position_embeddings", Kind::kInt, true},
    {"%s.rope.scaling.yarn_log_multiplier", "mscale_all_dim", Kind::kFloat,
     false, 10.0},
    {"%s.rope.scaling.yarn_beta_fast", "beta_fast", Kind::kFloat, false},
    {"%s.rope.scaling.yarn_beta_slow", "beta_slow", Kind::kFloat, false},
};
constexpr RopeScalingMap kDeepseekRope = {kDeepseekYarnKeys,
                                          R"({"type": "yarn"})", "null"};

// gpt-oss's YaRN does not floor/ceil the correction range (its config's
// truncate: false); without rope.scaling.type the rope is plain (its
// config.json's rope_scaling null would mean YaRN).
constexpr KeyMap kGptOssYarnKeys[] = {
    {"%s.rope.scaling.factor", "factor", Kind::kFloat, true},
    {"%s.rope.scaling.original_context_length",
     "original_max_position_embeddings", Kind::kInt, false},
    {"%s.rope.scaling.yarn_beta_fast", "beta_fast", Kind::kFloat, false},
    {"%s.rope.scaling.yarn_beta_slow", "beta_slow", Kind::kFloat, false},
};
constexpr RopeScalingMap kGptOssRope = {
    kGptOssYarnKeys, R"({"rope_type": "yarn", "truncate": false})",
    R"({"rope_type": "default"})"};

// YaRN keys whose other values ModelConfig cannot express.
struct NeutralFloat {
  const char* gguf;
  double value;
};
constexpr NeutralFloat kYarnNeutral[] = {
    {"%s.rope.scaling.attn_factor", 1.0},
    {"%s.rope.scaling.yarn_attn_factor", 1.0},
    {"%s.rope.scaling.yarn_ext_factor", 1.0},
};

// A key whose value must be the one the family runs (llama.cpp's enums).
struct ExpectedInt {
  const char* gguf;
  int64_t value;
  const char* meaning;
};

// llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE: 1 softmax, 2 sigmoid,
// 3 softmax over the top-k logits.
constexpr ExpectedInt kGlm4MoeExpected[] = {
    {"%s.expert_gating_func", 2, "sigmoid"}};
constexpr ExpectedInt kGptOssExpected[] = {
    {"%s.expert_gating_func", 3, "softmax over the top-k logits"}};

// Which of an architecture's rows a file is: the row whose `value` the
// key holds (`absent` when the file lacks it). deepseek2 is DeepSeek-V2
// (softmax scores) or V3 (sigmoid scores with a correction bias);
// llama.cpp reads files without the key as softmax.
struct Variant {
  const char* gguf;
  int64_t value;
  int64_t absent;
  const char* meaning;
};
constexpr Variant kDeepseekV2Variant = {"%s.expert_gating_func", 1, 1,
                                        "softmax: deepseek_v2"};
constexpr Variant kDeepseekV3Variant = {"%s.expert_gating_func", 2, 1,
                                        "sigmoid: deepseek_v3"};

// A config.json bool that llama.cpp leaves to the tensors: true when the
// file holds `tensor` (or `fused`, the tensor its --fuse-qkv writes
// instead).
struct TensorFlag {
  const char* tensor;
  const char* config;
  const char* fused = nullptr;
};

constexpr TensorFlag kQwen2MoeFlags[] = {
    {"blk.0.attn_q.bias", "qkv_bias", "blk.0.attn_qkv.bias"}};
constexpr TensorFlag kGlm4MoeFlags[] = {
    {"blk.0.attn_q.bias", "attention_bias", "blk.0.attn_qkv.bias"},
    {"blk.0.attn_q_norm.weight", "use_qk_norm"}};
constexpr TensorFlag kGptOssFlags[] = {
    {"blk.0.attn_q.bias", "attention_bias", "blk.0.attn_qkv.bias"}};

// How rope.dimension_count reads.
enum class RopeDims {
  kHeadWidth,  // must be the head width
  kPartial,    // the rotated part of each head: partial_rotary_factor
  kMlaRope,    // qk_rope_head_dim (read as a key)
};

// Fields derived from several keys after they are read.
using DeriveFn = absl::Status (*)(const GgufMetadata& m, absl::string_view arch,
                                  json* cfg);
absl::Status DeriveDeepseek2(const GgufMetadata& m, absl::string_view arch,
                             json* cfg);

// One general.architecture llama.cpp writes for a family we serve.
struct ArchRow {
  const char* name;
  ModelFamily family;
  absl::Span<const KeyMap> keys;  // besides kCommonKeys
  // config.json fields set before the keys: what llama.cpp's graph fixes
  // for the architecture, and its defaults where they differ from
  // transformers' (a JSON object).
  const char* fixed;
  absl::Span<const ExpectedInt> expected;
  absl::Span<const TensorFlag> flags;
  RopeDims rope_dims = RopeDims::kHeadWidth;
  // block_count counts the nextn (MTP) layers after the decoder's.
  bool nextn_in_block_count = false;
  // The name is also written for dense models (llama): expert_count tells.
  bool dense_without_experts = false;
  const Variant* variant = nullptr;  // null: the only row of its name
  // null: a rope.scaling.type other than "none" is refused.
  const RopeScalingMap* rope_scaling = nullptr;
  DeriveFn derive = nullptr;
};

// clang-format off
const ArchRow kArchs[] = {
    {"llama", ModelFamily::kMixtral, kMixtralKeys, "{}", {}, {},
     RopeDims::kHeadWidth, /*nextn_in_block_count=*/false,
     /*dense_without_experts=*/true},
    // llama.cpp's qwen2moe graph never renormalises the top-k weights.
    {"qwen2moe", ModelFamily::kQwen2Moe, kQwen2MoeKeys,
     R"({"norm_topk_prob": false})", {}, kQwen2MoeFlags},
    // Its qwen3moe graph always does (unless expert_weights_norm says).
    {"qwen3moe", ModelFamily::kQwen3Moe, kQwen3MoeKeys,
     R"({"norm_topk_prob": true})", {}, {}},
    {"olmoe", ModelFamily::kOlmoe, kOlmoeKeys,
     R"({"norm_topk_prob": false})", {}, {}},
    // llama.cpp's defaults for absent keys: no leading dense layers, no
    // shared expert, no renormalisation, one expert group, full rotary.
    {"glm4moe", ModelFamily::kGlm4Moe, kGlm4MoeKeys,
     R"({"first_k_dense_replace": 0, "n_shared_experts": 0,
         "norm_topk_prob": false, "n_group": 1, "topk_group": 1,
         "partial_rotary_factor": 1.0})",
     kGlm4MoeExpected, kGlm4MoeFlags, RopeDims::kPartial,
     /*nextn_in_block_count=*/true},
    // llama.cpp's defaults: no renormalisation, one expert group, no
    // q_lora (attn_q); the MTP layers are not converted.
    {"deepseek2", ModelFamily::kDeepseekV2, kDeepseek2Keys,
     R"({"norm_topk_prob": false, "n_group": 1, "topk_group": 1,
         "q_lora_rank": null, "scoring_func": "softmax",
         "rope_scaling": null})",
     {}, {}, RopeDims::kMlaRope, false, false, &kDeepseekV2Variant,
     &kDeepseekRope, DeriveDeepseek2},
    {"deepseek2", ModelFamily::kDeepseekV3, kDeepseek2Keys,
     R"({"norm_topk_prob": false, "n_group": 1, "topk_group": 1,
         "q_lora_rank": null, "scoring_func": "sigmoid",
         "topk_method": "noaux_tc", "rope_scaling": null})",
     {}, {}, RopeDims::kMlaRope, false, false, &kDeepseekV3Variant,
     &kDeepseekRope, DeriveDeepseek2},
    // llama.cpp's gpt-oss graph: sliding window on even layers (its SWA
    // pattern 2, gpt_oss's default layer_types), SwiGLU clamped at 7 with
    // alpha 1.702.
    {"gpt-oss", ModelFamily::kGptOss, kGptOssKeys,
     R"({"swiglu_limit": 7.0, "swiglu_alpha": 1.702})", kGptOssExpected,
     kGptOssFlags, RopeDims::kHeadWidth, false, false, nullptr, &kGptOssRope},
};
// clang-format on

std::string KeyOf(const char* pattern, absl::string_view arch) {
  return absl::StrReplaceAll(pattern, {{"%s", arch}});
}

absl::StatusOr<const ArchRow*> FindArch(const GgufMetadata& m) {
  ASSIGN_OR_RETURN(absl::string_view arch, m.GetString("general.architecture"));
  std::vector<std::string> variants;
  std::string variant_key;
  for (const ArchRow& row : kArchs) {
    if (arch != row.name) continue;
    const std::string experts = KeyOf("%s.expert_count", arch);
    if (row.dense_without_experts && !m.Has(experts)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "GGUF architecture '", arch, "' without ", experts,
          " is a dense model; only MoE models (Mixtral) are supported"));
    }
    if (row.variant == nullptr) return &row;
    variant_key = KeyOf(row.variant->gguf, arch);
    int64_t v = row.variant->absent;
    if (m.Has(variant_key)) {
      ASSIGN_OR_RETURN(v, m.GetInt(variant_key));
    }
    if (v == row.variant->value) return &row;
    variants.push_back(
        absl::StrCat(row.variant->value, " (", row.variant->meaning, ")"));
  }
  if (!variants.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(variant_key, " is ", *m.GetInt(variant_key), "; ", arch,
                     " runs ", absl::StrJoin(variants, " or "), " only"));
  }
  std::vector<std::string> names;
  for (const ArchRow& row : kArchs) {
    const std::string name = row.dense_without_experts
                                 ? absl::StrCat(row.name, " with experts")
                                 : std::string(row.name);
    if (names.empty() || names.back() != name) names.push_back(name);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("GGUF architecture '", arch, "' is not supported (",
                   absl::StrJoin(names, ", "), ")"));
}

absl::Status CopyKeys(const GgufMetadata& m, absl::string_view arch,
                      absl::Span<const KeyMap> keys, json* out) {
  for (const KeyMap& k : keys) {
    const std::string key = KeyOf(k.gguf, arch);
    if (!m.Has(key)) {
      if (k.required) {
        return absl::InvalidArgumentError(
            absl::StrCat("GGUF metadata lacks ", key, " (", k.config, ")"));
      }
      continue;
    }
    switch (k.kind) {
      case Kind::kInt: {
        ASSIGN_OR_RETURN((*out)[k.config], m.GetInt(key));
        break;
      }
      case Kind::kFloat: {
        ASSIGN_OR_RETURN(double v, m.GetFloat(key));
        (*out)[k.config] = k.multiply == 1.0 ? v : v * k.multiply;
        break;
      }
      case Kind::kBool: {
        ASSIGN_OR_RETURN((*out)[k.config], m.GetBool(key));
        break;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CheckExpected(const GgufMetadata& m, absl::string_view arch,
                           absl::Span<const ExpectedInt> expected) {
  for (const ExpectedInt& e : expected) {
    const std::string key = KeyOf(e.gguf, arch);
    if (!m.Has(key)) continue;
    ASSIGN_OR_RETURN(int64_t v, m.GetInt(key));
    if (v != e.value) {
      return absl::InvalidArgumentError(absl::StrCat(key, " is ", v, "; ", arch,
                                                     " runs ", e.value, " (",
                                                     e.meaning, ") only"));
    }
  }
  return absl::OkStatus();
}

// The decoder's layers: block_count less the nextn layers it counts.
absl::Status SubtractNextnLayers(absl::string_view arch, json* cfg) {
  if (!cfg->contains("num_nextn_predict_layers")) return absl::OkStatus();
  const int64_t blocks = (*cfg)["num_hidden_layers"].get<int64_t>();
  const int64_t nextn = (*cfg)["num_nextn_predict_layers"].get<int64_t>();
  if (nextn < 0 || nextn >= blocks) {
    return absl::InvalidArgumentError(
        absl::StrCat(arch, ".nextn_predict_layers is ", nextn,
                     ", leaving no decoder layers of the ", blocks, " in ",
                     arch, ".block_count"));
  }
  (*cfg)["num_hidden_layers"] = blocks - nextn;
  return absl::OkStatus();
}

int64_t HeadDimOf(const json& cfg) {
  if (cfg.contains("head_dim")) return cfg["head_dim"].get<int64_t>();
  const int64_t heads = cfg["num_attention_heads"].get<int64_t>();
  return heads > 0 ? cfg["hidden_size"].get<int64_t>() / heads : 0;
}

// rope.dimension_count: the head width, or (partial rotary) the factor.
absl::Status ReadRopeDims(const GgufMetadata& m, const ArchRow& row,
                          json* cfg) {
  const std::string key = absl::StrCat(row.name, ".rope.dimension_count");
  if (!m.Has(key) || row.rope_dims == RopeDims::kMlaRope) {
    return absl::OkStatus();
  }
  const bool partial = row.rope_dims == RopeDims::kPartial;
  ASSIGN_OR_RETURN(int64_t dims, m.GetInt(key));
  const int64_t head_dim = HeadDimOf(*cfg);
  if (partial && dims > 0 && dims <= head_dim) {
    (*cfg)["partial_rotary_factor"] =
        static_cast<double>(dims) / static_cast<double>(head_dim);
    return absl::OkStatus();
  }
  if (dims != head_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        key, " is ", dims, " but heads are ", head_dim, " wide; ",
        partial
            ? "it must be in [1, head width]"
            : absl::StrCat("partial rotary is not supported for ", row.name)));
  }
  return absl::OkStatus();
}

// rope.scaling.*: config.json's rope_scaling where the row maps YaRN;
// otherwise (and for other types) refused, as ModelConfig cannot express it.
absl::Status ReadRopeScaling(const GgufMetadata& m, const ArchRow& row,
                             json* cfg) {
  const std::string arch = row.name;
  const std::string scaling = arch + ".rope.scaling.type";
  absl::string_view type = "none";
  if (m.Has(scaling)) {
    ASSIGN_OR_RETURN(type, m.GetString(scaling));
  }
  const RopeScalingMap* map = row.rope_scaling;
  if (type == "none") {
    if (map != nullptr) (*cfg)["rope_scaling"] = json::parse(map->plain);
    return absl::OkStatus();
  }
  if (type != "yarn" || map == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        scaling, " '", type, "' is not supported yet",
        map != nullptr ? absl::StrCat(" (", arch, ": none or yarn)") : ""));
  }
  for (const NeutralFloat& k : kYarnNeutral) {
    const std::string key = KeyOf(k.gguf, arch);
    if (!m.Has(key)) continue;
    ASSIGN_OR_RETURN(double v, m.GetFloat(key));
    if (v != k.value) {
      return absl::InvalidArgumentError(
          absl::StrCat(key, " is ", v, "; only ", k.value, " is supported"));
    }
  }
  json yarn = json::parse(map->yarn);
  RETURN_IF_ERROR(CopyKeys(m, arch, map->keys, &yarn));
  (*cfg)["rope_scaling"] = std::move(yarn);
  return absl::OkStatus();
}

// deepseek2: the heads' sizes from the key/value lengths (see
// kDeepseek2Keys), DeepSeek-V2's selection from its groups, and the kv
// heads as DeepSeek's configs have them (llama.cpp writes 1, its MQA view).
absl::Status DeriveDeepseek2(const GgufMetadata& m, absl::string_view arch,
                             json* cfg) {
  if (!cfg->contains("qk_head_dim") || !cfg->contains("v_head_dim")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GGUF metadata lacks ", arch, ".attention.key_length_mla / ",
        "key_length and value_length_mla / value_length (the heads' sizes)"));
  }
  const int64_t qk = (*cfg)["qk_head_dim"].get<int64_t>();
  const int64_t rope = (*cfg)["qk_rope_head_dim"].get<int64_t>();
  if (qk <= rope) {
    return absl::InvalidArgumentError(absl::StrCat(
        arch, ".attention.key_length(_mla) is ", qk, ", not more than ", arch,
        ".rope.dimension_count ", rope));
  }
  (*cfg)["qk_nope_head_dim"] = qk - rope;
  cfg->erase("qk_head_dim");
  (*cfg)["num_key_value_heads"] = (*cfg)["num_attention_heads"];
  if ((*cfg)["scoring_func"] == "softmax") {
    (*cfg)["topk_method"] = (*cfg)["n_group"].get<int64_t>() > 1
                                ? "group_limited_greedy"
                                : "greedy";
  }
  json& yarn = (*cfg)["rope_scaling"];
  if (yarn.is_object() && yarn.contains("mscale_all_dim")) {
    yarn["mscale"] = yarn["mscale_all_dim"];
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelFamily> GgufModelFamily(const GgufMetadata& m) {
  ASSIGN_OR_RETURN(const ArchRow* row, FindArch(m));
  return row->family;
}

absl::StatusOr<ModelConfig> ModelConfigFromGguf(
    const GgufMetadata& m, absl::Span<const GgufTensorInfo> tensors) {
  ASSIGN_OR_RETURN(const ArchRow* row, FindArch(m));
  const std::string arch = row->name;
  json cfg = json::parse(row->fixed);
  cfg["model_type"] = std::string(ModelFamilyName(row->family));
  RETURN_IF_ERROR(CopyKeys(m, arch, kCommonKeys, &cfg));
  RETURN_IF_ERROR(CopyKeys(m, arch, row->keys, &cfg));
  RETURN_IF_ERROR(CheckExpected(m, arch, row->expected));
  if (row->nextn_in_block_count)
    RETURN_IF_ERROR(SubtractNextnLayers(arch, &cfg));
  if (!cfg.contains("vocab_size") && m.Has("tokenizer.ggml.tokens")) {
    ASSIGN_OR_RETURN(auto tokens, m.GetStringArray("tokenizer.ggml.tokens"));
    cfg["vocab_size"] = static_cast<int64_t>(tokens.size());
  }
  bool has_output = false;
  for (const GgufTensorInfo& t : tensors)
    has_output |= t.name == "output.weight";
  cfg["tie_word_embeddings"] = !has_output;
  for (const TensorFlag& f : row->flags) {
    bool present = false;
    for (const GgufTensorInfo& t : tensors) {
      present |= t.name == f.tensor || (f.fused != nullptr && t.name == f.fused);
    }
    cfg[f.config] = present;
  }
  RETURN_IF_ERROR(ReadRopeScaling(m, *row, &cfg));
  RETURN_IF_ERROR(ReadRopeDims(m, *row, &cfg));
  if (row->derive != nullptr) RETURN_IF_ERROR(row->derive(m, arch, &cfg));
  absl::StatusOr<ModelConfig> config = ParseModelConfig(cfg.dump());
  if (!config.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GGUF metadata (as config.json fields): ", config.status().message()));
  }
  const std::string rope_dims = arch + ".rope.dimension_count";
  if (row->rope_dims == RopeDims::kPartial && m.Has(rope_dims) &&
      config->rotary_dim != *m.GetInt(rope_dims)) {
    return absl::InvalidArgumentError(absl::StrCat(
        rope_dims, " is ", *m.GetInt(rope_dims), ", which a head of ",
        config->head_dim, " cannot rotate exactly"));
  }
  return config;
}

}  // namespace moe
