#include "common/model_config.h"

#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/config_reader.h"
#include "common/file_util.h"
#include "common/family_fields.h"
#include "common/fp8.h"
#include "common/gguf.h"
#include "common/gguf_model.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace moe {
namespace {

using nlohmann::json;

// Limits that keep every product of two sizes far from int64 overflow.
constexpr int64_t kMaxWidth = int64_t{1}
                              << 24;  // hidden, ffn, vocab, q/kv dims
constexpr int64_t kMaxCount = int64_t{1} << 16;  // layers, heads, experts
constexpr int64_t kMaxPositions = int64_t{1} << 40;

// The bounds of every integer field, checked as it is read and again by
// ValidateModelConfig (configs built in code). Relations between fields
// (top_k <= num_experts, token ids inside the vocabulary, ...) are checked
// after reading, when every operand is known to be in range.
struct IntField {
  const char* name;
  int64_t lo, hi;
};
constexpr IntField kIntFields[] = {
    {"hidden_size", 1, kMaxWidth},
    {"num_hidden_layers", 1, kMaxCount},
    {"num_attention_heads", 1, kMaxCount},
    {"num_key_value_heads", 1, kMaxCount},
    {"head_dim", 1, kMaxWidth},
    {"vocab_size", 1, kMaxWidth},
    {"intermediate_size", 0, kMaxWidth},  // 0: no dense MLP
    {"moe_intermediate_size", 1, kMaxWidth},
    {"shared_expert_intermediate_size", 1, kMaxWidth},
    {"num_experts", 1, kMaxCount},
    {"num_experts_per_tok", 1, kMaxCount},
    {"max_position_embeddings", 1, kMaxPositions},
    {"decoder_sparse_step", 1, kMaxCount},
    {"mlp_only_layers", 0, kMaxCount},
    {"sliding_window", 0, kMaxPositions},
    {"bos_token_id", 0, kMaxWidth},
    {"eos_token_id", 0, kMaxWidth},
    {"pad_token_id", 0, kMaxWidth},
    {"q_lora_rank", 0, kMaxWidth},  // 0: plain q_proj
    {"kv_lora_rank", 1, kMaxWidth},
    {"qk_nope_head_dim", 1, kMaxWidth},
    {"qk_rope_head_dim", 2, kMaxWidth},
    {"v_head_dim", 1, kMaxWidth},
    {"n_shared_experts", 0, kMaxCount},
    {"first_k_dense_replace", 0, kMaxCount},
    {"moe_layer_freq", 1, kMaxCount},
    {"n_group", 1, kMaxCount},
    {"topk_group", 1, kMaxCount},
    {"initial_context_length", 1, kMaxPositions},
    {"num_nextn_predict_layers", 0, kMaxCount},
    {"rope_scaling.original_max_position_embeddings", 1, kMaxPositions},
};

using config_internal::CheckIntField;
using config_internal::CheckRange;
using config_internal::FieldReader;

void ReadRope(FieldReader& r, const json& j, double def_theta, ModelConfig* c) {
  c->rope_theta = def_theta;
  auto type_of = [&](const json& obj) {
    for (const char* k : {"rope_type", "type"}) {
      auto it = obj.find(k);
      if (it != obj.end() && it->is_string() && *it != "default")
        return it->get<std::string>();
    }
    return std::string();
  };
  if (const json* params = r.Find("rope_parameters"); params != nullptr) {
    if (!params->is_object())
      return r.Fail("rope_parameters must be an object");
    auto theta = params->find("rope_theta");
    if (theta != params->end() && theta->is_number())
      c->rope_theta = theta->get<double>();
    c->rope_scaling_type = type_of(*params);
  }
  c->rope_theta = r.Double("rope_theta", c->rope_theta);
  if (const json* scaling = r.Find("rope_scaling"); scaling != nullptr) {
    if (!scaling->is_object())
      return r.Fail("rope_scaling must be an object or null");
    c->rope_scaling_type = type_of(*scaling);
  }
}

absl::Status CheckTokenId(const char* name, int64_t id, int64_t vocab) {
  if (id < 0 || id >= vocab) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, " ", id, " is outside the vocabulary [0, ", vocab, ")"));
  }
  return absl::OkStatus();
}

bool UsesDenseIntermediate(const ModelConfig& c) {
  if (c.traits().experts_use_intermediate_size) return true;
  for (bool moe : c.moe_layer) {
    if (!moe) return true;
  }
  return false;
}

}  // namespace

