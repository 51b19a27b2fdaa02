// What the tensors of a Hugging Face MoE checkpoint mean.
//
// ExpectedTensors(config) lists every tensor a family's checkpoint must hold,
// with its Hugging Face name, role, layer, expert and shape (PyTorch layout:
// Linear weights are [out_features, in_features]). ModelDescription opens a
// model directory (config.json + safetensors), or a `.gguf` file (its
// metadata as the config, its tensors under our names: Checkpoint::FromGguf),
// checks that every expected
// tensor exists with exactly that shape and a float dtype (F32/F16/BF16, or
// F8_E4M3 with block scales when config.json says so: common/fp8.h), and
// then hands out zero-copy views by role:
//
//   ASSIGN_OR_RETURN(ModelDescription model, ModelDescription::Open(dir));
//   ASSIGN_OR_RETURN(TensorView wq, model.Dense(TensorRole::kQProj, layer));
//   ASSIGN_OR_RETURN(TensorView w1,
//                    model.Expert(moe_layer, expert, TensorRole::kExpertGate));
//
// Extra tensors in the checkpoint (e.g. rotary inv_freq buffers) are ignored.
// Thread-safety: immutable after Open; concurrent reads are safe. Views live
// as long as the ModelDescription (it owns the mapped checkpoint).
#ifndef MOECACHE_COMMON_MODEL_DESC_H_
#define MOECACHE_COMMON_MODEL_DESC_H_

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/checkpoint.h"
#include "common/model_config.h"

