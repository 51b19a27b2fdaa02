#include "services/serving/metered_provider.h"

#include <chrono>

namespace moe::serving {

absl::Status MeteredProvider::BeginRequest(uint64_t request_id) {
  request_ = ExpertCounters();
  return inner_->BeginRequest(request_id);
}

absl::Status MeteredProvider::EndRequest(uint64_t request_id) {
  return inner_->EndRequest(request_id);
}

absl::StatusOr<AcquiredExperts> MeteredProvider::Acquire(
    int moe_layer, absl::Span<const ExpertDemand> demands, bool prefill) {
  return AcquireBatch(moe_layer, demands, {}, prefill);
}

absl::StatusOr<AcquiredExperts> MeteredProvider::AcquireBatch(
    int moe_layer, absl::Span<const ExpertDemand> demands,
    absl::Span<const MemberDemands> members, bool prefill) {
  return Counted([&] {
    return members.empty() ? inner_->Acquire(moe_layer, demands, prefill)
                           : inner_->AcquireBatch(moe_layer, demands, members, prefill);
  });
}

absl::StatusOr<AcquiredExperts> MeteredProvider::AcquireRest(
    int moe_layer, absl::Span<const ExpertDemand> rest, bool prefill) {
  return Counted([&] { return inner_->AcquireRest(moe_layer, rest, prefill); });
}

absl::StatusOr<AcquiredExperts> MeteredProvider::Counted(
    absl::FunctionRef<absl::StatusOr<AcquiredExperts>()> acquire) {
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<AcquiredExperts> lease = acquire();
  request_.wait_seconds += std::chrono::duration<double>(
                               std::chrono::steady_clock::now() - start)
                               .count();
  if (lease.ok()) {
    request_.hits += lease->usage.hits;
    request_.misses += lease->usage.misses;
    request_.stall_seconds += lease->usage.stall_seconds();
  }
  return lease;
}

}  // namespace moe::serving
