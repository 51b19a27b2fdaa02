#include "services/cache/expert_cache.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "services/cache/eamc_store.h"

namespace moe::cache {
namespace {

PrefetcherOptions MakePrefetcherOptions(const ExpertCacheOptions& o) {
  PrefetcherOptions p;
  p.num_layers = o.num_layers;
  p.num_experts = o.num_experts;
  p.transfer_seconds = o.link_bytes_per_sec > 0 ? o.expert_bytes / o.link_bytes_per_sec : 1.0;
  p.layer_seconds = std::max(0.0, o.layer_seconds);  // 0: estimated online
  p.gate = o.prefetch_gate;
  p.chunk_seconds = ChunkWaitSeconds(o.chunk_bytes, o.expert_bytes, o.link_bytes_per_sec);
  return p;
}

}  // namespace

void SetGateLinkFigures(const CopyEngine& engine, double link_bytes_per_sec,
                        double layer_seconds, ExpertCacheOptions* options) {
  options->link_bytes_per_sec = link_bytes_per_sec;
  options->chunk_bytes = engine.chunk_bytes();
  options->layer_seconds = layer_seconds;
}

absl::Status CheckCapacity(int capacity, int num_experts, MissMode miss_mode) {
  if (capacity < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("capacity ", capacity, " is negative"));
  }
  if (capacity < num_experts && miss_mode == MissMode::kFetch) {
    return absl::InvalidArgumentError(absl::StrCat(
        "capacity ", capacity, " is below one layer's experts (", num_experts,
        "): with --miss-mode fetch a layer could need more slots than exist; "
        "--miss-mode host or auto runs the misses that find no slot on the "
        "host, down to 0 slots"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ExpertCache>> ExpertCache::Create(
    const ExpertCacheOptions& options, std::unique_ptr<CachePolicy> policy, CopyEngine* engine,
    HostBlockFn host_block) {
  if (options.num_layers <= 0 || options.num_experts <= 0 || options.top_k <= 0) {
    return absl::InvalidArgumentError("cache needs positive num_layers, num_experts, top_k");
  }
  RETURN_IF_ERROR(CheckCapacity(options.capacity, options.num_experts, options.miss_mode));
  if (options.expert_bytes == 0) return absl::InvalidArgumentError("expert_bytes must be > 0");
  if (!options.layer_bytes.empty()) {
    if (options.layer_bytes.size() != static_cast<size_t>(options.num_layers)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "layer_bytes has ", options.layer_bytes.size(), " entries for ", options.num_layers,
          " layers"));
    }
    for (uint64_t b : options.layer_bytes) {
      if (b == 0 || b > options.expert_bytes) {
        return absl::InvalidArgumentError(absl::StrCat(
            "layer_bytes entry ", b, " is outside (0, expert_bytes = ", options.expert_bytes, "]"));
      }
    }
  }
  if (policy == nullptr || engine == nullptr) {
    return absl::InvalidArgumentError("cache needs a policy and a copy engine");
  }
  return std::unique_ptr<ExpertCache>(
      new ExpertCache(options, std::move(policy), engine, std::move(host_block)));
}

ExpertCache::ExpertCache(const ExpertCacheOptions& options, std::unique_ptr<CachePolicy> policy,
                         CopyEngine* engine, HostBlockFn host_block)
    : options_(options),
      engine_(engine),
      host_block_(std::move(host_block)),
      clock_(options.clock != nullptr ? options.clock : RealClock::Get()),
      policy_(std::move(policy)),
      prefetcher_(MakePrefetcherOptions(options)),
      slots_(options.capacity),
      meta_(options.capacity),
      layer_hits_(options.num_layers, 0),
      layer_misses_(options.num_layers, 0),
      kept_open_(static_cast<size_t>(options.num_layers) * options.num_experts, 0),
      host_(options.host) {}

ExpertCache::OwnerState& ExpertCache::Owner(const RequestOwner& owner) {
  OwnerState& o = owners_[owner];
  if (o.issued_for_layer.empty()) o.issued_for_layer.assign(options_.num_layers, 0);
  return o;
}

void ExpertCache::DropOwner(const RequestOwner& owner) {
  if (auto it = owners_.find(owner); it != owners_.end()) CloseLayerLocked(it->second);
  policy_->OnEndRequest(owner);
  prefetcher_.EndRequest(owner);
  owners_.erase(owner);
}

void ExpertCache::BeginRequest(const RequestOwner& owner) {
  absl::MutexLock lock(&mu_);
  if (auto it = owners_.find(owner); it != owners_.end()) CloseLayerLocked(it->second);
  owners_.erase(owner);
  Owner(owner);
  prefetcher_.EndRequest(owner);
  policy_->OnBeginRequest(owner);
}

void ExpertCache::EndRequest(const RequestOwner& owner) {
  absl::MutexLock lock(&mu_);
  DropOwner(owner);
}

void ExpertCache::AddHints(const RequestOwner& owner, absl::Span<const ExpertHint> hints) {
  absl::MutexLock lock(&mu_);
  for (const ExpertHint& h : hints) {
    MOE_CHECK(h.layer >= 0 && h.layer < options_.num_layers && h.expert >= 0 &&
              h.expert < options_.num_experts)
        << "hint for " << ExpertKey{h.layer, h.expert}.ToString() << " out of range";
    prefetcher_.AddHint(owner, h);
    policy_->OnHint(owner, h);
  }
  // A hint for a layer ahead of where the owner is (pre-gating predicts layer
  // l+1 right after layer l) can only help if its copy starts now, not at the
  // owner's next acquire: issue for the layers after its last one.
  auto it = owners_.find(owner);
  if (options_.prefetch && !hints.empty() && it != owners_.end() && it->second.last_layer >= 0 &&
      it->second.phase == Phase::kDecode) {
    IssuePrefetches({owner}, it->second.last_layer, Phase::kDecode);
  }
}

void ExpertCache::CheckDemands(int layer, absl::Span<const ExpertDemand> demands,
                               absl::Span<const MemberDemands> members) const {
  if (!members.empty()) {
    const absl::Status valid = ValidateMembers(
        ExchangeShape{options_.num_layers, options_.num_experts}, layer, demands, members);
    MOE_CHECK(valid.ok()) << valid;
  }
  MOE_CHECK(layer >= 0 && layer < options_.num_layers) << "layer " << layer << " out of range";
  for (size_t i = 0; i < demands.size(); ++i) {
    MOE_CHECK(demands[i].expert >= 0 && demands[i].expert < options_.num_experts)
        << "expert " << demands[i].expert << " out of range";
    MOE_CHECK(demands[i].tokens > 0) << "token count " << demands[i].tokens;
    for (size_t j = 0; j < i; ++j) {
      MOE_CHECK(demands[j].expert != demands[i].expert)
          << "duplicate expert " << demands[i].expert;
    }
  }
}

void ExpertCache::MaybeBeginIteration(const RequestOwner& owner, int layer, Phase phase) {
  OwnerState& o = Owner(owner);
  if (o.last_layer < 0 || layer <= o.last_layer || phase != o.phase) {
    policy_->OnBeginIteration(owner, phase);
    prefetcher_.BeginIteration(owner, phase);
    std::fill(o.issued_for_layer.begin(), o.issued_for_layer.end(), 0);
    ++stats_[PhaseIndex(phase)].iterations;
  }
  o.last_layer = layer;
  o.phase = phase;
}

void ExpertCache::ObserveComputeGap(const RequestOwner& owner, int layer, Phase phase) {
  auto it = owners_.find(owner);
  if (it == owners_.end()) return;
  OwnerState& o = it->second;
  const int64_t done = o.finish_ns;
  o.finish_ns = -1;
  if (done < 0 || phase != Phase::kDecode || layer <= o.finish_layer) return;
  const int64_t gap = clock_->NowNanos() - done;
  prefetcher_.ObserveLayerSeconds(std::max<int64_t>(0, gap) * 1e-9 / (layer - o.finish_layer));
}

SlotId ExpertCache::ChooseSlot(const VictimContext& context,
                               const std::function<bool(const ExpertKey&)>& may_evict,
                               const std::function<bool(const ExpertKey&)>* prefer) {
  if (auto empty = slots_.FindEmpty(); empty.has_value()) return *empty;
  std::vector<ExpertKey> keys;
  std::vector<SlotId> ids;
  bool preferred = false;  // keys/ids hold only preferred candidates
  for (SlotId s = 0; s < slots_.num_slots(); ++s) {
    const SlotInfo& info = slots_.Get(s);
    if (info.state != SlotState::kReady || info.leases > 0 || meta_[s].pins > 0) continue;
    if (kept_open_[static_cast<size_t>(info.key.layer) * options_.num_experts +
                   info.key.expert] > 0) {
      continue;
    }
    if (listener_ != nullptr && listener_->Pinned(s)) continue;
    if (!may_evict(info.key)) continue;
    const bool p = prefer != nullptr && (*prefer)(info.key);
    if (p && !preferred) {
      keys.clear();
      ids.clear();
      preferred = true;
    }
    if (preferred && !p) continue;
    keys.push_back(info.key);
    ids.push_back(s);
  }
  if (keys.empty()) return -1;
  const size_t pick = policy_->ChooseVictim(keys, context);
  MOE_CHECK(pick < keys.size()) << "policy " << policy_->name() << " chose a non-candidate";
  return ids[pick];
}

bool ExpertCache::EvictSlot(SlotId slot) {
  const SlotInfo& info = slots_.Get(slot);
  if (info.state == SlotState::kEmpty) return true;
  MOE_CHECK(info.state == SlotState::kReady && info.leases == 0 && meta_[slot].pins == 0)
      << "evicting a busy slot " << slot;
  if (listener_ != nullptr && !listener_->TryRetract(slot)) return false;
  NotePrefetchOutcome(meta_[slot], /*used=*/false);
  policy_->OnEvict(info.key);
  slots_.Evict(slot);
  meta_[slot] = SlotMeta{};
  return true;
}

SlotId ExpertCache::TakeSlot(const VictimContext& context,
                             const std::function<bool(const ExpertKey&)>& may_evict,
                             const std::function<bool(const ExpertKey&)>* prefer) {
  std::vector<ExpertKey> pinned;  // chosen, then found pinned by a worker
  while (true) {
    const SlotId slot = ChooseSlot(context, [&](const ExpertKey& k) {
      return may_evict(k) && std::find(pinned.begin(), pinned.end(), k) == pinned.end();
    }, prefer);
    if (slot < 0 || EvictSlot(slot)) return slot;
    pinned.push_back(slots_.Get(slot).key);
  }
}

void ExpertCache::SetResidencyListener(ResidencyListener* listener) {
  absl::MutexLock lock(&mu_);
  listener_ = listener;
  if (listener_ == nullptr) return;
  for (SlotId s = 0; s < slots_.num_slots(); ++s) {
    const SlotInfo& info = slots_.Get(s);
    if (info.state == SlotState::kReady) listener_->Publish(s, info.key);
  }
}

absl::Status ExpertCache::StartLoad(SlotId slot, const ExpertKey& key, TransferPriority priority,
                                    Phase phase) {
  const uint64_t gen = slots_.BeginLoad(slot, key);
  TransferRequest req;
  req.src = host_block_ ? host_block_(key) : nullptr;
  req.dst_offset = static_cast<uint64_t>(slot) * options_.expert_bytes;
  req.bytes = CopyBytes(key.layer);
  req.priority = priority;
  auto id = engine_->Submit(req, [this, slot, gen](TransferId, absl::Status status) {
    OnTransferDone(slot, gen, std::move(status));
  });
  if (!id.ok()) {
    slots_.AbortLoad(slot, gen).IgnoreError();
    return id.status();
  }
  SlotMeta& m = meta_[slot];
  m = SlotMeta{};
  m.transfer = *id;
  m.demand = priority == TransferPriority::kDemand;
  m.prefetched = !m.demand;
  m.phase = phase;
  m.counted = !m.demand;
  if (m.counted) ++inflight_prefetches_;
  return absl::OkStatus();
}

namespace {

// What the acquires waiting for a load see when the engine keeps failing it.
absl::Status LoadFailure(const ExpertKey& key, int attempts, const absl::Status& engine_error) {
  const absl::StatusCode code = absl::IsUnavailable(engine_error)
                                    ? absl::StatusCode::kUnavailable
                                    : absl::StatusCode::kInternal;
  return absl::Status(code, absl::StrCat("copying expert ", key.ToString(), " failed (",
                                         attempts, " attempts): ", engine_error.message()));
}

}  // namespace

void ExpertCache::OnTransferDone(SlotId slot, uint64_t generation, absl::Status status) {
  absl::MutexLock lock(&mu_);
  const SlotInfo& info = slots_.Get(slot);
  if (info.state != SlotState::kLoading || info.generation != generation) return;
  SlotMeta& m = meta_[slot];
  if (m.counted) --inflight_prefetches_;
  m.counted = false;
  m.cancelling = false;
  m.transfer = kNoTransfer;
  if (status.ok()) {
    stats_[PhaseIndex(m.phase)].bytes_moved += CopyBytes(info.key.layer);
    slots_.CompleteLoad(slot, generation).IgnoreError();
    m.demand = false;
    if (listener_ != nullptr) listener_->Publish(slot, info.key);
  } else {
    const ExpertKey key = info.key;
    const Phase phase = m.phase;
    const int pins = m.pins;
    // CANCELLED: Cancel or engine shutdown. Anything else is an engine error
    // (a failed memcpy or CUDA copy), which may well repeat: retried a
    // bounded number of times, then the waiting acquires fail with it.
    const bool engine_error = !absl::IsCancelled(status);
    const int failures = m.failures + (engine_error ? 1 : 0);
    absl::Status failure;
    if (engine_error) {
      failure = LoadFailure(key, failures, status);
      MOE_LOG(WARNING) << "copy into slot " << slot << ": " << failure
                       << (pins > 0 && failures <= kMaxLoadRetries ? "; retrying" : "");
    }
    NotePrefetchOutcome(m, /*used=*/false);
    slots_.AbortLoad(slot, generation).IgnoreError();
    m = SlotMeta{};
    // A cancelled prefetch that an acquire started to need meanwhile, or a
    // failed load within its retries: load it again, as a demand, into the
    // same slot.
    absl::Status again = absl::CancelledError();
    if (pins > 0 && failures <= kMaxLoadRetries) {
      again = StartLoad(slot, key, TransferPriority::kDemand, phase);
    }
    const uint64_t new_gen = slots_.Get(slot).generation;
    if (again.ok()) {
      meta_[slot].pins = pins;
      meta_[slot].failures = failures;
    } else {
      policy_->OnEvict(key);  // the slot stays empty
    }
    for (auto& [ticket, p] : pending_) {
      for (auto l = p.entries.begin(); l != p.entries.end();) {
        if (l->slot != slot || l->generation != generation) {
          ++l;
        } else if (again.ok()) {
          l->generation = new_gen;
          ++l;
        } else {
          // Its pin went with the slot's meta: FinishAcquire must not drop
          // it again.
          p.failed = true;
          if (p.error.ok()) p.error = failure;
          l = p.entries.erase(l);
        }
      }
    }
  }
  ready_cv_.SignalAll();
}

uint64_t ExpertCache::CopyBytes(int layer) const {
  return options_.layer_bytes.empty() ? options_.expert_bytes
                                      : options_.layer_bytes[static_cast<size_t>(layer)];
}

double ExpertCache::RemainingLoadSeconds(SlotId slot) const {
  const SlotMeta& m = meta_[slot];
  if (m.transfer == kNoTransfer || !(options_.link_bytes_per_sec > 0)) return 0;
  uint64_t left = options_.expert_bytes;
  if (auto q = engine_->Query(m.transfer); q.has_value()) left = q->bytes - q->bytes_done;
  return static_cast<double>(left) / options_.link_bytes_per_sec;
}

double ExpertCache::LinkBacklogSeconds() const {
  double seconds = 0;
  bool prefetch_on_link = false;
  for (SlotId s = 0; s < slots_.num_slots(); ++s) {
    const SlotMeta& m = meta_[s];
    if (m.transfer == kNoTransfer || m.cancelling) continue;
    if (m.demand) {
      seconds += RemainingLoadSeconds(s);
    } else {
      prefetch_on_link = true;
    }
  }
  if (prefetch_on_link) {
    seconds += ChunkWaitSeconds(options_.chunk_bytes, options_.expert_bytes,
                                options_.link_bytes_per_sec);
  }
  return seconds;
}

void ExpertCache::ReportHostRuns(const HostRunReport& report) {
  const absl::Status valid = ValidateHostRunReport(report);
  MOE_CHECK(valid.ok()) << valid;
  const double w = options_.host_tracking_weight;
  if (!(w > 0)) return;
  absl::MutexLock lock(&mu_);
  host_ = TrackHostFigures(host_, report, static_cast<double>(options_.expert_bytes),
                           options_.expert_flops_per_token, w);
}

HostFigures ExpertCache::host_figures() const {
  absl::MutexLock lock(&mu_);
  return host_;
}

Phase ExpertCache::TakeCall(const RequestOwner& owner, const AcquireCall& call) {
  CheckDemands(call.layer, call.demands, call.members);
  const absl::Status parts =
      ValidateParts(ExchangeShape{options_.num_layers, options_.num_experts}, call);
  MOE_CHECK(parts.ok()) << parts;
  if (!call.members.empty()) {
    bool lead = false;
    for (const MemberDemands& m : call.members)
      lead |= m.request == owner.request;
    MOE_CHECK(lead) << "the acquiring request " << owner.request << " is not a member";
  }
  if (!call.hints.empty()) AddHints(owner, call.hints);
  return call.prefill ? Phase::kPrefill : Phase::kDecode;
}

void ExpertCache::NoteFinishLocked(const RequestOwner& owner, int layer, Phase phase,
                                   int64_t now) {
  if (phase != Phase::kDecode) return;
  if (auto o = owners_.find(owner); o != owners_.end()) {
    o->second.finish_ns = now;
    o->second.finish_layer = layer;
  }
}

void ExpertCache::RecordLocalHits(const RequestOwner& owner, const AcquireCall& call) {
  const Phase phase = TakeCall(owner, call);
  absl::MutexLock lock(&mu_);
  CloseLayerLocked(Owner(owner));
  const std::vector<RequestOwner> routed = RouteLocked(owner, call, phase);
  CachePhaseStats& st = stats_[PhaseIndex(phase)];
  for (const ExpertDemand& d : call.demands) {
    const ExpertKey key{call.layer, d.expert};
    if (auto slot = slots_.Lookup(key); slot.has_value()) {
      NotePrefetchOutcome(meta_[*slot], /*used=*/true);
    }
    policy_->OnAccess(key, phase, /*hit=*/true);
    ++st.hits;
    ++layer_hits_[call.layer];
  }
  SpeculateAfterAcquireLocked(routed, call.layer, phase);
  NoteFinishLocked(owner, call.layer, phase, clock_->NowNanos());
}

absl::StatusOr<ExpertCache::Ticket> ExpertCache::StartAcquire(
    const RequestOwner& owner, const AcquireCall& call) {
  const Phase phase = TakeCall(owner, call);
  absl::MutexLock lock(&mu_);
  std::vector<RequestOwner> routed;
  if (call.continues) {
    RETURN_IF_ERROR(CheckNextPartLocked(owner, call, phase));
  } else {
    CloseLayerLocked(Owner(owner));  // an open layer left unfinished
    routed = RouteLocked(owner, call, phase);
    if (call.part > 0) OpenLayerLocked(owner, call, phase);
  }
  OwnerState::OpenLayer* open = nullptr;
  if (auto it = owners_.find(owner); it != owners_.end() && it->second.open.layer >= 0) {
    open = &it->second.open;
  }
  Pending p;
  p.owner = owner;
  p.layer = call.layer;
  p.phase = phase;
  p.start_ns = clock_->NowNanos();
  // The miss cost model (miss_planner.h); the simulator's layer time is
  // stall + max(T, host runs), as the worker waits for the copies, then runs
  // its host answers.
  MissPlanner planner({options_.miss_mode, options_.link_bytes_per_sec,
                       static_cast<double>(options_.expert_bytes),
                       options_.expert_flops_per_token, host_},
                      call.host_ok, [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
                        return LinkBacklogSeconds();
                      });
  size_t answered = 0;
  for (const ExpertDemand& d : call.demands) {
    // A part ends before the first miss past its `part` copies.
    if (open != nullptr && p.misses - static_cast<int32_t>(p.host.size()) >= open->part &&
        !ReadyForPartLocked(*open, ExpertKey{call.layer, d.expert})) {
      break;
    }
    const absl::Status served =
        ServeDemandLocked(owner, call, phase, d, planner, open, p);
    if (!served.ok()) {
      for (const SlotLease& l : p.entries) --meta_[l.slot].pins;
      if (open != nullptr) CloseLayerLocked(owners_[owner]);
      return served;
    }
    ++answered;
  }
  if (open != nullptr) AnsweredPartLocked(owner, call.demands.first(answered));
  if (!call.continues) SpeculateAfterAcquireLocked(routed, call.layer, phase);
  const Ticket t = next_ticket_++;
  pending_.emplace(t, std::move(p));
  return t;
}

std::vector<RequestOwner> ExpertCache::RouteLocked(const RequestOwner& owner,
                                                   const AcquireCall& call,
                                                   Phase phase) {
  ObserveComputeGap(owner, call.layer, phase);
  // Whose routing this is: each member's own row, or the owner's.
  struct Routed {
    RequestOwner owner;
    Phase phase;
    absl::Span<const ExpertDemand> demands;
  };
  std::vector<Routed> routed;
  if (call.members.empty()) {
    routed.push_back({owner, phase, call.demands});
  } else {
    for (const MemberDemands& m : call.members) {
      routed.push_back({RequestOwner{owner.session, m.request},
                        m.prefill ? Phase::kPrefill : Phase::kDecode, m.demands});
    }
  }
  // The acquiring owner first (its quota bounds the batch's prefetches).
  std::vector<RequestOwner> owners = {owner};
  for (const Routed& r : routed) {
    MaybeBeginIteration(r.owner, call.layer, r.phase);
    // A member's prefetch that another member needs is kept: the union.
    CancelUnneededPrefetches(r.owner, call.layer, call.demands);
    policy_->OnRoute(r.owner, call.layer, r.phase, r.demands);
    prefetcher_.OnRoute(r.owner, call.layer, r.phase, r.demands);
    if (r.owner != owner) owners.push_back(r.owner);
  }
  return owners;
}

void ExpertCache::AnswerOnHostLocked(const ExpertKey& key, Phase phase,
                                     Pending& p) {
  policy_->OnAccess(key, phase, /*hit=*/false);
  CachePhaseStats& st = stats_[PhaseIndex(phase)];
  ++st.misses;
  ++p.misses;
  ++layer_misses_[key.layer];
  ++st.host_runs;
  p.host.push_back(key);
}

absl::Status ExpertCache::ServeDemandLocked(const RequestOwner& owner,
                                            const AcquireCall& call,
                                            Phase phase, const ExpertDemand& d,
                                            MissPlanner& planner,
                                            const OwnerState::OpenLayer* open, Pending& p) {
  const ExpertKey key{call.layer, d.expert};
  // An open layer's answered experts go first: their next use is a step away.
  std::function<bool(const ExpertKey&)> answered;
  if (open != nullptr) answered = AnsweredIn(*open);
  const std::function<bool(const ExpertKey&)>* prefer = open != nullptr ? &answered : nullptr;
  // Copied ahead of its part: a miss, whether or not its copy is done.
  const bool ahead = open != nullptr && open->copied_ahead(d.expert);
  auto needed = [&call](const ExpertKey& k) {
    if (k.layer != call.layer) return false;
    for (const ExpertDemand& x : call.demands) {
      if (x.expert == k.expert) return true;
    }
    return false;
  };
  const bool may_host = planner.may_host();
  bool hit = false;
  SlotId slot;
  if (auto found = slots_.Lookup(key); found.has_value()) {
    slot = *found;
    SlotMeta& m = meta_[slot];
    const bool ready = slots_.Get(slot).state == SlotState::kReady;
    hit = ready && !ahead;
    if (!ready && may_host &&
        planner.RunOnHost(d.tokens,
                          m.demand ? 0.0 : RemainingLoadSeconds(slot))) {
      AnswerOnHostLocked(key, phase, p);  // its copy goes on, as a prefetch
      return absl::OkStatus();
    }
    NotePrefetchOutcome(m, /*used=*/true);
    if (!ready && !m.demand && m.transfer != kNoTransfer &&
        engine_->Promote(m.transfer).ok()) {
      m.demand = true;
      if (m.counted) --inflight_prefetches_;
      m.counted = false;
    }
  } else if (may_host && planner.RunOnHost(d.tokens, planner.copy_seconds())) {
    AnswerOnHostLocked(key, phase, p);
    CopyBehind(owner, key, phase, needed);
    return absl::OkStatus();
  } else {
    slot = TakeSlot(VictimContext{owner, call.layer, phase},
                    [&](const ExpertKey& k) { return !needed(k); }, prefer);
    if (slot < 0 && may_host) {
      // Every slot is leased, loading or needed: a caller that can run it
      // from host memory does so rather than fail.
      AnswerOnHostLocked(key, phase, p);
      return absl::OkStatus();
    }
    if (slot < 0) {
      return absl::ResourceExhaustedError(
          absl::StrCat("no free slot for ", key.ToString(),
                       ": all slots leased, loading or needed"));
    }
    RETURN_IF_ERROR(StartLoad(slot, key, TransferPriority::kDemand, phase));
    policy_->OnInsert(key, /*prefetch=*/false);
  }
  ++meta_[slot].pins;
  policy_->OnAccess(key, phase, hit);
  CachePhaseStats& st = stats_[PhaseIndex(phase)];
  ++(hit ? st.hits : st.misses);
  ++(hit ? p.hits : p.misses);
  ++(hit ? layer_hits_ : layer_misses_)[call.layer];
  p.entries.push_back(SlotLease{key, slot, slots_.Get(slot).generation});
  return absl::OkStatus();
}

void ExpertCache::SpeculateAfterAcquireLocked(
    absl::Span<const RequestOwner> owners, int layer, Phase phase) {
  // A batch prefetches for its next union within the acquiring owner's
  // quota: each member proposes from its own state, and an expert's chance
  // is that any member needs it.
  if (options_.prefetch) IssuePrefetches(owners, layer, phase);
  // A placement policy's set, learned online, is re-read now and then and
  // placed while the link has nothing better to do.
  if (warm_queue_.empty() && ++acquires_since_placement_ >= kPlacementInterval) {
    acquires_since_placement_ = 0;
    warm_queue_ = policy_->WarmSet(options_.capacity);
    std::reverse(warm_queue_.begin(), warm_queue_.end());
  }
  if (!warm_queue_.empty()) ContinueWarmUp(owners[0], phase);
}

bool ExpertCache::IsReadyLocked(const Pending& p) const {
  for (const SlotLease& l : p.entries) {
    const SlotInfo& info = slots_.Get(l.slot);
    if (info.state != SlotState::kReady || info.generation != l.generation) return false;
  }
  return true;
}

absl::StatusOr<bool> ExpertCache::IsReady(Ticket ticket) const {
  absl::MutexLock lock(&mu_);
  auto it = pending_.find(ticket);
  if (it == pending_.end()) return absl::NotFoundError("unknown ticket");
  return it->second.failed || IsReadyLocked(it->second);
}

absl::StatusOr<AcquireResult> ExpertCache::FinishAcquire(Ticket ticket) {
  absl::MutexLock lock(&mu_);
  auto it = pending_.find(ticket);
  if (it == pending_.end()) return absl::NotFoundError("unknown ticket");
  Pending& p = it->second;
  if (p.failed) {
    for (const SlotLease& l : p.entries) --meta_[l.slot].pins;
    absl::Status error =
        p.error.ok() ? absl::AbortedError("a load for this acquire was cancelled") : p.error;
    pending_.erase(it);
    return error;
  }
  if (!IsReadyLocked(p)) return absl::FailedPreconditionError("acquire not ready yet");
  const int64_t now = clock_->NowNanos();
  AcquireResult out;
  out.leases = std::move(p.entries);
  out.host = std::move(p.host);
  out.usage.hits = p.hits;
  out.usage.misses = p.misses;
  out.usage.host = static_cast<int32_t>(out.host.size());
  const bool fetched = p.misses > out.usage.host;
  out.usage.stall_ns = fetched ? std::max<int64_t>(0, now - p.start_ns) : 0;
  const RequestOwner owner = p.owner;
  NoteFinishLocked(owner, p.layer, p.phase, now);
  pending_.erase(it);  // `p` dangles from here on
  for (SlotLease& l : out.leases) {
    --meta_[l.slot].pins;
    auto gen = slots_.Lease(l.slot, owner.session);
    MOE_CHECK(gen.ok()) << gen.status();
    l.generation = *gen;
  }
  if (out.usage.stall_ns > 0) policy_->OnStall(owner, out.usage.stall_ns);
  return out;
}

absl::StatusOr<AcquireResult> ExpertCache::Acquire(const RequestOwner& owner,
                                                   const AcquireCall& call) {
  ASSIGN_OR_RETURN(Ticket t, StartAcquire(owner, call));
  {
    absl::MutexLock lock(&mu_);
    while (true) {
      auto it = pending_.find(t);
      if (it == pending_.end() || it->second.failed || IsReadyLocked(it->second)) break;
      ready_cv_.Wait(&mu_);
    }
  }
  return FinishAcquire(t);
}

absl::Status ExpertCache::Release(OwnerId session, absl::Span<const SlotLease> leases) {
  absl::MutexLock lock(&mu_);
  absl::Status first;
  for (const SlotLease& l : leases) {
    absl::Status s = slots_.Release(l.slot, l.generation, session);
    if (first.ok() && !s.ok()) first = s;
  }
  return first;
}

int64_t ExpertCache::ReleaseOwner(OwnerId session) {
  absl::MutexLock lock(&mu_);
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->second.owner.session == session) {
      for (const SlotLease& l : it->second.entries) --meta_[l.slot].pins;
      pending_.erase(it++);
    } else {
      ++it;
    }
  }
  std::vector<RequestOwner> gone;
  for (const auto& [owner, state] : owners_) {
    if (owner.session == session) gone.push_back(owner);
  }
  for (const RequestOwner& owner : gone) DropOwner(owner);
  return slots_.ReleaseAllForOwner(session);
}

