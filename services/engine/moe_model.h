// A Mixture-of-Experts decoder loaded for one compute backend: every tensor
// except the routed experts (embeddings, attention, norms, routers, shared
// experts, dense MLPs, lm_head). Routed experts come from an ExpertProvider.
//
// On the CPU backend the weights are used in place from the mmap'ed
// checkpoint (zero copy); on a device backend they are uploaded once. Norm
// weights and biases are widened to f32 at load time.
//
// Thread-safe after Load(): read-only.
#ifndef MOECACHE_SERVICES_ENGINE_MOE_MODEL_H_
#define MOECACHE_SERVICES_ENGINE_MOE_MODEL_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/huge_page_arena.h"
#include "common/model_config.h"
#include "common/model_desc.h"
#include "kernels/backend.h"

namespace moe {

// A matrix in backend memory, [rows, cols] row-major (HF Linear layout).
struct Weight {
  const void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
};

struct LayerWeights {
  const float* input_norm = nullptr;  // [hidden]
  const float* post_norm = nullptr;   // [hidden]
  Weight q, k, v, o;
  const float* q_bias = nullptr;  // [heads*head_dim] or null
  const float* k_bias = nullptr;  // [kv_heads*head_dim] or null
  const float* v_bias = nullptr;  // [kv_heads*head_dim] or null
  const float* q_norm = nullptr;  // [head_dim] or [heads*head_dim] or null
  const float* k_norm = nullptr;
  int moe_index = -1;  // index among MoE layers, -1 for a dense layer
  Weight router;       // [experts, hidden]
  Weight shared_gate, shared_up, shared_down;  // qwen2_moe shared expert
  Weight shared_expert_gate;                   // [1, hidden]
  Weight dense_gate, dense_up, dense_down;     // dense layers
  // Latent attention (q is q_proj when there is no q_lora_rank).
  Weight q_a, q_b, kv_a, kv_b;
  const float* q_a_norm = nullptr;    // [q_lora_rank] or null
  const float* kv_a_norm = nullptr;   // [kv_lora_rank]
  const float* score_bias = nullptr;  // [experts] (noaux_tc) or null
  // Table-roped layers (table_rope_weights.cc): q and k (weights and
  // biases) have each head's rows permuted
  // so that the half-split rotary pairs (i, i + d/2) sit at (2i, 2i + 1):
  // RopeInterleaved then rotates them as the published rotate-half does,
  // and q . k is unchanged because both sides carry the same permutation.
  const float* sinks = nullptr;        // [heads] or null
  const float* o_bias = nullptr;       // [hidden] or null
  const float* router_bias = nullptr;  // [experts] or null
  bool sliding = false;                // attends to the last sliding_window
};

class MoeModel {
 public:
  // Opens and validates the checkpoint in `dir` and prepares the dense
  // weights on `backend` (not owned; must outlive the model). Models with
  // features we do not implement (rope scaling, clip_qkv) are refused with
  // UNIMPLEMENTED naming the feature.
  static absl::StatusOr<std::unique_ptr<MoeModel>> Load(const std::string& dir,
                                                        Backend* backend);
  ~MoeModel();

  const ModelConfig& config() const { return desc_->config(); }
  const ModelDescription& description() const { return *desc_; }
  Backend& backend() const { return *backend_; }
  const LayerWeights& layer(int i) const { return layers_[i]; }
  const Weight& embed() const { return embed_; }
  const Weight& lm_head() const { return lm_head_; }
  const float* final_norm() const { return final_norm_; }
  // Longest sequence a session may hold (sliding window or max positions).
  int64_t max_context() const;

  // A rope's inverse frequencies (backend memory) and factors.
  struct RopeFrequencies {
    const float* inv_freq = nullptr;  // [rotated values / 2]
    float mscale = 1.0f;
    float softmax_scale = 1.0f;
  };
  // MLA models: the rope part's, from MlaRopeFor (mla_attention.h).
  const RopeFrequencies& mla_rope() const { return mla_rope_; }
  // Grouped attention roped from a table on head-permuted q/k rows (YaRN,
  // partial rotary): YarnRopeFor over rotary_dim, softmax_scale
  // head_dim^-0.5. inv_freq is null for the plain rotate-half rope.
  const RopeFrequencies& head_rope() const { return head_rope_; }

 private:
  MoeModel() = default;
  absl::Status Prepare();
  absl::Status PrepareMla(LayerWeights& w, int layer);
  // table_rope_weights.cc: grouped attention whose rope comes from a table
  // (YaRN or partial rotary): q/k rows (and their biases and norms) permuted
  // within each head so that rotate-half pairs sit side by side, sinks, o
  // and router biases, the table.
  absl::Status PrepareTableRoped(LayerWeights& w, int layer);
  absl::StatusOr<Weight> HeadPermuted(TensorRole role, int layer);
  // Null when the checkpoint has no such tensor.
  absl::StatusOr<const float*> HeadPermutedVector(TensorRole role, int layer);
  // Router, shared expert or dense MLP of `layer`.
  absl::Status PrepareMlp(LayerWeights& w, int layer);
  absl::StatusOr<Weight> Matrix(TensorRole role, int layer);
  // The dense tensor as the engine reads it: block-format weights (GGUF
  // files) stay blocks where `blocks_ok` (a plain MatMul weight) and the
  // backend has kernels for them, else are decoded to F32 here (exactly
  // the file's values); F8_E4M3 becomes BF16.
  absl::StatusOr<TensorView> DenseView(TensorRole role, int layer, bool blocks_ok);
  absl::StatusOr<const float*> Vector(TensorRole role, int layer);
  absl::StatusOr<const void*> Place(const TensorView& view);

  std::unique_ptr<ModelDescription> desc_;
  Backend* backend_ = nullptr;
  bool device_ = false;
  std::vector<void*> owned_;  // backend buffers we allocated
  // Host copies (huge pages, common/huge_page_arena.h): F8_E4M3 dense
  // weights dequantized to BF16 at load, block-format ones decoded to F32
  // (DenseView), head-permuted q/k weights, and on a CPU backend every
  // matrix a token reads whole (all but the embedding), copied as stored.
  HugePageArena host_;
  std::vector<LayerWeights> layers_;
  Weight embed_, lm_head_;
  const float* final_norm_ = nullptr;
  RopeFrequencies mla_rope_;
  RopeFrequencies head_rope_;
};

}  // namespace moe

#endif  // MOECACHE_SERVICES_ENGINE_MOE_MODEL_H_
