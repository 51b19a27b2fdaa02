#include "services/engine/expert_provider.h"

#include <algorithm>
#include <numeric>

#include "common/logging.h"

namespace moe {
namespace {

// Splits `total` in proportion to `tokens` (sum `sum` > 0): floors, then the
// leftover units to the largest remainders (ties: earlier index first).
template <typename T>
std::vector<T> Apportion(T total, absl::Span<const OwnerTokens> owners,
                         int64_t sum) {
  const size_t n = owners.size();
  std::vector<T> share(n, 0);
  std::vector<std::pair<long double, size_t>> rem;
  T given = 0;
  for (size_t i = 0; i < n; ++i) {
    const long double exact = static_cast<long double>(total) *
                              static_cast<long double>(owners[i].tokens) /
                              static_cast<long double>(sum);
    share[i] = static_cast<T>(exact);  // floor: both are >= 0
    given += share[i];
    rem.push_back({exact - static_cast<long double>(share[i]), i});
  }
  std::stable_sort(rem.begin(), rem.end(), [](const auto& a, const auto& b) {
    return a.first > b.first;
  });
  for (size_t j = 0; given < total; j = (j + 1) % n) {
    if (owners[rem[j].second].tokens == 0) continue;
    ++share[rem[j].second];
    ++given;
  }
  return share;
}

}  // namespace

std::vector<AcquireUsage> SplitUsage(const AcquireUsage& usage,
                                     absl::Span<const OwnerTokens> owners) {
  int64_t sum = 0;
  for (const OwnerTokens& o : owners) {
    MOE_CHECK(o.tokens >= 0);
    sum += o.tokens;
  }
  MOE_CHECK(sum > 0);
  const std::vector<int32_t> hits = Apportion(usage.hits, owners, sum);
  const std::vector<int32_t> misses = Apportion(usage.misses, owners, sum);
  const std::vector<int32_t> host = Apportion(usage.host, owners, sum);
  const std::vector<int64_t> stall = Apportion(usage.stall_ns, owners, sum);
  std::vector<AcquireUsage> out(owners.size());
  for (size_t i = 0; i < owners.size(); ++i) {
    out[i].hits = hits[i];
    out[i].misses = misses[i];
    out[i].host = host[i];
    out[i].stall_ns = stall[i];
  }
  return out;
}

}  // namespace moe