absl::Status ExpertCache::SaveState(const std::string& path) const {
  LearnedState state;
  state.num_layers = options_.num_layers;
  state.num_experts = options_.num_experts;
  {
    absl::MutexLock lock(&mu_);
    policy_->ExportLearned(&state);
    prefetcher_.ExportLearned(&state);
  }
  return SaveLearnedState(path, state);  // outside the lock: it fsyncs
}

absl::Status ExpertCache::LoadState(const std::string& path) {
  auto state = LoadLearnedState(path, options_.num_layers, options_.num_experts);
  if (absl::IsNotFound(state.status())) {
    MOE_LOG(INFO) << "no saved cache state at " << path << "; starting empty";
    return absl::OkStatus();
  }
  if (!state.ok()) {
    MOE_LOG(WARNING) << "ignoring saved cache state: " << state.status().message()
                     << "; the EAMC starts empty";
    return state.status();
  }
  absl::MutexLock lock(&mu_);
  policy_->ImportLearned(*state);
  prefetcher_.ImportLearned(*state);
  MOE_LOG(INFO) << "loaded cache state from " << path << ": " << state->records.size()
                << " EAMC records";
  return absl::OkStatus();
}

CachePhaseStats ExpertCache::GetStats(Phase phase) const {
  absl::MutexLock lock(&mu_);
  return stats_[PhaseIndex(phase)];
}

