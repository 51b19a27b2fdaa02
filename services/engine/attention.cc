#include "services/engine/attention.h"

#include <cmath>

#include "common/status_macros.h"

namespace moe {

KvWidths KvWidthsFor(const ModelConfig& c) {
  if (c.is_mla()) return {c.mla.kv_lora_rank, c.mla.qk_rope_head_dim};
  return {c.num_key_value_heads * c.head_dim,
          c.num_key_value_heads * c.head_dim};
}

AttentionBlock::AttentionBlock(const MoeModel& model)
    : model_(model), be_(model.backend()) {}

AttentionBlock::~AttentionBlock() {
  for (void* p : scratch_) be_.Free(p);
}

absl::Status AttentionBlock::ReserveScratch(int64_t rows,
                                            absl::Span<const int64_t> widths) {
  if (rows <= capacity_ && scratch_.size() == widths.size())
    return absl::OkStatus();
  for (void* p : scratch_) be_.Free(p);
  scratch_.assign(widths.size(), nullptr);
  capacity_ = 0;
  for (size_t i = 0; i < widths.size(); ++i) {
    ASSIGN_OR_RETURN(scratch_[i], be_.Alloc(sizeof(float) * rows * widths[i]));
  }
  capacity_ = rows;
  return absl::OkStatus();
}

namespace {

// Grouped-query attention, every variant the config asks for (see
// attention.h). Scratch: q [rows, heads*head_dim], k and v
// [rows, kv_heads*head_dim], the attention output [rows, heads*head_dim].
class GroupedAttention final : public AttentionBlock {
 public:
  explicit GroupedAttention(const MoeModel& model) : AttentionBlock(model) {}

  absl::Status Run(const LayerWeights& w, const float* x,
                   const int32_t* positions,
                   absl::Span<const SequenceRows> seqs, int64_t rows,
                   float* out) override;

 private:
  enum : size_t { kQ, kK, kV, kAttn };
  // q, k, v of every row: projected, normed, roped at each row's position.
  absl::Status Project(const LayerWeights& w, const float* x,
                       const int32_t* positions, int64_t rows);
};

absl::Status GroupedAttention::Project(const LayerWeights& w, const float* x,
                                       const int32_t* positions, int64_t t) {
  const ModelConfig& c = model_.config();
  const int64_t hd = c.head_dim, nh = c.num_attention_heads,
                nkv = c.num_key_value_heads, hidden = c.hidden_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  float* q = Scratch(kQ);
  float* k = Scratch(kK);
  RETURN_IF_ERROR(
      be_.MatMul(x, w.q.data, w.q.dtype, w.q_bias, q, t, nh * hd, hidden));
  RETURN_IF_ERROR(
      be_.MatMul(x, w.k.data, w.k.dtype, w.k_bias, k, t, nkv * hd, hidden));
  RETURN_IF_ERROR(be_.MatMul(x, w.v.data, w.v.dtype, w.v_bias, Scratch(kV), t,
                             nkv * hd, hidden));
  if (c.qk_norm == QkNorm::kPerHead) {
    RETURN_IF_ERROR(be_.RmsNorm(q, w.q_norm, q, t * nh, hd, eps));
    RETURN_IF_ERROR(be_.RmsNorm(k, w.k_norm, k, t * nkv, hd, eps));
  } else if (c.qk_norm == QkNorm::kFull) {
    RETURN_IF_ERROR(be_.RmsNorm(q, w.q_norm, q, t, nh * hd, eps));
    RETURN_IF_ERROR(be_.RmsNorm(k, w.k_norm, k, t, nkv * hd, eps));
  }
  const MoeModel::RopeFrequencies& rope = model_.head_rope();
  if (rope.inv_freq == nullptr) {
    return be_.Rope(q, k, positions, t, nh, nkv, hd,
                    static_cast<float>(c.rope_theta));
  }
  // q/k rows are head-permuted at load (moe_model.h): interleaved rope here
  // is the published rotate-half rope over the first rotary_dim.
  const int64_t rd = c.rotary_dim;
  RETURN_IF_ERROR(be_.RopeInterleaved(q, positions, rope.inv_freq, t, nh, hd, 0,
                                      rd, rope.mscale));
  return be_.RopeInterleaved(k, positions, rope.inv_freq, t, nkv, hd, 0, rd,
                             rope.mscale);
}

absl::Status GroupedAttention::Run(const LayerWeights& w, const float* x,
                                   const int32_t* positions,
                                   absl::Span<const SequenceRows> seqs,
                                   int64_t rows, float* out) {
  const ModelConfig& c = model_.config();
  const int64_t hd = c.head_dim, nh = c.num_attention_heads,
                nkv = c.num_key_value_heads;
  const int64_t q_width = nh * hd, kv_width = nkv * hd;
  RETURN_IF_ERROR(ReserveScratch(rows, {q_width, kv_width, kv_width, q_width}));
  RETURN_IF_ERROR(Project(w, x, positions, rows));
  const MoeModel::RopeFrequencies& rope = model_.head_rope();
  const float scale = rope.inv_freq != nullptr
                          ? rope.softmax_scale
                          : 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t window = w.sliding ? c.sliding_window : 0;
  for (const SequenceRows& s : seqs) {
    AttentionShape shape;
    shape.tokens = s.tokens;
    shape.heads = nh;
    shape.kv_heads = nkv;
    shape.head_dim = hd;
    shape.max_seq = s.kv.capacity;
    shape.start_pos = s.start_pos;
    const float* q = Scratch(kQ) + s.offset * q_width;
    float* attn = Scratch(kAttn) + s.offset * q_width;
    RETURN_IF_ERROR(be_.KvCacheAppend(Scratch(kK) + s.offset * kv_width,
                                      Scratch(kV) + s.offset * kv_width,
                                      s.kv.first, s.kv.second, shape));
    if (w.sinks != nullptr || w.sliding) {
      RETURN_IF_ERROR(be_.SinkAttention(q, s.kv.first, s.kv.second, w.sinks,
                                        attn, shape, scale, window));
    } else {
      RETURN_IF_ERROR(
          be_.Attention(q, s.kv.first, s.kv.second, attn, shape, scale));
    }
  }
  return be_.MatMul(Scratch(kAttn), w.o.data, w.o.dtype, w.o_bias, out, rows,
                    c.hidden_size, q_width);
}

}  // namespace

std::unique_ptr<AttentionBlock> AttentionBlock::Create(const MoeModel& model) {
  if (model.config().is_mla()) return NewLatentAttention(model);
  return std::make_unique<GroupedAttention>(model);
}

}  // namespace moe
