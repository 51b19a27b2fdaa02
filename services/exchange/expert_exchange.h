// The vocabulary a worker and the expert cache exchange, defined once.
//
// Every layer speaks these types: the engine (ExpertProvider), the cache
// client of moe-worker, the daemon's SessionManager, the cache core
// (ExpertCache, policies, prefetcher, simulator) and the trace tools. The two
// transports have exactly one converter each: the shared-memory ring
// (services/channel/shm_channel.h: ToWire/FromWire) and the gRPC messages
// (services/exchange/exchange_proto.h).
//
// Who validates what:
//  - Anything that arrives from another process (a worker's acquire, hints,
//    release) is checked once, by the daemon's SessionManager, with
//    ValidateDemands / ValidateHints / ValidateHostRunReport below (INVALID_ARGUMENT naming the bad
//    value). The client checks hints with the same functions only because
//    over shared memory hints are posted without a reply.
//  - Below SessionManager, the cache core treats these as preconditions and
//    MOE_CHECKs them (a violation is a bug in the daemon, not bad input).
//  - Routing traces are files, validated when parsed (trace.h).
//
// Thread-safety: plain values.
#ifndef MOECACHE_SERVICES_EXCHANGE_EXPERT_EXCHANGE_H_
#define MOECACHE_SERVICES_EXCHANGE_EXPERT_EXCHANGE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace moe {

// Identity of one routed expert: MoE-layer index (0-based, counting MoE
// layers only) and expert index within that layer.
struct ExpertKey {
  int32_t layer = 0;
  int32_t expert = 0;

  friend bool operator==(const ExpertKey& a, const ExpertKey& b) {
    return a.layer == b.layer && a.expert == b.expert;
  }
  friend bool operator!=(const ExpertKey& a, const ExpertKey& b) { return !(a == b); }
  // Orders by (layer, expert), for deterministic iteration.
  friend bool operator<(const ExpertKey& a, const ExpertKey& b) {
    return a.layer != b.layer ? a.layer < b.layer : a.expert < b.expert;
  }
  template <typename H>
  friend H AbslHashValue(H h, const ExpertKey& k) {
    return H::combine(std::move(h), k.layer, k.expert);
  }

  // "L3/E17".
  std::string ToString() const;
};

// An expert one layer needs in this iteration, with the tokens of the
// iteration routed to it (one entry of the iteration's expert activation
// matrix).
struct ExpertDemand {
  int32_t expert = 0;
  int32_t tokens = 1;
};

// Where a prediction came from (the prefetcher calibrates each source).
enum class HintSource : uint8_t { kPolicy = 0, kHint = 1, kAffinity = 2 };
inline constexpr int kNumHintSources = 3;

// A prediction that `expert` of `layer` will be needed soon, with
// `probability` in [0, 1]. Workers send kHint (pre-gating); the cache's own
// policy and affinity statistics make the others.
struct ExpertHint {
  int32_t layer = 0;
  int32_t expert = 0;
  float probability = 1;
  HintSource source = HintSource::kHint;
};

// One request's own part of a batched acquire (one acquire that serves the
// union of several requests' routed experts in a layer): the experts it
// routed there with its own token counts (a row of that request's
// activation matrix) and whether those tokens are prompt (prefill) or one
// decode step. The union's tokens for an expert are the sum of its members'.
struct MemberDemands {
  uint64_t request = 0;
  bool prefill = false;
  std::vector<ExpertDemand> demands;

  // The member's routed (token, expert) pairs: the sum of its tokens.
  int64_t tokens() const {
    int64_t n = 0;
    for (const ExpertDemand& d : demands) n += d.tokens;
    return n;
  }
};