void ExpertCache::ResetStats() {
  absl::MutexLock lock(&mu_);
  stats_[0] = stats_[1] = CachePhaseStats{};
}

ExpertCache::Gauges ExpertCache::GetGauges() const {
  absl::MutexLock lock(&mu_);
  Gauges g;
  g.resident = slots_.CountInState(SlotState::kReady);
  g.loading = slots_.CountInState(SlotState::kLoading);
  g.prefetch_stride = options_.prefetch ? policy_->MaxPrefetchDistance() : 0;
  g.eamc_entries = policy_->EamcEntries();
  g.host = host_;
  g.layer_resident.assign(options_.num_layers, 0);
  for (SlotId s = 0; s < slots_.num_slots(); ++s) {
    const SlotInfo& info = slots_.Get(s);
    if (info.state == SlotState::kReady) ++g.layer_resident[info.key.layer];
  }
  g.layer_hits = layer_hits_;
  g.layer_misses = layer_misses_;
  g.layer_seconds = prefetcher_.layer_seconds();
  return g;
}

std::string ExpertCache::policy_name() const {
  absl::MutexLock lock(&mu_);
  return policy_->name();
}

std::vector<SlotInfo> ExpertCache::SlotsForTest() const {
  absl::MutexLock lock(&mu_);
  std::vector<SlotInfo> out;
  for (SlotId s = 0; s < slots_.num_slots(); ++s) out.push_back(slots_.Get(s));
  return out;
}

void ExpertCache::CheckInvariantsForTest() const {
  absl::MutexLock lock(&mu_);
  slots_.CheckInvariantsForTest();
  for (SlotId s = 0; s < slots_.num_slots(); ++s) MOE_CHECK(meta_[s].pins >= 0);
}

}  // namespace moe::cache