namespace config_internal {

IntBounds IntFieldBounds(absl::string_view field) {
  for (const IntField& f : kIntFields) {
    if (field == f.name) return {f.lo, f.hi};
  }
  MOE_CHECK(false) << "no bounds declared for config field " << field;
  return {0, 0};
}

absl::Status CheckRange(absl::string_view name, int64_t v, int64_t lo,
                        int64_t hi) {
  if (v < lo) {
    return absl::InvalidArgumentError(absl::StrCat(
        name,
        lo == 1 ? " must be positive" : absl::StrCat(" must be at least ", lo),
        ", got ", v));
  }
  if (v > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " is ", v, ", more than the supported ", hi));
  }
  return absl::OkStatus();
}

absl::Status CheckIntField(absl::string_view field, int64_t v) {
  const IntBounds b = IntFieldBounds(field);
  return CheckRange(field, v, b.lo, b.hi);
}

}  // namespace config_internal

int ModelConfig::MoeLayerIndex(int layer) const {
  if (layer < 0 || layer >= static_cast<int>(moe_layer_index.size())) return -1;
  return moe_layer_index[layer];
}

int ModelConfig::LayerOfMoeLayer(int moe_index) const {
  MOE_CHECK(moe_index >= 0 && moe_index < num_moe_layers())
      << "MoE layer " << moe_index << " out of range";
  return moe_layers[moe_index];
}

namespace {

absl::StatusOr<ModelConfig> Parse(absl::string_view text,
                                  std::vector<std::string>* int_keys) {
  json j = json::parse(text.begin(), text.end(), nullptr,
                       /*allow_exceptions=*/false);
  if (j.is_discarded())
    return absl::InvalidArgumentError("config is not valid JSON");
  if (!j.is_object())
    return absl::InvalidArgumentError("config is not a JSON object");
  FieldReader r(j);
  r.RecordIntKeysForTest(int_keys);
  if (!r.Has("model_type"))
    return absl::InvalidArgumentError("config has no \"model_type\"");
  std::string model_type = r.String("model_type", "");
  RETURN_IF_ERROR(r.status());
  ModelConfig c;
  ASSIGN_OR_RETURN(c.family, ParseModelFamily(model_type));
  const FamilyDefaults& d = c.traits().defaults;

  if (const json* arch = r.Find("architectures"); arch != nullptr) {
    if (!arch->is_array())
      return absl::InvalidArgumentError("architectures must be a list");
    for (const json& a : *arch) {
      if (a.is_string()) c.architectures.push_back(a.get<std::string>());
    }
  }
  c.hidden_size = r.Int("hidden_size", d.hidden_size);
  c.num_hidden_layers = r.Int("num_hidden_layers", d.num_hidden_layers);
  c.num_attention_heads = r.Int("num_attention_heads", d.num_attention_heads);
  c.num_key_value_heads = r.Int(
      "num_key_value_heads", d.num_key_value_heads > 0 ? d.num_key_value_heads
                                                       : c.num_attention_heads);
  c.head_dim = r.Int("head_dim", c.num_attention_heads > 0
                                     ? c.hidden_size / c.num_attention_heads
                                     : 0);
  // transformers' OLMoE ignores `head_dim` (ValidateModelConfig insists it
  // matches the split of hidden_size).
  // Latent attention's head sizes are qk_nope/qk_rope/v_head_dim instead;
  // with attention sinks head_dim has its own default.
  bool derived_head_dim =
      (!r.Has("head_dim") || c.family == ModelFamily::kOlmoe) &&
      !c.is_mla() && !c.has_attention_sinks();
  if (derived_head_dim && c.num_attention_heads > 0 &&
      c.hidden_size % c.num_attention_heads != 0) {
    r.Fail(absl::StrCat("hidden_size (", c.hidden_size,
                        ") is not a multiple of ", "num_attention_heads (",
                        c.num_attention_heads,
                        ") and no usable head_dim is given"));
  }
  c.vocab_size = r.Int("vocab_size", d.vocab_size);
  c.intermediate_size = r.Int("intermediate_size", d.intermediate_size);
  c.top_k = r.Int("num_experts_per_tok", d.top_k);
  c.rms_norm_eps = r.Double("rms_norm_eps", d.rms_norm_eps);
  c.max_position_embeddings =
      r.Int("max_position_embeddings", d.max_position_embeddings);
  c.tie_word_embeddings = r.Bool("tie_word_embeddings", false);
  c.bos_token_id = r.OptInt("bos_token_id", d.bos);
  c.eos_token_ids = r.IntOrList("eos_token_id", d.eos);
  c.pad_token_id = r.OptInt("pad_token_id", d.pad);
  c.torch_dtype = r.String("torch_dtype", r.String("dtype", ""));
  std::string act = r.String("hidden_act", "silu");
  if (act != "silu")
    r.Fail(absl::StrCat("hidden_act '", act, "' is not supported (only silu)"));
  ReadRope(r, j, d.rope_theta, &c);
  ReadFamilyFields(r, d, &c);
  // int(head_dim * partial_rotary_factor), as transformers' rope init (the
  // factor is 1 without partial rotary; head_dim is final only now, the
  // latent-attention reader derives it).
  if (r.status().ok()) {
    c.rotary_dim = static_cast<int64_t>(static_cast<double>(c.head_dim) *
                                        c.partial_rotary_factor);
  }
  RETURN_IF_ERROR(r.status());
  if (!c.mxfp4) {  // else the family's reader took it ("mxfp4")
    ASSIGN_OR_RETURN(c.fp8, ParseQuantizationConfig(j));
  }
  RETURN_IF_ERROR(ValidateModelConfig(&c));
  return c;
}

}  // namespace

absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view text) {
  return Parse(text, nullptr);
}

std::vector<std::string> IntKeysReadForTest(absl::string_view text) {
  std::vector<std::string> keys;
  (void)Parse(text, &keys);
  return keys;
}

namespace {

absl::Status CheckSizes(const ModelConfig& c) {
  RETURN_IF_ERROR(CheckIntField("hidden_size", c.hidden_size));
  RETURN_IF_ERROR(CheckIntField("num_hidden_layers", c.num_hidden_layers));
  RETURN_IF_ERROR(CheckIntField("num_attention_heads", c.num_attention_heads));
  RETURN_IF_ERROR(CheckIntField("num_key_value_heads", c.num_key_value_heads));
  RETURN_IF_ERROR(CheckIntField("head_dim", c.head_dim));
  RETURN_IF_ERROR(CheckRange("num_attention_heads * head_dim",
                             c.num_attention_heads * c.head_dim, 1, kMaxWidth));
  RETURN_IF_ERROR(CheckIntField("vocab_size", c.vocab_size));
  RETURN_IF_ERROR(CheckIntField("num_experts", c.num_experts));
  RETURN_IF_ERROR(CheckIntField("num_experts_per_tok", c.top_k));
  RETURN_IF_ERROR(
      CheckIntField("moe_intermediate_size", c.moe_intermediate_size));
  RETURN_IF_ERROR(
      CheckIntField("max_position_embeddings", c.max_position_embeddings));
  RETURN_IF_ERROR(CheckIntField("decoder_sparse_step", c.decoder_sparse_step));
  RETURN_IF_ERROR(CheckIntField("sliding_window", c.sliding_window));
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_attention_heads (", c.num_attention_heads,
                     ") is not a multiple of ", "num_key_value_heads (",
                     c.num_key_value_heads, ")"));
  }
  if (c.family == ModelFamily::kOlmoe &&
      c.head_dim * c.num_attention_heads != c.hidden_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "olmoe requires head_dim * num_attention_heads == hidden_size (",
        c.hidden_size, "), got head_dim ", c.head_dim));
  }
  if (c.top_k > c.num_experts) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_experts_per_tok (", c.top_k,
                     ") exceeds the number of experts (", c.num_experts, ")"));
  }
  if (!(c.rms_norm_eps > 0) || !std::isfinite(c.rms_norm_eps)) {
    return absl::InvalidArgumentError(
        "rms_norm_eps must be a positive finite number");
  }
  if (!(c.rope_theta > 0) || !std::isfinite(c.rope_theta)) {
    return absl::InvalidArgumentError(
        "rope_theta must be a positive finite number");
  }
  if (c.clip_qkv.has_value() && !(*c.clip_qkv > 0)) {
    return absl::InvalidArgumentError("clip_qkv must be positive or null");
  }
  return absl::OkStatus();
}

