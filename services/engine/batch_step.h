// One forward step over several sequences at once (continuous batching).
//
//   BatchStep step(model, provider);
//   std::vector<BatchStep::Entry> entries = {{&s1, prompt_chunk, true, 7},
//                                            {&s2, {last_token}, false, 9}};
//   RETURN_IF_ERROR(step.Run(entries));
//   sampler.Next(step.logits(1));
//
// Each entry is one sequence (a Session: its own KV cache and position) with
// the tokens it runs this step: a prompt chunk or one decode token. The rows
// of all entries are concatenated for everything that is per row (embedding,
// norms, router, shared expert, dense MLP, lm_head); attention runs per
// sequence with the session's own Attention against its own KV cache; per MoE
// layer there is ONE acquire for the union of the batch's routed experts with
// per-expert token counts (and per-request token counts, for attribution),
// and each expert's FFN runs once over all its rows.
//
// Results do not depend on the batch (design invariant 4 extended): every
// CPU kernel reduces each row the same way whatever the number of rows
// (matmul tiles keep one accumulator chain per row and column; attention,
// norms and top-k are per row), and the routed experts are summed into each
// row in ascending expert id, exactly as a lone Session::Forward does. So on
// the CPU backend a sequence's logits are bit-identical alone or batched, and
// also whether its prompt ran whole or in chunks (batch_step_test.cc). On
// CUDA, cuBLAS may choose a different reduction for a different row count:
// there the tolerance is that of the backend parity tests (1e-3 relative on
// logits), not bits.
//
// Per-request expert usage: a shared acquire reports totals, which are split
// among the batch's requests in proportion to their (token, expert) pairs in
// that layer (SplitUsage: exact sums), added to each session's stats().
//
// Thread-compatible: one thread runs a step at a time; the sessions must not
// be driven elsewhere during Run.
#ifndef MOECACHE_SERVICES_ENGINE_BATCH_STEP_H_
#define MOECACHE_SERVICES_ENGINE_BATCH_STEP_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "services/engine/expert_provider.h"
#include "services/engine/moe_model.h"
#include "services/engine/session.h"

namespace moe {

class BatchStep {
 public:
  struct Entry {
    Session* session = nullptr;        // not owned; of the same model
    absl::Span<const int32_t> tokens;  // >= 1 token
    bool prefill = false;  // prompt tokens (a whole prompt or a chunk)
    uint64_t request = 0;  // owner, for usage attribution
  };

  // `model` and `experts` are not owned and must outlive the step.
  BatchStep(const MoeModel& model, ExpertProvider* experts);
  ~BatchStep();
  BatchStep(const BatchStep&) = delete;
  BatchStep& operator=(const BatchStep&) = delete;

  // Runs every entry's tokens at its session's next positions and keeps the
  // logits of each entry's last token. Each session is checked as in
  // Session::Forward (INVALID_ARGUMENT for bad ids or an empty entry,
  // OUT_OF_RANGE past its context) before anything runs; a session may
  // appear once. On error no session has advanced.
  absl::Status Run(absl::Span<const Entry> entries);

  // Attention for the four standard families (mixtral, qwen2_moe,
  // qwen3_moe, olmoe) runs its projections, q/k norms and rotary over all
  // rows at once and only the KV append and the attention proper per
  // sequence (same kernels, same bits as Session::Attention); any other
  // family calls Session::Attention once per sequence. `on` = false forces
  // the per-sequence path (tests of both paths).
  void set_batched_projections(bool on) { batched_projections_ = on; }

  // Entry i's last-token logits from the last Run, valid until the next.
  absl::Span<const float> logits(size_t i) const;
  // Rows (tokens) of the last Run.
  int64_t rows() const { return rows_; }

 private:
  absl::Status Reserve(int64_t rows, int64_t entries);
  absl::Status AttentionPerSequence(const LayerWeights& w, int layer,
                                    absl::Span<const Entry> entries);
  absl::Status AttentionBatched(const LayerWeights& w, int layer,
                                absl::Span<const Entry> entries);
  absl::Status MoeBlock(const LayerWeights& w, absl::Span<const Entry> entries,
                        bool prefill);
  // The MLP half on the batch's buffers (services/engine/mlp_blocks.h).
  MlpBuffers Mlp();
  absl::Status Pregate(int layer, absl::Span<const Entry> entries);
  float* Buf(size_t i) { return static_cast<float*>(bufs_[i]); }

  const MoeModel& model_;
  Backend& be_;
  ExpertProvider* experts_;
  bool batched_projections_ = true;
  int64_t rows_ = 0;
  int64_t capacity_ = 0;          // rows the scratch holds
  int64_t entry_capacity_ = 0;    // entries the logits scratch holds
  std::vector<int64_t> offsets_;  // first row of each entry
  std::vector<void*> bufs_;
  std::vector<float> host_logits_;  // [entries, vocab]
  std::vector<int32_t> host_ids_;
  std::vector<float> host_weights_;
};

}  // namespace moe

#endif  // MOECACHE_SERVICES_ENGINE_BATCH_STEP_H_