// One acquire, as every layer spells it: the engine's ExpertProvider, the
// worker's CacheClient, the daemon's SessionManager and the ExpertCache all
// take this type (who asks is each layer's own: the cache's RequestOwner,
// the daemon's session and request, the client's current request). The
// spans are views that must outlive the call.
//   layer:    the MoE layer (0-based among MoE layers).
//   demands:  distinct experts of `layer` with tokens >= 1 (ValidateDemands);
//             for a batched acquire, the union of the members' rows.
//   prefill:  the tokens are (or, batched, some member's are) prompt tokens.
//   members:  empty for a request's own acquire; else one row per request
//             sharing it (ValidateMembers), the asking request among them.
//   hints:    predictions for later layers, given to the cache before the
//             acquire (ValidateHints).
//   host_ok:  the caller can run misses from host memory, so the cache may
//             answer some "run on host" (per its miss mode). The daemon sets
//             it from the session's registration, never from the wire.
// A layer leased in parts (docs/architecture.md, "A layer in parts"), so
// that a cache smaller than the model need not hold a layer's whole union
// at once (ValidateParts):
//   part:      0: every demand is answered now. Else the call opens the
//              layer and answers a first part: its demands in order up to
//              the first miss past `part` misses (resident experts cost no
//              slot, so a part takes every hit on its way), at least one.
//              The rest stays the owner's open layer (kept from eviction),
//              answered by `continues` calls, and the cache copies the next
//              part's misses while this part is computed. The call routes
//              the layer as a whole (one iteration, one routing event per
//              member, the whole union's prefetch cancel).
//   continues: answers the next part of the owner's open layer the same
//              way: `layer` is that layer, `demands` the start (usually all)
//              of what is left of it, in order, `prefill` as the opening
//              call's; no members, hints or part. Routes nothing.
// The answer then covers a prefix of `demands` (AcquireResult).
struct AcquireCall {
  int layer = 0;
  absl::Span<const ExpertDemand> demands;
  bool prefill = false;
  absl::Span<const MemberDemands> members;
  absl::Span<const ExpertHint> hints;
  bool host_ok = false;
  int32_t part = 0;
  bool continues = false;
};

// Index of a slot in a model's arena.
using SlotId = int32_t;

// A lease on one arena slot: the expert in it, and the slot's generation when
// the lease was granted (a release must name both; a stale generation is
// refused). The slot's bytes are readable until the lease is released.
struct SlotLease {
  ExpertKey key;
  SlotId slot = -1;
  uint64_t generation = 0;
};

// What one acquire cost its caller: demanded experts that were ready when the
// layer was routed (hits) or not (misses), how many of the misses the caller
// was told to run from host memory instead of waiting for a copy (host), and
// the time waited for copies (0 when nothing was fetched).
struct AcquireUsage {
  int32_t hits = 0;
  int32_t misses = 0;
  int32_t host = 0;  // <= misses
  int64_t stall_ns = 0;

  double stall_seconds() const { return static_cast<double>(stall_ns) * 1e-9; }
  AcquireUsage& operator+=(const AcquireUsage& o) {
    hits += o.hits;
    misses += o.misses;
    host += o.host;
    stall_ns += o.stall_ns;
    return *this;
  }
};

// The most stall one acquire may report: 10^12 ns (1000 s). A worker takes
// the daemon's figure through PeerStallNsFromSeconds / PeerStallNsFromNs,
// which clamp to [0, kMaxPeerStallNs] (NaN and negatives to 0), so that a
// peer's absurd value neither wraps in the conversion nor overflows the
// worker's sums of usages.
inline constexpr int64_t kMaxPeerStallNs = 1000000000000;
int64_t PeerStallNsFromSeconds(double seconds);
int64_t PeerStallNsFromNs(uint64_t nanoseconds);

// What a worker measured running experts on its CPU (from host memory or
// from an arena in host memory: the same kernel), reported so the daemon's
// miss cost model tracks the real host speed: `experts` expert FFNs over
// `tokens` tokens in total took `nanoseconds` of wall time; `host_experts`
// of them were "run on host" answers (the rest ran from arena slots).
struct HostRunReport {
  int32_t experts = 0;
  int32_t host_experts = 0;  // <= experts
  int64_t tokens = 0;
  int64_t nanoseconds = 0;
};

// The answer to one acquire. Every demanded expert (of a part, a prefix of
// the demands: AcquireCall::part) is answered once, either with a lease on a
// ready arena slot or as "run on host": compute it from the daemon's host
// copy of the expert (no copy was waited for). Both lists keep demand
// order.
struct AcquireResult {
  std::vector<SlotLease> leases;
  std::vector<ExpertKey> host;
  AcquireUsage usage;
};