namespace moe {

enum class TensorRole {
  // Model level (layer -1).
  kEmbed,   // model.embed_tokens.weight      [vocab, hidden]
  kLmHead,  // lm_head.weight                 [vocab, hidden] (absent if tied)
  kFinalNorm,  // model.norm.weight              [hidden]
  // Per decoder layer.
  kInputNorm,     // input_layernorm.weight          [hidden]
  kPostAttnNorm,  // post_attention_layernorm.weight [hidden]
  kQProj,         // self_attn.q_proj.weight [heads*head_dim, hidden]
  kKProj,         // self_attn.k_proj.weight [kv_heads*head_dim, hidden]
  kVProj,         // self_attn.v_proj.weight [kv_heads*head_dim, hidden]
  kOProj,         // self_attn.o_proj.weight [hidden, heads*head_dim]
  kQBias,         // self_attn.q_proj.bias   [heads*head_dim]   (qkv_bias)
  kKBias,         // self_attn.k_proj.bias   [kv_heads*head_dim]
  kVBias,         // self_attn.v_proj.bias   [kv_heads*head_dim]
  kOBias,         // self_attn.o_proj.bias   [hidden]           (o_bias)
  kQNorm,         // self_attn.q_norm.weight [head_dim] or [heads*head_dim]
  kKNorm,         // self_attn.k_norm.weight [head_dim] or [kv_heads*head_dim]
  // MoE layers.
  kRouter,      // [experts, hidden]
  kExpertGate,  // per expert [moe_inter, hidden] (mixtral w1)
  kExpertUp,    // per expert [moe_inter, hidden] (mixtral w3)
  kExpertDown,  // per expert [hidden, moe_inter] (mixtral w2)
  // The shared expert block (mlp.<FamilyTraits::shared_block>.*):
  kSharedGate,  // qwen2_moe mlp.shared_expert.gate_proj [shared_inter, hidden]
  kSharedUp,    // qwen2_moe mlp.shared_expert.up_proj   [shared_inter, hidden]
  kSharedDown,  // qwen2_moe mlp.shared_expert.down_proj [hidden, shared_inter]
  kSharedExpertGate,  // qwen2_moe mlp.shared_expert_gate [1, hidden] (sigmoid)
  // Dense MLP layers (qwen mlp_only_layers / decoder_sparse_step).
  kMlpGate,  // mlp.gate_proj [intermediate, hidden]
  kMlpUp,    // mlp.up_proj   [intermediate, hidden]
  kMlpDown,  // mlp.down_proj [hidden, intermediate]
  // Multi-head latent attention (self_attn.*); nope/rope/v are
  // qk_nope_head_dim, qk_rope_head_dim, v_head_dim, H the heads. Without
  // q_lora_rank, kQProj is q_proj [H*(nope+rope), hidden].
  kQAProj,    // q_a_proj.weight           [q_lora_rank, hidden]
  kQANorm,    // q_a_layernorm.weight      [q_lora_rank]
  kQBProj,    // q_b_proj.weight           [H*(nope+rope), q_lora_rank]
  kKvAProj,   // kv_a_proj_with_mqa.weight [kv_lora_rank+rope, hidden]
  kKvANorm,   // kv_a_layernorm.weight     [kv_lora_rank]
  kKvBProj,   // kv_b_proj.weight          [H*(nope+v), kv_lora_rank]
  kScoreBias,  // mlp.gate.e_score_correction_bias [experts] (noaux_tc)
  // Attention sinks, a biased router and fused experts (see below).
  kSinks,       // self_attn.sinks   [heads]
  kRouterBias,  // mlp.router.bias   [experts] (the router is mlp.router.weight)
  // Per expert, after Open (views into the fused tensors):
  kExpertGateBias,  // [moe_inter]
  kExpertUpBias,    // [moe_inter]
  kExpertDownBias,  // [hidden]
};

// With ExpertActivation::kClampedSwiglu all experts of a layer sit in a few
// fused tensors (mlp.experts.*), gate and up in interleaved columns:
//   gate_up_proj [E, hidden, 2*inter] (x @ W: gate = [..., ::2], up = [..., 1::2])
//   gate_up_proj_bias [E, 2*inter], down_proj [E, inter, hidden],
//   down_proj_bias [E, hidden]
// or, in MXFP4 checkpoints, instead of gate_up_proj / down_proj:
//   gate_up_proj_blocks U8 [E, 2*inter, hidden/32, 16] + _scales U8
//   [E, 2*inter, hidden/32]; down_proj_blocks [E, hidden, inter/32, 16] +
//   _scales [E, hidden, inter/32] (rows are output features, common/mxfp4.h).
// ExpectedTensors lists these with fused = true and expert -1; Open checks
// them (shape and dtype, naming the tensor) and Expert() hands out per-expert
// strided views in the Linear layout: gate/up [inter, hidden], down
// [hidden, inter], and the three biases.

// How a checkpoint stores biased (kClampedSwiglu) experts: fused as above
// (Hugging Face), or per expert and projection as a GGUF file does
// (Checkpoint::FromGguf): experts.E.{gate,up,down}_proj.weight (the
// Linear layout) and experts.E.{gate,up,down}_proj.bias. Other families'
// experts are per expert either way.
enum class BiasedExperts { kFused, kPerExpert };

// Index of an expert role in {gate, up, down, gate_bias, up_bias,
// down_bias}. REQUIRES: IsExpertRole(role).
int ExpertSlot(TensorRole role);

// A short lower-case name, e.g. "expert_gate", for messages.
absl::string_view TensorRoleName(TensorRole role);
// True for kExpertGate, kExpertUp, kExpertDown and the three expert bias
// roles.
bool IsExpertRole(TensorRole role);

struct TensorSpec {
  std::string name;  // Hugging Face tensor name
  TensorRole role;
  int layer = -1;   // decoder layer, -1 for model-level tensors
  int expert = -1;  // expert index for expert roles, else -1
  std::vector<int64_t> shape;
  // A fused tensor holding every expert of the layer (see above); `dtype`
  // is required of it (U8 for MXFP4 blocks and scales) when not kF32, else
  // any float dtype.
  bool fused = false;
  DType dtype = DType::kF32;
};

// Every tensor a checkpoint of `config` must hold, model-level first, then
// layer by layer (experts in order). lm_head is omitted when tied.
std::vector<TensorSpec> ExpectedTensors(
    const ModelConfig& config, BiasedExperts biased = BiasedExperts::kFused);

// The length of ExpectedTensors(config, biased), computed without building
// it (a config may claim millions of tensors; check this against the
// checkpoint before materialising the list).
uint64_t ExpectedTensorCount(const ModelConfig& config,
                             BiasedExperts biased = BiasedExperts::kFused);

// The weights of one routed expert (gate, up, down and their biases; MXFP4
// counts two weights per byte and not its scales): the size of an expert
// in any format is this times the format's bytes per weight. Every routed
// expert of a model has the same count. REQUIRES: `config` validated.
int64_t RoutedExpertParams(const ModelConfig& config);

class ModelDescription {
 public:
  // Loads `dir`/config.json and the weights, and checks every expected
  // tensor. Errors name the directory and the first offending tensor.
  static absl::StatusOr<ModelDescription> Open(const std::string& dir);

