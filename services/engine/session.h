// One sequence being generated: its KV cache, its position, and the forward
// pass over a MoeModel, with routed experts from an ExpertProvider.
//
// Results do not depend on the provider's cache state: experts are applied
// in ascending id order and every kernel is deterministic, so the same
// tokens give bit-identical logits for any cache capacity or policy
// (design invariant 4).
//
// Thread-compatible: one thread drives a session at a time.
#ifndef MOECACHE_SERVICES_ENGINE_SESSION_H_
#define MOECACHE_SERVICES_ENGINE_SESSION_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "services/engine/expert_provider.h"
#include "services/engine/mlp_blocks.h"
#include "services/engine/moe_model.h"

namespace moe {

// Sees each MoE layer's routing and, with pre-gating on, the hints the
// session gives the provider. Built from a routing callable alone (hints are
// then not observed) or from both callbacks.
class RoutingObserver {
 public:
  // Called after each MoE layer's router with that iteration's routing:
  // experts and weights are [tokens, top_k] row-major.
  using RoutingFn =
      std::function<void(int moe_layer, int64_t tokens,
                         absl::Span<const int32_t> experts,
                         absl::Span<const float> weights)>;
  // Called with the hints passed to ExpertProvider::Hint, all for one MoE
  // layer, predicted for the iteration's last token before that layer runs.
  using HintFn = std::function<void(absl::Span<const ExpertHint> hints)>;

  RoutingObserver() = default;
  RoutingObserver(std::nullptr_t) {}  // NOLINT: like std::function
  template <typename F,
            typename = std::enable_if_t<
                !std::is_same_v<std::decay_t<F>, RoutingObserver> &&
                std::is_constructible_v<RoutingFn, F>>>
  RoutingObserver(F routing)  // NOLINT: a plain routing callable converts
      : routing_(std::move(routing)) {}
  RoutingObserver(RoutingFn routing, HintFn hints)
      : routing_(std::move(routing)), hints_(std::move(hints)) {}

  explicit operator bool() const { return routing_ || hints_; }
  void operator()(int moe_layer, int64_t tokens,
                  absl::Span<const int32_t> experts,
                  absl::Span<const float> weights) const {
    if (routing_) routing_(moe_layer, tokens, experts, weights);
  }
  bool wants_hints() const { return static_cast<bool>(hints_); }
  void Hints(absl::Span<const ExpertHint> hints) const {
    if (hints_) hints_(hints);
  }

