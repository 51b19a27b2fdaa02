#include "services/engine/mlp_blocks.h"

#include <thread>
#include <vector>

#include "common/status_macros.h"
#include "services/engine/mla_attention.h"

namespace moe {

absl::Status RouteRows(Backend& be, const MoeModel& model, const LayerWeights& w,
                       const float* x, const MlpBuffers& b, int64_t t, bool renormalize) {
  const ModelConfig& c = model.config();
  // With a router bias: logits = x W^T + b. A softmax over the top-k logits
  // equals the softmax over all experts renormalized over the top-k.
  RETURN_IF_ERROR(be.MatMul(x, w.router.data, w.router.dtype, w.router_bias, b.router, t,
                            c.num_experts, c.hidden_size));
  if (!c.has_scored_router()) {
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

namespace {

// out += the routed rows of one expert through `view`, on `be`; `rows` and
// `row_w` are backend memory of `be` holding `er`'s rows of the expert.
absl::Status RunOneExpert(Backend& be, const ModelConfig& c, const ExpertView& view,
                          const float* x, const int32_t* rows, const float* row_w, float* out,
                          int64_t t, int64_t count) {
  if (c.has_expert_biases()) {
    const ClampedSwiglu act{static_cast<float>(c.swiglu_limit),
                            static_cast<float>(c.swiglu_alpha)};
    // Biased (fused) experts come in one dtype (ModelDescription checks it).
    return be.BiasedExpertFfn(x, rows, row_w, view.gate, view.up, view.down, view.dtypes.gate,
                              view.gate_bias, view.up_bias, view.down_bias, act, out, t, count,
                              c.hidden_size, c.moe_intermediate_size);
  }
  return be.ExpertFfn(x, rows, row_w, view.gate, view.up, view.down, view.dtypes, out, t, count,
                      c.hidden_size, c.moe_intermediate_size);
}

// out = (first 0) or += (later parts) the sum of the lease's experts
// (er.demands from `first`, ascending id) on `be`, leaving out the on_host
// ones when `skip_on_host`; then waits for `be`. Unbiased experts go to the
// backend as one ExpertFfns (their rows packed one after another in
// b.rows), biased ones one at a time.
absl::Status RunBackendExperts(Backend& be, const ModelConfig& c, const ExpertRows& er,
                               size_t first, const AcquiredExperts& lease,
                               const MlpBuffers& b, int64_t t, bool skip_on_host) {
  absl::Status status =
      first == 0 ? be.MemsetZero(b.out, 4 * t * c.hidden_size) : absl::OkStatus();
  if (!c.has_expert_biases()) {
    thread_local std::vector<Backend::ExpertCall> calls;
    thread_local std::vector<int32_t> rows;
    thread_local std::vector<float> weights;
    calls.clear();
    rows.clear();
    weights.clear();
    for (size_t i = 0; i < lease.views.size(); ++i) {
      if (skip_on_host && lease.views[i].on_host) continue;
      const int32_t e = er.demands[first + i].expert;
      const ExpertView& v = lease.views[i];
      Backend::ExpertCall call;
      call.rows = b.rows + rows.size();  // device addresses: b.rows's, offset
      call.weights = b.row_w + weights.size();
      call.gate = v.gate;
      call.up = v.up;
      call.down = v.down;
      call.dtypes = v.dtypes;
      call.count = er.demands[first + i].tokens;
      calls.push_back(call);
      rows.insert(rows.end(), er.rows[e].begin(), er.rows[e].end());
      weights.insert(weights.end(), er.weights[e].begin(), er.weights[e].end());
    }
    if (status.ok() && !rows.empty()) status = be.CopyToDevice(b.rows, rows.data(), 4 * rows.size());
    if (status.ok() && !weights.empty()) {
      status = be.CopyToDevice(b.row_w, weights.data(), 4 * weights.size());
    }
    if (status.ok()) {
      status = be.ExpertFfns(b.x, calls, b.out, t, c.hidden_size, c.moe_intermediate_size);
    }
    if (status.ok()) status = be.Synchronize();
    return status;
  }
  for (size_t i = 0; status.ok() && i < lease.views.size(); ++i) {
    if (skip_on_host && lease.views[i].on_host) continue;
    const int32_t e = er.demands[first + i].expert;
    const int64_t count = er.demands[first + i].tokens;
    status = be.CopyToDevice(b.rows, er.rows[e].data(), 4 * count);
    if (status.ok()) status = be.CopyToDevice(b.row_w, er.weights[e].data(), 4 * count);
    if (status.ok()) {
      status = RunOneExpert(be, c, lease.views[i], b.x, b.rows, b.row_w, b.out, t, count);
    }
  }
  if (status.ok()) status = be.Synchronize();
  return status;
}

// The device runs the resident experts while `host` runs the on_host ones
// from host memory on a host copy of x; the host sum is then added to the
// device's. Each part sums its experts in ascending id, so the result is
// deterministic but rounds differently from one ascending sum (the
// tolerance of docs/architecture.md, "Where a miss is served").
absl::Status RunSplitExperts(Backend& be, Backend& host, const ModelConfig& c,
                             const ExpertRows& er, size_t first, const AcquiredExperts& lease,
                             const MlpBuffers& b, int64_t t) {
  const int64_t n = t * c.hidden_size;
  std::vector<float> x(n), host_out(n, 0.0f), sum(n);
  // x first: behind the device's experts the copy would wait for them.
  RETURN_IF_ERROR(be.CopyToHost(x.data(), b.x, 4 * n));
  // The host's experts on their own thread, so they overlap the device's
  // whatever the device copies block on.
  absl::Status host_status;
  std::thread host_thread([&] {
    for (size_t i = 0; host_status.ok() && i < lease.views.size(); ++i) {
      if (!lease.views[i].on_host) continue;
      const int32_t e = er.demands[first + i].expert;
      host_status = RunOneExpert(host, c, lease.views[i], x.data(), er.rows[e].data(),
                                 er.weights[e].data(), host_out.data(), t,
                                 er.demands[first + i].tokens);
    }
    if (host_status.ok()) host_status = host.Synchronize();
  });
  absl::Status status =
      RunBackendExperts(be, c, er, first, lease, b, t, /*skip_on_host=*/true);
  host_thread.join();
  if (status.ok()) status = host_status;
  if (status.ok()) status = be.CopyToHost(sum.data(), b.out, 4 * n);
  if (!status.ok()) return status;
  for (int64_t j = 0; j < n; ++j) sum[j] += host_out[j];
  RETURN_IF_ERROR(be.CopyToDevice(b.out, sum.data(), 4 * n));
  return be.Synchronize();
}

}  // namespace

absl::Status RunRoutedExperts(Backend& be, const ModelConfig& c, const ExpertRows& er,
                              size_t first, const AcquiredExperts& lease, const MlpBuffers& b,
                              int64_t t) {
  if (lease.host_backend != nullptr) {
    for (const ExpertView& v : lease.views) {
      if (v.on_host) return RunSplitExperts(be, *lease.host_backend, c, er, first, lease, b, t);
    }
  }
  return RunBackendExperts(be, c, er, first, lease, b, t, /*skip_on_host=*/false);
}

absl::Status SharedExperts(Backend& be, const ModelConfig& c, const LayerWeights& w,
                           const MlpBuffers& b, int64_t t) {
  const float* gate = nullptr;  // ungated shared experts
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
