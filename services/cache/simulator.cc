#include "services/cache/simulator.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "services/cache/expert_cache.h"
#include "services/cache/fake_copy_engine.h"
#include "services/cache/policy.h"

namespace moe::cache {
namespace {

using trace::Phase;
using trace::Trace;
using trace::TraceRequest;

using trace::Iteration;
using trace::SplitIterations;

PhaseResult ToPhase(const CachePhaseStats& s, double stall_ms, double time_ms) {
  PhaseResult p;
  p.iterations = s.iterations;
  p.hits = s.hits;
  p.misses = s.misses;
  p.prefetches_issued = s.prefetches_issued;
  p.prefetches_used = s.prefetches_used;
  p.bytes_moved = s.bytes_moved;
  p.stall_ms = stall_ms;
  p.time_ms = time_ms;
  return p;
}

nlohmann::json PhaseJson(const trace::TraceHeader& h, const SimOptions& o, const PhaseResult& r,
                         const PhaseResult& belady) {
  const double tokens = std::max<double>(1, r.iterations);
  const double accesses = std::max<double>(1, r.hits + r.misses);
  const double compute = h.num_layers * o.link.layer_ms;
  const double floor = std::max(compute, belady.misses / tokens * o.link.transfer_ms());
  const double tpot = r.time_ms / tokens;
  nlohmann::json j;
  j["tokens"] = r.iterations;
  j["hit_rate"] = r.hits / accesses;
  j["misses"] = r.misses;
  j["prefetches_issued"] = r.prefetches_issued;
  j["prefetches_used"] = r.prefetches_used;
  j["bytes_moved"] = r.bytes_moved;
  j["stall_ms_per_token"] = r.stall_ms / tokens;
  j["tpot_ms"] = tpot;
  j["floor_tpot_ms"] = floor;
  j["tpot_over_floor"] = floor > 0 ? tpot / floor : 0.0;
  return j;
}

}  // namespace

absl::StatusOr<int> CapacityFromFraction(const trace::TraceHeader& h, double frac) {
  if (!(frac > 0 && frac <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("capacity fraction must be in (0, 1], got ", frac));
  }
  return std::max(1, static_cast<int>(std::lround(frac * h.num_layers * h.num_experts)));
}

std::vector<std::vector<ExpertKey>> FlattenAccessGroups(const Trace& trace, int passes) {
  std::vector<std::vector<ExpertKey>> groups;
  for (int pass = 0; pass < passes; ++pass) {
    for (const auto& r : trace.requests) {
      for (const auto& it : SplitIterations(r, trace.header.num_layers)) {
        for (int l = 0; l < trace.header.num_layers; ++l) {
          std::vector<ExpertKey> g;
          for (const auto& d : it.layers[l]) g.push_back({l, d.expert});
          groups.push_back(std::move(g));
        }
      }
    }
  }
  return groups;
}

namespace {

// One simulated daemon: a cache over a modelled link on a virtual clock.
struct SimCache {
  ManualClock clock;
  std::unique_ptr<FakeCopyEngine> engine;
  std::unique_ptr<ExpertCache> cache;
  bool prefetch = false;
};

absl::Status ValidateSimOptions(const trace::TraceHeader& h, const SimOptions& o) {
  if (o.capacity < h.num_experts) {
    return absl::InvalidArgumentError(absl::StrCat(
        "capacity ", o.capacity, " is below one layer's experts (", h.num_experts, ")"));
  }
  if (!(o.link.expert_mb > 0 && o.link.link_gbps > 0 && o.link.layer_ms >= 0 &&
        o.link.chunk_mb > 0)) {
    return absl::InvalidArgumentError("link model needs expert_mb, link_gbps, chunk_mb > 0");
  }
  if (o.passes < 1) return absl::InvalidArgumentError("passes must be >= 1");
  return absl::OkStatus();
}

// REQUIRES: `sim` not moved afterwards (the cache and engine point at its
// clock).
PolicyConfig SimPolicyConfig(const trace::TraceHeader& h, const SimOptions& o) {
  PolicyConfig pc;
  pc.num_layers = h.num_layers;
  pc.num_experts = h.num_experts;
  pc.top_k = h.top_k;
  pc.capacity = o.capacity;
  pc.expert_bytes = static_cast<double>(o.link.expert_bytes());
  pc.link_bytes_per_sec = o.link.link_gbps * 1e9;
  pc.layer_seconds = o.link.layer_ms * 1e-3;
  return pc;
}

absl::Status BuildSimCache(const Trace& trace, const std::string& policy_spec,
                           const SimOptions& o, SimCache* sim) {
  const auto& h = trace.header;
  const PolicyConfig pc = SimPolicyConfig(h, o);
  std::unique_ptr<CachePolicy> policy;
  const bool belady = policy_spec == "belady";
  if (belady) {
    policy = MakeBeladyPolicy(FlattenAccessGroups(trace, o.passes), pc);
  } else {
    ASSIGN_OR_RETURN(policy, MakePolicy(policy_spec, pc));
  }
  // The cache reads time (its online estimate of T when layer_ms is 0) from
  // the engine's virtual clock: runs stay deterministic.
  FakeCopyEngineOptions eo;
  eo.bandwidth_bytes_per_sec = static_cast<uint64_t>(o.link.link_gbps * 1e9);
  eo.chunk_bytes = std::max<uint64_t>(1, static_cast<uint64_t>(o.link.chunk_mb * 1e6));
  eo.clock = &sim->clock;
  ASSIGN_OR_RETURN(sim->engine, FakeCopyEngine::Create(eo));
  ExpertCacheOptions co;
  co.num_layers = h.num_layers;
  co.num_experts = h.num_experts;
  co.top_k = h.top_k;
  co.capacity = o.capacity;
  co.expert_bytes = o.link.expert_bytes();
  co.prefetch = o.prefetch && !belady;
  SetGateLinkFigures(*sim->engine, pc.link_bytes_per_sec, pc.layer_seconds, &co);
  co.clock = &sim->clock;
  sim->prefetch = co.prefetch;
  ASSIGN_OR_RETURN(sim->cache, ExpertCache::Create(co, std::move(policy), sim->engine.get()));
  return absl::OkStatus();
}

// Serves one layer of one iteration on the virtual clock, then computes for
// `layer_ns`. Returns the stall.
absl::StatusOr<int64_t> ServeLayer(SimCache& sim, const RequestOwner& owner, int layer,
                                   const Iteration& it, int64_t layer_ns) {
  FakeCopyEngine& engine = *sim.engine;
  const int64_t t0 = engine.now_ns();
  ASSIGN_OR_RETURN(auto ticket, sim.cache->StartAcquire(owner, layer, it.layers[layer], it.phase));
  while (true) {
    ASSIGN_OR_RETURN(bool ready, sim.cache->IsReady(ticket));
    if (ready) break;
    auto next = engine.NextCompletionTime();
    if (!next.has_value()) return absl::InternalError("acquire waits on an idle link");
    engine.AdvanceTo(std::max(*next, engine.now_ns()));
  }
  const int64_t stall = engine.now_ns() - t0;
  ASSIGN_OR_RETURN(AcquireResult acquired, sim.cache->FinishAcquire(ticket));
  engine.AdvanceTo(engine.now_ns() + layer_ns);
  RETURN_IF_ERROR(sim.cache->Release(owner.session, acquired.leases));
  return stall;
}

}  // namespace

absl::Status ValidateSimulation(const trace::TraceHeader& header, const std::string& policy,
                                const SimOptions& options) {
  RETURN_IF_ERROR(ValidateSimOptions(header, options));
  if (policy == "belady") return absl::OkStatus();
  return MakePolicy(policy, SimPolicyConfig(header, options)).status();
}

absl::StatusOr<SimResult> Simulate(const Trace& trace, const std::string& policy_spec,
                                   const SimOptions& o) {
  const auto& h = trace.header;
  RETURN_IF_ERROR(ValidateSimOptions(h, o));
  SimCache sim;
  RETURN_IF_ERROR(BuildSimCache(trace, policy_spec, o, &sim));
  ExpertCache& cache = *sim.cache;
  // One client, one request at a time: like one worker.
  const RequestOwner owner{1, 0};
  const int64_t layer_ns = static_cast<int64_t>(std::llround(o.link.layer_ms * 1e6));
  double stall_ms[2] = {0, 0}, time_ms[2] = {0, 0};
  std::vector<ExpertHint> hints;
  const double total = static_cast<double>(o.passes) * std::max<size_t>(1, trace.requests.size());
  int64_t replayed = 0;
  for (int pass = 0; pass < o.passes; ++pass) {
    if (pass == o.passes - 1) {
      cache.ResetStats();
      stall_ms[0] = stall_ms[1] = time_ms[0] = time_ms[1] = 0;
    }
    for (const auto& r : trace.requests) {
      cache.BeginRequest(owner);
      for (const Iteration& it : SplitIterations(r, h.num_layers)) {
        const int pi = it.phase == Phase::kPrefill ? 0 : 1;
        for (int l = 0; l < h.num_layers; ++l) {
          if (!r.hints.empty() && l + 1 < h.num_layers && it.phase == Phase::kDecode) {
            hints.clear();
            for (int32_t e : r.hints[it.token][l + 1]) hints.push_back({l + 1, e, 0.0f});
            cache.AddHints(owner, hints);
          }
          ASSIGN_OR_RETURN(const int64_t stall, ServeLayer(sim, owner, l, it, layer_ns));
          stall_ms[pi] += stall * 1e-6;
          time_ms[pi] += (stall + layer_ns) * 1e-6;
        }
      }
      cache.EndRequest(owner);
      ++replayed;
      if (o.progress) o.progress(static_cast<double>(replayed) / total);
    }
  }
  SimResult res;
  res.policy = policy_spec == "belady" ? "belady" : policy_spec;
  res.capacity = o.capacity;
  res.prefetch = sim.prefetch;
  res.prefill = ToPhase(cache.GetStats(Phase::kPrefill), stall_ms[0], time_ms[0]);
  res.decode = ToPhase(cache.GetStats(Phase::kDecode), stall_ms[1], time_ms[1]);
  return res;
}

nlohmann::json ReportJson(const trace::TraceHeader& h, const SimOptions& o, const SimResult& r,
                          const SimResult& belady) {
  nlohmann::json j = PhaseJson(h, o, r.decode, belady.decode);
  nlohmann::json out;
  out["policy"] = r.policy;
  out["capacity"] = r.capacity;
  out["prefetch"] = r.prefetch;
  for (auto& [k, v] : j.items()) out[k] = v;
  out["prefill"] = PhaseJson(h, o, r.prefill, belady.prefill);
  return out;
}

}  // namespace moe::cache
