#include "services/cache/simulator.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "services/cache/cache_config.h"
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

PhaseResult ToPhase(const CachePhaseStats& s, double stall_ms, double time_ms,
                    uint64_t host_runs, double host_ms) {
  PhaseResult p;
  p.iterations = s.iterations;
  p.hits = s.hits;
  p.misses = s.misses;
  p.prefetches_issued = s.prefetches_issued;
  p.prefetches_used = s.prefetches_used;
  p.bytes_moved = s.bytes_moved;
  p.stall_ms = stall_ms;
  p.time_ms = time_ms;
  p.host_runs = host_runs;
  p.host_ms = host_ms;
  return p;
}

nlohmann::json PhaseJson(const trace::TraceHeader& h, const SimOptions& o, const PhaseResult& r,
                         const PhaseResult& belady) {
  // Per step (what each stream waits per token) and per token (what the
  // tokens share); the same with one request at a time.
  const double steps = std::max<double>(1, r.iterations);
  const double tokens = r.tokens > 0 ? static_cast<double>(r.tokens) : steps;
  const double accesses = std::max<double>(1, r.hits + r.misses);
  const double compute = h.num_layers * o.link.layer_ms;
  const double floor =
      std::max(compute, belady.misses / std::max<double>(1, belady.iterations) *
                            o.link.transfer_ms());
  const double tpot = r.time_ms / steps;
  nlohmann::json j;
  j["tokens"] = r.tokens > 0 ? r.tokens : r.iterations;
  if (o.batch > 1) {
    j["batch"] = o.batch;
    if (!o.batch_members) j["batch_members"] = false;
    j["steps"] = r.iterations;
    j["tokens_per_s"] = r.time_ms > 0 ? tokens / (r.time_ms * 1e-3) : 0.0;
    j["bytes_per_token"] = r.bytes_moved / tokens;
  }
  j["hit_rate"] = r.hits / accesses;
  j["misses"] = r.misses;
  j["prefetches_issued"] = r.prefetches_issued;
  j["prefetches_used"] = r.prefetches_used;
  j["bytes_moved"] = r.bytes_moved;
  j["stall_ms_per_token"] = r.stall_ms / tokens;
  j["host_runs_per_token"] = r.host_runs / tokens;
  j["host_ms_per_token"] = r.host_ms / tokens;
  j["miss_mode"] = MissModeName(o.miss_mode);
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

namespace {

// One step of a batched replay: the union of its members' iterations.
struct BatchPlanStep {
  Iteration it;            // phase and per-layer union (ascending expert)
  uint64_t tokens = 0;     // members (one iteration each)
  size_t lead = 0;         // the oldest member (owner of the step's acquires)
  std::vector<size_t> joins, leaves;  // request indexes
  // Per layer, each member's own row (request = index + 1, as owner_of).
  std::vector<std::vector<MemberDemands>> members;
};

std::vector<BatchPlanStep> BatchPlan(const Trace& trace, int batch) {
  const int num_layers = trace.header.num_layers;
  struct Member {
    size_t request;
    std::vector<Iteration> its;
    size_t next = 0;
  };
  std::vector<Member> active;
  std::vector<BatchPlanStep> plan;
  size_t next_request = 0;
  while (next_request < trace.requests.size() || !active.empty()) {
    BatchPlanStep step;
    while (static_cast<int>(active.size()) < batch && next_request < trace.requests.size()) {
      active.push_back(
          {next_request, SplitIterations(trace.requests[next_request], num_layers)});
      step.joins.push_back(next_request++);
    }
    step.lead = active.front().request;
    std::vector<std::map<int32_t, int32_t>> sums(num_layers);
    step.members.resize(num_layers);
    bool prefill = false;
    for (Member& m : active) {
      const Iteration& it = m.its[m.next++];
      prefill = prefill || it.phase == Phase::kPrefill;
      ++step.tokens;
      for (int l = 0; l < num_layers; ++l) {
        for (const ExpertDemand& d : it.layers[l]) sums[l][d.expert] += d.tokens;
        if (it.layers[l].empty()) continue;
        MemberDemands row;
        row.request = m.request + 1;
        row.prefill = it.phase == Phase::kPrefill;
        row.demands = it.layers[l];
        step.members[l].push_back(std::move(row));
      }
    }
    step.it.phase = prefill ? Phase::kPrefill : Phase::kDecode;
    step.it.layers.resize(num_layers);
    for (int l = 0; l < num_layers; ++l) {
      for (const auto& [e, t] : sums[l]) step.it.layers[l].push_back({e, t});
    }
    for (const Member& m : active) {
      if (m.next == m.its.size()) step.leaves.push_back(m.request);
    }
    active.erase(std::remove_if(active.begin(), active.end(),
                                [](const Member& m) { return m.next == m.its.size(); }),
                 active.end());
    plan.push_back(std::move(step));
  }
  return plan;
}

}  // namespace

std::vector<std::vector<ExpertKey>> FlattenAccessGroups(const Trace& trace, int passes,
                                                        int batch) {
  std::vector<std::vector<ExpertKey>> groups;
  if (batch > 1) {
    const std::vector<BatchPlanStep> plan = BatchPlan(trace, batch);
    for (int pass = 0; pass < passes; ++pass) {
      for (const BatchPlanStep& step : plan) {
        for (int l = 0; l < trace.header.num_layers; ++l) {
          std::vector<ExpertKey> g;
          for (const auto& d : step.it.layers[l]) g.push_back({l, d.expert});
          groups.push_back(std::move(g));
        }
      }
    }
    return groups;
  }
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

// A bf16 expert of B bytes has B / 2 parameters: 2 FLOPs each per token.
double SimExpertFlopsPerToken(const SimOptions& o) {
  return static_cast<double>(o.link.expert_bytes());
}

// The cache the simulation runs: the same figures moe-cached's would have.
CacheShape SimCacheShape(const trace::TraceHeader& h, const SimOptions& o) {
  return {h.num_layers, h.num_experts, h.top_k, o.link.expert_bytes(),
          SimExpertFlopsPerToken(o)};
}

CacheConfig SimCacheConfig(const std::string& policy_spec,
                           const SimOptions& o) {
  CacheConfig c;
  c.policy = policy_spec;
  c.capacity = o.capacity;
  c.prefetch = o.prefetch;
  c.link_bytes_per_sec = o.link.link_gbps * 1e9;
  c.layer_seconds = o.link.layer_ms * 1e-3;
  c.miss_mode = o.miss_mode;
  c.host = o.host();
  return c;
}

absl::Status ValidateSimOptions(const trace::TraceHeader& h, const SimOptions& o) {
  RETURN_IF_ERROR(
      ValidateCacheConfig(SimCacheShape(h, o), SimCacheConfig("", o)));
  if (!(o.link.expert_mb > 0 && o.link.link_gbps > 0 && o.link.layer_ms >= 0 &&
        o.link.chunk_mb > 0)) {
    return absl::InvalidArgumentError("link model needs expert_mb, link_gbps, chunk_mb > 0");
  }
  if (o.passes < 1) return absl::InvalidArgumentError("passes must be >= 1");
  if (o.batch < 1 || o.batch > kMaxSimBatch) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch must be in [1, ", kMaxSimBatch, "], got ", o.batch));
  }
  if (o.lease_part < 0 || o.lease_part > h.num_experts) {
    return absl::InvalidArgumentError(absl::StrCat("lease part must be in [0, ", h.num_experts,
                                                   "], got ", o.lease_part));
  }
  return absl::OkStatus();
}

// REQUIRES: `sim` not moved afterwards (the cache and engine point at its
// clock).
absl::Status BuildSimCache(const Trace& trace, const std::string& policy_spec,
                           const SimOptions& o, SimCache* sim) {
  const auto& h = trace.header;
  const bool belady = policy_spec == "belady";
  CacheConfig config = SimCacheConfig(policy_spec, o);
  if (belady) {  // the offline optimum of demand fetching
    config.prefetch = false;
    config.miss_mode = MissMode::kFetch;
  }
  const CacheShape shape = SimCacheShape(h, o);
  const PolicyConfig pc = MakePolicyConfig(shape, config);
  std::unique_ptr<CachePolicy> policy;
  if (belady) {
    policy = MakeBeladyPolicy(FlattenAccessGroups(trace, o.passes, o.batch), pc);
  } else if (policy_spec == "oracle") {
    policy = MakeOraclePolicy(FlattenAccessGroups(trace, o.passes, o.batch), pc);
  } else if (policy_spec == "static-popular-oracle") {
    std::vector<double> tokens(static_cast<size_t>(h.num_layers) * h.num_experts, 0);
    for (const auto& r : trace.requests) {
      for (const Iteration& it : SplitIterations(r, h.num_layers)) {
        for (int l = 0; l < h.num_layers; ++l) {
          for (const ExpertDemand& d : it.layers[l]) tokens[l * h.num_experts + d.expert] += d.tokens;
        }
      }
    }
    policy = MakeOraclePopularPolicy(std::move(tokens), pc);
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
  const ExpertCacheOptions co =
      MakeCacheOptions(shape, config, *sim->engine, &sim->clock);
  sim->prefetch = co.prefetch;
  ASSIGN_OR_RETURN(sim->cache, ExpertCache::Create(co, std::move(policy), sim->engine.get()));
  sim->cache->WarmUp();  // as the daemon does at start
  return absl::OkStatus();
}

struct LayerTime {
  int64_t stall_ns = 0;
  int64_t host_ns = 0;  // host runs of the misses answered on the host
  int host_runs = 0;
};

// Serves one layer of one iteration on the virtual clock, then computes for
// max(`layer_ns`, the host runs). With o.lease_part the layer comes in parts
// (AcquireCall::part), each computed for its share of `layer_ns` (by tokens)
// before the next is asked for.
absl::StatusOr<LayerTime> ServeLayer(SimCache& sim, const SimOptions& o, const RequestOwner& owner,
                                     int layer, const Iteration& it, int64_t layer_ns,
                                     absl::Span<const MemberDemands> members = {}) {
  FakeCopyEngine& engine = *sim.engine;
  const absl::Span<const ExpertDemand> demands = it.layers[layer];
  int64_t tokens = 0;
  for (const ExpertDemand& d : demands) tokens += d.tokens;
  LayerTime time;
  for (size_t first = 0; first < demands.size();) {
    const int64_t t0 = engine.now_ns();
    AcquireCall call{.layer = layer,
                     .demands = demands.subspan(first),
                     .prefill = it.phase == Phase::kPrefill,
                     .host_ok = true};
    if (first == 0) {
      call.members = members;
      call.part = o.lease_part;
    } else {
      call.continues = true;
    }
    ASSIGN_OR_RETURN(auto ticket, sim.cache->StartAcquire(owner, call));
    while (true) {
      ASSIGN_OR_RETURN(bool ready, sim.cache->IsReady(ticket));
      if (ready) break;
      auto next = engine.NextCompletionTime();
      if (!next.has_value()) return absl::InternalError("acquire waits on an idle link");
      engine.AdvanceTo(std::max(*next, engine.now_ns()));
    }
    time.stall_ns += engine.now_ns() - t0;
    ASSIGN_OR_RETURN(AcquireResult acquired, sim.cache->FinishAcquire(ticket));
    const size_t answered = acquired.leases.size() + acquired.host.size();
    if (answered == 0) return absl::InternalError("a part answered no expert");
    double host_seconds = 0;
    int64_t part_tokens = 0;
    for (const ExpertDemand& d : demands.subspan(first, answered)) {
      part_tokens += d.tokens;
      for (const ExpertKey& k : acquired.host) {
        if (d.expert != k.expert) continue;
        host_seconds += HostRunSeconds(o.host(), static_cast<double>(o.link.expert_bytes()),
                                       SimExpertFlopsPerToken(o), d.tokens);
      }
    }
    const int64_t host_ns = static_cast<int64_t>(std::llround(host_seconds * 1e9));
    time.host_runs += static_cast<int>(acquired.host.size());
    time.host_ns += host_ns;
    const int64_t compute_ns =
        answered == demands.size() ? layer_ns : layer_ns * part_tokens / std::max<int64_t>(1, tokens);
    engine.AdvanceTo(engine.now_ns() + std::max(compute_ns, host_ns));
    RETURN_IF_ERROR(sim.cache->Release(owner.session, acquired.leases));
    first += answered;
  }
  return time;
}

}  // namespace

absl::Status ValidateSimulation(const trace::TraceHeader& header, const std::string& policy,
                                const SimOptions& options) {
  RETURN_IF_ERROR(ValidateSimOptions(header, options));
  if (policy == "belady" || policy == "oracle" || policy == "static-popular-oracle") {
    return absl::OkStatus();
  }
  return MakePolicy(policy, MakePolicyConfig(SimCacheShape(header, options),
                                             SimCacheConfig(policy, options)))
      .status();
}

namespace {

bool HasMember(absl::Span<const MemberDemands> members, uint64_t request) {
  for (const MemberDemands& m : members) {
    if (m.request == request) return true;
  }
  return false;
}

// The batched replay (SimOptions::batch > 1).
absl::StatusOr<SimResult> SimulateBatched(const Trace& trace, const std::string& policy_spec,
                                          const SimOptions& o, SimCache& sim) {
  const auto& h = trace.header;
  ExpertCache& cache = *sim.cache;
  const std::vector<BatchPlanStep> plan = BatchPlan(trace, o.batch);
  const int64_t layer_ns = static_cast<int64_t>(std::llround(o.link.layer_ms * 1e6));
  double stall_ms[2] = {0, 0}, time_ms[2] = {0, 0}, host_ms[2] = {0, 0};
  uint64_t host_runs[2] = {0, 0}, tokens[2] = {0, 0}, steps[2] = {0, 0};
  const double total = static_cast<double>(o.passes) * std::max<size_t>(1, plan.size());
  int64_t replayed = 0;
  auto owner_of = [](size_t request) { return RequestOwner{1, request + 1}; };
  for (int pass = 0; pass < o.passes; ++pass) {
    if (pass == o.passes - 1) {
      cache.ResetStats();
      for (int i = 0; i < 2; ++i) {
        stall_ms[i] = time_ms[i] = host_ms[i] = 0;
        host_runs[i] = tokens[i] = steps[i] = 0;
      }
    }
    for (const BatchPlanStep& step : plan) {
      for (size_t r : step.joins) cache.BeginRequest(owner_of(r));
      const int pi = step.it.phase == Phase::kPrefill ? 0 : 1;
      for (int l = 0; l < h.num_layers; ++l) {
        ASSIGN_OR_RETURN(
            const LayerTime t,
            ServeLayer(sim, o, owner_of(step.lead), l, step.it, layer_ns,
                       o.batch_members && HasMember(step.members[l], step.lead + 1)
                           ? absl::MakeConstSpan(step.members[l])
                           : absl::Span<const MemberDemands>()));
        stall_ms[pi] += t.stall_ns * 1e-6;
        host_ms[pi] += t.host_ns * 1e-6;
        host_runs[pi] += t.host_runs;
        time_ms[pi] += (t.stall_ns + std::max(layer_ns, t.host_ns)) * 1e-6;
      }
      tokens[pi] += step.tokens;
      ++steps[pi];
      for (size_t r : step.leaves) cache.EndRequest(owner_of(r));
      ++replayed;
      if (o.progress) o.progress(static_cast<double>(replayed) / total);
    }
  }
  SimResult res;
  res.policy = policy_spec;
  res.capacity = o.capacity;
  res.prefetch = sim.prefetch;
  res.prefill = ToPhase(cache.GetStats(Phase::kPrefill), stall_ms[0], time_ms[0], host_runs[0],
                        host_ms[0]);
  res.decode = ToPhase(cache.GetStats(Phase::kDecode), stall_ms[1], time_ms[1], host_runs[1],
                       host_ms[1]);
  res.prefill.tokens = tokens[0];
  res.decode.tokens = tokens[1];
  // The cache counts each member's iterations; a batched phase reports steps.
  res.prefill.iterations = steps[0];
  res.decode.iterations = steps[1];
  return res;
}

}  // namespace

absl::StatusOr<SimResult> Simulate(const Trace& trace, const std::string& policy_spec,
                                   const SimOptions& o) {
  const auto& h = trace.header;
  RETURN_IF_ERROR(ValidateSimOptions(h, o));
  if ((policy_spec == "belady" || policy_spec == "oracle") && o.lease_part > 0) {
    // The offline optimum chooses every victim itself: whole layers (parts
    // would put the layer's answered experts first).
    SimOptions whole = o;
    whole.lease_part = 0;
    return Simulate(trace, policy_spec, whole);
  }
  SimCache sim;
  RETURN_IF_ERROR(BuildSimCache(trace, policy_spec, o, &sim));
  if (o.batch > 1) {
    // Belady finds its place by counting OnRoute calls (one per acquire) and
    // keeps no per-request state: it replays without members.
    SimOptions batched = o;
    if (policy_spec == "belady" || policy_spec == "oracle") batched.batch_members = false;
    return SimulateBatched(trace, policy_spec, batched, sim);
  }
  ExpertCache& cache = *sim.cache;
  // One client, one request at a time: like one worker.
  const RequestOwner owner{1, 0};
  const int64_t layer_ns = static_cast<int64_t>(std::llround(o.link.layer_ms * 1e6));
  double stall_ms[2] = {0, 0}, time_ms[2] = {0, 0}, host_ms[2] = {0, 0};
  uint64_t host_runs[2] = {0, 0};
  std::vector<ExpertHint> hints;
  const double total = static_cast<double>(o.passes) * std::max<size_t>(1, trace.requests.size());
  int64_t replayed = 0;
  for (int pass = 0; pass < o.passes; ++pass) {
    if (pass == o.passes - 1) {
      cache.ResetStats();
      stall_ms[0] = stall_ms[1] = time_ms[0] = time_ms[1] = host_ms[0] = host_ms[1] = 0;
      host_runs[0] = host_runs[1] = 0;
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
          ASSIGN_OR_RETURN(const LayerTime t, ServeLayer(sim, o, owner, l, it, layer_ns));
          stall_ms[pi] += t.stall_ns * 1e-6;
          host_ms[pi] += t.host_ns * 1e-6;
          host_runs[pi] += t.host_runs;
          time_ms[pi] += (t.stall_ns + std::max(layer_ns, t.host_ns)) * 1e-6;
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
  res.prefill = ToPhase(cache.GetStats(Phase::kPrefill), stall_ms[0], time_ms[0], host_runs[0],
                       host_ms[0]);
  res.decode = ToPhase(cache.GetStats(Phase::kDecode), stall_ms[1], time_ms[1], host_runs[1],
                       host_ms[1]);
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
