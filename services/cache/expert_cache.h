// ExpertCache: the core of the expert-cache daemon, also driven by the
// simulator. It decides residency of experts in a fixed arena of slots:
// serves per-layer demands (hits, misses, victims), issues prefetches, and
// hands out leases on ready slots.
//
//   cache.BeginRequest(owner);                        // owner: {session,
//   request} for each iteration, for each MoE layer l:
//     r = cache.Acquire(owner, {.layer = l, .demands = d,  // blocks until
//     ready
//                               .prefill = p, .hints = for_later_layers});
//     ... compute on r.leases' slots; r.usage is this acquire's own cost ...
//     cache.Release(owner.session, r.leases);
//   cache.EndRequest(owner);
//
// Virtual-time use (simulator, tests): StartAcquire returns a ticket at once;
// the caller advances its FakeCopyEngine until IsReady(ticket), then calls
// FinishAcquire. No thread ever blocks.
//
// Guarantees: a slot that is leased, that a started acquire needs, or that a
// worker pinned (ResidencyListener) is never chosen as a victim (invariant 1
// of the design); a lease is only granted on a slot whose copy completed
// (invariant 2); an owner's leases can be dropped at once (ReleaseOwner,
// invariant 3). An iteration starts when an owner acquires a layer not above
// its previous one.
//
// A layer in parts (AcquireCall::part): the opening acquire routes the whole
// union and answers its first part; the rest is the owner's open layer,
// answered by `continues` acquires in order. Until answered, the open
// layer's experts are not evicted; an answered part's experts are the first
// victims of the layer's later parts (their next use is a step away); in
// miss mode fetch (or for a caller without host execution) the next part is
// copied, at demand priority, as soon as a part is answered. The open layer
// closes with its last part, or when its owner acquires anything else,
// ends, or departs.
//
// Owners: every call names a RequestOwner (session + request). Leases belong
// to the session; per-request state (the policy's activation matrices and
// counters, the prefetcher's routed experts and hints, iteration boundaries,
// the prefetches issued for it) is kept per owner, so several workers can
// generate at once without disturbing each other's state. Each acquire's
// hits, misses and stall are its own (AcquireResult::usage), so the usages
// of all acquires add up to the totals of GetStats exactly.
//
// Preconditions (REQUIRES below) are MOE_CHECKed, not returned: callers
// validate what comes from outside (moe-cached's SessionManager with
// ValidateDemands/ValidateHints, the simulator's trace parser).
//
// Thread-safety: all public methods are thread-safe (one mutex). Copy-engine
// callbacks take the same mutex; the engine never calls back from inside
// Submit/Promote/Cancel, so the cache may call the engine with it held.
#ifndef MOECACHE_SERVICES_CACHE_EXPERT_CACHE_H_
#define MOECACHE_SERVICES_CACHE_EXPERT_CACHE_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "services/cache/clock.h"
#include "services/cache/copy_engine.h"
#include "services/cache/miss_planner.h"
#include "services/cache/policy.h"
#include "services/cache/prefetcher.h"
#include "services/cache/residency_listener.h"
#include "services/cache/slot_table.h"

