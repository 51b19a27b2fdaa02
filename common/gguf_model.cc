#include "common/gguf_model.h"

#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/logging.h"
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
    {"%s.attention.layer_norm_rms_epsilon", "rms_norm_eps", Kind::kFloat, false},
    {"%s.rope.freq_base", "rope_theta", Kind::kFloat, false},
    {"%s.vocab_size", "vocab_size", Kind::kInt, false},
    {"tokenizer.ggml.bos_token_id", "bos_token_id", Kind::kInt, false},
    {"tokenizer.ggml.eos_token_id", "eos_token_id", Kind::kInt, false},
    {"tokenizer.ggml.padding_token_id", "pad_token_id", Kind::kInt, false},
};

constexpr KeyMap kMixtralKeys[] = {
    {"%s.expert_count", "num_local_experts", Kind::kInt, true},
};

constexpr KeyMap kQwen3MoeKeys[] = {
    {"%s.expert_count", "num_experts", Kind::kInt, true},
    {"%s.expert_feed_forward_length", "moe_intermediate_size", Kind::kInt, true},
    {"%s.attention.key_length", "head_dim", Kind::kInt, false},
    {"%s.expert_weights_norm", "norm_topk_prob", Kind::kBool, false},
};

absl::Status CopyKeys(const GgufMetadata& m, absl::string_view arch,
                      absl::Span<const KeyMap> keys, json* out) {
  for (const KeyMap& k : keys) {
    const std::string key = absl::StrReplaceAll(k.gguf, {{"%s", arch}});
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

// Refuses what the metadata says that ModelConfig cannot express yet.
absl::Status CheckUnsupported(const GgufMetadata& m, absl::string_view arch,
                              const json& cfg) {
  const std::string scaling = absl::StrCat(arch, ".rope.scaling.type");
  if (m.Has(scaling)) {
    ASSIGN_OR_RETURN(absl::string_view type, m.GetString(scaling));
    if (type != "none") {
      return absl::InvalidArgumentError(
          absl::StrCat(scaling, " '", type, "' is not supported yet"));
    }
  }
  const std::string rope_dims = absl::StrCat(arch, ".rope.dimension_count");
  if (m.Has(rope_dims) && cfg.contains("hidden_size")) {
    ASSIGN_OR_RETURN(int64_t dims, m.GetInt(rope_dims));
    const int64_t heads = cfg["num_attention_heads"].get<int64_t>();
    const int64_t head_dim = cfg.contains("head_dim")
                                 ? cfg["head_dim"].get<int64_t>()
                                 : (heads > 0 ? cfg["hidden_size"].get<int64_t>() / heads : 0);
    if (dims != head_dim) {
      return absl::InvalidArgumentError(absl::StrCat(
          rope_dims, " is ", dims, " but heads are ", head_dim,
          " wide; partial rotary is not supported for ", arch));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelFamily> GgufModelFamily(const GgufMetadata& m) {
  ASSIGN_OR_RETURN(absl::string_view arch, m.GetString("general.architecture"));
  if (arch == "qwen3moe") return ModelFamily::kQwen3Moe;
  if (arch == "llama") {
    if (!m.Has("llama.expert_count")) {
      return absl::InvalidArgumentError(
          "GGUF architecture 'llama' without llama.expert_count is a dense "
          "model; only MoE models (Mixtral) are supported");
    }
    return ModelFamily::kMixtral;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "GGUF architecture '", arch, "' is not supported (qwen3moe, llama with experts)"));
}

absl::StatusOr<ModelConfig> ModelConfigFromGguf(
    const GgufMetadata& m, absl::Span<const GgufTensorInfo> tensors) {
  ASSIGN_OR_RETURN(ModelFamily family, GgufModelFamily(m));
  const std::string arch(*m.GetString("general.architecture"));
  json cfg = json::object();
  cfg["model_type"] = std::string(ModelFamilyName(family));
  RETURN_IF_ERROR(CopyKeys(m, arch, kCommonKeys, &cfg));
  if (family == ModelFamily::kMixtral) {
    RETURN_IF_ERROR(CopyKeys(m, arch, kMixtralKeys, &cfg));
  } else {
    cfg["norm_topk_prob"] = true;  // llama.cpp's qwen3moe graph normalises
    RETURN_IF_ERROR(CopyKeys(m, arch, kQwen3MoeKeys, &cfg));
  }
  if (!cfg.contains("vocab_size") && m.Has("tokenizer.ggml.tokens")) {
    ASSIGN_OR_RETURN(auto tokens, m.GetStringArray("tokenizer.ggml.tokens"));
    cfg["vocab_size"] = static_cast<int64_t>(tokens.size());
  }
  bool has_output = false;
  for (const GgufTensorInfo& t : tensors) has_output |= t.name == "output.weight";
  cfg["tie_word_embeddings"] = !has_output;
  RETURN_IF_ERROR(CheckUnsupported(m, arch, cfg));
  absl::StatusOr<ModelConfig> config = ParseModelConfig(cfg.dump());
  if (!config.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GGUF metadata (as config.json fields): ", config.status().message()));
  }
  return config;
}

std::string GgufName::ForExpert(int expert) const {
  MOE_CHECK(stacked_experts) << ours;
  return absl::StrReplaceAll(ours, {{"{expert}", absl::StrCat(expert)}});
}

namespace {

// llama.cpp's per-layer names (after "blk.N.") and ours (after
// "model.layers.N."). Expert entries are completed from the family row.
struct LayerName {
  const char* gguf;
  const char* ours;
  bool rope_permuted_in_llama;
};

constexpr LayerName kLayerNames[] = {
    {"attn_norm.weight", "input_layernorm.weight", false},
    {"ffn_norm.weight", "post_attention_layernorm.weight", false},
    {"attn_q.weight", "self_attn.q_proj.weight", true},
    {"attn_k.weight", "self_attn.k_proj.weight", true},
    {"attn_v.weight", "self_attn.v_proj.weight", false},
    {"attn_output.weight", "self_attn.o_proj.weight", false},
    {"attn_q_norm.weight", "self_attn.q_norm.weight", false},
    {"attn_k_norm.weight", "self_attn.k_norm.weight", false},
};

// gate, up, down as llama.cpp names them.
constexpr const char* kExpertKinds[3] = {"ffn_gate", "ffn_up", "ffn_down"};

absl::StatusOr<GgufName> MapLayerTensor(ModelFamily family, int layer,
                                        absl::string_view rest) {
  const FamilyTraits& traits = TraitsOf(family);
  const std::string prefix = absl::StrCat("model.layers.", layer, ".");
  const std::string moe = absl::StrCat(prefix, traits.moe_block, ".");
  GgufName out;
  out.layer = layer;
  for (const LayerName& n : kLayerNames) {
    if (rest != n.gguf) continue;
    const bool qk_norm = absl::StartsWith(rest, "attn_q_norm") ||
                         absl::StartsWith(rest, "attn_k_norm");
    if (qk_norm && family != ModelFamily::kQwen3Moe) break;
    out.ours = prefix + n.ours;
    out.rope_permuted = n.rope_permuted_in_llama && family == ModelFamily::kMixtral;
    return out;
  }
  if (rest == "ffn_gate_inp.weight") {
    out.ours = absl::StrCat(moe, traits.router_name, ".weight");
    return out;
  }
  for (int k = 0; k < 3; ++k) {
    const std::string kind = kExpertKinds[k];
    if (rest == kind + "_exps.weight") {
      out.ours = absl::StrCat(moe, "experts.{expert}.", traits.expert_names[k], ".weight");
      out.stacked_experts = true;
      return out;
    }
    // Older per-expert files: ffn_gate.E.weight.
    std::vector<absl::string_view> parts = absl::StrSplit(rest, '.');
    int expert = 0;
    if (parts.size() == 3 && parts[0] == kind && parts[2] == "weight" &&
        absl::SimpleAtoi(parts[1], &expert) && expert >= 0) {
      out.ours = absl::StrCat(moe, "experts.", expert, ".", traits.expert_names[k], ".weight");
      return out;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "GGUF tensor 'blk.", layer, ".", rest, "' has no counterpart in a ",
      ModelFamilyName(family), " model"));
}

}  // namespace

absl::StatusOr<GgufName> MapGgufTensorName(ModelFamily family,
                                           absl::string_view gguf_name) {
  GgufName out;
  if (gguf_name == "token_embd.weight") {
    out.ours = "model.embed_tokens.weight";
    return out;
  }
  if (gguf_name == "output_norm.weight") {
    out.ours = "model.norm.weight";
    return out;
  }
  if (gguf_name == "output.weight") {
    out.ours = "lm_head.weight";
    return out;
  }
  if (family != ModelFamily::kMixtral && family != ModelFamily::kQwen3Moe) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GGUF tensor names are not mapped for ", ModelFamilyName(family), " yet"));
  }
  int layer = -1;
  if (absl::StartsWith(gguf_name, "blk.")) {
    absl::string_view rest = gguf_name.substr(4);
    size_t dot = rest.find('.');
    if (dot != absl::string_view::npos && absl::SimpleAtoi(rest.substr(0, dot), &layer) &&
        layer >= 0) {
      return MapLayerTensor(family, layer, rest.substr(dot + 1));
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "GGUF tensor '", gguf_name, "' has no counterpart in a ", ModelFamilyName(family),
      " model"));
}

void UndoLlamaRopePermutation(const uint8_t* in, int64_t heads, int64_t head_dim,
                              size_t row_bytes, uint8_t* out) {
  MOE_CHECK(head_dim % 2 == 0) << head_dim;
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t j = 0; j < 2; ++j) {
      for (int64_t i = 0; i < half; ++i) {
        const int64_t hf = h * head_dim + j * half + i;
        const int64_t gguf = h * head_dim + 2 * i + j;
        std::memcpy(out + hf * row_bytes, in + gguf * row_bytes, row_bytes);
      }
    }
  }
}

}  // namespace moe