// Latent attention sizes (what its modeling code assumes).
absl::Status CheckMla(const ModelConfig& c) {
  const MlaConfig& m = c.mla;
  RETURN_IF_ERROR(CheckIntField("q_lora_rank", m.q_lora_rank));
  RETURN_IF_ERROR(CheckIntField("kv_lora_rank", m.kv_lora_rank));
  RETURN_IF_ERROR(CheckIntField("qk_nope_head_dim", m.qk_nope_head_dim));
  RETURN_IF_ERROR(CheckIntField("qk_rope_head_dim", m.qk_rope_head_dim));
  RETURN_IF_ERROR(CheckIntField("v_head_dim", m.v_head_dim));
  RETURN_IF_ERROR(
      CheckRange("num_attention_heads * (qk_nope_head_dim + "
                 "v_head_dim)",
                 c.num_attention_heads * (m.qk_nope_head_dim + m.v_head_dim), 1,
                 kMaxWidth));
  if (m.qk_rope_head_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "qk_rope_head_dim must be even, got ", m.qk_rope_head_dim));
  }
  return absl::OkStatus();
}

// Partial rotary: rope pairs within the first rotary_dim values.
absl::Status CheckRotary(const ModelConfig& c) {
  if (c.rotary_dim < 2 || c.rotary_dim > c.head_dim || c.rotary_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "head_dim * partial_rotary_factor must be even and in [2, head_dim ",
        c.head_dim, "], got ", c.rotary_dim));
  }
  return absl::OkStatus();
}

// The scored router's groups and its shared experts (what the families'
// modeling code assumes).
absl::Status CheckScoredRouter(const ModelConfig& c) {
  RETURN_IF_ERROR(CheckIntField("n_shared_experts", c.n_shared_experts));
  RETURN_IF_ERROR(
      CheckIntField("first_k_dense_replace", c.first_k_dense_replace));
  RETURN_IF_ERROR(CheckIntField("moe_layer_freq", c.moe_layer_freq));
  RETURN_IF_ERROR(CheckIntField("n_group", c.n_group));
  RETURN_IF_ERROR(CheckRange("topk_group", c.topk_group, 1, c.n_group));
  if (!(c.routed_scaling_factor > 0) ||
      !std::isfinite(c.routed_scaling_factor)) {
    return absl::InvalidArgumentError(
        "routed_scaling_factor must be a positive finite number");
  }
  RETURN_IF_ERROR(config_internal::CheckRouterVariant(c));
  if (c.topk_method != TopkMethod::kGreedy) {
    if (c.num_experts % c.n_group != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("n_routed_experts (", c.num_experts,
                       ") is not a multiple of n_group (", c.n_group, ")"));
    }
    const int64_t per_group = c.num_experts / c.n_group;
    if (c.topk_method == TopkMethod::kNoauxTc && per_group < 2) {
      return absl::InvalidArgumentError(
          "noaux_tc scores each group by its top 2 experts: n_group must "
          "leave at least 2 experts per group");
    }
    if (c.top_k > c.topk_group * per_group) {
      return absl::InvalidArgumentError(
          absl::StrCat("num_experts_per_tok (", c.top_k, ") exceeds the ",
                       c.topk_group * per_group, " experts of the topk_group (",
                       c.topk_group, ") groups chosen"));
    }
  }
  if (c.yarn.has_value()) {
    const YarnConfig& y = *c.yarn;
    if (!(y.factor >= 1.0) || !std::isfinite(y.factor)) {
      return absl::InvalidArgumentError(
          "rope_scaling.factor must be a finite number >= 1");
    }
    RETURN_IF_ERROR(
        CheckIntField("rope_scaling.original_max_position_embeddings",
                      y.original_max_position_embeddings));
    if (!(y.beta_fast > 0) || !(y.beta_slow > 0) || !std::isfinite(y.mscale) ||
        !std::isfinite(y.mscale_all_dim)) {
      return absl::InvalidArgumentError(
          "rope_scaling: beta_fast and beta_slow must be positive, mscale and "
          "mscale_all_dim finite");
    }
  }
  return absl::OkStatus();
}

// Fills moe_layer, moe_layers and moe_layer_index (qwen's rule; mixtral and
// olmoe have decoder_sparse_step 1 and no mlp_only_layers).
absl::Status AssignMoeLayers(ModelConfig& c) {
  c.moe_layer.assign(c.num_hidden_layers, false);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    c.moe_layer[i] = c.has_scored_router() ? i >= c.first_k_dense_replace &&
                                           i % c.moe_layer_freq == 0
                                     : (i + 1) % c.decoder_sparse_step == 0;
  }
  for (int64_t layer : c.mlp_only_layers) {
    if (layer < 0 || layer >= c.num_hidden_layers) {
      return absl::InvalidArgumentError(
          absl::StrCat("mlp_only_layers names layer ", layer, ", outside [0, ",
                       c.num_hidden_layers, ")"));
    }
    c.moe_layer[layer] = false;
  }
  c.moe_layers.clear();
  c.moe_layer_index.assign(c.num_hidden_layers, -1);
  for (int i = 0; i < static_cast<int>(c.num_hidden_layers); ++i) {
    if (!c.moe_layer[i]) continue;
    c.moe_layer_index[i] = static_cast<int>(c.moe_layers.size());
    c.moe_layers.push_back(i);
  }
  if (c.num_moe_layers() == 0) {
    return absl::InvalidArgumentError("the config has no MoE layers");
  }
  return absl::OkStatus();
}

