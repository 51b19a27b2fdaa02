#include "common/model_config.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/fp8.h"
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

// transformers' defaults for the fields we read (configuration_<family>.py).
struct FamilyDefaults {
  int64_t vocab_size, hidden_size, intermediate_size, num_hidden_layers;
  int64_t num_attention_heads, num_key_value_heads;  // 0: = heads
  int64_t max_position_embeddings;
  double rms_norm_eps, rope_theta;
  int64_t num_experts, top_k, moe_intermediate_size,
      shared_expert_intermediate_size;
  std::optional<int64_t> bos, pad;
  std::vector<int64_t> eos;
};

FamilyDefaults DefaultsFor(ModelFamily family) {
  switch (family) {
    case ModelFamily::kMixtral:
      return {32000, 4096, 14336, 32, 32, 8, 4096 * 32, 1e-5,
              1e6,   8,    2,     0,  0,  1, {},        {2}};
    case ModelFamily::kQwen2Moe:
      return {151936, 2048, 5632, 24,   16,   16, 32768, 1e-6,
              1e4,    60,   4,    1408, 5632, {}, {},    {}};
    case ModelFamily::kQwen3Moe:
      return {151936, 2048, 6144, 24,  32, 4,  32768, 1e-6,
              1e4,    128,  8,    768, 0,  {}, {},    {}};
    case ModelFamily::kOlmoe:
      return {50304, 2048, 2048, 16, 16, 0,  4096, 1e-5,
              1e4,   64,   8,    0,  0,  {}, 1,    {50279}};
  }
  MOE_CHECK(false) << "unreachable";
  return {};
}

// Reads typed fields; a missing or null field gives the default. The first
// type error is kept in status() and later reads are no-ops.
class FieldReader {
 public:
  explicit FieldReader(const json& j) : j_(j) {}
  const absl::Status& status() const { return status_; }

  const json* Find(const char* key) const {
    auto it = j_.find(key);
    return (it == j_.end() || it->is_null()) ? nullptr : &*it;
  }
  bool Has(const char* key) const { return Find(key) != nullptr; }

  int64_t Int(const char* key, int64_t def) {
    const json* v = Find(key);
    if (v == nullptr || !status_.ok()) return def;
    return ToInt(key, *v, def);
  }
  // Token ids: missing gives `def`, an explicit null gives none (as
  // transformers, where null overrides the default).
  std::optional<int64_t> OptInt(const char* key, std::optional<int64_t> def) {
    if (IsExplicitNull(key)) return std::nullopt;
    if (!Has(key)) return def;
    return Int(key, 0);
  }
  bool IsExplicitNull(const char* key) const {
    auto it = j_.find(key);
    return it != j_.end() && it->is_null();
  }
  double Double(const char* key, double def) {
    const json* v = Find(key);
    if (v == nullptr || !status_.ok()) return def;
    if (!v->is_number()) return Fail(key, "must be a number", def);
    return v->get<double>();
  }
  bool Bool(const char* key, bool def) {
    const json* v = Find(key);
    if (v == nullptr || !status_.ok()) return def;
    if (!v->is_boolean()) return Fail(key, "must be true or false", def);
    return v->get<bool>();
  }
  std::string String(const char* key, std::string def) {
    const json* v = Find(key);
    if (v == nullptr || !status_.ok()) return def;
    if (!v->is_string()) return Fail(key, "must be a string", def);
    return v->get<std::string>();
  }
  // An int or a list of ints (eos_token_id); `null` or missing gives `def`.
  std::vector<int64_t> IntOrList(const char* key, std::vector<int64_t> def) {
    if (IsExplicitNull(key)) return {};
    const json* v = Find(key);
    if (v == nullptr || !status_.ok()) return def;
    if (!v->is_array()) return {ToInt(key, *v, 0)};
    std::vector<int64_t> out;
    for (const json& e : *v) out.push_back(ToInt(key, e, 0));
    return out;
  }
  std::vector<int64_t> IntList(const char* key) {
    const json* v = Find(key);
    if (v == nullptr || !status_.ok()) return {};
    if (!v->is_array())
      return Fail(key, "must be a list of integers", std::vector<int64_t>{});
    return IntOrList(key, {});
  }
  void Fail(const std::string& message) {
    if (status_.ok()) status_ = absl::InvalidArgumentError(message);
  }

 private:
  template <typename T>
  T Fail(const char* key, const char* what, T def) {
    Fail(absl::StrCat(key, " ", what));
    return def;
  }
  int64_t ToInt(const char* key, const json& v, int64_t def) {
    if (v.is_number_integer() &&
        !(v.is_number_unsigned() && v.get<uint64_t>() > INT64_MAX)) {
      return v.get<int64_t>();
    }
    return Fail(key, absl::StrCat("must be an integer, got ", v.dump()).c_str(),
                def);
  }

  const json& j_;
  absl::Status status_;
};

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

