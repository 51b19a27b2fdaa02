// The families we serve, as data: one row per Hugging Face `model_type`
// (llama.cpp's architecture tables are the model). A row holds what is true
// of every checkpoint of the family: its names, transformers' config
// defaults (configuration_<family>.py), how it attends, routes and runs its
// experts, and how its tensors are named. Code downstream asks these
// questions of a ModelConfig (which carries its row), never "is this
// family X": adding a family that combines known parts is a row here, its
// config fields (model_config.cc's readers) and tests.
//
// Thread-safety: the table is immutable static data.
#ifndef MOECACHE_COMMON_MODEL_FAMILY_H_
#define MOECACHE_COMMON_MODEL_FAMILY_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace moe {

enum class ModelFamily {
  kMixtral,
  kQwen2Moe,
  kQwen3Moe,
  kOlmoe,
  kDeepseekV2,
  kDeepseekV3,
  kGptOss,
  kGlm4Moe,
};

// How the decoder attends.
enum class AttentionKind {
  // q/k/v/o projections over grouped kv heads; optional q/k RMSNorm, biases,
  // partial rotary, learned sinks and a sliding window (config fields).
  kGrouped,
  // Multi-head latent attention: a compressed kv cache (MlaConfig).
  kLatent,
};

// How the router turns logits into the top-k experts and their weights.
enum class RouterKind {
  // softmax over every expert, the top-k, renormalised when norm_topk_prob.
  // With a router bias this is also softmax over the top-k logits.
  kSoftmaxTopK,
  // Scores (softmax or sigmoid), optionally bias-corrected and
  // group-limited selection, routed_scaling_factor (Backend::RouterSelect).
  kScoredGroups,
};

// A shared expert beside the routed ones.
enum class SharedExpertKind {
  kNone,
  kSigmoidGated,  // out += sigmoid(x . shared_expert_gate) * shared(x)
  kUngated,       // out += shared(x); width moe_intermediate * n_shared
};

// The routed experts' activation.
enum class ExpertActivation {
  kSwiglu,         // down(silu(gate x) * up x)
  kClampedSwiglu,  // biased, clamped, alpha-scaled (swiglu_limit/_alpha)
};

// transformers' defaults for the fields every family reads.
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

struct FamilyTraits {
  ModelFamily family;
  absl::string_view model_type;    // "mixtral"
  absl::string_view architecture;  // "MixtralForCausalLM"
  FamilyDefaults defaults;
  AttentionKind attention;
  RouterKind router;
  SharedExpertKind shared_expert;
  ExpertActivation activation;
  // Tensor names under model.layers.N.: the MoE block ("block_sparse_moe"
  // or "mlp"), its router ("gate" or "router"), each expert's projections
  // (gate, up, down: "w1", "w3", "w2" or "*_proj"), the shared expert block.
  absl::string_view moe_block;
  absl::string_view router_name;
  absl::string_view expert_names[3];
  absl::string_view shared_block;  // "" without one
  // deepseek_v2's code skips routed_scaling_factor when it renormalises.
  bool unscaled_when_normalized = false;
  // The experts are intermediate_size wide (no moe_intermediate_size), so
  // intermediate_size must be positive even without dense layers.
  bool experts_use_intermediate_size = false;
};

// The row of `family`; every enumerator has one.
const FamilyTraits& TraitsOf(ModelFamily family);
// Every row, in enum order.
const std::vector<FamilyTraits>& AllFamilies();

// The Hugging Face `model_type`, e.g. "mixtral".
absl::string_view ModelFamilyName(ModelFamily family);
// The `architectures` entry transformers writes, e.g. "MixtralForCausalLM".
absl::string_view ModelFamilyArchitecture(ModelFamily family);
// Inverse of ModelFamilyName; INVALID_ARGUMENT naming an unknown type and
// listing the supported ones.
absl::StatusOr<ModelFamily> ParseModelFamily(absl::string_view model_type);

}  // namespace moe

#endif  // MOECACHE_COMMON_MODEL_FAMILY_H_