namespace moe::cache {

struct ExpertCacheOptions {
  int num_layers = 0;
  int num_experts = 0;
  int top_k = 1;
  // Slots, >= 0 (CheckCapacity). Below one layer's experts only with
  // miss_mode host or auto: a miss that finds no slot then runs on the host,
  // and an acquire that may not run on the host (AcquireCall::host_ok false)
  // fails with RESOURCE_EXHAUSTED when its layer's experts find no slots.
  int capacity = 0;
  uint64_t expert_bytes = 0;  // one expert's block; slot i at i * expert_bytes
  // Where the layers' experts differ in size (mixed types): the bytes one
  // copy moves for an expert of each layer, each in (0, expert_bytes], one
  // per layer. Empty: expert_bytes for every layer. The cost figures (the
  // gate's X, the miss planner) keep expert_bytes: the largest, a bound.
  std::vector<uint64_t> layer_bytes;
  bool prefetch = false;
  bool prefetch_gate = true;
  int max_prefetch_per_layer = 1;
  // The prefetch gate's figures (prefetcher.h); set them with
  // SetGateLinkFigures. X = expert_bytes / link; C = ChunkWaitSeconds(
  // chunk_bytes, expert_bytes, link) (0 without a chunk); T = layer_seconds
  // if > 0, else estimated online: the time from an owner's FinishAcquire to
  // its next decode StartAcquire of a later layer in the same iteration (the
  // worker's compute for that layer), as an EWMA on `clock`.
  double link_bytes_per_sec = 0;  // for the prefetch gate and stride
  uint64_t chunk_bytes = 0;       // the copy engine's chunk
  double layer_seconds = 0;
  Clock* clock = nullptr;  // not owned; null: RealClock::Get()
  // Where misses are served ("Where a miss is served" in
  // docs/architecture.md). With kHost or kAuto, an acquire whose caller can
  // run experts from host memory (AcquireCall::host_ok) may get misses
  // answered "run on host" (AcquireResult::host) instead of a copy: kHost
  // always, kAuto when HostRunSeconds is below the stall its copy would add
  // to this acquire (link backlog plus its own copy, less what the acquire
  // already waits for: the worker waits, then runs its host answers). A
  // miss answered on the host may be copied behind it (CopyBehind).
  MissMode miss_mode = MissMode::kFetch;
  HostFigures host;                    // the caller's host: bandwidth, FLOP rate
  double expert_flops_per_token = 0;   // 2 x the expert's parameters
  // Weight of each worker report in the online host figures (ReportHostRuns);
  // 0 keeps `host` fixed.
  double host_tracking_weight = 0.2;
};

// OK when `capacity` slots may serve a model of `num_experts` experts per
// layer: >= 0, and >= num_experts unless misses may run on the host
// (miss_mode host or auto; design invariant 5). INVALID_ARGUMENT saying
// which, and what would allow it.
absl::Status CheckCapacity(int capacity, int num_experts, MissMode miss_mode);

// Sets the gate's link figures of `options` for a cache over `engine`: the
// one place where the simulator and moe-cached derive them (the chunk is the
// engine's; layer_seconds 0 asks for the online estimate).
void SetGateLinkFigures(const CopyEngine& engine, double link_bytes_per_sec,
                        double layer_seconds, ExpertCacheOptions* options);

struct CachePhaseStats {
  uint64_t hits = 0;      // demanded and ready when the layer routed
  uint64_t misses = 0;    // everything else (incl. prefetches still in flight)
  uint64_t prefetches_issued = 0;
  uint64_t prefetches_used = 0;    // demanded before eviction
  uint64_t prefetches_wasted = 0;  // evicted or cancelled unused
  uint64_t bytes_moved = 0;        // demand and prefetch, cancelled parts too
  uint64_t host_runs = 0;          // misses answered "run on host"
  uint64_t iterations = 0;
};

class ExpertCache {
 public:
  using Ticket = uint64_t;
  // A load the copy engine fails (an error other than CANCELLED) is retried,
  // as a demand, this many times while an acquire needs it.
  static constexpr int kMaxLoadRetries = 2;
  // Host block of an expert for the copy engine (may return null for engines
  // that only model time).
  using HostBlockFn = std::function<const void*(const ExpertKey&)>;

  // INVALID_ARGUMENT on bad options (capacity below one layer's experts:
  // invariant 5). `engine` is not owned and must outlive the cache.
  static absl::StatusOr<std::unique_ptr<ExpertCache>> Create(
      const ExpertCacheOptions& options, std::unique_ptr<CachePolicy> policy,
      CopyEngine* engine, HostBlockFn host_block = nullptr);

  ExpertCache(const ExpertCache&) = delete;
  ExpertCache& operator=(const ExpertCache&) = delete;

  // Starts (or restarts) `owner`'s per-request state.
  void BeginRequest(const RequestOwner& owner);
  // Ends it: the policy learns from the request (the EAMC) and forgets it.
  void EndRequest(const RequestOwner& owner);

  // Hints for later layers of `owner`'s current iteration (worker pre-gating
  // or a trace's "hints"). REQUIRES: layers and experts in range.
  void AddHints(const RequestOwner& owner, absl::Span<const ExpertHint> hints);