// Fields whose meaning differs between families.
void ReadFamilyFields(FieldReader& r, const FamilyDefaults& d, ModelConfig* c) {
  switch (c->family) {
    case ModelFamily::kMixtral:
      c->num_experts =
          r.Int("num_local_experts", r.Int("num_experts", d.num_experts));
      c->moe_intermediate_size = c->intermediate_size;
      c->norm_topk_prob = true;  // MixtralSparseMoeBlock always renormalises
      c->sliding_window = r.Int("sliding_window", 0);
      break;
    case ModelFamily::kQwen2Moe:
    case ModelFamily::kQwen3Moe: {
      bool qwen2 = c->family == ModelFamily::kQwen2Moe;
      c->num_experts =
          r.Int("num_experts", r.Int("num_local_experts", d.num_experts));
      c->moe_intermediate_size =
          r.Int("moe_intermediate_size", d.moe_intermediate_size);
      c->norm_topk_prob = r.Bool("norm_topk_prob", false);
      c->decoder_sparse_step = r.Int("decoder_sparse_step", 1);
      c->mlp_only_layers = r.IntList("mlp_only_layers");
      if (r.Bool("use_sliding_window", false))
        c->sliding_window = r.Int("sliding_window", 4096);
      if (qwen2) {
        c->shared_expert_intermediate_size =
            r.Int("shared_expert_intermediate_size",
                  d.shared_expert_intermediate_size);
        c->qkv_bias = r.Bool("qkv_bias", true);
      } else {
        c->qkv_bias = c->o_bias = r.Bool("attention_bias", false);
        c->qk_norm = QkNorm::kPerHead;
      }
      break;
    }
    case ModelFamily::kOlmoe:
      c->num_experts =
          r.Int("num_experts", r.Int("num_local_experts", d.num_experts));
      c->moe_intermediate_size = c->intermediate_size;
      c->norm_topk_prob = r.Bool("norm_topk_prob", false);
      c->qkv_bias = c->o_bias = r.Bool("attention_bias", false);
      c->qk_norm = QkNorm::kFull;
      if (r.Has("clip_qkv")) c->clip_qkv = r.Double("clip_qkv", 0);
      break;
  }
}

absl::Status CheckRange(const char* name, int64_t v, int64_t lo, int64_t hi) {
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

absl::Status CheckTokenId(const char* name, int64_t id, int64_t vocab) {
  if (id < 0 || id >= vocab) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, " ", id, " is outside the vocabulary [0, ", vocab, ")"));
  }
  return absl::OkStatus();
}

bool UsesDenseIntermediate(const ModelConfig& c) {
  if (c.family == ModelFamily::kMixtral || c.family == ModelFamily::kOlmoe)
    return true;
  for (bool moe : c.moe_layer) {
    if (!moe) return true;
  }
  return false;
}

}  // namespace

absl::string_view ModelFamilyName(ModelFamily family) {
  switch (family) {
    case ModelFamily::kMixtral:
      return "mixtral";
    case ModelFamily::kQwen2Moe:
      return "qwen2_moe";
    case ModelFamily::kQwen3Moe:
      return "qwen3_moe";
    case ModelFamily::kOlmoe:
      return "olmoe";
  }
  return "?";
}

absl::string_view ModelFamilyArchitecture(ModelFamily family) {
  switch (family) {
    case ModelFamily::kMixtral:
      return "MixtralForCausalLM";
    case ModelFamily::kQwen2Moe:
      return "Qwen2MoeForCausalLM";
    case ModelFamily::kQwen3Moe:
      return "Qwen3MoeForCausalLM";
    case ModelFamily::kOlmoe:
      return "OlmoeForCausalLM";
  }
  return "?";
}

absl::StatusOr<ModelFamily> ParseModelFamily(absl::string_view model_type) {
  for (ModelFamily f : {ModelFamily::kMixtral, ModelFamily::kQwen2Moe,
                        ModelFamily::kQwen3Moe, ModelFamily::kOlmoe}) {
    if (ModelFamilyName(f) == model_type) return f;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported model_type '", std::string(model_type),
                   "' (supported: mixtral, qwen2_moe, qwen3_moe, olmoe)"));
}

int ModelConfig::MoeLayerIndex(int layer) const {
  if (layer < 0 || layer >= static_cast<int>(moe_layer_index.size())) return -1;
  return moe_layer_index[layer];
}

int ModelConfig::LayerOfMoeLayer(int moe_index) const {
  MOE_CHECK(moe_index >= 0 && moe_index < num_moe_layers())
      << "MoE layer " << moe_index << " out of range";
  return moe_layers[moe_index];
}

absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view text) {
  json j = json::parse(text.begin(), text.end(), nullptr,
                       /*allow_exceptions=*/false);
  if (j.is_discarded())
    return absl::InvalidArgumentError("config is not valid JSON");
  if (!j.is_object())
    return absl::InvalidArgumentError("config is not a JSON object");
  FieldReader r(j);
  if (!r.Has("model_type"))
    return absl::InvalidArgumentError("config has no \"model_type\"");
  std::string model_type = r.String("model_type", "");
  RETURN_IF_ERROR(r.status());
  ModelConfig c;
  ASSIGN_OR_RETURN(c.family, ParseModelFamily(model_type));
  const FamilyDefaults d = DefaultsFor(c.family);

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
  bool derived_head_dim = !r.Has("head_dim") || c.family == ModelFamily::kOlmoe;
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
  RETURN_IF_ERROR(r.status());
  ASSIGN_OR_RETURN(c.fp8, ParseQuantizationConfig(j));
  RETURN_IF_ERROR(ValidateModelConfig(&c));
  return c;
}

namespace {

absl::Status CheckSizes(const ModelConfig& c) {
  RETURN_IF_ERROR(CheckRange("hidden_size", c.hidden_size, 1, kMaxWidth));
  RETURN_IF_ERROR(
      CheckRange("num_hidden_layers", c.num_hidden_layers, 1, kMaxCount));
  RETURN_IF_ERROR(
      CheckRange("num_attention_heads", c.num_attention_heads, 1, kMaxCount));
  RETURN_IF_ERROR(
      CheckRange("num_key_value_heads", c.num_key_value_heads, 1, kMaxCount));
  RETURN_IF_ERROR(CheckRange("head_dim", c.head_dim, 1, kMaxWidth));
  RETURN_IF_ERROR(CheckRange("num_attention_heads * head_dim",
                             c.num_attention_heads * c.head_dim, 1, kMaxWidth));
  RETURN_IF_ERROR(CheckRange("vocab_size", c.vocab_size, 1, kMaxWidth));
  RETURN_IF_ERROR(CheckRange("num_experts", c.num_experts, 1, kMaxCount));
  RETURN_IF_ERROR(CheckRange("num_experts_per_tok", c.top_k, 1, kMaxCount));
  RETURN_IF_ERROR(CheckRange("moe_intermediate_size", c.moe_intermediate_size,
                             1, kMaxWidth));
  RETURN_IF_ERROR(CheckRange("max_position_embeddings",
                             c.max_position_embeddings, 1, int64_t{1} << 40));
  RETURN_IF_ERROR(
      CheckRange("decoder_sparse_step", c.decoder_sparse_step, 1, kMaxCount));
  RETURN_IF_ERROR(
      CheckRange("sliding_window", c.sliding_window, 0, int64_t{1} << 40));
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

// Fills moe_layer, moe_layers and moe_layer_index (qwen's rule; mixtral and
// olmoe have decoder_sparse_step 1 and no mlp_only_layers).
absl::Status AssignMoeLayers(ModelConfig& c) {
  c.moe_layer.assign(c.num_hidden_layers, false);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    c.moe_layer[i] = (i + 1) % c.decoder_sparse_step == 0;
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
  RETURN_IF_ERROR(
      CheckRange("intermediate_size", c.intermediate_size, 0, kMaxWidth));
  if (UsesDenseIntermediate(c)) {
    RETURN_IF_ERROR(
        CheckRange("intermediate_size", c.intermediate_size, 1, kMaxWidth));
  }
  if (c.has_shared_expert()) {
    RETURN_IF_ERROR(CheckRange("shared_expert_intermediate_size",
                               c.shared_expert_intermediate_size, 1,
                               kMaxWidth));
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
  RETURN_IF_ERROR(AssignMoeLayers(*config));
  return CheckMlpAndTokens(*config);
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& dir) {
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
  j["head_dim"] = c.head_dim;
  j["vocab_size"] = c.vocab_size;
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  j["rope_scaling"] = nullptr;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["num_experts_per_tok"] = c.top_k;
  switch (c.family) {
    case ModelFamily::kMixtral:
      j["num_local_experts"] = c.num_experts;
      j["sliding_window"] =
          c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
      break;
    case ModelFamily::kQwen2Moe:
    case ModelFamily::kQwen3Moe:
      j["num_experts"] = c.num_experts;
      j["moe_intermediate_size"] = c.moe_intermediate_size;
      if (c.has_shared_expert()) {
        j["shared_expert_intermediate_size"] =
            c.shared_expert_intermediate_size;
        if (!c.qkv_bias)
          j["qkv_bias"] = false;  // transformers' default is true
      } else {
        j["attention_bias"] = c.qkv_bias;
      }
      j["norm_topk_prob"] = c.norm_topk_prob;
      j["decoder_sparse_step"] = c.decoder_sparse_step;
      j["mlp_only_layers"] = c.mlp_only_layers;
      j["use_sliding_window"] = c.sliding_window > 0;
      j["sliding_window"] =
          c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
      break;
    case ModelFamily::kOlmoe:
      j["num_experts"] = c.num_experts;
      j["norm_topk_prob"] = c.norm_topk_prob;
      j["attention_bias"] = c.qkv_bias;
      j["clip_qkv"] = c.clip_qkv ? json(*c.clip_qkv) : json(nullptr);
      break;
  }
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
