#include "services/engine/mla_attention.h"

#include <algorithm>
#include <cmath>

#include "common/status_macros.h"
#include "services/engine/attention.h"

namespace moe {
namespace {

double YarnMscale(double factor, double m) {
  return factor <= 1.0 ? 1.0 : 0.1 * m * std::log(factor) + 1.0;
}

// The dimension whose wavelength makes `rotations` turns over `length`.
double CorrectionDim(double rotations, double dim, double theta,
                     double length) {
  return dim * std::log(length / (rotations * 2.0 * M_PI)) /
         (2.0 * std::log(theta));
}

}  // namespace

RopeTable YarnRopeFor(int64_t d, double theta, const std::optional<YarnConfig>& yarn) {
  RopeTable r;
  r.inv_freq.resize(d / 2);
  for (int64_t i = 0; i < d / 2; ++i) {
    r.inv_freq[i] = static_cast<float>(1.0 / std::pow(theta, static_cast<double>(2 * i) / d));
  }
  if (!yarn.has_value()) return r;
  const YarnConfig& y = *yarn;
  const double len = static_cast<double>(y.original_max_position_embeddings);
  double low = CorrectionDim(y.beta_fast, d, theta, len);
  double high = CorrectionDim(y.beta_slow, d, theta, len);
  if (y.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(d - 1));
  if (low == high) high += 0.001;
  for (int64_t i = 0; i < d / 2; ++i) {
    const double extra = 1.0 / std::pow(theta, static_cast<double>(2 * i) / d);
    const double inter = extra / y.factor;
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    // The published code: inv_freq_mask = 1 - ramp weights freq_extra.
    r.inv_freq[i] = static_cast<float>(inter * ramp + extra * (1.0 - ramp));
  }
  r.mscale = static_cast<float>(YarnMscale(y.factor, y.mscale) /
                                YarnMscale(y.factor, y.mscale_all_dim));
  return r;
}

MlaRope MlaRopeFor(const ModelConfig& c) {
  MlaRope r;
  const int64_t d = c.mla.qk_rope_head_dim;
  r.softmax_scale = static_cast<float>(
      1.0 / std::sqrt(static_cast<double>(c.mla.qk_head_dim())));
  RopeTable t = YarnRopeFor(d, c.rope_theta, c.yarn);
  r.inv_freq = std::move(t.inv_freq);
  r.mscale = t.mscale;
  if (c.yarn.has_value() && c.yarn->mscale_all_dim != 0.0) {
    const double m = YarnMscale(c.yarn->factor, c.yarn->mscale_all_dim);
    r.softmax_scale = static_cast<float>(r.softmax_scale * m * m);
  }
  return r;
}

RouterSpec RouterSpecFor(const ModelConfig& c) {
  RouterSpec s;
  s.scoring = c.scoring_func == ScoringFunc::kSigmoid ? RouterScoring::kSigmoid
                                                      : RouterScoring::kSoftmax;
  switch (c.topk_method) {
    case TopkMethod::kGreedy:
      s.selection = RouterSelection::kGreedy;
      break;
    case TopkMethod::kGroupLimitedGreedy:
      s.selection = RouterSelection::kGroupLimited;
      break;
    case TopkMethod::kNoauxTc:
      s.selection = RouterSelection::kBiasedGroupLimited;
      break;
  }
  s.n_group = c.n_group;
  s.topk_group = c.topk_group;
  s.renormalize = c.norm_topk_prob;
  const bool normalized = c.norm_topk_prob && c.top_k > 1;
  s.scale = (c.traits().unscaled_when_normalized && normalized)
                ? 1.0f
                : static_cast<float>(c.routed_scaling_factor);
  return s;
}

namespace {

// Multi-head latent attention (attention.h). Scratch: the compressed q
// [rows, q_lora_rank] (unused without q_lora), q [rows, heads*qk_head_dim],
// the new rows' c_kv [rows, kv_lora_rank] and k_pe [rows, qk_rope], the
// attention output [rows, heads*v_head_dim]. A layer's cache is c_kv
// [capacity, kv_lora_rank] (LayerKv::first) and k_pe [capacity, qk_rope]
// (second); prefill and decode both take the absorbed path
// (Backend::MlaAttention).
class LatentAttention final : public AttentionBlock {
 public:
  explicit LatentAttention(const MoeModel& model) : AttentionBlock(model) {}

  absl::Status Run(const LayerWeights& w, const float* x, const int32_t* positions,
                   absl::Span<const SequenceRows> seqs, int64_t rows, float* out) override;