  // Routes `call.layer` for `owner` (AcquireCall in expert_exchange.h):
  // gives `call.hints` to the cache (as AddHints), serves hits, starts
  // fetches for misses (victims chosen by the policy), cancels the owner's
  // prefetches for this layer that it does not need and issues prefetches
  // for its later layers. REQUIRES: layer in range; demands of distinct
  // in-range experts with tokens >= 1 (ValidateDemands); hints in range.
  // With `call.part` > 0 (ValidateParts holds) the call opens the layer
  // and answers its first part: the demands in order up to the first miss
  // past `part` misses (at least one demand); a `call.continues` acquire
  // answers the next part the same way. The result's leases and host
  // answers then cover that prefix of the call's demands. A continue is
  // FAILED_PRECONDITION when the owner has no open layer, or its demands
  // are not the start of what is left of it (layer, experts and tokens in
  // order, phase).
  // RESOURCE_EXHAUSTED when no slot can be freed (every slot leased, loading
  // or needed), unless the miss may run on the host (`call.host_ok` and
  // miss_mode host or auto): it is then answered so, in AcquireResult::host.
  // Batched (`call.members` non-empty): `demands` is the union of the
  // members' rows (ValidateMembers holds; each member is request `request`
  // of `owner`'s session, `owner` among them). The routing events
  // (iteration boundaries, the policy's OnRoute, the prefetcher's routed
  // experts, prefetch issue) then go to each member with its own row and
  // phase, so per-request state (moe-infinity's activation matrices)
  // follows each request; `owner` holds the ticket, its leases and stall,
  // and the members' prefetch candidates merge within its per-iteration
  // quota (a batch prefetches as much as one request).
  absl::StatusOr<Ticket> StartAcquire(const RequestOwner& owner,
                                      const AcquireCall& call);
  // True once every expert of the ticket is ready. NOT_FOUND: unknown ticket.
  absl::StatusOr<bool> IsReady(Ticket ticket) const;
  // Leases the ticket's slots (in demand order, to the owner's session) and
  // returns them with the ticket's own usage; a stall is reported to the
  // policy. FAILED_PRECONDITION if not ready yet; ABORTED if a load was
  // cancelled (engine shutdown); UNAVAILABLE or INTERNAL, with the engine's
  // message, if the copy engine failed a load 1 + kMaxLoadRetries times (the
  // slot is freed).
  absl::StatusOr<AcquireResult> FinishAcquire(Ticket ticket);
  // StartAcquire, wait until ready (engine callbacks from another thread),
  // FinishAcquire. Not for FakeCopyEngine (nobody would advance it).
  absl::StatusOr<AcquireResult> Acquire(const RequestOwner& owner,
                                        const AcquireCall& call);

  // Records an acquire that `owner`'s worker served itself from slots it
  // pinned through shared memory (ResidencyListener): every demand a hit,
  // nothing leased or loaded. The routing events, the policy's and the
  // prefetcher's, the stats and the prefetches for later layers are as for
  // an acquire of the same call whose demands all hit, whether or not the
  // experts are still resident when this runs. Same REQUIRES as
  // StartAcquire.
  void RecordLocalHits(const RequestOwner& owner, const AcquireCall& call);

  // Makes `listener` (not owned; null: none) the one told of ready slots
  // from now on, starting with those ready now. Set it before workers
  // attach; it must outlive the cache or be replaced.
  void SetResidencyListener(ResidencyListener* listener);

  // Returns leases of `session`. INVALID_ARGUMENT / FAILED_PRECONDITION (from
  // SlotTable) for a lease it does not hold; the others are still released.
  absl::Status Release(OwnerId session, absl::Span<const SlotLease> leases);
  // Drops every lease, pending ticket and request state of a departed
  // session. Returns the number of leases dropped.
  int64_t ReleaseOwner(OwnerId session);

  // Persists what the policy and the prefetcher learned (EAMC, next-visit and
  // inter-layer affinity statistics) to `path`, atomically, mode 0600
  // (format in eamc_store.h). Errors name the path.
  absl::Status SaveState(const std::string& path) const;
  // Loads what SaveState wrote, typically once at start. A missing file
  // leaves the learned state empty and returns OK. A truncated, corrupt,
  // wrong-version or other-shape file logs a WARNING, leaves the learned state
  // as it was (empty at start) and returns the error (DATA_LOSS or
  // FAILED_PRECONDITION) for the caller to report; it never crashes.
  absl::Status LoadState(const std::string& path);
  // Places the policy's warm set (CachePolicy::WarmSet: static-layers' layers,
  // static-popular's persisted most popular experts) at prefetch priority,
  // so that a restarted daemon serves its first tokens from a placed arena.
  // Loads start now while a layer's demand still fits
  // (RoomForSpeculativeLoad), the rest at the next acquires. The set is
  // read again every kPlacementInterval acquires (popularity learned
  // online) and placed the same way: into free slots, or over a resident
  // the policy ranks lower, one at a time while the link is idle.
  // Returns how many experts were queued.
  int WarmUp();

