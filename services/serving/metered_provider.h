// An ExpertProvider decorator that counts what the wrapped provider reports
// (hits, misses, stall) and the wall time spent inside Acquire, so the worker
// can read a request's expert outcome while the request is still running
// (the usage of the last streamed token) and export it as metrics.
//
// Thread-compatible, like the providers it wraps: the engine thread drives
// it; counters are read by that same thread.
#ifndef MOECACHE_SERVICES_SERVING_METERED_PROVIDER_H_
#define MOECACHE_SERVICES_SERVING_METERED_PROVIDER_H_

#include <cstdint>

#include "absl/functional/function_ref.h"
#include "services/engine/expert_provider.h"

namespace moe::serving {

struct ExpertCounters {
  int64_t hits = 0;
  int64_t misses = 0;
  double stall_seconds = 0.0;
  double wait_seconds = 0.0;  // wall time inside Acquire
};

class MeteredProvider : public ExpertProvider {
 public:
  // `inner` is not owned and must outlive this object.
  explicit MeteredProvider(ExpertProvider* inner) : inner_(inner) {}

  absl::Status BeginRequest(uint64_t request_id) override;
  absl::Status EndRequest(uint64_t request_id) override;
  absl::StatusOr<AcquiredExperts> Acquire(int moe_layer,
                                      absl::Span<const ExpertDemand> demands,
                                      bool prefill) override;
  // Passed on with its owners; request() counts it too (the batched runner
  // reads each request's share from its Session instead).
  absl::StatusOr<AcquiredExperts> AcquireBatch(int moe_layer,
                                               absl::Span<const ExpertDemand> demands,
                                               absl::Span<const MemberDemands> members,
                                               bool prefill) override;
  // Counted as Acquire.
  absl::StatusOr<AcquiredExperts> AcquireRest(int moe_layer,
                                              absl::Span<const ExpertDemand> rest,
                                              bool prefill) override;
  void Release(AcquiredExperts& lease) override { inner_->Release(lease); }
  void Hint(absl::Span<const ExpertHint> hints) override {
    inner_->Hint(hints);
  }
  void HintFor(uint64_t request, absl::Span<const ExpertHint> hints) override {
    inner_->HintFor(request, hints);
  }

  // Since the last BeginRequest.
  const ExpertCounters& request() const { return request_; }

 private:
  // Runs `acquire` and counts its wait and usage.
  absl::StatusOr<AcquiredExperts> Counted(
      absl::FunctionRef<absl::StatusOr<AcquiredExperts>()> acquire);

  ExpertProvider* inner_;
  ExpertCounters request_;
};

}  // namespace moe::serving

#endif  // MOECACHE_SERVICES_SERVING_METERED_PROVIDER_H_
