// The attention half of a decoder layer, one interface for every family's
// kind of attention, run over all the rows of a forward step (batch_step.h)
// at once:
//
//   grouped (GQA): q/k/v projections with optional biases, optional q/k
//     RMSNorm (per head or over the whole projection), rotate-half rope or
//     a rope from the model's table on head-permuted rows (YaRN, partial
//     rotary), optional learned sinks and sliding window, an optional o
//     bias (AttentionKind::kGrouped in common/model_family.h);
//   latent (MLA): multi-head latent attention over a cache of compressed
//     latents, absorbed path (AttentionKind::kLatent).
//
// Every projection, norm and rope runs once over all rows (each row roped
// at its own position); only the cache append and the attention proper run
// per sequence, against that sequence's cache. Each row goes through the
// same sequence of ops whatever the other rows are, and every CPU kernel
// reduces a row the same way whatever the row count, so on the CPU backend
// a sequence's outputs are bit-identical alone or batched (design
// invariant 4; tests/engine/batch_step_test.cc).
//
// The KV layout is the attention kind's (KvWidthsFor); the storage is the
// sequence's (Session, session.h).
//
// Thread-compatible: one thread runs a block at a time.
#ifndef MOECACHE_SERVICES_ENGINE_ATTENTION_H_
#define MOECACHE_SERVICES_ENGINE_ATTENTION_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/model_config.h"
#include "kernels/backend.h"
#include "services/engine/moe_model.h"

namespace moe {

// Floats per position of each of a layer's two caches: grouped attention
// keeps keys and values (kv_heads * head_dim each), latent attention the
// compressed c_kv (kv_lora_rank) and the roped k_pe (qk_rope_head_dim).
struct KvWidths {
  int64_t first = 0;
  int64_t second = 0;
};
KvWidths KvWidthsFor(const ModelConfig& config);

// One layer's two caches of one sequence, in backend memory:
// first [capacity, KvWidths::first], second [capacity, KvWidths::second].
struct LayerKv {
  float* first = nullptr;
  float* second = nullptr;
  int64_t capacity = 0;  // positions each holds
};

// One sequence's rows in a step: rows [offset, offset + tokens) of the
// step's buffers, at positions start_pos, start_pos + 1, ...; `kv` is the
// layer's cache of that sequence, able to hold start_pos + tokens
// positions.
struct SequenceRows {
  int64_t offset = 0;
  int64_t tokens = 0;
  int64_t start_pos = 0;
  LayerKv kv;
};

class AttentionBlock {
 public:
  // The attention of `model`'s family: latent when config().is_mla(), else
  // grouped. `model` is not owned and must outlive the block.
  static std::unique_ptr<AttentionBlock> Create(const MoeModel& model);

  virtual ~AttentionBlock();
  AttentionBlock(const AttentionBlock&) = delete;
  AttentionBlock& operator=(const AttentionBlock&) = delete;

  // Layer `w` over `rows` rows:
  //   x          [rows, hidden]  the normed input
  //   positions  [rows] int32    each row's position
  //   out        [rows, hidden]  the attention output (after o_proj)
  // Writes each sequence's new keys/values (latents) into its cache at
  // start_pos.. and attends each new token over positions
  // [0, its position] of that cache. All pointers in backend memory.
  // REQUIRES: `seqs` cover [0, rows) in order without overlap.
  virtual absl::Status Run(const LayerWeights& w, const float* x,
                           const int32_t* positions,
                           absl::Span<const SequenceRows> seqs, int64_t rows,
                           float* out) = 0;

 protected:
  explicit AttentionBlock(const MoeModel& model);
  // Scratch buffer i holds rows * widths[i] floats; grown (never shrunk)
  // to `rows`, kept across calls.
  absl::Status ReserveScratch(int64_t rows, absl::Span<const int64_t> widths);
  float* Scratch(size_t i) const { return static_cast<float*>(scratch_[i]); }

  const MoeModel& model_;
  Backend& be_;

 private:
  std::vector<void*> scratch_;
  int64_t capacity_ = 0;  // rows the scratch holds
};

// The latent (MLA) block, mla_attention.cc. REQUIRES: config().is_mla().
std::unique_ptr<AttentionBlock> NewLatentAttention(const MoeModel& model);

}  // namespace moe

#endif  // MOECACHE_SERVICES_ENGINE_ATTENTION_H_