 private:
  enum : size_t { kCq, kQ, kCkv, kKpe, kAttn };
  // q, c_kv and k_pe of every row: projected, normed, roped at each row's
  // position.
  absl::Status Project(const LayerWeights& w, const float* x, const int32_t* positions,
                       int64_t rows);
};

absl::Status LatentAttention::Project(const LayerWeights& w, const float* h,
                                      const int32_t* positions, int64_t t) {
  const ModelConfig& c = model_.config();
  const MlaConfig& m = c.mla;
  const int64_t nh = c.num_attention_heads, hidden = c.hidden_size;
  const int64_t qk = m.qk_head_dim();
  const float eps = static_cast<float>(c.rms_norm_eps);
  float* cq = Scratch(kCq);
  float* q = Scratch(kQ);
  float* ckv = Scratch(kCkv);
  float* kpe = Scratch(kKpe);
  if (m.q_lora_rank > 0) {
    RETURN_IF_ERROR(be_.MatMul(h, w.q_a.data, w.q_a.dtype, nullptr, cq, t, m.q_lora_rank, hidden));
    RETURN_IF_ERROR(be_.RmsNorm(cq, w.q_a_norm, cq, t, m.q_lora_rank, eps));
    RETURN_IF_ERROR(
        be_.MatMul(cq, w.q_b.data, w.q_b.dtype, nullptr, q, t, nh * qk, m.q_lora_rank));
  } else {
    RETURN_IF_ERROR(be_.MatMul(h, w.q.data, w.q.dtype, nullptr, q, t, nh * qk, hidden));
  }
  // kv_a_proj_with_mqa's rows: kv_lora_rank of c_kv, then qk_rope of k_pe.
  RETURN_IF_ERROR(
      be_.MatMul(h, w.kv_a.data, w.kv_a.dtype, nullptr, ckv, t, m.kv_lora_rank, hidden));
  const void* kpe_rows = static_cast<const char*>(w.kv_a.data) +
                         m.kv_lora_rank * hidden * DTypeSize(w.kv_a.dtype);
  RETURN_IF_ERROR(
      be_.MatMul(h, kpe_rows, w.kv_a.dtype, nullptr, kpe, t, m.qk_rope_head_dim, hidden));
  RETURN_IF_ERROR(be_.RmsNorm(ckv, w.kv_a_norm, ckv, t, m.kv_lora_rank, eps));
  const MoeModel::RopeFrequencies& rope = model_.mla_rope();
  RETURN_IF_ERROR(be_.RopeInterleaved(q, positions, rope.inv_freq, t, nh, qk,
                                      m.qk_nope_head_dim, m.qk_rope_head_dim, rope.mscale));
  return be_.RopeInterleaved(kpe, positions, rope.inv_freq, t, 1, m.qk_rope_head_dim, 0,
                             m.qk_rope_head_dim, rope.mscale);
}

absl::Status LatentAttention::Run(const LayerWeights& w, const float* x,
                                  const int32_t* positions, absl::Span<const SequenceRows> seqs,
                                  int64_t rows, float* out) {
  const ModelConfig& c = model_.config();
  const MlaConfig& m = c.mla;
  const int64_t nh = c.num_attention_heads;
  const int64_t q_width = nh * m.qk_head_dim(), attn_width = nh * m.v_head_dim;
  RETURN_IF_ERROR(ReserveScratch(rows, {std::max<int64_t>(m.q_lora_rank, 1), q_width,
                                        m.kv_lora_rank, m.qk_rope_head_dim, attn_width}));
  RETURN_IF_ERROR(Project(w, x, positions, rows));
  const float softmax_scale = model_.mla_rope().softmax_scale;
  for (const SequenceRows& s : seqs) {
    RETURN_IF_ERROR(be_.CopyDeviceToDevice(s.kv.first + s.start_pos * m.kv_lora_rank,
                                           Scratch(kCkv) + s.offset * m.kv_lora_rank,
                                           sizeof(float) * s.tokens * m.kv_lora_rank));
    RETURN_IF_ERROR(be_.CopyDeviceToDevice(s.kv.second + s.start_pos * m.qk_rope_head_dim,
                                           Scratch(kKpe) + s.offset * m.qk_rope_head_dim,
                                           sizeof(float) * s.tokens * m.qk_rope_head_dim));
    MlaShape shape;
    shape.tokens = s.tokens;
    shape.heads = nh;
    shape.nope_dim = m.qk_nope_head_dim;
    shape.rope_dim = m.qk_rope_head_dim;
    shape.v_dim = m.v_head_dim;
    shape.rank = m.kv_lora_rank;
    shape.max_seq = s.kv.capacity;
    shape.start_pos = s.start_pos;
    RETURN_IF_ERROR(be_.MlaAttention(Scratch(kQ) + s.offset * q_width, w.kv_b.data,
                                     w.kv_b.dtype, s.kv.first, s.kv.second,
                                     Scratch(kAttn) + s.offset * attn_width, shape,
                                     softmax_scale));
  }
  return be_.MatMul(Scratch(kAttn), w.o.data, w.o.dtype, nullptr, out, rows, c.hidden_size,
                    attn_width);
}

}  // namespace

std::unique_ptr<AttentionBlock> NewLatentAttention(const MoeModel& model) {
  return std::make_unique<LatentAttention>(model);
}

}  // namespace moe
