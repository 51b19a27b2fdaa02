#include "services/cache/copy_engine.h"

#include <limits>

#include "common/logging.h"

namespace moe::cache {

int64_t LinkNanos(uint64_t bytes, uint64_t bytes_per_sec) {
  MOE_CHECK(bytes_per_sec > 0) << "LinkNanos: zero bandwidth";
  using u128 = unsigned __int128;
  const u128 num = static_cast<u128>(bytes) * 1000000000u;
  const u128 ns = (num + bytes_per_sec - 1) / bytes_per_sec;
  MOE_CHECK(ns <= static_cast<u128>(std::numeric_limits<int64_t>::max()))
      << "LinkNanos overflow: " << bytes << " bytes";
  return static_cast<int64_t>(ns);
}

}  // namespace moe::cache
