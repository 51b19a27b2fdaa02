// Writes small Hugging Face MoE checkpoints with random weights: the layout,
// names and config fields of real mixtral / qwen2_moe / qwen3_moe / olmoe
// models, so that everything that reads a tiny model also reads real ones.
//
//   MakeModelOptions opts = TinyPreset(ModelFamily::kQwen3Moe);
//   opts.seed = 7;
//   RETURN_IF_ERROR(MakeModel(opts, "/tmp/tiny-qwen3"));
//
// The output directory gets config.json, model.safetensors (or
// model-0000k-of-0000N.safetensors shards + model.safetensors.index.json),
// tokenizer.json (a byte-level BPE, see tiny_tokenizer.h),
// tokenizer_config.json and generation_config.json.
//
// Weights are a pure function of (options, seed, tensor name): the same
// options give byte-identical files, and the shard count does not change any
// tensor. Scales keep activations O(1): projections ~ N(0, 1/fan_in), norms
// 1 + N(0, 0.05^2), embeddings N(0, 1), biases N(0, 0.1^2); router rows
// N(0, 1/hidden), which gives logits of unit spread and spreads tokens over
// all experts.
#ifndef MOECACHE_COMMON_MODEL_MAKER_H_
#define MOECACHE_COMMON_MODEL_MAKER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "common/model_config.h"
#include "common/model_desc.h"

namespace moe {

struct MakeModelOptions {
  ModelFamily arch = ModelFamily::kMixtral;
  int64_t layers = 4;
  int64_t hidden = 64;
  int64_t heads = 4;
  int64_t kv_heads = 2;
  int64_t head_dim = 0;  // 0: hidden / heads
  int64_t experts = 8;
  int64_t top_k = 2;
  // Dense MLP width (qwen dense layers; written as intermediate_size). For
  // mixtral/olmoe the expert width comes from here too unless
  // moe_intermediate is set. 0: 2 * hidden.
  int64_t intermediate = 0;
  int64_t moe_intermediate = 0;     // 0: intermediate (mixtral/olmoe) or hidden
  int64_t shared_intermediate = 0;  // qwen2_moe; 0: 2 * moe_intermediate
  int64_t vocab = 512;
  uint64_t seed = 0;
  DType dtype = DType::kBF16;  // F32, F16 or BF16
  int shards = 1;
  // FP8 E4M3 with block scales, laid out as the DeepSeek-V3 and Qwen3 FP8
  // releases (common/fp8.h): every Linear weight except the embeddings,
  // lm_head, routers and qwen2_moe's shared_expert_gate is F8_E4M3 with an
  // F32 `<name>_scale_inv`, and config.json gets the quantization_config.
  // The other tensors stay `dtype`. Unset: every weight is `dtype`.
  std::optional<Fp8BlockScheme> fp8;

  // Family knobs; unset means the family's transformers default.
  std::optional<bool> norm_topk_prob;    // ignored for mixtral (always true)
  int64_t decoder_sparse_step = 1;       // qwen only
  std::vector<int64_t> mlp_only_layers;  // qwen only
  std::optional<bool> qkv_bias;          // qwen2_moe: true; others false
  std::optional<double> clip_qkv;        // olmoe only
  bool tie_word_embeddings = false;
  double rms_norm_eps = 1e-6;
  std::optional<double> rope_theta;  // family default when unset
  int64_t max_position_embeddings = 4096;

  // deepseek_v2 / deepseek_v3 and, for the router fields, glm4_moe (the
  // config fields of the same names). For DeepSeek `heads` is
  // num_attention_heads; kv_heads and head_dim are ignored (MLA).
  MlaConfig mla;
  int64_t n_shared_experts = 0;  // 0: none (config null)
  int64_t first_k_dense_replace = 0;
  int64_t moe_layer_freq = 1;
  TopkMethod topk_method = TopkMethod::kGreedy;  // v3: noaux_tc is forced
  int64_t n_group = 1;
  int64_t topk_group = 1;
  double routed_scaling_factor = 1.0;
  std::optional<YarnConfig> yarn;  // rope_scaling type yarn

