// Where the forward pass gets routed experts from. After each MoE layer's
// router, the engine asks for the experts this iteration needs (with the
// number of tokens routed to each: one row of the iteration's expert
// activation matrix) and gets views of their weights in backend memory, valid
// until it releases them. Demands and hints are the exchange types
// (services/exchange/expert_exchange.h).
//
// Implementations: InMemoryExpertProvider (all experts already in backend
// memory: `moectl run`, tests) and the daemon-backed provider of moe-worker
// (leases slots of moe-cached's arena).
#ifndef MOECACHE_SERVICES_ENGINE_EXPERT_PROVIDER_H_
#define MOECACHE_SERVICES_ENGINE_EXPERT_PROVIDER_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/dtype.h"
#include "services/exchange/expert_exchange.h"

namespace moe {

class Backend;  // kernels/backend.h

// One expert's SwiGLU weights (and biases) in backend memory.
struct ExpertView {
  int32_t expert = 0;
  const void* gate = nullptr;  // [inter, hidden]
  const void* up = nullptr;    // [inter, hidden]
  const void* down = nullptr;  // [hidden, inter]
  ExpertDTypes dtypes;  // of gate, up and down (the layer's: they may differ)
  // With ModelConfig::has_expert_biases(), f32; else nullptr.
  const float* gate_bias = nullptr;  // [inter]
  const float* up_bias = nullptr;    // [inter]
  const float* down_bias = nullptr;  // [hidden]
  // The weights lie in host memory (a "run on host" answer of moe-cached),
  // not in backend memory: readable by the CPU backend; for a device
  // backend, computed by AcquiredExperts::host_backend.
  bool on_host = false;
};

// What an Acquire hands the engine: views of one layer's demanded experts,
// valid until Release, what the acquire cost, and the provider's slot leases
// (empty when the experts are always in memory).
struct AcquiredExperts {
  int32_t moe_layer = -1;
  std::vector<ExpertView> views;  // one per demand, in demand order
  AcquireUsage usage;
  std::vector<SlotLease> leases;  // one per view for a leasing provider
  // Set by a provider whose views may be on_host while the engine computes
  // on a device: the CPU backend (the provider's, valid as long as it) that
  // runs those experts from host memory beside the device, their sum then
  // added on the device (RunRoutedExperts). Null: every view is readable by
  // the engine's backend.
  Backend* host_backend = nullptr;
};

// Splits one acquire's usage among the requests that shared it, in
// proportion to `tokens` (each member's routed (token, expert) pairs in that
// layer: MemberDemands::tokens()), so that the shares add up exactly to
// `usage` (hits, misses, host and stall_ns each: floors, then the remainders
// go to the largest fractional parts, ties to the earlier member). One share
// per member, in member order. An acquire reports only totals, so this is
// the attribution a batch can make: see docs/architecture.md, "Batches".
// REQUIRES: every count >= 0 and at least one > 0.
std::vector<AcquireUsage> SplitUsage(const AcquireUsage& usage, absl::Span<const int64_t> tokens);

class ExpertProvider {
 public:
  virtual ~ExpertProvider() = default;

  // Request boundaries, for request-level activation tracking.
  virtual absl::Status BeginRequest(uint64_t request_id) {
    return absl::OkStatus();
  }
  virtual absl::Status EndRequest(uint64_t request_id) {
    return absl::OkStatus();
  }

  // Blocks until every demanded expert is readable in backend memory.
  // REQUIRES: demands are distinct experts of `moe_layer`.
  virtual absl::StatusOr<AcquiredExperts> Acquire(
      int moe_layer, absl::Span<const ExpertDemand> demands, bool prefill) = 0;

  // One acquire for a batch of requests: `demands` is the union of their
  // routed experts (token counts summed over the batch) and `members` gives
  // each request's own row of it (ValidateMembers holds). `prefill`: some
  // member is in its prompt. The default ignores the members (the acquire is
  // made for the provider's current request); a provider that keeps
  // per-request accounts overrides it.
  // REQUIRES: as Acquire; members non-empty.
  virtual absl::StatusOr<AcquiredExperts> AcquireBatch(
      int moe_layer, absl::Span<const ExpertDemand> demands,
      absl::Span<const MemberDemands> members, bool prefill) {
    return Acquire(moe_layer, demands, prefill);
  }

  // A layer in parts (docs/architecture.md, "A layer in parts"): a provider
  // may answer Acquire or AcquireBatch with views of a prefix of `demands`
  // only (at least one). The engine computes and releases that part, then
  // asks AcquireRest for the demands not yet answered, in order, until
  // every one is; each answer again covers a prefix (at least one) of
  // `rest`. `prefill` is the opening call's. The default answers all of
  // `rest` (a provider that always answers whole layers is never asked).
  // REQUIRES: `rest` is the unanswered tail of the layer just acquired,
  // whose previous part was released.
  virtual absl::StatusOr<AcquiredExperts> AcquireRest(int moe_layer,
                                                      absl::Span<const ExpertDemand> rest,
                                                      bool prefill) {
    return Acquire(moe_layer, rest, prefill);
  }

  // Ends the acquire's leases; the views must not be used afterwards.
  virtual void Release(AcquiredExperts& acquired) = 0;

  // Optional prefetch hints; the default ignores them.
  virtual void Hint(absl::Span<const ExpertHint> hints) {}
  // Hints of one member of a batch (`request`), so that a provider keeping
  // per-request state files them under it; the default is Hint.
  virtual void HintFor(uint64_t request, absl::Span<const ExpertHint> hints) { Hint(hints); }
};

}  // namespace moe

#endif  // MOECACHE_SERVICES_ENGINE_EXPERT_PROVIDER_H_
