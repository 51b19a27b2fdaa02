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

// One expert's SwiGLU weights in backend memory.
struct ExpertView {
  int32_t expert = 0;
  const void* gate = nullptr;  // [inter, hidden]
  const void* up = nullptr;    // [inter, hidden]
  const void* down = nullptr;  // [hidden, inter]
  DType dtype = DType::kBF16;
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

  // Ends the acquire's leases; the views must not be used afterwards.
  virtual void Release(AcquiredExperts& acquired) = 0;

  // Optional prefetch hints; the default ignores them.
  virtual void Hint(absl::Span<const ExpertHint> hints) {}
};

}  // namespace moe

#endif  // MOECACHE_SERVICES_ENGINE_EXPERT_PROVIDER_H_