  // What a worker measured running experts on its CPU. Moves the host
  // figures the cost model uses towards what was measured (an EWMA with
  // options.host_tracking_weight): the per-expert time updates the read
  // bandwidth when the current figures say the runs were read-bound, the
  // FLOP rate when they say compute-bound.
  // REQUIRES: ValidateHostRunReport(report).ok() (MOE_CHECKed).
  void ReportHostRuns(const HostRunReport& report);
  // The host figures the cost model uses now.
  HostFigures host_figures() const;

  CachePhaseStats GetStats(Phase phase) const;
  void ResetStats();
  std::string policy_name() const;
  int capacity() const { return options_.capacity; }

  // Point-in-time figures for monitoring: one pass over the slots, no
  // copies (O(capacity + layers)).
  struct Gauges {
    int resident = 0;         // slots holding a ready expert
    int loading = 0;          // slots being filled
    int prefetch_stride = 0;  // layers ahead the policy prefetches
    int eamc_entries = 0;     // learned activation matrices
    HostFigures host;         // what the miss cost model uses now
    // Per MoE layer (num_layers entries): ready experts, and demanded
    // experts that were hits / misses since creation (both phases; not
    // cleared by ResetStats, so monitoring counters never go down).
    std::vector<int> layer_resident;
    std::vector<uint64_t> layer_hits;
    std::vector<uint64_t> layer_misses;
    // T of the prefetch gate: the fixed layer_seconds or the online
    // estimate (0 before the first decode layer gap was seen).
    double layer_seconds = 0;
  };
  Gauges GetGauges() const;

  // Slots and their states, for tests.
  std::vector<SlotInfo> SlotsForTest() const;
  void CheckInvariantsForTest() const;

 private:
  struct Pending {  // a started acquire
    RequestOwner owner;
    int layer = 0;
    Phase phase = Phase::kDecode;
    int32_t hits = 0;
    int32_t misses = 0;
    int64_t start_ns = 0;
    std::vector<SlotLease> entries;
    std::vector<ExpertKey> host;  // misses answered "run on host"
    bool failed = false;
    absl::Status error;  // why it failed (OK: a cancelled load, e.g. shutdown)
  };
  struct SlotMeta {
    TransferId transfer = kNoTransfer;  // while loading
    bool prefetched = false;            // inserted by a prefetch, not yet used
    HintSource source = HintSource::kPolicy;  // of that prefetch
    RequestOwner prefetch_owner;        // whose prefetch it was
    bool demand = false;                // the load is (now) a demand
    bool counted = false;               // counted in inflight_prefetches_
    bool cancelling = false;
    int pins = 0;                       // started acquires that need it
    int failures = 0;                   // engine errors of this load so far
    Phase phase = Phase::kDecode;       // phase whose stats pay its bytes
  };
  struct OwnerState {
    int last_layer = -1;
    Phase phase = Phase::kDecode;
    std::vector<int> issued_for_layer;  // prefetches this iteration, per layer
    // The owner's last FinishAcquire (decode only), until its next
    // StartAcquire; finish_ns < 0: none.
    int64_t finish_ns = -1;
    int finish_layer = -1;
    // The layer being answered in parts (AcquireCall::part); layer -1: none.
    struct OpenLayer {
      int layer = -1;
      Phase phase = Phase::kDecode;
      int part = 0;
      bool copy_ahead = false;         // the next part is copied ahead
      std::vector<ExpertDemand> rest;  // the layer's demands (the union)
      size_t next = 0;                 // rest[next..] not yet answered
      std::vector<int32_t> done;       // answered: the first victims
      std::vector<int32_t> ahead;      // copied ahead: misses when answered

      bool answered(int32_t expert) const {
        return std::find(done.begin(), done.end(), expert) != done.end();
      }
      bool copied_ahead(int32_t expert) const {
        return std::find(ahead.begin(), ahead.end(), expert) != ahead.end();
      }
    } open;
  };

  ExpertCache(const ExpertCacheOptions& options, std::unique_ptr<CachePolicy> policy,
              CopyEngine* engine, HostBlockFn host_block);

