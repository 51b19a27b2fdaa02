#include "services/plan/predict.h"

#include <algorithm>

#include "common/status_macros.h"
#include "services/cache/miss_planner.h"
#include "services/cache/simulator.h"
#include "services/cache/synth_trace.h"

namespace moe::plan {
namespace {

// The daemon's default policy (moe-cached --policy).
constexpr char kPolicy[] = "moe-infinity";

struct Device {
  double bytes_per_s = 0;
  double flops_per_s = 0;
};

Device DeviceOf(const PlanOptions& o) {
  return {DeviceReadGbps(o) * 1e9, (o.gpu_bytes > 0 ? o.device_gflops : o.host_gflops) * 1e9};
}

// The step's compute figures, per MoE layer.
struct LayerCost {
  double decode_s = 0;   // one decode step of the batch
  double prefill_s = 0;  // one prompt of `prompt` tokens
  int64_t routed = 0;    // experts a decode step reads per layer
  int prompt = 0;
};

// The non-expert bytes a step reads per MoE layer: all but the embedding
// (a step reads rows of it), unless it is also the output head (tied).
double DenseBytesPerLayer(const ModelConfig& c, const ModelFigures& m) {
  const int64_t element = m.stored.dense == DType::kF8E4M3 ? 2 : DTypeSize(m.stored.dense);
  const double embed =
      c.tie_word_embeddings ? 0.0 : static_cast<double>(c.vocab_size * c.hidden_size * element);
  return std::max(0.0, static_cast<double>(m.dense_bytes_device) - embed) / m.num_moe_layers;
}

// Decode reads DecodeBytesPerLayer; prefill also does 2 FLOPs per active
// parameter per token. Each adds the fixed cost of a layer
// (options.layer_overhead_us) once per step.
LayerCost Cost(const ModelConfig& c, const Plan& p) {
  const ModelFigures& m = p.model;
  const Device dev = DeviceOf(p.options);
  const double overhead_s = p.options.layer_overhead_us * 1e-6;
  LayerCost cost;
  cost.routed = std::min<int64_t>(m.experts_per_layer, int64_t{p.options.max_batch} * m.top_k);
  cost.prompt = static_cast<int>(std::clamp<int64_t>(p.context / 2, 1, 64));
  cost.decode_s = DecodeBytesPerLayer(c, m, p.options.max_batch) / dev.bytes_per_s + overhead_s;
  const double read = (DenseBytesPerLayer(c, m) +
                       m.experts_per_layer * static_cast<double>(m.expert_bytes)) /
                      dev.bytes_per_s;
  const double flops = 2.0 * m.params_active * cost.prompt / m.num_moe_layers;
  cost.prefill_s =
      (dev.flops_per_s > 0 ? std::max(read, flops / dev.flops_per_s) : read) + overhead_s;
  return cost;
}

// Below one layer of slots: every miss runs on the host, a layer takes
// max(its compute, its host runs) (the simulator's rule), misses spread
// evenly over the experts.
Rates ClosedForm(const Plan& p, const LayerCost& cost) {
  const ModelFigures& m = p.model;
  const PlanOptions& o = p.options;
  const HostFigures host{o.host_gbps * 1e9, o.host_gflops * 1e9};
  const double flops_per_token = 2.0 * m.expert_params;
  const double resident = static_cast<double>(p.cache_slots) / m.experts_total;
  const double expert = static_cast<double>(m.expert_bytes);
  auto layer = [&](double compute_s, double experts, double tokens) {
    const int per_expert = std::max(1, static_cast<int>(tokens / experts));
    const double run = cache::HostRunSeconds(host, expert, flops_per_token, per_expert);
    return std::max(compute_s, experts * (1 - resident) * run);
  };
  Rates r;
  r.layer_ms = cost.decode_s * 1e3;
  const double step = m.num_moe_layers *
                      layer(cost.decode_s, cost.routed, double(o.max_batch) * m.top_k);
  r.decode_tokens_per_s = o.max_batch / step;
  const double union_experts =
      std::min<double>(m.experts_per_layer, double(cost.prompt) * m.top_k);
  const double prompt = m.num_moe_layers *
                        layer(cost.prefill_s, union_experts, double(cost.prompt) * m.top_k);
  r.prefill_tokens_per_s = cost.prompt / prompt;
  return r;
}

cache::SimOptions SimOptionsFor(const Plan& p, const LayerCost& cost) {
  const PlanOptions& o = p.options;
  cache::SimOptions s;
  s.capacity = static_cast<int>(p.cache_slots);
  s.prefetch = true;  // as moe-cached ships
  s.link.expert_mb = static_cast<double>(p.model.expert_bytes) / 1e6;
  // Without a GPU a "copy" is a memcpy at the host's bandwidth.
  s.link.link_gbps = o.gpu_bytes > 0 ? o.link_gbps : o.host_gbps;
  s.link.layer_ms = cost.decode_s * 1e3;
  s.batch = std::min(o.max_batch, cache::kMaxSimBatch);
  s.passes = 2;  // the last pass is reported: a warm cache, as a serving daemon has
  s.miss_mode = p.miss_mode;
  s.host_gbps = o.host_gbps;
  s.host_gflops = o.host_gflops;
  return s;
}

absl::StatusOr<Rates> Simulated(const Plan& p, const LayerCost& cost) {
  const ModelFigures& m = p.model;
  trace::SynthOptions t;
  t.model = "plan";
  t.num_layers = m.num_moe_layers;
  t.num_experts = static_cast<int>(m.experts_per_layer);
  t.top_k = static_cast<int>(m.top_k);
  t.requests = 2 * p.options.max_batch;
  t.prefill_tokens = cost.prompt;
  t.decode_tokens = 24;
  ASSIGN_OR_RETURN(trace::Trace trace, trace::GenerateSyntheticTrace(t));
  const cache::SimOptions s = SimOptionsFor(p, cost);
  ASSIGN_OR_RETURN(cache::SimResult result, cache::Simulate(trace, kPolicy, s));
  Rates r;
  r.simulated = true;
  r.layer_ms = s.link.layer_ms;
  const cache::PhaseResult& d = result.decode;
  const double tokens = static_cast<double>(d.tokens > 0 ? d.tokens : d.iterations);
  r.decode_tokens_per_s = d.time_ms > 0 ? tokens * 1e3 / d.time_ms : 0;
  int64_t prompt_tokens = 0;
  for (const trace::TraceRequest& q : trace.requests) prompt_tokens += q.num_prefill_tokens();
  const cache::PhaseResult& f = result.prefill;
  // The simulator charges a prompt one decode step's compute per layer;
  // add what its FLOPs take beyond that.
  const double extra_ms = static_cast<double>(f.iterations) * m.num_moe_layers *
                          std::max(0.0, cost.prefill_s - cost.decode_s) * 1e3;
  const double prefill_ms = f.time_ms + extra_ms;
  r.prefill_tokens_per_s = prefill_ms > 0 ? prompt_tokens * 1e3 / prefill_ms : 0;
  return r;
}

}  // namespace

double DecodeBytesPerLayer(const ModelConfig& c, const ModelFigures& m, int sequences) {
  const int64_t routed = std::min<int64_t>(m.experts_per_layer, int64_t{sequences} * m.top_k);
  return DenseBytesPerLayer(c, m) + routed * static_cast<double>(m.expert_bytes);
}

absl::StatusOr<Rates> PredictRates(const ModelConfig& config, const Plan& plan) {
  const LayerCost cost = Cost(config, plan);
  if (plan.cache_slots < plan.model.experts_per_layer) return ClosedForm(plan, cost);
  return Simulated(plan, cost);
}

}  // namespace moe::plan
