#include "services/engine/expert_provider.h"

#include <algorithm>
#include <numeric>

#include "common/logging.h"

namespace moe {
namespace {

// Splits `total` in proportion to `tokens` (sum `sum` > 0): floors, then the
// leftover units to the largest remainders (ties: earlier index first).
template <typename T>
std::vector<T> Apportion(T total, absl::Span<const int64_t> tokens, int64_t sum) {
  const size_t n = tokens.size();
  std::vector<T> share(n, 0);
  std::vector<std::pair<long double, size_t>> rem;
  T given = 0;
  for (size_t i = 0; i < n; ++i) {
    const long double exact = static_cast<long double>(total) *
                              static_cast<long double>(tokens[i]) /
                              static_cast<long double>(sum);
    share[i] = static_cast<T>(exact);  // floor: both are >= 0
    given += share[i];
    rem.push_back({exact - static_cast<long double>(share[i]), i});
  }
  std::stable_sort(rem.begin(), rem.end(), [](const auto& a, const auto& b) {
    return a.first > b.first;
  });
  for (size_t j = 0; given < total; j = (j + 1) % n) {
    if (tokens[rem[j].second] == 0) continue;
    ++share[rem[j].second];
    ++given;
  }
  return share;
}

}  // namespace

std::vector<AcquireUsage> SplitUsage(const AcquireUsage& usage, absl::Span<const int64_t> tokens) {
  int64_t sum = 0;
  for (const int64_t n : tokens) {
    MOE_CHECK(n >= 0);
    sum += n;
  }
  MOE_CHECK(sum > 0);
  const std::vector<int32_t> hits = Apportion(usage.hits, tokens, sum);
  const std::vector<int32_t> misses = Apportion(usage.misses, tokens, sum);
  const std::vector<int32_t> host = Apportion(usage.host, tokens, sum);
  const std::vector<int64_t> stall = Apportion(usage.stall_ns, tokens, sum);
  std::vector<AcquireUsage> out(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    out[i].hits = hits[i];
    out[i].misses = misses[i];
    out[i].host = host[i];
    out[i].stall_ns = stall[i];
  }
  return out;
}

}  // namespace moe
