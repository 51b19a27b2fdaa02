// One sequence being generated: its state and nothing else. A Session holds
// its KV cache (the storage; the layout is its attention kind's, attention.h),
// its position, its expert-usage stats, its routing observer and its
// pre-gating settings; it holds no math. Every forward pass runs in the one
// forward step (BatchStep, batch_step.h) over a MoeModel, with routed experts
// from an ExpertProvider: a batch of several sessions, or, through
// Session::Forward, a batch of one.
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
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "services/engine/attention.h"
#include "services/engine/expert_provider.h"
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

// The keys and values (or MLA latents) of a sequence's first `positions`
// positions, copied to host memory (Session::SaveKv): what a prefix cache
// keeps so that a later sequence beginning with the same tokens loads them
// (Session::LoadKv) instead of running those positions again. `caches` holds
// each layer's two caches in order (layer 0 first, then second, ...), each
// [positions, width] row-major (KvWidthsFor).
struct KvSnapshot {
  int64_t positions = 0;
  std::vector<std::vector<float>> caches;
  int64_t bytes() const {
    int64_t n = 0;
    for (const std::vector<float>& c : caches) n += static_cast<int64_t>(c.size() * sizeof(float));
    return n;
  }
};

// Largest pre-gating distance a session accepts.
inline constexpr int kMaxPregateDistance = 8;

class BatchStep;  // batch_step.h

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
  // (OUT_OF_RANGE). The session's own BatchStep runs it as a batch of one
  // for no request (request 0: ExpertProvider::Acquire and Hint, not
  // their per-request forms).
  absl::StatusOr<absl::Span<const float>> Forward(
      absl::Span<const int32_t> tokens, bool prefill);

  // Bytes of KV cache a session of `max_seq` tokens of `model` holds (f32
  // keys and values for every layer, allocated at its first step). MLA
  // models keep the latent instead: kv_lora_rank +
  // qk_rope_head_dim f32 values per token per layer.
  static int64_t KvCacheBytes(const MoeModel& model, int64_t max_seq);
  // The bytes a session of `max_seq` positions in KV blocks of
  // `block_tokens` (0: none) holds once `positions` have run: whole blocks,
  // at most max_seq (KvCacheBytes(model, max_seq) without blocks).
  static int64_t KvBlockBytes(const MoeModel& model, int64_t positions,
                              int64_t block_tokens, int64_t max_seq);
  // The bytes of KV (or latent) cache this session has allocated: 0 before
  // the first step (Forward or a BatchStep), then KvCacheBytes(model, positions held): max_seq()
  // by default, or the positions run so far rounded up to whole blocks.
  int64_t kv_cache_allocated_bytes() const { return kv_allocated_; }
  // KV blocks: with `tokens` > 0 the cache holds whole blocks of that many
  // positions and grows by blocks as the sequence does (the positions run
  // so far move to the larger cache: one device-to-device copy per block
  // added, amortized against attention, which reads them every step); 0
  // (the default) allocates max_seq() positions at the first step.
  // FAILED_PRECONDITION after the first step, INVALID_ARGUMENT if < 0.
  // Tokens are bit-identical either way (same kernels, same rows).
  absl::Status set_kv_block_tokens(int64_t tokens);
  // The bytes kv_cache_allocated_bytes() will be once `tokens` more
  // positions have run (what the next Forward of that many would allocate).
  int64_t KvBytesAfter(int64_t tokens) const;

  // Prefix reuse. SaveKv copies the first `positions` positions' caches
  // (0 < positions <= position()) to the host. LoadKv, on a session that has
  // run nothing, takes the first `positions` of `snapshot`'s positions as its
  // own (0 < positions <= snapshot.positions, positions < max_seq(): at
  // least one position is left to run, for logits) and moves position()
  // past them. The snapshot must come from a session of the same model over
  // the same tokens: the caller checks the tokens. Since every kernel
  // computes a position's row the same whichever rows share its step
  // (design invariant 4), the tokens that follow are bit-identical to
  // running the whole prompt (CPU backend). Errors: INVALID_ARGUMENT for
  // positions out of range or a snapshot of another layout,
  // FAILED_PRECONDITION for LoadKv after the first step; the backend's copy
  // errors.
  absl::StatusOr<KvSnapshot> SaveKv(int64_t positions) const;
  absl::Status LoadKv(const KvSnapshot& snapshot, int64_t positions);

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

  // The forward step's interface (batch_step.h); not for other callers.
  const MoeModel& model() const { return model_; }
  // OK when `tokens` can run next: at least one, ids in the vocabulary
  // (INVALID_ARGUMENT), room in the context (OUT_OF_RANGE). Changes
  // nothing.
  absl::Status CheckTokens(absl::Span<const int32_t> tokens) const;
  // Grows the KV cache to hold `tokens` more positions (whole blocks with
  // set_kv_block_tokens; all of max_seq() at the first call without).
  // REQUIRES: CheckTokens passed for that many tokens.
  absl::Status ReserveKv(int64_t tokens);
  // Layer `layer`'s caches, holding ReserveKv's positions.
  LayerKv layer_kv(int layer) const;
  // Moves the position past `tokens` positions whose keys and values (or
  // latents) the step has written into every layer's cache.
  void Advance(int64_t tokens) { pos_ += tokens; }
  // Adds one acquire's usage (this sequence's share) and the wall time spent
  // waiting for it to stats().
  void AddExpertUsage(const AcquireUsage& usage, double wait_seconds);
  const RoutingObserver& routing_observer() const { return observer_; }
  bool pregate_hints() const { return pregate_; }

 private:
  // Positions the caches hold to run up to `tokens` positions.
  int64_t KvPositions(int64_t tokens) const;

  const MoeModel& model_;
  Backend& be_;
  ExpertProvider* experts_;
  const int64_t max_seq_;
  int64_t pos_ = 0;
  std::vector<void*> kv_;  // per layer: its two caches (KvWidthsFor)
  int64_t kv_allocated_ = 0;
  int64_t kv_block_ = 0;   // positions per KV block; 0 = max_seq_ at once
  int64_t kv_tokens_ = 0;  // positions the KV caches hold
  SessionStats stats_;
  RoutingObserver observer_;
  bool pregate_ = false;
  int pregate_distance_ = 1;
  std::unique_ptr<BatchStep> step_;  // Forward's, made at its first call
};

}  // namespace moe

#endif  // MOECACHE_SERVICES_ENGINE_SESSION_H_
