// Where the forward pass gets routed experts from. After each MoE layer's
// router, the engine asks for the experts this iteration needs (with the
// number of tokens routed to each: one row of the iteration's expert
// activation matrix) and gets views of their weights in backend memory, valid
// until it releases them.
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

namespace moe {

struct ExpertDemand {
  int32_t expert = 0;
  int32_t tokens = 0;  // tokens of this iteration routed to the expert
};

// One expert's SwiGLU weights in backend memory.
struct ExpertView {
  int32_t expert = 0;
  const void* gate = nullptr;  // [inter, hidden]
  const void* up = nullptr;    // [inter, hidden]
  const void* down = nullptr;  // [hidden, inter]
  DType dtype = DType::kBF16;
};

struct ExpertLease {
  int32_t moe_layer = -1;
  std::vector<ExpertView> views;  // one per demand, in demand order
  // Outcome of this acquire, as the provider saw it.
  int32_t hits = 0;
  int32_t misses = 0;
  double stall_seconds = 0.0;
  // Provider-private bookkeeping (e.g. slot leases).
  std::vector<uint64_t> handles;
};

// A speculative prediction (pre-gating): `expert` is likely needed at
// `moe_layer` with `probability`.
struct ExpertHint {
  int32_t moe_layer = 0;
  int32_t expert = 0;
  float probability = 0.0f;
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
  virtual absl::StatusOr<ExpertLease> Acquire(
      int moe_layer, absl::Span<const ExpertDemand> demands, bool prefill) = 0;

  // Ends the lease; the views must not be used afterwards.
  virtual void Release(ExpertLease& lease) = 0;

  // Optional prefetch hints; the default ignores them.
  virtual void Hint(absl::Span<const ExpertHint> hints) {}
};

}  // namespace moe

#endif  // MOECACHE_SERVICES_ENGINE_EXPERT_PROVIDER_H_
