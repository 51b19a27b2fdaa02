// CachedModel: everything moe-cached holds for one model — its ExpertStore
// (host copy), its arena (a shared-memory region of capacity x block_bytes,
// mode 0600, under an unguessable name that only Attach reveals), a
// CpuCopyEngine that copies experts into the arena (optionally paced to a
// link rate), the ExpertCache deciding residency, and its metrics.
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
#include "prometheus/registry.h"
#include "services/cache/cpu_copy_engine.h"
#include "services/cache/expert_cache.h"
#include "services/cache/shm_region.h"
#include "services/moe_cached/cache_metrics.h"
#include "services/moe_cached/expert_store.h"

namespace moe::cached {

struct CachedModelOptions {
  std::string name;
  int capacity = 0;  // slots; REQUIRES >= the model's experts per layer
  std::string policy = "lru";
  bool prefetch = false;
  double link_bytes_per_sec = 0;  // 0: unpaced copies
  // EAMC persistence file; empty: none.
  std::string state_path;
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
  const cache::ExpertCache& cache() const { return *cache_; }
  const ExpertStore& store() const { return *store_; }
  const cache::ShmRegion& arena() const { return arena_; }
  CacheMetrics& metrics() { return *metrics_; }
  int ResidentExperts() const;
  int eamc_entries() const;
  double prefetch_stride() const;

 private:
  CachedModel() = default;

  CachedModelOptions options_;
  std::unique_ptr<ExpertStore> store_;
  cache::ShmRegion arena_;
  std::unique_ptr<cache::CpuCopyEngine> engine_;
  std::unique_ptr<cache::ExpertCache> cache_;
  std::unique_ptr<CacheMetrics> metrics_;
  std::atomic<bool> started_{false};
  std::atomic<bool> stopped_{false};
};

}  // namespace moe::cached

#endif  // MOECACHE_SERVICES_MOE_CACHED_CACHED_MODEL_H_