absl::Status CheckMlpAndTokens(const ModelConfig& c) {
  RETURN_IF_ERROR(CheckIntField("intermediate_size", c.intermediate_size));
  if (UsesDenseIntermediate(c)) {
    RETURN_IF_ERROR(
        CheckRange("intermediate_size", c.intermediate_size, 1, kMaxWidth));
  }
  if (c.has_shared_expert()) {
    RETURN_IF_ERROR(CheckIntField("shared_expert_intermediate_size",
                                  c.shared_expert_intermediate_size));
  }
  if (c.bos_token_id) {
    RETURN_IF_ERROR(
        CheckTokenId("bos_token_id", *c.bos_token_id, c.vocab_size));
  }
  for (int64_t eos : c.eos_token_ids) {
    RETURN_IF_ERROR(CheckTokenId("eos_token_id", eos, c.vocab_size));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateModelConfig(ModelConfig* config) {
  RETURN_IF_ERROR(CheckSizes(*config));
  if (config->is_mla()) RETURN_IF_ERROR(CheckMla(*config));
  if (config->has_scored_router()) {
    RETURN_IF_ERROR(CheckScoredRouter(*config));
  }
  if (config->has_partial_rotary()) RETURN_IF_ERROR(CheckRotary(*config));
  RETURN_IF_ERROR(config_internal::CheckFamilyFields(*config));
  RETURN_IF_ERROR(AssignMoeLayers(*config));
  return CheckMlpAndTokens(*config);
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& dir) {
  if (absl::EndsWith(dir, ".gguf") && IsRegularFile(dir)) {
    ASSIGN_OR_RETURN(std::unique_ptr<GgufCheckpoint> gguf, GgufCheckpoint::Open(dir));
    absl::StatusOr<ModelConfig> config =
        ModelConfigFromGguf(gguf->metadata(), gguf->tensors());
    if (!config.ok()) {
      return absl::Status(config.status().code(),
                          absl::StrCat(dir, ": ", config.status().message()));
    }
    return config;
  }
  std::string path = JoinPath(dir, "config.json");
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  auto config = ParseModelConfig(text);
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        absl::StrCat(path, ": ", config.status().message()));
  }
  return config;
}

std::string ModelConfigToJson(const ModelConfig& c) {
  nlohmann::ordered_json j;
  j["architectures"] = c.architectures.empty()
                           ? std::vector<std::string>{std::string(
                                 ModelFamilyArchitecture(c.family))}
                           : c.architectures;
  j["model_type"] = std::string(ModelFamilyName(c.family));
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  if (!c.is_mla()) j["head_dim"] = c.head_dim;
  j["vocab_size"] = c.vocab_size;
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  j["rope_scaling"] = nullptr;
  if (c.yarn.has_value()) {
    const YarnConfig& y = *c.yarn;
    j["rope_scaling"] = {{"type", "yarn"},
                         {"factor", y.factor},
                         {"original_max_position_embeddings",
                          y.original_max_position_embeddings},
                         {"beta_fast", y.beta_fast},
                         {"beta_slow", y.beta_slow},
                         {"mscale", y.mscale},
                         {"mscale_all_dim", y.mscale_all_dim}};
  }
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["num_experts_per_tok"] = c.top_k;
  config_internal::FamilyFieldsToJson(c, j);
  j["bos_token_id"] = c.bos_token_id ? json(*c.bos_token_id) : json(nullptr);
  if (c.eos_token_ids.size() == 1) {
    j["eos_token_id"] = c.eos_token_ids[0];
  } else {
    j["eos_token_id"] =
        c.eos_token_ids.empty() ? json(nullptr) : json(c.eos_token_ids);
  }
  j["pad_token_id"] = c.pad_token_id ? json(*c.pad_token_id) : json(nullptr);
  j["torch_dtype"] = c.torch_dtype.empty() ? "float32" : c.torch_dtype;
  if (c.fp8) j["quantization_config"] = QuantizationConfigJson(*c.fp8);
  j["use_cache"] = true;
  return j.dump(2) + "\n";
}

}  // namespace moe
