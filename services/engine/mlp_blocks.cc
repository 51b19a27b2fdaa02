#include "services/engine/mlp_blocks.h"

#include "common/status_macros.h"
#include "services/engine/mla_attention.h"

namespace moe {

absl::Status RouteRows(Backend& be, const MoeModel& model, const LayerWeights& w,
                       const float* x, const MlpBuffers& b, int64_t t, bool renormalize) {
  const ModelConfig& c = model.config();
  // gpt_oss: logits = x W^T + b; its softmax over the top-k logits equals
  // the softmax over all experts renormalized over the top-k.
  RETURN_IF_ERROR(be.MatMul(x, w.router.data, w.router.dtype, w.router_bias, b.router, t,
                            c.num_experts, c.hidden_size));
  if (!c.is_deepseek()) {
    return be.RouterTopK(b.router, b.top_ids, b.top_w, t, c.num_experts, c.top_k, renormalize);
  }
  return be.RouterSelect(b.router, w.score_bias, b.top_ids, b.top_w, t, c.num_experts, c.top_k,
                         RouterSpecFor(c));
}

ExpertRows GroupByExpert(absl::Span<const int32_t> ids, absl::Span<const float> weights,
                         int64_t t, int64_t top_k, int64_t num_experts) {
  ExpertRows er;
  er.rows.resize(num_experts);
  er.weights.resize(num_experts);
  for (int64_t i = 0; i < t * top_k; ++i) {
    er.rows[ids[i]].push_back(static_cast<int32_t>(i / top_k));
    er.weights[ids[i]].push_back(weights[i]);
  }
  for (int32_t x = 0; x < num_experts; ++x) {
    if (!er.rows[x].empty()) er.demands.push_back({x, static_cast<int32_t>(er.rows[x].size())});
  }
  return er;
}

absl::Status RunRoutedExperts(Backend& be, const ModelConfig& c, const ExpertRows& er,
                              const AcquiredExperts& lease, const MlpBuffers& b, int64_t t) {
  absl::Status status = be.MemsetZero(b.out, 4 * t * c.hidden_size);
  for (size_t i = 0; status.ok() && i < er.demands.size(); ++i) {
    const int32_t x = er.demands[i].expert;
    const ExpertView& view = lease.views[i];
    const int64_t count = er.demands[i].tokens;
    status = be.CopyToDevice(b.rows, er.rows[x].data(), 4 * count);
    if (status.ok()) status = be.CopyToDevice(b.row_w, er.weights[x].data(), 4 * count);
    if (status.ok() && c.has_expert_biases()) {
      const ClampedSwiglu act{static_cast<float>(c.gpt_oss.swiglu_limit),
                              static_cast<float>(c.gpt_oss.swiglu_alpha)};
      status = be.BiasedExpertFfn(b.x, b.rows, b.row_w, view.gate, view.up, view.down,
                                  view.dtype, view.gate_bias, view.up_bias, view.down_bias,
                                  act, b.out, t, count, c.hidden_size, c.moe_intermediate_size);
    } else if (status.ok()) {
      status = be.ExpertFfn(b.x, b.rows, b.row_w, view.gate, view.up, view.down, view.dtype,
                            b.out, t, count, c.hidden_size, c.moe_intermediate_size);
    }
  }
  if (status.ok()) status = be.Synchronize();
  return status;
}

absl::Status SharedExperts(Backend& be, const ModelConfig& c, const LayerWeights& w,
                           const MlpBuffers& b, int64_t t) {
  const float* gate = nullptr;  // DeepSeek: shared experts, no gate
  if (c.has_shared_expert_gate()) {
    // out += sigmoid(x . shared_expert_gate) * shared_expert(x), per row.
    RETURN_IF_ERROR(be.MatMul(b.x, w.shared_expert_gate.data, w.shared_expert_gate.dtype,
                              nullptr, b.gate, t, 1, c.hidden_size));
    RETURN_IF_ERROR(be.Sigmoid(b.gate, b.gate, t));
    gate = b.gate;
  }
  return be.ExpertFfn(b.x, nullptr, gate, w.shared_gate.data, w.shared_up.data,
                      w.shared_down.data, w.shared_gate.dtype, b.out, t, t, c.hidden_size,
                      w.shared_gate.rows);
}

absl::Status DenseMlp(Backend& be, const ModelConfig& c, const LayerWeights& w,
                      const MlpBuffers& b, int64_t t) {
  RETURN_IF_ERROR(be.MemsetZero(b.out, 4 * t * c.hidden_size));
  return be.ExpertFfn(b.x, nullptr, nullptr, w.dense_gate.data, w.dense_up.data,
                      w.dense_down.data, w.dense_gate.dtype, b.out, t, t, c.hidden_size,
                      w.dense_gate.rows);
}

}  // namespace moe
