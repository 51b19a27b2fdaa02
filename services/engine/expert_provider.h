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

// One expert's SwiGLU weights (and biases) in backend memory.
struct ExpertView {
  int32_t expert = 0;
  const void* gate = nullptr;  // [inter, hidden]
  const void* up = nullptr;    // [inter, hidden]
  const void* down = nullptr;  // [hidden, inter]
  DType dtype = DType::kBF16;
  // gpt_oss (ModelConfig::has_expert_biases), f32; else nullptr.
  const float* gate_bias = nullptr;  // [inter]
  const float* up_bias = nullptr;    // [inter]
  const float* down_bias = nullptr;  // [hidden]
};

// What an Acquire hands the engine: views of one layer's demanded experts,
// valid until Release, what the acquire cost, and the provider's slot leases
// (empty when the experts are always in memory).
struct AcquiredExperts {
  int32_t moe_layer = -1;
  std::vector<ExpertView> views;  // one per demand, in demand order
  AcquireUsage usage;
  std::vector<SlotLease> leases;  // one per view for a leasing provider
};

// The tokens one request contributes to a batched acquire: the sum of its
// routed (token, expert) pairs in that layer (tokens x top_k).
struct OwnerTokens {
  uint64_t request = 0;
  int64_t tokens = 0;
};

// Splits one acquire's usage among the requests that shared it, in
// proportion to their tokens, so that the shares add up exactly to `usage`
// (hits, misses, host and stall_ns each: floors, then the remainders go to
// the largest fractional parts, ties to the earlier owner). One share per
// owner, in owner order. An acquire reports only totals, so this is the
// attribution a batch can make: see docs/architecture.md, "Batches".
// REQUIRES: every owner's tokens >= 0 and at least one > 0.
std::vector<AcquireUsage> SplitUsage(const AcquireUsage& usage,
                                     absl::Span<const OwnerTokens> owners);

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
  // routed experts (token counts summed over the batch) and `owners` says
  // how many of those tokens each request contributed. The default ignores
  // the owners (the acquire is made for the provider's current request);
  // a provider that keeps per-request accounts overrides it.
  // REQUIRES: as Acquire; owners non-empty.
  virtual absl::StatusOr<AcquiredExperts> AcquireBatch(
      int moe_layer, absl::Span<const ExpertDemand> demands,
      absl::Span<const OwnerTokens> owners, bool prefill) {
    return Acquire(moe_layer, demands, prefill);
  }

  // Ends the acquire's leases; the views must not be used afterwards.
  virtual void Release(AcquiredExperts& acquired) = 0;

  // Optional prefetch hints; the default ignores them.
  virtual void Hint(absl::Span<const ExpertHint> hints) {}
};

}  // namespace moe

#endif  // MOECACHE_SERVICES_ENGINE_EXPERT_PROVIDER_H_
