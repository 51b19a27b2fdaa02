// `config.json` of a Hugging Face MoE checkpoint, for the families of
// common/model_family.h (one row each: names, defaults, kinds).
//
// Field names and defaults follow transformers' configuration_<family>.py:
// a field missing from config.json (or null) takes that family's default.
// ParseModelConfig validates every size so that later code can multiply
// them without checks (every integer is range-checked as it is read, before
// any arithmetic on it): all positive, within sane limits, heads divisible by
// kv heads, top_k <= num_experts, at least one MoE layer, token ids inside
// the vocabulary. Errors are INVALID_ARGUMENT naming the field.
#ifndef MOECACHE_COMMON_MODEL_CONFIG_H_
#define MOECACHE_COMMON_MODEL_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/model_family.h"

namespace moe {

// Where q/k RMSNorm applies (after the projections, before RoPE).
enum class QkNorm {
  kNone,     // mixtral, qwen2_moe
  kPerHead,  // qwen3_moe: weight [head_dim], applied to each head
  kFull,     // olmoe: weight [heads*head_dim] / [kv_heads*head_dim]
};

// Multi-head latent attention (a latent KV cache; its config fields).
struct MlaConfig {
  int64_t q_lora_rank = 0;  // 0 (`null` in config.json): plain q_proj
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  // REQUIRES: both parts range-checked (ParseModelConfig checks each field
  // as it reads it, before it derives head_dim from this sum).
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
};

// `rope_scaling: {"type": "yarn", ...}`, with the defaults of the YaRN
// rotary embedding of latent-attention models.
struct YarnConfig {
  double factor = 1.0;
  int64_t original_max_position_embeddings = 4096;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 1.0;
  double mscale_all_dim = 0.0;
  // transformers' _compute_yarn_parameters: floor/ceil the correction range
  // (some families' code always does; others' configs say false).
  bool truncate = true;
};

// How a scored router scores experts and picks its top-k.
enum class ScoringFunc { kSoftmax, kSigmoid };
enum class TopkMethod { kGreedy, kGroupLimitedGreedy, kNoauxTc };

// config.json's quantization_config of an FP8 block-scaled checkpoint
// (common/fp8.h): weights per scale along rows (out) and columns (in).
struct Fp8BlockScheme {
  int64_t block_rows = 128;
  int64_t block_cols = 128;
};

// config.json's quantization_config {"quant_method": "mxfp4"}: the routed
// experts are stored as `*_blocks` + `*_scales` (common/mxfp4.h).
struct Mxfp4Scheme {
  // quantization_config.modules_to_not_convert, kept to write it back.
  std::vector<std::string> modules_to_not_convert;
};

struct ModelConfig {
  ModelFamily family = ModelFamily::kMixtral;
  std::vector<std::string> architectures;

  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // default: num_attention_heads
  int64_t head_dim = 0;             // `head_dim` if given, else hidden/heads
  // Rotary width of each q/k head: head_dim, or head_dim *
  // partial_rotary_factor on the head's first rotary_dim values.
  int64_t rotary_dim = 0;
  double partial_rotary_factor = 1.0;
  int64_t vocab_size = 0;

  // Dense MLP width (qwen2_moe/qwen3_moe dense layers). For mixtral and olmoe
  // this is the expert width, as in their configs.
  int64_t intermediate_size = 0;
  // Expert FFN width for every family (= intermediate_size for
  // mixtral/olmoe), so model code need not special-case.
  int64_t moe_intermediate_size = 0;
  int64_t shared_expert_intermediate_size = 0;  // qwen2_moe only, else 0

  int64_t num_experts = 0;      // mixtral: num_local_experts
  int64_t top_k = 0;            // num_experts_per_tok
  bool norm_topk_prob = false;  // mixtral: always true

  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  // rope_scaling / rope_parameters type other than "default"; empty if none.
  std::string rope_scaling_type;
  int64_t max_position_embeddings = 0;
  // 0 = full attention. With sliding_layers: the window of those layers
  // only; without: every layer (refused at load).
  int64_t sliding_window = 0;
  bool tie_word_embeddings = false;

  bool qkv_bias = false;  // q/k/v projections have a bias
  bool o_bias = false;    // o projection has a bias
  QkNorm qk_norm = QkNorm::kNone;
  std::optional<double> clip_qkv;  // olmoe: clamp q, k, v to [-c, c]

  // Which layers are MoE (qwen: decoder_sparse_step + mlp_only_layers).
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  std::vector<bool> moe_layer;  // size num_hidden_layers
  // Derived by ValidateModelConfig (which ParseModelConfig and
  // ConfigFromOptions call): the decoder layer of each MoE layer, and the
  // MoE index of each decoder layer (-1 for dense).
  std::vector<int> moe_layers;
  std::vector<int> moe_layer_index;

  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;  // `eos_token_id`: an int or a list
  std::optional<int64_t> pad_token_id;
  std::string torch_dtype;  // as written, e.g. "bfloat16"; may be empty
  // Set when quantization_config declares FP8 E4M3 block-scaled weights.
  std::optional<Fp8BlockScheme> fp8;
  // Set when quantization_config declares MXFP4 experts.
  std::optional<Mxfp4Scheme> mxfp4;

