// A model description from GGUF metadata (issue 30): the hyper-parameters
// llama.cpp writes as `{arch}.*` keys mapped to our ModelConfig, and
// llama.cpp's tensor names mapped to ours. Both are tables: one row per
// architecture in gguf_model.cc (its keys, what llama.cpp's graph fixes,
// the bools the tensors decide), the layer names in gguf_names.cc.
//
// Architectures (general.architecture): "llama" with experts (Mixtral; a
// llama without {arch}.expert_count is dense and refused), "qwen2moe"
// (Qwen1.5/Qwen2-MoE: sigmoid-gated shared expert, q/k/v biases),
// "qwen3moe", "olmoe" (q/k norms over the whole projection), "glm4moe"
// (GLM-4.5: leading dense layers, shared experts, sigmoid router with
// correction bias, partial rotary from rope.dimension_count; block_count
// counts the nextn_predict_layers MTP layers, which are not run:
// ModelConfig::num_hidden_layers excludes them and their tensors are
// marked GgufName::nextn or lie past the decoder's layers), "deepseek2"
// (latent attention; deepseek_v2 with expert_gating_func 1 or absent,
// group_limited_greedy when expert_group_count > 1, deepseek_v3 with 2:
// sigmoid, noaux_tc; qk_nope/v head sizes from key_length_mla /
// value_length_mla, or from key_length / value_length in older files;
// num_key_value_heads = heads, not llama.cpp's MQA 1; YaRN from
// rope.scaling.*, mscale = mscale_all_dim = 10 * yarn_log_multiplier, as
// llama.cpp assumes) and "gpt-oss" (sinks, biases, sliding window on even
// layers, SwiGLU clamp 7 unless swiglu_clamp_exp says, YaRN without
// truncation, plain rope without rope.scaling.type). The keys are
// turned into the config.json fields of the family and parsed by
// ParseModelConfig, so defaults and validation are the same as for a
// Hugging Face folder; where llama.cpp's graph fixes a choice (qwen2moe
// and olmoe never renormalise the top-k weights; glm4moe routes with
// expert_gating_func 2, sigmoid) the row says so, and a file that says
// otherwise is refused. Errors are INVALID_ARGUMENT naming the GGUF key
// where one is missing, of the wrong type or of a value we do not run.
// A deepseek2 file's norm_topk_prob / routed_scaling_factor mean what
// transformers' deepseek_v2 code does (no scaling when renormalising),
// not llama.cpp's graph (which always scales).
//
// Tensor names: llama.cpp stores each layer's routed experts stacked, one
// tensor per projection (blk.N.ffn_{gate,up,down}_exps.weight, ggml dims
// [in, out, experts]); older Mixtral files store them per expert
// (blk.N.ffn_gate.E.weight). A stacked tensor maps to a name pattern with
// "{expert}" in it; expert e's weights are the e-th slice of dims[2]
// (rows() / experts rows each), to be viewed without copying. Shared
// experts are ffn_*_shexp, qwen2moe's shared gate ffn_gate_inp_shexp, the
// router's correction bias exp_probs_b.bias, dense layers ffn_{gate,up,down}.
// gpt-oss stores gate and up (of HF's fused gate_up_proj) as separate
// stacks with stacked biases ffn_{gate,up,down}_exps.bias ([out,
// experts]); they map to per-expert names experts.{expert}.{gate,up,
// down}_proj.{weight,bias} (model_desc.h, BiasedExperts::kPerExpert).
// Newer converters' attn_k_b / attn_v_b (DeepSeek's kv_b split for
// absorbed MLA) map to GgufName::stands_in_for: skipped when the file also
// holds the kv_b they stand in for, else joined back into it (JoinKvB,
// F32). A fused ffn_gate_up_exps or attn_qkv (GgufName::fused) becomes
// views of its parts.
//
// llama.cpp's converter permutes the rows of attn_q / attn_k of "llama"
// (Mixtral) models so that its interleaved rope pairs the values that HF's
// rotate_half pairs; GgufName::rope_permuted marks them, and
// UndoLlamaRopePermutation restores the HF order. The other architectures
// use NEOX rope and are stored unpermuted.
//
// Thread-safe: pure functions.
#ifndef MOECACHE_COMMON_GGUF_MODEL_H_
#define MOECACHE_COMMON_GGUF_MODEL_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/gguf.h"
#include "common/model_config.h"

