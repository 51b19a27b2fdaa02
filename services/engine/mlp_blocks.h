// The MLP half of a decoder layer, used by the forward step (BatchStep: the
// rows of a batch, one sequence or many). Each function works on
// caller-owned backend buffers of `t` rows (a family's router, shared-expert
// or dense-MLP rule lives here and nowhere else).
//
// Determinism (design invariant 4): every row is computed the same way
// whatever the other rows are; routed experts are applied in ascending id
// order, each expert's rows in ascending order.
//
// Thread-compatible: plain functions over the caller's buffers.
#ifndef MOECACHE_SERVICES_ENGINE_MLP_BLOCKS_H_
#define MOECACHE_SERVICES_ENGINE_MLP_BLOCKS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/backend.h"
#include "services/engine/expert_provider.h"
#include "services/engine/moe_model.h"

namespace moe {

// Backend buffers the blocks read and write; sizes for t rows.
struct MlpBuffers {
  const float* x = nullptr;   // [t, hidden] the normed input
  float* out = nullptr;       // [t, hidden] the block's output (written)
  float* router = nullptr;    // [t, experts] scratch
  int32_t* top_ids = nullptr; // [t, top_k]
  float* top_w = nullptr;     // [t, top_k]
  int32_t* rows = nullptr;    // [t, top_k] scratch
  float* row_w = nullptr;     // [t, top_k] scratch
  float* gate = nullptr;      // [t] scratch
};

// The router of MoE layer `w` on t rows: logits into b.router, the chosen
// experts and their weights into b.top_ids / b.top_w (RouterTopK, or
// RouterSelect with the config's scoring for a scored router). `renormalize`
// overrides norm_topk_prob for the softmax routers (pre-gating asks for
// raw probabilities); a scored router always uses its own rule.
absl::Status RouteRows(Backend& be, const MoeModel& model, const LayerWeights& w,
                       const float* x, const MlpBuffers& b, int64_t t, bool renormalize);

// The routing of t rows, grouped by expert: per expert its rows (ascending)
// and their weights; the demands list the used experts in ascending id with
// their row counts (one row of the iteration's activation matrix).
struct ExpertRows {
  std::vector<std::vector<int32_t>> rows;
  std::vector<std::vector<float>> weights;
  std::vector<ExpertDemand> demands;
};
ExpertRows GroupByExpert(absl::Span<const int32_t> ids, absl::Span<const float> weights,
                         int64_t t, int64_t top_k, int64_t num_experts);

// out = sum over the demanded experts (ascending id) of weight x FFN(x), for
// the rows routed to each, from the views of `lease` (in demand order); then
// waits for the backend (the slots may be reused once released). With
// `lease.host_backend` and on_host views, those run there from host memory
// on their own thread beside the device's experts, and their sum (ascending
// id) is added to the device's: deterministic, within the backend parity
// tolerance of the one-sum result, not bit-equal to it.
//
// A layer in parts (ExpertProvider::AcquireRest): `lease` answers
// er.demands[first, first + lease.views.size()); the first part (first 0)
// sets out, later ones add to it. The CPU backend adds each expert's rows
// in call order, so parts in ascending id give the bits of one whole call.
absl::Status RunRoutedExperts(Backend& be, const ModelConfig& c, const ExpertRows& er,
                              size_t first, const AcquiredExperts& lease, const MlpBuffers& b,
                              int64_t t);

// out += the layer's shared experts: a sigmoid-gated one, or ungated ones
// (SharedExpertKind). REQUIRES: c.has_shared_expert().
absl::Status SharedExperts(Backend& be, const ModelConfig& c, const LayerWeights& w,
                           const MlpBuffers& b, int64_t t);

// out = the dense MLP of a non-MoE layer.
absl::Status DenseMlp(Backend& be, const ModelConfig& c, const LayerWeights& w,
                      const MlpBuffers& b, int64_t t);

}  // namespace moe

#endif  // MOECACHE_SERVICES_ENGINE_MLP_BLOCKS_H_