  // Latent attention and the scored router (common/family_fields.cc).
  MlaConfig mla;
  std::optional<YarnConfig> yarn;  // rope_scaling type "yarn"
  ScoringFunc scoring_func = ScoringFunc::kSoftmax;
  TopkMethod topk_method = TopkMethod::kGreedy;
  int64_t n_group = 1;     // `null`: 1
  int64_t topk_group = 1;  // `null`: 1
  double routed_scaling_factor = 1.0;
  int64_t n_shared_experts = 0;  // shared width = moe_intermediate * this
  int64_t first_k_dense_replace = 0;
  int64_t moe_layer_freq = 1;

  // Per-layer attention kinds (layer_types): true for "sliding_attention"
  // (attends to the last sliding_window positions), false for
  // "full_attention"; empty when every layer is alike.
  std::vector<bool> sliding_layers;
  // The clamped SwiGLU of ExpertActivation::kClampedSwiglu experts.
  double swiglu_limit = 7.0;
  double swiglu_alpha = 1.702;
  int64_t initial_context_length = 4096;  // kept to write it back
  // Multi-token-prediction layers stored after the decoder layers
  // (not run; kept to write the config back).
  int64_t num_nextn_predict_layers = 0;

  // The family's row (common/model_family.h): ask it, not the family.
  const FamilyTraits& traits() const { return TraitsOf(family); }
  // Biased clamped-SwiGLU experts whose biases travel with them.
  bool has_expert_biases() const {
    return traits().activation == ExpertActivation::kClampedSwiglu;
  }
  // Learned per-head attention sinks and alternating sliding layers.
  bool has_attention_sinks() const { return has_expert_biases(); }
  // Whether decoder layer `layer` attends to the last sliding_window
  // positions only (per-layer layer_types).
  bool IsSlidingLayer(int layer) const {
    return layer >= 0 &&
           layer < static_cast<int>(sliding_layers.size()) &&
           sliding_layers[layer];
  }
  // Multi-head latent attention (a latent KV cache) instead of q/k/v.
  bool is_mla() const { return traits().attention == AttentionKind::kLatent; }
  // Scored, group-limited routing (Backend::RouterSelect) instead of a
  // softmax top-k.
  bool has_scored_router() const {
    return traits().router == RouterKind::kScoredGroups;
  }
  // q/k rotate over their first rotary_dim values only.
  bool has_partial_rotary() const { return rotary_dim != head_dim; }
  // A sigmoid-gated shared expert, or ungated shared experts
  // (n_shared_experts > 0), of shared_expert_intermediate_size.
  bool has_shared_expert() const {
    switch (traits().shared_expert) {
      case SharedExpertKind::kNone:
        return false;
      case SharedExpertKind::kSigmoidGated:
        return true;
      case SharedExpertKind::kUngated:
        return n_shared_experts > 0;
    }
    return false;
  }
  bool has_shared_expert_gate() const {
    return traits().shared_expert == SharedExpertKind::kSigmoidGated;
  }
  // The router adds mlp.gate.e_score_correction_bias to choose experts.
  bool has_score_correction_bias() const {
    return topk_method == TopkMethod::kNoauxTc;
  }
  // These three are O(1). REQUIRES: the config was validated.
  int num_moe_layers() const { return static_cast<int>(moe_layers.size()); }
  // Index of `layer` among the MoE layers, or -1 for a dense layer (or one
  // out of range).
  int MoeLayerIndex(int layer) const;
  // The decoder layer of the `moe_layer`-th MoE layer.
  // REQUIRES: 0 <= moe_layer < num_moe_layers().
  int LayerOfMoeLayer(int moe_layer) const;
};

// Parses config.json text. Unknown `model_type` is refused by name.
absl::StatusOr<ModelConfig> ParseModelConfig(absl::string_view json);

// Test seam: the config.json keys whose integers ParseModelConfig(json)
// reads (given in the file or not), in reading order.
std::vector<std::string> IntKeysReadForTest(absl::string_view json);

// Reads and parses `dir`/config.json; errors are prefixed with the path.
// A `dir` that is a `.gguf` file: its metadata (ModelConfigFromGguf).
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& dir);

// Checks the invariants listed at the top of this file and recomputes
// `moe_layer`. ParseModelConfig calls it; builders of configs should too.
absl::Status ValidateModelConfig(ModelConfig* config);

// config.json text as transformers writes it for `config`'s family (real
// field names: model_type, architectures, num_local_experts for mixtral, ...).
// ParseModelConfig(ModelConfigToJson(c)) gives back `c`.
std::string ModelConfigToJson(const ModelConfig& config);

}  // namespace moe

#endif  // MOECACHE_COMMON_MODEL_CONFIG_H_
