// `moectl make-model --gguf TYPE`: the model MakeModel writes (the same
// options, seed and weights) as one GGUF v3 file in llama.cpp's layout,
// the layout tests/reference/hf_to_gguf.py writes and our reader
// (common/gguf_model.h) is tested against:
//   - general.architecture ("llama" for mixtral, "qwen2moe", "qwen3moe",
//     "olmoe", "glm4moe", "deepseek2", "gpt-oss") and the {arch}.* keys
//     llama.cpp's converter writes (also qwen3moe.expert_weights_norm, and
//     llama's key_length / value_length when heads are not hidden / heads
//     wide, which our reader takes);
//   - llama.cpp's tensor names (common/gguf_names.cc's table, inverted
//     through MapGgufTensorName), each layer's routed experts stacked into
//     blk.N.ffn_{gate,up,down}_exps [experts, out, in]; gpt_oss's fused
//     gate_up_proj split into gate (even columns) and up (odd) as llama.cpp
//     splits it, with stacked biases;
//   - the rows of llama's attn_q / attn_k permuted for its interleaved rope
//     (Hugging Face row h d + j d/2 + i becomes row h d + 2 i + j);
//   - tokenizer.ggml.* from the tokenizer.json MakeModel writes (model
//     "gpt2", pre "default", tokens by id, merges, token types 3 for special
//     added tokens, 4 for other added ones, 1 otherwise), the bos and eos.
//
// Weights are MakeModelTensorValues rounded through options.dtype, as the
// folder stores them, then stored as the file type says (GgufTensorTypeFor):
//   f32          every tensor F32: the folder's weights bit for bit;
//   f16, bf16    weight matrices and experts in that type; vectors (norms,
//                biases, sinks) and routers F32, as llama.cpp's converter
//                writes them;
//   q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k
//                routed experts and the other weight matrices (embedding and
//                lm head included) quantized by common/gguf_quantize.h, each
//                in the type GgufTypeForRow gives its row length (a K-quant
//                falls back to Q5_0 / Q5_1 / Q8_0 for rows not of 256, and a
//                row not of 32 stays F32); routers and vectors F32;
//   q4_k_m       as q4_k, with Q6_K for every ffn_down_exps, ffn_down,
//                ffn_down_shexp, attn_v and output (llama.cpp's Q4_K_M gives
//                Q6_K to output and to some layers' attn_v and ffn_down; here
//                to all of them);
//   mxfp4        gpt_oss only: routed experts in MXFP4 with the codes the
//                folder holds with MakeModelOptions::mxfp4 (what moectl
//                make-model --expert-format mxfp4 writes), in ggml's order;
//                everything else F32.
// Refused with INVALID_ARGUMENT saying why: FP8 options, MXFP4 experts with
// another file type, dense qwen layers (mlp_only_layers,
// decoder_sparse_step), moe_layer_freq != 1, top-k renormalisation for
// qwen2_moe / olmoe (llama.cpp's graphs never do it), deepseek_v2's greedy
// selection over several groups, YaRN that llama.cpp's keys cannot express.
//
// Thread-safe: pure functions (MakeGgufModel writes only `path`).
#ifndef MOECACHE_COMMON_MODEL_MAKER_GGUF_H_
#define MOECACHE_COMMON_MODEL_MAKER_GGUF_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/gguf_types.h"
#include "common/model_maker.h"

namespace moe {

enum class GgufFileType {
  kF32,
  kF16,
  kBF16,
  kQ8_0,
  kQ4_0,
  kQ4_1,
  kQ5_0,
  kQ5_1,
  kQ4_K,
  kQ5_K,
  kQ6_K,
  kQ4_K_M,
  kMxfp4,
};

// "q4_k_m" for kQ4_K_M: the lower-case names of the enumerators.
absl::string_view GgufFileTypeName(GgufFileType type);
// "f32, f16, bf16, q8_0, ..., mxfp4".
std::string GgufFileTypeNames();
// Case-insensitive inverse of GgufFileTypeName; INVALID_ARGUMENT listing
// the names otherwise.
absl::StatusOr<GgufFileType> ParseGgufFileType(absl::string_view name);
// "model-q4_k_m.gguf": the file moectl make-model --gguf writes in --out.
std::string GgufModelFileName(GgufFileType type);

// llama.cpp's general.architecture for `family`.
absl::string_view GgufArchitectureOf(ModelFamily family);

enum class GgufTensorKind {
  kExperts,  // a stack of routed experts' weights
  kMatrix,   // any other 2-D weight (embedding and lm head included)
  kRouter,   // a router's weight, qwen2_moe's shared_expert_gate
  kVector,   // norms, biases (stacked expert biases too), sinks
};

// The ggml type of GGUF tensor `gguf_name` of `kind`, whose rows hold
// `row_length` weights, in a file of `file` type (the rules above).
// REQUIRES: row_length >= 1.
GgufType GgufTensorTypeFor(GgufFileType file, GgufTensorKind kind,
                           absl::string_view gguf_name, int64_t row_length);

// Writes the model as one GGUF file at `path` (atomically), creating its
// directory if needed once everything else has succeeded. Errors: what
// ConfigFromOptions refuses, the refusals above, write failures.
absl::Status MakeGgufModel(const MakeModelOptions& options, GgufFileType type,
                           const std::string& path);

}  // namespace moe

#endif  // MOECACHE_COMMON_MODEL_MAKER_GGUF_H_
