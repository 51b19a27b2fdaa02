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
// config.json field it becomes.
struct KeyMap {
  const char* gguf;    // "%s" stands for the architecture
  const char* config;  // Hugging Face config.json field
  Kind kind;
  bool required;
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

// A key whose value must be the one the family runs (llama.cpp's enums).
struct ExpectedInt {
  const char* gguf;
  int64_t value;
  const char* meaning;
};

// llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE: 1 softmax, 2 sigmoid.
constexpr ExpectedInt kGlm4MoeExpected[] = {
    {"%s.expert_gating_func", 2, "sigmoid"}};

// A config.json bool that llama.cpp leaves to the tensors: true when the
// file holds `tensor`.
struct TensorFlag {
  const char* tensor;
  const char* config;
};

constexpr TensorFlag kQwen2MoeFlags[] = {{"blk.0.attn_q.bias", "qkv_bias"}};
constexpr TensorFlag kGlm4MoeFlags[] = {
    {"blk.0.attn_q.bias", "attention_bias"},
    {"blk.0.attn_q_norm.weight", "use_qk_norm"}};

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
  // rope.dimension_count gives partial_rotary_factor; otherwise it must be
  // the head width.
  bool partial_rotary = false;
  // block_count counts the nextn (MTP) layers after the decoder's.
  bool nextn_in_block_count = false;
  // The name is also written for dense models (llama): expert_count tells.
  bool dense_without_experts = false;
};

// clang-format off
const ArchRow kArchs[] = {
    {"llama", ModelFamily::kMixtral, kMixtralKeys, "{}", {}, {},
     /*partial_rotary=*/false, /*nextn_in_block_count=*/false,
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
     kGlm4MoeExpected, kGlm4MoeFlags,
     /*partial_rotary=*/true, /*nextn_in_block_count=*/true},
};
// clang-format on

std::string KeyOf(const char* pattern, absl::string_view arch) {
  return absl::StrReplaceAll(pattern, {{"%s", arch}});
}

absl::StatusOr<const ArchRow*> FindArch(const GgufMetadata& m) {
  ASSIGN_OR_RETURN(absl::string_view arch, m.GetString("general.architecture"));
  for (const ArchRow& row : kArchs) {
    if (arch != row.name) continue;
    const std::string experts = KeyOf("%s.expert_count", arch);
    if (row.dense_without_experts && !m.Has(experts)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "GGUF architecture '", arch, "' without ", experts,
          " is a dense model; only MoE models (Mixtral) are supported"));
    }
    return &row;
  }
  std::vector<std::string> names;
  for (const ArchRow& row : kArchs) {
    names.push_back(row.dense_without_experts
                        ? absl::StrCat(row.name, " with experts")
                        : std::string(row.name));
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
        ASSIGN_OR_RETURN((*out)[k.config], m.GetFloat(key));
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
  if (!m.Has(key)) return absl::OkStatus();
  ASSIGN_OR_RETURN(int64_t dims, m.GetInt(key));
  const int64_t head_dim = HeadDimOf(*cfg);
  if (row.partial_rotary && dims > 0 && dims <= head_dim) {
    (*cfg)["partial_rotary_factor"] =
        static_cast<double>(dims) / static_cast<double>(head_dim);
    return absl::OkStatus();
  }
  if (dims != head_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        key, " is ", dims, " but heads are ", head_dim, " wide; ",
        row.partial_rotary
            ? "it must be in [1, head width]"
            : absl::StrCat("partial rotary is not supported for ", row.name)));
  }
  return absl::OkStatus();
}

// Refuses what the metadata says that ModelConfig cannot express yet.
absl::Status CheckRopeScaling(const GgufMetadata& m, absl::string_view arch) {
  const std::string scaling = absl::StrCat(arch, ".rope.scaling.type");
  if (!m.Has(scaling)) return absl::OkStatus();
  ASSIGN_OR_RETURN(absl::string_view type, m.GetString(scaling));
  if (type != "none") {
    return absl::InvalidArgumentError(
        absl::StrCat(scaling, " '", type, "' is not supported yet"));
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
    for (const GgufTensorInfo& t : tensors) present |= t.name == f.tensor;
    cfg[f.config] = present;
  }
  RETURN_IF_ERROR(CheckRopeScaling(m, arch));
  RETURN_IF_ERROR(ReadRopeDims(m, *row, &cfg));
  absl::StatusOr<ModelConfig> config = ParseModelConfig(cfg.dump());
  if (!config.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GGUF metadata (as config.json fields): ", config.status().message()));
  }
  const std::string rope_dims = arch + ".rope.dimension_count";
  if (row->partial_rotary && m.Has(rope_dims) &&
      config->rotary_dim != *m.GetInt(rope_dims)) {
    return absl::InvalidArgumentError(absl::StrCat(
        rope_dims, " is ", *m.GetInt(rope_dims), ", which a head of ",
        config->head_dim, " cannot rotate exactly"));
  }
  return config;
}

}  // namespace moe
