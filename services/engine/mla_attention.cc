#include "services/engine/mla_attention.h"

#include <algorithm>
#include <cmath>

#include "common/status_macros.h"
#include "services/engine/session.h"

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

absl::Status Session::ReserveMla(int64_t tokens) {
  if (tokens <= mla_capacity_) return absl::OkStatus();
  const ModelConfig& c = model_.config();
  const MlaConfig& m = c.mla;
  for (void* p : mla_bufs_) be_.Free(p);
  mla_bufs_.assign(4, nullptr);
  const int64_t sizes[4] = {
      tokens * std::max<int64_t>(m.q_lora_rank, 1),  // compressed q
      tokens * m.kv_lora_rank,                       // c_kv of the new tokens
      tokens * m.qk_rope_head_dim,                   // k_pe of the new tokens
      tokens * c.num_attention_heads * m.v_head_dim  // attention output
  };
  for (size_t i = 0; i < 4; ++i) {
    ASSIGN_OR_RETURN(mla_bufs_[i], be_.Alloc(sizeof(float) * sizes[i]));
  }
  mla_capacity_ = tokens;
  return absl::OkStatus();
}

// The latent cache of layer l is kv_[2l] (c_kv, [max_seq, kv_lora_rank])
// and kv_[2l+1] (k_pe, [max_seq, qk_rope_head_dim]); prefill and decode
// both take the absorbed path (Backend::MlaAttention).
absl::Status Session::MlaAttention(const LayerWeights& w, int layer, int64_t t,
                                   float* h, float* q, const int32_t* positions,
                                   float* out) {
  const ModelConfig& c = model_.config();
  const MlaConfig& m = c.mla;
  const int64_t nh = c.num_attention_heads, hidden = c.hidden_size;
  const int64_t qk = m.qk_head_dim();
  const float eps = static_cast<float>(c.rms_norm_eps);
  RETURN_IF_ERROR(ReserveMla(t));
  float* cq = static_cast<float*>(mla_bufs_[0]);
  float* ckv = static_cast<float*>(mla_bufs_[1]);
  float* kpe = static_cast<float*>(mla_bufs_[2]);
  float* attn = static_cast<float*>(mla_bufs_[3]);
  if (m.q_lora_rank > 0) {
    RETURN_IF_ERROR(be_.MatMul(h, w.q_a.data, w.q_a.dtype, nullptr, cq, t,
                               m.q_lora_rank, hidden));
    RETURN_IF_ERROR(be_.RmsNorm(cq, w.q_a_norm, cq, t, m.q_lora_rank, eps));
    RETURN_IF_ERROR(be_.MatMul(cq, w.q_b.data, w.q_b.dtype, nullptr, q, t,
                               nh * qk, m.q_lora_rank));
  } else {
    RETURN_IF_ERROR(
        be_.MatMul(h, w.q.data, w.q.dtype, nullptr, q, t, nh * qk, hidden));
  }
  // kv_a_proj_with_mqa's rows: kv_lora_rank of c_kv, then qk_rope of k_pe.
  RETURN_IF_ERROR(be_.MatMul(h, w.kv_a.data, w.kv_a.dtype, nullptr, ckv, t,
                             m.kv_lora_rank, hidden));
  const void* kpe_rows = static_cast<const char*>(w.kv_a.data) +
                         m.kv_lora_rank * hidden * DTypeSize(w.kv_a.dtype);
  RETURN_IF_ERROR(be_.MatMul(h, kpe_rows, w.kv_a.dtype, nullptr, kpe, t,
                             m.qk_rope_head_dim, hidden));
  RETURN_IF_ERROR(be_.RmsNorm(ckv, w.kv_a_norm, ckv, t, m.kv_lora_rank, eps));
  const MoeModel::RopeFrequencies& rope = model_.mla_rope();
  RETURN_IF_ERROR(be_.RopeInterleaved(q, positions, rope.inv_freq, t, nh, qk,
                                      m.qk_nope_head_dim, m.qk_rope_head_dim,
                                      rope.mscale));
  RETURN_IF_ERROR(be_.RopeInterleaved(kpe, positions, rope.inv_freq, t, 1,
                                      m.qk_rope_head_dim, 0, m.qk_rope_head_dim,
                                      rope.mscale));
  float* ckv_cache = static_cast<float*>(kv_[2 * layer]);
  float* kpe_cache = static_cast<float*>(kv_[2 * layer + 1]);
  RETURN_IF_ERROR(be_.CopyDeviceToDevice(ckv_cache + pos_ * m.kv_lora_rank, ckv,
                                         sizeof(float) * t * m.kv_lora_rank));
  RETURN_IF_ERROR(
      be_.CopyDeviceToDevice(kpe_cache + pos_ * m.qk_rope_head_dim, kpe,
                             sizeof(float) * t * m.qk_rope_head_dim));
  MlaShape shape;
  shape.tokens = t;
  shape.heads = nh;
  shape.nope_dim = m.qk_nope_head_dim;
  shape.rope_dim = m.qk_rope_head_dim;
  shape.v_dim = m.v_head_dim;
  shape.rank = m.kv_lora_rank;
  shape.max_seq = kv_tokens_;
  shape.start_pos = pos_;
  RETURN_IF_ERROR(be_.MlaAttention(q, w.kv_b.data, w.kv_b.dtype, ckv_cache,
                                   kpe_cache, attn, shape, rope.softmax_scale));
  return be_.MatMul(attn, w.o.data, w.o.dtype, nullptr, out, t, hidden,
                    nh * m.v_head_dim);
}

}  // namespace moe