// Where misses are served (the daemon's --miss-mode): always copied into a
// slot (kFetch), always run from host memory (kHost), or per miss, whichever
// the cost model says is cheaper (kAuto).
enum class MissMode : uint8_t { kFetch = 0, kHost = 1, kAuto = 2 };

// What running experts from host memory costs on one machine.
struct HostFigures {
  double read_bytes_per_sec = 0;  // weights streamed from host memory
  double flops_per_sec = 0;       // the expert kernel's FLOP rate
};
const char* MissModeName(MissMode mode);
// "fetch", "host" or "auto"; INVALID_ARGUMENT otherwise.
absl::Status ParseMissMode(absl::string_view text, MissMode* mode);

// Who an acquire is for: the session that holds its leases (a worker, or
// the simulator's single client) and the request within that session whose
// per-request cache state (activation matrix, counters, hints) it updates.
// Implicit from a session id (request 0) so that single-request callers
// (tests, the simulator) need not spell it out.
struct RequestOwner {
  uint64_t session = 0;
  uint64_t request = 0;

  RequestOwner() = default;
  RequestOwner(uint64_t session_id, uint64_t request_id = 0)  // NOLINT(runtime/explicit)
      : session(session_id), request(request_id) {}

  friend bool operator==(const RequestOwner& a, const RequestOwner& b) {
    return a.session == b.session && a.request == b.request;
  }
  friend bool operator!=(const RequestOwner& a, const RequestOwner& b) { return !(a == b); }
  template <typename H>
  friend H AbslHashValue(H h, const RequestOwner& o) {
    return H::combine(std::move(h), o.session, o.request);
  }
};

// The shape an exchange is checked against: one model's MoE layers and
// routed experts per layer.
struct ExchangeShape {
  int num_layers = 0;
  int num_experts = 0;
};

// Bounds on what one exchange may carry.
inline constexpr int32_t kMaxDemandTokens = 1 << 24;
inline constexpr int kMaxHintsPerCall = 4096;
// Requests one session may have begun and not ended at once.
inline constexpr int kMaxRequestsPerSession = 64;

// The acquire rule: `layer` in range; 1..num_experts demands of distinct
// in-range experts, each with tokens in [1, kMaxDemandTokens].
// INVALID_ARGUMENT naming the first violation.
absl::Status ValidateDemands(const ExchangeShape& shape, int layer,
                             absl::Span<const ExpertDemand> demands);

// The batch rule, for an acquire of `demands` (already valid) that names its
// members: 1..kMaxRequestsPerSession members of distinct requests, each with
// valid demands of its own (ValidateDemands), naming only experts of
// `demands`, and for every expert of `demands` the members' tokens add up to
// its tokens. INVALID_ARGUMENT naming the first violation.
absl::Status ValidateMembers(const ExchangeShape& shape, int layer,
                             absl::Span<const ExpertDemand> demands,
                             absl::Span<const MemberDemands> members);

// The parts rule: `part` in [0, num_experts]; a `continues` call has no
// members, no hints and part 0. (Whether it matches the owner's open layer
// is the cache's to say: FAILED_PRECONDITION there.) INVALID_ARGUMENT.
absl::Status ValidateParts(const ExchangeShape& shape, const AcquireCall& call);
// A part as a transport carries it (unsigned) to AcquireCall::part: values
// beyond int32 become -1, which ValidateParts refuses.
inline int32_t WirePart(uint32_t part) {
  return part > 0x7fffffffu ? -1 : static_cast<int32_t>(part);
}

// The hint rule: at most kMaxHintsPerCall hints, each for an in-range layer
// and expert, with a finite probability in [0, 1]. INVALID_ARGUMENT.
absl::Status ValidateHints(const ExchangeShape& shape, absl::Span<const ExpertHint> hints);

// The host-run report rule: experts in [1, 2^20], host_experts in
// [0, experts], tokens in [experts,
// experts * kMaxDemandTokens], nanoseconds in [1, 10^12] (a report covers
// at most a few seconds of work). INVALID_ARGUMENT.
absl::Status ValidateHostRunReport(const HostRunReport& report);

}  // namespace moe

#endif  // MOECACHE_SERVICES_EXCHANGE_EXPERT_EXCHANGE_H_