namespace moe {

// The families GGUF files can describe today, by general.architecture.
// INVALID_ARGUMENT naming the architecture otherwise.
absl::StatusOr<ModelFamily> GgufModelFamily(const GgufMetadata& metadata);

// The ModelConfig of a GGUF checkpoint. `tensors` decides
// tie_word_embeddings (no output.weight: the embedding is the lm head).
absl::StatusOr<ModelConfig> ModelConfigFromGguf(
    const GgufMetadata& metadata, absl::Span<const GgufTensorInfo> tensors);

struct GgufName {
  // Our (Hugging Face) name; for stacked experts it holds "{expert}".
  std::string ours;
  int layer = -1;                // -1 for embedding, final norm, lm head
  bool stacked_experts = false;  // dims[2] is the expert index
  bool rope_permuted = false;    // llama attn_q / attn_k: see above
  bool nextn = false;            // an MTP layer's own tensor (not loaded)
  // Set (with `ours` empty) for a tensor that stands in for our tensor
  // `stands_in_for` (newer converters' attn_k_b / attn_v_b for kv_b_proj):
  // not loaded as itself; when the file lacks `stands_in_for`, kv_b's
  // halves are joined into it and anything else is refused with `why`.
  std::string stands_in_for;
  std::string why;
  // 1 for attn_k_b, 2 for attn_v_b: the halves JoinKvB joins.
  int kv_b_half = 0;
  // A tensor llama.cpp's converter fused from several of ours, row after
  // row: their names in row order (`ours` is the first). ffn_gate_up_exps
  // (--fuse-gate-up-exps; stacked, with "{expert}"): gate, up, each half of
  // an expert's rows. attn_qkv (--fuse-qkv): q, k, v, of the config's
  // heads * head_dim and kv_heads * head_dim rows (llama's q and k parts
  // rope-permuted when rope_permuted). Each part is a view, except permuted
  // ones (copies, as for attn_q / attn_k).
  std::vector<std::string> fused;
  // `ours` for expert e, or fused part `part`'s. REQUIRES: stacked_experts,
  // part < max(1, fused.size()).
  std::string ForExpert(int expert, int part = 0) const;
};

// Our name for llama.cpp tensor `gguf_name` of a `family` model.
// INVALID_ARGUMENT for a name the family does not have.
absl::StatusOr<GgufName> MapGgufTensorName(ModelFamily family,
                                           absl::string_view gguf_name);

// The llama.cpp tensor names a `family` file holds for decoder layer
// `layer` (-1: the model-level ones), as llama.cpp's converter writes them:
// stacked experts, nothing fused, no stand-ins, the nextn rows included
// where the family has them. Each is a name MapGgufTensorName maps; a
// writer inverts the mapping through it (common/model_maker_gguf.cc).
std::vector<std::string> GgufTensorNamesOf(ModelFamily family, int layer);

// Restores Hugging Face row order of a llama.cpp-permuted q or k weight of
// `heads` heads of `head_dim` rows each (row r = h * head_dim + x): HF row
// h * head_dim + j * head_dim / 2 + i is GGUF row h * head_dim + 2 * i + j.
// Rows are moved whole, so any block type works. REQUIRES: head_dim even;
// `in` and `out` hold heads * head_dim rows of `row_bytes`, not overlapping.
void UndoLlamaRopePermutation(const uint8_t* in, int64_t heads, int64_t head_dim,
                              size_t row_bytes, uint8_t* out);

// DeepSeek's kv_b_proj [heads * (nope + v), rank] from llama.cpp's split
// (its converter's view of kv_b as [heads, nope + v, rank], split on the
// middle axis, the first part transposed): k_b [heads, rank, nope] and
// v_b [heads, v, rank], all F32. Head h's rows are k_b[h] transposed, then
// v_b[h]; exact (values are moved, not computed). REQUIRES: the buffers
// hold those sizes and do not overlap.
void JoinKvB(const float* k_b, const float* v_b, int64_t heads, int64_t nope, int64_t v,
             int64_t rank, float* out);

}  // namespace moe

#endif  // MOECACHE_COMMON_GGUF_MODEL_H_