 private:
  RoutingFn routing_;
  HintFn hints_;
};

struct SessionStats {
  int64_t expert_hits = 0;
  int64_t expert_misses = 0;
  double expert_stall_seconds = 0.0;
  double expert_wait_seconds = 0.0;  // wall time inside Acquire
};

// Largest pre-gating distance a session accepts.
inline constexpr int kMaxPregateDistance = 8;

class Session {
 public:
  // `model` and `experts` are not owned and must outlive the session.
  // `max_seq` <= model.max_context().
  Session(const MoeModel& model, ExpertProvider* experts, int64_t max_seq);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Runs `tokens` at the next positions (the whole prompt in one call for
  // prefill; one token per call for decode) and returns the logits of the
  // last one, on the host, valid until the next call. Ids are validated
  // (INVALID_ARGUMENT), as is the room left in the context
  // (OUT_OF_RANGE).
  absl::StatusOr<absl::Span<const float>> Forward(
      absl::Span<const int32_t> tokens, bool prefill);

  // Bytes of KV cache a session of `max_seq` tokens of `model` holds (f32
  // keys and values for every layer, allocated at its first Forward). MLA
  // models keep the latent instead: kv_lora_rank +
  // qk_rope_head_dim f32 values per token per layer.
  static int64_t KvCacheBytes(const MoeModel& model, int64_t max_seq);
  // The bytes a session of `max_seq` positions in KV blocks of
  // `block_tokens` (0: none) holds once `positions` have run: whole blocks,
  // at most max_seq (KvCacheBytes(model, max_seq) without blocks).
  static int64_t KvBlockBytes(const MoeModel& model, int64_t positions,
                              int64_t block_tokens, int64_t max_seq);
  // The bytes of KV (or latent) cache this session has allocated: 0 before
  // the first Forward, then KvCacheBytes(model, positions held): max_seq()
  // by default, or the positions run so far rounded up to whole blocks.
  int64_t kv_cache_allocated_bytes() const { return kv_allocated_; }
  // KV blocks: with `tokens` > 0 the cache holds whole blocks of that many
  // positions and grows by blocks as the sequence does (the positions run
  // so far move to the larger cache: one device-to-device copy per block
  // added, amortized against attention, which reads them every step); 0
  // (the default) allocates max_seq() positions at the first Forward.
  // FAILED_PRECONDITION after the first Forward, INVALID_ARGUMENT if < 0.
  // Tokens are bit-identical either way (same kernels, same rows).
  absl::Status set_kv_block_tokens(int64_t tokens);
  // The bytes kv_cache_allocated_bytes() will be once `tokens` more
  // positions have run (what the next Forward of that many would allocate).
  int64_t KvBytesAfter(int64_t tokens) const;

  int64_t position() const { return pos_; }
  int64_t max_seq() const { return max_seq_; }
  const SessionStats& stats() const { return stats_; }
  void set_routing_observer(RoutingObserver observer) {
    observer_ = std::move(observer);
  }
  // Pre-gating: during decode, after layer l, apply the router of layer
  // l + distance (when that layer is a MoE layer) to layer l's output,
  // normed by that layer's post-attention norm, and pass its top_k experts
  // to the provider as hints for that layer. Distance 1 (the default)
  // predicts the next layer; 2 predicts a layer further ahead, so the
  // provider has a whole layer of lead to copy them (hidden states change
  // slowly across layers, so the prediction stays good). The hints are
  // advisory: the tokens are bit-identical with or without them.
  void set_pregate_hints(bool on) { pregate_ = on; }
  // INVALID_ARGUMENT outside [1, kMaxPregateDistance].
  absl::Status set_pregate_distance(int distance);
  int pregate_distance() const { return pregate_distance_; }

 private:
  // The batched step (batch_step.h) drives a session's own attention and KV
  // cache, one sequence of the batch at a time.
  friend class BatchStep;
  // Checks `tokens` (ids, room in the context), sizes the scratch and
  // writes their positions: the part of Forward before the layers.
  absl::Status BeginStep(absl::Span<const int32_t> tokens);
  // The scratch rows Attention reads (normed input), writes (its output)
  // and PregateHints reads (the residual stream), for the batched step.
  float* attention_input();
  float* attention_output();
  float* residual();
  absl::Status Reserve(int64_t tokens);
  absl::Status Attention(const LayerWeights& w, int layer, int64_t t);
  // Multi-head latent attention of one sequence's `t` new tokens
  // at positions pos_..: h [t, hidden] -> out [t, hidden], with q
  // [t, heads * qk_head_dim] as scratch; see mla_attention.cc.
  absl::Status MlaAttention(const LayerWeights& w, int layer, int64_t t,
                            float* h, float* q, const int32_t* positions,
                            float* out);
  absl::Status ReserveMla(int64_t tokens);
  // Grouped-query attention of the `t` new tokens with what the config
  // adds (biases, q/k norm, table rope on permuted rows, sinks, window).
  absl::Status GroupedAttention(const LayerWeights& w, int layer, int64_t t);
  // The key and value caches of `layer` and their shape for `t` new tokens
  // at this session's position (grouped attention; the batched step's too).
  struct KvCaches {
    float* k = nullptr;
    float* v = nullptr;
    AttentionShape shape;
  };
  KvCaches Kv(int layer, int64_t t) const;
  // The MLP half on this session's buffers (services/engine/mlp_blocks.h).
  MlpBuffers Mlp();
  absl::Status MoeBlock(const LayerWeights& w, int64_t t, bool prefill);
  absl::Status DenseMlp(const LayerWeights& w, int64_t t);
  // Hints for `target_layer` from the current residual stream; `request`
  // (a batch member's, BatchStep) != 0 files them under that request.
  absl::Status PregateHints(int target_layer, int64_t t, uint64_t request = 0);
  float* Buf(size_t i) { return static_cast<float*>(bufs_[i]); }

  const MoeModel& model_;
  Backend& be_;
  ExpertProvider* experts_;
  const int64_t max_seq_;
  int64_t pos_ = 0;
  int64_t capacity_ = 0;  // tokens the scratch buffers hold
  std::vector<void*> kv_;    // per layer: k_cache, v_cache
  std::vector<void*> bufs_;  // scratch, see session.cc
  int64_t kv_allocated_ = 0;
  int64_t kv_block_ = 0;   // positions per KV block; 0 = max_seq_ at once
  int64_t kv_tokens_ = 0;  // positions the KV caches hold
  // Positions the caches hold to run up to `tokens` positions.
  int64_t KvPositions(int64_t tokens) const;
  std::vector<void*> mla_bufs_;  // MLA scratch, see mla_attention.cc
  int64_t mla_capacity_ = 0;
  std::vector<float> host_logits_;
  std::vector<int32_t> host_ids_;
  std::vector<float> host_weights_;
  SessionStats stats_;
  RoutingObserver observer_;
  bool pregate_ = false;
  int pregate_distance_ = 1;
};

}  // namespace moe

#endif  // MOECACHE_SERVICES_ENGINE_SESSION_H_