  static int PhaseIndex(Phase p) { return p == Phase::kPrefill ? 0 : 1; }
  // MOE_CHECKs StartAcquire's preconditions.
  void CheckDemands(int layer, absl::Span<const ExpertDemand> demands,
                    absl::Span<const MemberDemands> members) const;
  // An acquire's (or local hits') first step: CheckDemands and the lead
  // member MOE_CHECKed, the hints filed; returns the call's phase.
  Phase TakeCall(const RequestOwner& owner, const AcquireCall& call);
  // The owner's acquire of `layer` finished at `now` (decode): the compute
  // gap to its next layer starts (ObserveComputeGap).
  void NoteFinishLocked(const RequestOwner& owner, int layer, Phase phase, int64_t now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  OwnerState& Owner(const RequestOwner& owner) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybeBeginIteration(const RequestOwner& owner, int layer, Phase phase)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Feeds the gate's online T: the owner's compute since its last finished
  // acquire, per layer, when `layer` follows it in the same decode iteration.
  void ObserveComputeGap(const RequestOwner& owner, int layer, Phase phase)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Cancels `owner`'s in-flight prefetches for `layer` that `demands` do not
  // name.
  void CancelUnneededPrefetches(const RequestOwner& owner, int layer,
                                absl::Span<const ExpertDemand> demands)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // StartAcquire's steps, under mu_. RouteLocked observes the compute gap,
  // sends the routing events (to each member, batched) and returns the
  // owners whose candidates the acquire prefetches from, `owner` first.
  // ServeDemandLocked serves one demanded expert (hit, fetch, or answered on
  // the host per `planner`) and counts it in `p`; on error `p`'s pins are
  // the caller's to drop. SpeculateAfterAcquireLocked issues the prefetches
  // and continues the warm set's placement.
  std::vector<RequestOwner> RouteLocked(const RequestOwner& owner,
                                        const AcquireCall& call, Phase phase)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `open`: the owner's open layer when `call` answers part of it (its
  // answered experts are then the preferred victims), else null.
  absl::Status ServeDemandLocked(const RequestOwner& owner,
                                 const AcquireCall& call, Phase phase,
                                 const ExpertDemand& d, MissPlanner& planner,
                                 const OwnerState::OpenLayer* open,
                                 Pending& p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A continues call: FAILED_PRECONDITION unless its demands are the
  // start of what is left of `owner`'s open layer, in its phase.
  absl::Status CheckNextPartLocked(const RequestOwner& owner, const AcquireCall& call,
                                   Phase phase) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `key` would be a hit of the open layer's part: ready and not copied
  // ahead (those count as the misses they were).
  bool ReadyForPartLocked(const OwnerState::OpenLayer& open, const ExpertKey& key) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Opens `owner`'s layer with every demand of `call`, each kept from
  // eviction until answered.
  void OpenLayerLocked(const RequestOwner& owner, const AcquireCall& call, Phase phase)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `part`, the next demands of `owner`'s open layer, was answered: no
  // longer kept, now the first victims; the layer closes when that was the
  // last, else the next part is copied ahead (OpenLayer::copy_ahead).
  void AnsweredPartLocked(const RequestOwner& owner, absl::Span<const ExpertDemand> part)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Closes `o`'s open layer (a no-op when none): what is left of it may be
  // evicted again.
  void CloseLayerLocked(OwnerState& o) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // True for `open`'s answered experts (the preferred victims); `open` must
  // outlive the predicate.
  static std::function<bool(const ExpertKey&)> AnsweredIn(const OwnerState::OpenLayer& open);
  // Copies the open layer's next `part` experts that are neither resident
  // nor loading into slots (victims: its answered experts first), at demand
  // priority.
  void CopyNextPartLocked(const RequestOwner& owner, OwnerState::OpenLayer& open)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AnswerOnHostLocked(const ExpertKey& key, Phase phase, Pending& p)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SpeculateAfterAcquireLocked(absl::Span<const RequestOwner> owners,
                                   int layer, Phase phase)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets `owner`'s request state in the cache, policy and prefetcher.
  void DropOwner(const RequestOwner& owner) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Finds a slot for a new load: empty, else the policy's victim among
  // evictable slots (filter: which keys may go; slots a worker pinned and
  // experts of an open layer not yet answered are not candidates), among
  // the `prefer`red candidates if there are any (null: no preference).
  // -1 if none. Not evicted yet; the caller calls EvictSlot.
  SlotId ChooseSlot(const VictimContext& context,
                    const std::function<bool(const ExpertKey&)>& may_evict,
                    const std::function<bool(const ExpertKey&)>* prefer = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Empties `slot` (a no-op when empty). False, changing nothing, when a
  // worker pinned it (ResidencyListener::TryRetract): the caller looks
  // elsewhere.
  [[nodiscard]] bool EvictSlot(SlotId slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ChooseSlot, then EvictSlot; another victim while a worker pinned the
  // chosen one. -1 if none.
  SlotId TakeSlot(const VictimContext& context,
                  const std::function<bool(const ExpertKey&)>& may_evict,
                  const std::function<bool(const ExpertKey&)>* prefer = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status StartLoad(SlotId slot, const ExpertKey& key, TransferPriority priority, Phase phase)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Prefetches for the layers after `layer` from the candidates of `owners`
  // (merged: an expert's probability is that any of them needs it), within
  // the per-iteration quota of owners[0]; nothing outside decode.
  void IssuePrefetches(absl::Span<const RequestOwner> owners, int layer, Phase phase)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts loads of warm_queue_ while there is room: into empty slots, or
  // over the policy's victim while the link is idle if the policy admits it.
  void ContinueWarmUp(const RequestOwner& owner, Phase phase) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Seconds of demand copies queued on the link (plus the rest of an
  // in-flight prefetch chunk a demand would wait behind).
  double LinkBacklogSeconds() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What one copy of an expert of `layer` moves (ExpertCacheOptions::layer_bytes).
  uint64_t CopyBytes(int layer) const;
  // Seconds until the load into `slot` completes (remaining bytes / link).
  double RemainingLoadSeconds(SlotId slot) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A speculative load (prefetch, copy behind) may take a slot only while a
  // whole layer's demand can still be served: busy slots + E < capacity.
  bool RoomForSpeculativeLoad() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Evicts `slot` and loads `key` into it at prefetch priority, for `owner`
  // (whose prediction from `source` it was). False if the engine refused.
  bool StartSpeculativeLoad(SlotId slot, const ExpertKey& key, Phase phase,
                            const RequestOwner& owner, HintSource source)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A miss answered on the host: copy it into a slot behind the answer (a
  // free slot at any time, over a resident only when nothing is on the
  // link), so that the cache still adapts. `keep` says which keys may not
  // be evicted (the acquire's own).
  void CopyBehind(const RequestOwner& owner, const ExpertKey& key, Phase phase,
                  const std::function<bool(const ExpertKey&)>& keep)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnTransferDone(SlotId slot, uint64_t generation, absl::Status status);
  bool IsReadyLocked(const Pending& p) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NotePrefetchOutcome(SlotMeta& meta, bool used) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ExpertCacheOptions options_;
  CopyEngine* const engine_;
  const HostBlockFn host_block_;
  Clock* const clock_;

  mutable absl::Mutex mu_;
  absl::CondVar ready_cv_;
  std::unique_ptr<CachePolicy> policy_ ABSL_GUARDED_BY(mu_);
  Prefetcher prefetcher_ ABSL_GUARDED_BY(mu_);
  SlotTable slots_ ABSL_GUARDED_BY(mu_);
  std::vector<SlotMeta> meta_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<Ticket, Pending> pending_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<RequestOwner, OwnerState> owners_ ABSL_GUARDED_BY(mu_);
  Ticket next_ticket_ ABSL_GUARDED_BY(mu_) = 1;
  int inflight_prefetches_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<ExpertKey> warm_queue_ ABSL_GUARDED_BY(mu_);  // best last
  ResidencyListener* listener_ ABSL_GUARDED_BY(mu_) = nullptr;
  // Acquires between two readings of the policy's WarmSet.
  static constexpr int kPlacementInterval = 64;
  int acquires_since_placement_ ABSL_GUARDED_BY(mu_) = 0;
  CachePhaseStats stats_[2] ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> layer_hits_ ABSL_GUARDED_BY(mu_);    // num_layers
  std::vector<uint64_t> layer_misses_ ABSL_GUARDED_BY(mu_);  // num_layers
  // Per expert (layer * num_experts + expert): how many open layers still
  // have it to answer (kept from eviction while > 0).
  std::vector<int32_t> kept_open_ ABSL_GUARDED_BY(mu_);
  HostFigures host_ ABSL_GUARDED_BY(mu_);  // options_.host, tracked online
};

}  // namespace moe::cache

#endif  // MOECACHE_SERVICES_CACHE_EXPERT_CACHE_H_
