// The forward step: embedding -> every layer -> lm_head for any number of
// sequences at once (continuous batching), and the only place the layers
// run. A lone Session::Forward is a batch of one through this same step.
//
//   BatchStep step(model, provider);
//   std::vector<BatchStep::Entry> entries = {{&s1, prompt_chunk, true, 7},
//                                            {&s2, {last_token}, false, 9}};
//   RETURN_IF_ERROR(step.Run(entries));
//   sampler.Next(step.logits(1));
//
// Each entry is one sequence (a Session: its state, holding its own KV cache
// and position) with the tokens it runs this step: a prompt chunk or one
// decode token. The rows of all entries are concatenated, and everything
// runs over all rows at once: embedding, norms, the attention block's
// projections, norms and rope (each row at its own position), router, shared
// expert, dense MLP, lm_head. Only the KV append and the attention proper run
// per sequence, against its own cache, for every kind of attention
// (attention.h: grouped with q/k norm, table rope, sinks and sliding window;
// latent). Per MoE layer there is ONE acquire for the union of the batch's
// routed experts with per-expert token counts (and per-request token counts,
// for attribution), and each expert's FFN runs once over all its rows.
//
// Results do not depend on the batch (design invariant 4 extended): every
// CPU kernel reduces each row the same way whatever the number of rows
// (matmul tiles keep one accumulator chain per row and column; attention,
// norms, rope and top-k are per row), and the routed experts are summed into
// each row in ascending expert id. So on the CPU backend a sequence's logits
// are bit-identical alone or batched, and also whether its prompt ran whole
// or in chunks (batch_step_test.cc). On CUDA, cuBLAS may choose a different
// reduction for a different row count: there the tolerance is that of the
// backend parity tests (1e-3 relative on logits), not bits.
//
// Requests: a batch of one entry for request 0 (what Session::Forward runs)
// acquires with ExpertProvider::Acquire and hints with Hint, and its session
// gets the whole usage. Any other batch acquires with AcquireBatch (each
// member's own demands) and hints with HintFor its request (Hint for request
// 0); a shared acquire reports totals, which are split among the batch's
// requests in proportion to their (token, expert) pairs in that layer
// (SplitUsage: exact sums), added to each session's stats().
//
// Thread-compatible: one thread runs a step at a time; the sessions must not
// be driven elsewhere during Run.
#ifndef MOECACHE_SERVICES_ENGINE_BATCH_STEP_H_
#define MOECACHE_SERVICES_ENGINE_BATCH_STEP_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "services/engine/attention.h"
#include "services/engine/expert_provider.h"
#include "services/engine/mlp_blocks.h"
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
  // logits of each entry's last token. Before anything runs, every entry is
  // checked (Session::CheckTokens: INVALID_ARGUMENT for bad ids or no
  // tokens, OUT_OF_RANGE past its context), and the batch: not empty, each
  // session once and of this step's model (INVALID_ARGUMENT). On error no
  // session has advanced.
  absl::Status Run(absl::Span<const Entry> entries);

  // Entry i's last-token logits from the last Run, valid until the next.
  absl::Span<const float> logits(size_t i) const;
  // Rows (tokens) of the last Run.
  int64_t rows() const { return rows_; }

 private:
  // Checks every entry (as Run says), grows the sessions' KV caches and
  // the scratch, and writes the rows' token ids and positions.
  absl::Status Begin(absl::Span<const Entry> entries);
  absl::Status Reserve(int64_t rows, int64_t entries);
  // Layer l over all rows: attention, then the MoE or dense MLP, each with
  // its residual add; then the pre-gating hints.
  absl::Status Layer(int l, absl::Span<const Entry> entries, bool prefill);
  // The last row of each entry, normed, through lm_head into host_logits_.
  absl::Status Head(absl::Span<const Entry> entries);
  absl::Status MoeBlock(const LayerWeights& w, absl::Span<const Entry> entries,
                        bool prefill);
  // Each member's (token, expert) pairs within `part` (a run of the layer's
  // union in ascending id), into `tokens` (one per member).
  static void PartTokens(absl::Span<const MemberDemands> members,
                         absl::Span<const ExpertDemand> part, std::vector<int64_t>* tokens);
  // The acquire's usage and wait, shared among the entries' sessions in
  // proportion to `member_tokens`.
  void Attribute(absl::Span<const Entry> entries, const AcquireUsage& usage,
                 double waited, const std::vector<int64_t>& member_tokens);
  // The MLP half on the batch's buffers (services/engine/mlp_blocks.h).
  MlpBuffers Mlp();
  absl::Status Pregate(int layer, absl::Span<const Entry> entries);
  // Hints for `target_layer` from the last row of entry `e` (row `last`).
  absl::Status PregateHints(int target_layer, const Entry& e, int64_t last);
  float* Buf(size_t i) { return static_cast<float*>(bufs_[i]); }
  // A batch of one for request 0 (Session::Forward): the provider's plain
  // Acquire and Hint.
  static bool Lone(absl::Span<const Entry> entries) {
    return entries.size() == 1 && entries[0].request == 0;
  }

  const MoeModel& model_;
  Backend& be_;
  ExpertProvider* experts_;
  std::unique_ptr<AttentionBlock> attention_;
  int64_t rows_ = 0;
  int64_t capacity_ = 0;          // rows the scratch holds
  int64_t entry_capacity_ = 0;    // entries the logits scratch holds
  std::vector<int64_t> offsets_;  // first row of each entry
  std::vector<SequenceRows> seqs_;  // the entries' rows, for attention
  std::vector<void*> bufs_;
  std::vector<float> host_logits_;  // [entries, vocab]
  std::vector<int32_t> host_ids_;
  std::vector<float> host_weights_;
};

}  // namespace moe

#endif  // MOECACHE_SERVICES_ENGINE_BATCH_STEP_H_
