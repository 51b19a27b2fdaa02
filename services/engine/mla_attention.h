// The pieces of latent attention and the scored router that are pure
// functions of the config: the rotary parameters of the rope part of
// multi-head latent attention (with YaRN when rope_scaling asks for it), its
// softmax scale, and the router's selection rule. The latent attention block
// (attention.h, defined in mla_attention.cc) uses them.
//
// The formulas follow the modeling code the latent-attention checkpoints
// ship with (common/model_family.cc names them):
//   inv_freq_i = 1 / theta^(2i/d), d = qk_rope_head_dim; with YaRN
//     (factor s, original length L, beta_fast bf, beta_slow bs):
//     low  = max(floor(corr(bf)), 0), high = min(ceil(corr(bs)), d - 1),
//     corr(r) = d * ln(L / (2 pi r)) / (2 ln theta),
//     ramp_i = clamp((i - low) / (high - low), 0, 1) (high += 0.001 if equal),
//     inv_freq_i = inv_freq_i / s * ramp_i + inv_freq_i * (1 - ramp_i),
//     and cos/sin are multiplied by
//     yarn_mscale(s, mscale) / yarn_mscale(s, mscale_all_dim),
//     yarn_mscale(s, m) = s <= 1 ? 1 : 0.1 m ln(s) + 1.
//   softmax scale = 1 / sqrt(qk_nope + qk_rope), times
//     yarn_mscale(s, mscale_all_dim)^2 when YaRN and mscale_all_dim != 0.
#ifndef MOECACHE_SERVICES_ENGINE_MLA_ATTENTION_H_
#define MOECACHE_SERVICES_ENGINE_MLA_ATTENTION_H_

#include <optional>
#include <vector>

#include "common/model_config.h"
#include "kernels/backend.h"

namespace moe {

struct MlaRope {
  std::vector<float> inv_freq;  // [qk_rope_head_dim / 2]
  float mscale = 1.0f;          // cos/sin factor
  float softmax_scale = 1.0f;
};

// REQUIRES: config.is_mla() and the config was validated.
MlaRope MlaRopeFor(const ModelConfig& config);

// Inverse frequencies of a rotary embedding over `dim` dimensions (base
// theta), with YaRN when `yarn` is set (the formulas above; the correction
// range is floored/ceiled only when yarn->truncate, as transformers'
// _compute_yarn_parameters), and the cos/sin factor.
struct RopeTable {
  std::vector<float> inv_freq;  // [dim / 2]
  float mscale = 1.0f;
};
RopeTable YarnRopeFor(int64_t dim, double theta,
                      const std::optional<YarnConfig>& yarn);

// The scored router of a MoE layer (RouterKind::kScoredGroups). With the row's
// unscaled_when_normalized: weights
// renormalized when top_k > 1 and norm_topk_prob, else scaled by
// routed_scaling_factor; otherwise renormalized when asked, then always
// scaled. REQUIRES: config.has_scored_router().
RouterSpec RouterSpecFor(const ModelConfig& config);

}  // namespace moe

#endif  // MOECACHE_SERVICES_ENGINE_MLA_ATTENTION_H_
