#include "services/moe_cached/huge_page_collapser.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/threads.h"
#include "services/cache/shm_region.h"

namespace moe::cached {

HugePageCollapser::HugePageCollapser(std::vector<Range> ranges)
    : ranges_(std::move(ranges)), thread_([this] { Run(); }) {}

HugePageCollapser::~HugePageCollapser() {
  stop_.store(true, std::memory_order_relaxed);
  thread_.join();
}

void HugePageCollapser::Run() {
  NameThisThread("moe-hugepages");
  sched_param idle{};
  // Best effort: at the normal priority it only takes longer to be polite.
  pthread_setschedparam(pthread_self(), SCHED_IDLE, &idle);
  const absl::Time start = absl::Now();
  for (const Range& r : ranges_) {
    const uint8_t* base = static_cast<const uint8_t*>(r.start);
    uint64_t done = 0;
    bool refused = false;
    for (uint64_t off = 0; off < r.bytes && !stop_.load(std::memory_order_relaxed);
         off += kChunkBytes) {
      const uint64_t n = std::min(kChunkBytes, r.bytes - off);
      uint64_t got = cache::CollapseToHugePages(base + off, n);
      // The call fails whole when one huge page could not be had: then a
      // huge page at a time.
      for (uint64_t p = 0; got == 0 && p < n; p += cache::kHugePageBytes) {
        got += cache::CollapseToHugePages(base + off + p,
                                          std::min(cache::kHugePageBytes, n - p));
      }
      if (got == 0 && n >= 2 * cache::kHugePageBytes) {
        refused = true;  // the kernel cannot (older than 6.1, no free huge page)
        break;
      }
      done += got;
      done_.fetch_add(got, std::memory_order_relaxed);
    }
    if (stop_.load(std::memory_order_relaxed)) return;
    MOE_LOG(INFO) << absl::StrFormat(
        "%s: %.1f of %.1f MiB moved onto 2 MiB pages%s (%.1f s since start)", r.what,
        done / 1048576.0, r.bytes / 1048576.0,
        refused ? ", then the kernel refused (needs Linux 6.1 and free huge pages)" : "",
        absl::ToDoubleSeconds(absl::Now() - start));
  }
  finished_.store(true, std::memory_order_release);
}

}  // namespace moe::cached