  // gpt_oss (attention biases, sinks and expert biases always; yarn as
  // above, unset: plain rope). `intermediate` is the expert width.
  int64_t sliding_window = 128;  // of the sliding (even) layers
  double swiglu_limit = 7.0;
  // Routed experts as MXFP4 `_blocks` + `_scales` (common/mxfp4.h) with a
  // quantization_config {"quant_method": "mxfp4"}, as the published
  // checkpoints; everything else stays `dtype`.
  bool mxfp4 = false;

  // glm4_moe: rope over head_dim * partial_rotary_factor values of each
  // head, per-head q/k RMSNorm (use_qk_norm); attention_bias is qkv_bias.
  double partial_rotary_factor = 0.5;
  bool use_qk_norm = false;
};

// Small (a few MB) but structurally complete: >= 4 MoE layers, 8 experts,
// top_k 2, GQA (kv_heads < heads), vocab 512. Per family:
//   mixtral   4 layers, hidden 64, experts of width 128.
//   qwen2_moe 4 layers, expert width 64, shared expert 128 (sigmoid gate).
//   qwen3_moe 5 layers with layer 2 dense (mlp_only_layers), head_dim 32
//             != hidden/heads, norm_topk_prob true (as Qwen3-30B-A3B).
//   olmoe     4 layers, experts of width 64, clip_qkv unset.
//   deepseek_v2  4 layers (layer 0 dense: first_k_dense_replace 1), MLA
//             without q_lora_rank (as V2-Lite), kv_lora_rank 32, nope 16,
//             rope 8, v 16; 8 experts of 32 in 4 groups, group_limited_greedy
//             (topk_group 2), 2 shared experts, routed_scaling_factor 2.
//   deepseek_v3  as deepseek_v2 with q_lora_rank 32, sigmoid + noaux_tc
//             routing with e_score_correction_bias, 1 shared expert,
//             norm_topk_prob, routed_scaling_factor 2.5.
//   gpt_oss   4 layers alternating sliding (window 8) and full attention,
//             head_dim 16, experts of width 64, YaRN (factor 4 over 1024
//             positions, truncate false), swiglu_limit 1.5 (so that the
//             clamp acts on the tiny model's O(1) activations).
//   glm4_moe  4 layers (layer 0 dense), head_dim 32 != hidden/heads, rope
//             on half of each head, q/k/v biases and q/k norm; 8 experts of
//             32 in 2 groups (topk_group 1: group-limited), sigmoid +
//             e_score_correction_bias, 1 shared expert, norm_topk_prob,
//             routed_scaling_factor 2.5 (as GLM-4.5's config).
MakeModelOptions TinyPreset(ModelFamily family);

// The config MakeModel writes for `options` (validated).
absl::StatusOr<ModelConfig> ConfigFromOptions(const MakeModelOptions& options);

// Creates `out_dir` if needed and writes the model into it, replacing any
// checkpoint files (model.safetensors, the index, model-*-of-*.safetensors)
// left there by an earlier run. Each file is written atomically.
absl::Status MakeModel(const MakeModelOptions& options,
                       const std::string& out_dir);

// The values MakeModel draws for `spec` (an ExpectedTensors(config) entry)
// with `seed`, before they are stored as the options' dtype: a pure
// function of (spec, config, seed). For an MXFP4 `_blocks` spec [E, rows,
// cols / 32, 16], the [E, rows, cols] weights whose codes it holds (each
// row quantized by QuantizeMxfp4Row). REQUIRES: not an MXFP4 `_scales`
// spec.
std::vector<float> MakeModelTensorValues(const TensorSpec& spec,
                                         const ModelConfig& config,
                                         uint64_t seed);

// The special tokens MakeModel puts in tokenizer.json (after the BPE
// tokens); the first is the eos (and bos) token.
const std::vector<std::string>& TinySpecialTokens();

}  // namespace moe

#endif  // MOECACHE_COMMON_MODEL_MAKER_H_