  // Same checks on parts already loaded (for tools and tests).
  static absl::StatusOr<ModelDescription> FromParts(
      ModelConfig config, std::unique_ptr<Checkpoint> ckpt);

  ModelDescription(ModelDescription&&) = default;
  ModelDescription& operator=(ModelDescription&&) = default;

  const ModelConfig& config() const { return config_; }
  const Checkpoint& checkpoint() const { return *checkpoint_; }
  const std::vector<TensorSpec>& specs() const { return specs_; }

  // A non-expert tensor. `layer` is -1 for kEmbed, kLmHead (the embedding
  // when tied), kFinalNorm. NOT_FOUND when this model has no such tensor
  // (e.g. kQBias without qkv_bias, kRouter on a dense layer).
  absl::StatusOr<TensorView> Dense(TensorRole role, int layer = -1) const;
  bool HasDense(TensorRole role, int layer = -1) const;

  // One expert weight (or bias). `moe_layer` counts MoE layers only
  // (config().LayerOfMoeLayer maps it to a decoder layer). Views into fused
  // experts are strided (TensorView::strided()): read them with
  // ConvertWeightView / ConvertVectorView. INVALID_ARGUMENT for out-of-range
  // indices, a non-expert role, or a bias role of a family without them.
  absl::StatusOr<TensorView> Expert(int moe_layer, int expert,
                                    TensorRole role) const;

  // The dtypes of the experts of MoE layer `moe_layer`: the experts of a
  // layer share them (Open refuses a file where they differ), and a GGUF
  // file may mix them per projection and per layer (llama.cpp's Q4_K_M).
  // REQUIRES: 0 <= moe_layer < config().num_moe_layers().
  const ExpertDTypes& expert_dtypes(int moe_layer) const { return layer_dtypes_[moe_layer]; }
  // One entry per MoE layer.
  const std::vector<ExpertDTypes>& all_expert_dtypes() const { return layer_dtypes_; }
  // True when the expert weights are not all of one dtype.
  bool mixed_expert_dtypes() const { return mixed_; }
  // The dtype of every expert weight; with mixed_expert_dtypes(), the one
  // of most bytes per weight among them (WidestDType), which plans and
  // conversions size against.
  DType expert_dtype() const { return expert_dtype_; }
  // Bytes of one expert's gate + up + down weights, as stored (with the
  // block scales of F8_E4M3 and MXFP4 weights, and the expert biases): of
  // the largest layer's experts when they differ (expert_bytes).
  uint64_t bytes_per_expert() const { return bytes_per_expert_; }
  // The same for the experts of MoE layer `moe_layer` (REQUIRES as
  // expert_dtypes).
  uint64_t expert_bytes(int moe_layer) const { return layer_bytes_[moe_layer]; }
  // Bytes of every expected tensor that is not a routed expert (embeddings,
  // attention, norms, routers, shared experts, dense MLPs, lm_head).
  uint64_t dense_bytes() const { return dense_bytes_; }
  // Every routed expert of every MoE layer, as stored.
  uint64_t routed_expert_bytes() const;
  // dense_bytes() + routed_expert_bytes().
  uint64_t total_bytes() const;

 private:
  ModelDescription() = default;
  absl::Status Index();

  ModelConfig config_;
  std::unique_ptr<Checkpoint> checkpoint_;
  std::vector<TensorSpec> specs_;
  std::map<std::pair<TensorRole, int>, TensorView> dense_;
  // model_desc_fused.cc
  absl::Status IndexFusedExperts(const TensorSpec& spec);

  // [moe_layer * num_experts + expert] -> {gate, up, down, gate_bias,
  // up_bias, down_bias} (the biases with has_expert_biases() only)
  std::vector<std::array<TensorView, 6>> experts_;
  // Index's last step: per-layer dtypes and bytes, checked alike per layer.
  absl::Status IndexExpertTypes();
  std::vector<ExpertDTypes> layer_dtypes_;  // per MoE layer
  std::vector<uint64_t> layer_bytes_;       // per MoE layer
  bool mixed_ = false;
  DType expert_dtype_ = DType::kF32;
  uint64_t bytes_per_expert_ = 0;
  uint64_t dense_bytes_ = 0;
};

}  // namespace moe

#endif  // MOECACHE_COMMON_MODEL_DESC_H_
