// CachedModel: everything moe-cached holds for one model — its ExpertStore
// (host copy), its arena of capacity x block_bytes, a copy engine that
// copies experts into the arena, the ExpertCache deciding residency, and its
// metrics. The arena is either
//  - CPU (options.cuda == null): a shared-memory region (mode 0600, under an
//    unguessable name that only Attach reveals), filled by a CpuCopyEngine
//    (optionally paced to a link rate); or
//  - CUDA: device memory (CudaArena, exported to workers by CUDA IPC),
//    filled by a CudaCopyEngine; the store should then be pinned
//    (PinnedStoreOptions).
//
// Lifecycle: Create (allocates, validates) -> Start (starts the copy thread;
// loads the learned state when a path is set) -> ... -> Stop (persists,
// stops the copy thread). Stop is idempotent; the destructor calls it.
//
// Thread-safety: after Start, all methods are thread-safe.
#ifndef MOECACHE_SERVICES_MOE_CACHED_CACHED_MODEL_H_
#define MOECACHE_SERVICES_MOE_CACHED_CACHED_MODEL_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/device_memory.h"
#include "prometheus/registry.h"
#include "services/cache/cache_config.h"
#include "services/cache/cpu_copy_engine.h"
#include "services/cache/cuda_copy_engine.h"
#include "services/cache/expert_cache.h"
#include "services/cache/shm_region.h"
#include "services/moe_cached/cache_metrics.h"
#include "services/moe_cached/cuda_arena.h"
#include "services/moe_cached/expert_store.h"
#include "services/moe_cached/residency_board.h"

namespace moe::cached {

struct CachedModelOptions {
  std::string name;
  // The cache (cache_config.h): capacity in slots (REQUIRES >= the model's
  // experts per layer), policy, prefetch, the link (0: unpaced copies), miss
  // mode and host figures. Its shape comes from the store.
  cache::CacheConfig cache;
  // EAMC persistence file; empty: none.
  std::string state_path;
  // Host arena as an unnamed memfd (handed to workers by the FdBroker)
  // instead of a /dev/shm name.
  bool anonymous_arena = false;
  // Non-null: the arena lives in this CUDA device memory (see DeviceChoice).
  std::shared_ptr<DeviceMemory> cuda;
};

// "/<prefix>-<pid>-<32 hex digits from getrandom>": a shm_open name nobody
// can guess.
std::string UnguessableShmName(const std::string& prefix);

class CachedModel {
 public:
  static absl::StatusOr<std::unique_ptr<CachedModel>> Create(
      std::unique_ptr<ExpertStore> store, const CachedModelOptions& options,
      prometheus::Registry& registry);
  ~CachedModel();

  absl::Status Start();
  void Stop();

  // Writes the learned state to options.state_path (no-op without one) and
  // updates the EAMC gauge from what was written.
  absl::Status Persist();
  // Pulls the cache's counters into the metrics.
  void SyncMetrics();

  const std::string& name() const { return options_.name; }
  const CachedModelOptions& options() const { return options_; }
  cache::ExpertCache& cache() { return *cache_; }
  // The cache's ready slots as every attached worker's channel shows them
  // (the hit path through shared memory).
  ResidencyBoard& residency() { return *residency_; }
  const cache::ExpertCache& cache() const { return *cache_; }
  const ExpertStore& store() const { return *store_; }
  // The CPU arena (empty, size 0, on CUDA).
  const cache::ShmRegion& arena() const { return arena_; }
  // The CUDA arena; null on the CPU.
  const CudaArena* cuda_arena() const { return cuda_arena_.get(); }
  // Bytes of whichever arena is in use.
  uint64_t arena_bytes() const;
  CacheMetrics& metrics() { return *metrics_; }
  int ResidentExperts() const;
  int eamc_entries() const;
  double prefetch_stride() const;

 private:
  CachedModel() = default;
  // The arena and copy engine of `bytes`, on options_.cuda or the CPU.
  absl::Status CreateArenaAndEngine(uint64_t bytes);

  CachedModelOptions options_;
  std::unique_ptr<ExpertStore> store_;
  cache::ShmRegion arena_;
  std::unique_ptr<CudaArena> cuda_arena_;
  // Exactly one engine exists; engine_ points at it.
  std::unique_ptr<cache::CpuCopyEngine> cpu_engine_;
  std::unique_ptr<cache::CudaCopyEngine> cuda_engine_;
  cache::CopyEngine* engine_ = nullptr;
  std::unique_ptr<ResidencyBoard> residency_;  // outlives cache_, its listener
  std::unique_ptr<cache::ExpertCache> cache_;
  std::unique_ptr<CacheMetrics> metrics_;
  std::atomic<bool> started_{false};
  std::atomic<bool> stopped_{false};
};

}  // namespace moe::cached

#endif  // MOECACHE_SERVICES_MOE_CACHED_CACHED_MODEL_H_
