// HugePageCollapser: moves moe-cached's shared memory (each model's CPU
// arena, then its host copy of every expert) onto 2 MiB pages in the
// background, where the kernel did not give it huge pages when it was
// allocated (shmem_enabled `never`, Debian's default).
//
// A decode step streams the arena; on 4 KiB pages each page costs a TLB
// miss, and served decode measured 1.07-1.17x `moectl run`'s time a token
// (q4 experts, Sapphire Rapids VM) against 0.95-1.03x on huge pages.
// CollapseToHugePages (services/cache/shm_region.h) copies each 2 MiB into
// one huge page, contents unchanged while workers read and copies write;
// it takes ~3 ms a MiB, so it runs on a thread of its own at SCHED_IDLE
// (only on CPU time nobody else wants), a chunk at a time, after the
// daemon serves. Workers map the memory at 2 MiB boundaries
// (MapSharedAligned) and map each huge page whole on their next touch.
//
// Lifecycle: the constructor starts the thread; the destructor stops it
// at the next chunk and joins. The ranges must stay mapped until then.
// Thread-safe: done_bytes() and finished() from any thread.
#ifndef MOECACHE_SERVICES_MOE_CACHED_HUGE_PAGE_COLLAPSER_H_
#define MOECACHE_SERVICES_MOE_CACHED_HUGE_PAGE_COLLAPSER_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

namespace moe::cached {

class HugePageCollapser {
 public:
  struct Range {
    std::string what;  // for the log line: "model m: arena"
    const void* start = nullptr;
    uint64_t bytes = 0;
  };
  // Bytes per CollapseToHugePages call (the stop flag is checked between).
  static constexpr uint64_t kChunkBytes = uint64_t{32} << 20;

  explicit HugePageCollapser(std::vector<Range> ranges);
  ~HugePageCollapser();
  HugePageCollapser(const HugePageCollapser&) = delete;
  HugePageCollapser& operator=(const HugePageCollapser&) = delete;

  // Bytes moved onto huge pages so far, and whether every range is done
  // (or was refused by the kernel).
  uint64_t done_bytes() const { return done_.load(std::memory_order_relaxed); }
  bool finished() const { return finished_.load(std::memory_order_acquire); }

  // Whether moe-cached should run one: shared memory is on 4 KiB pages
  // unless collapsed (`mode` is ShmemHugePageMode(): "never"; `advise` and
  // `always` give huge pages at allocation, `deny` refuses them).
  static bool Needed(const std::string& mode) { return mode == "never"; }

 private:
  void Run();

  const std::vector<Range> ranges_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> finished_{false};
  std::atomic<uint64_t> done_{0};
  std::thread thread_;  // last: started once the rest is built
};

}  // namespace moe::cached

#endif  // MOECACHE_SERVICES_MOE_CACHED_HUGE_PAGE_COLLAPSER_H_
