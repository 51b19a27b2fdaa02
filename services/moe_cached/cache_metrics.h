// Prometheus metrics of one cached model (`model` label), owned by its
// CachedModel. Counters that the ExpertCache already counts (hits, misses,
// prefetches, bytes) are pulled from it by Sync(), which adds the difference
// since the previous Sync, so /metrics shows exact totals right after a call
// returns; acquire latency and stall time are recorded as they happen.
//
// Thread-safety: all methods are thread-safe.
#ifndef MOECACHE_SERVICES_MOE_CACHED_CACHE_METRICS_H_
#define MOECACHE_SERVICES_MOE_CACHED_CACHE_METRICS_H_

#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "services/cache/expert_cache.h"

namespace moe::cached {

class CacheMetrics {
 public:
  CacheMetrics(prometheus::Registry& registry, const std::string& model, int capacity);

  // One acquire that took `seconds` of which `stall_seconds` waiting for
  // copies (0 on an all-hit acquire).
  void RecordAcquire(double seconds, double stall_seconds);
  // A worker's measured host runs: the host-answered experts' share of the
  // measured CPU time goes to moe_cache_host_seconds_total.
  void RecordHostRuns(const HostRunReport& report);
  // Adds what `stats` (the cache's totals over both phases) and the gauges'
  // per-layer counters counted since the previous call; sets the gauges.
  void Sync(const cache::CachePhaseStats& stats, const cache::ExpertCache::Gauges& gauges);
  double stall_seconds() const { return stall_seconds_.Value(); }

 private:
  prometheus::Counter& hits_;
  prometheus::Counter& misses_;
  prometheus::Counter& prefetch_issued_;
  prometheus::Counter& prefetch_used_;
  prometheus::Counter& prefetch_wasted_;
  prometheus::Counter& stall_seconds_;
  prometheus::Counter& bytes_copied_;
  prometheus::Counter& host_executions_;
  prometheus::Counter& host_seconds_;
  prometheus::Gauge& host_read_gbps_;
  prometheus::Gauge& host_gflops_;
  prometheus::Histogram& acquire_seconds_;
  prometheus::Gauge& resident_;
  prometheus::Gauge& capacity_;
  prometheus::Gauge& eamc_entries_;
  prometheus::Gauge& prefetch_stride_;
  // Per-layer series ({model, layer}), created by the first Sync that sees
  // the layer count.
  const std::string model_;
  prometheus::Family<prometheus::Counter>& layer_hits_family_;
  prometheus::Family<prometheus::Counter>& layer_misses_family_;
  prometheus::Family<prometheus::Gauge>& layer_resident_family_;

  absl::Mutex mu_;
  cache::CachePhaseStats last_ ABSL_GUARDED_BY(mu_);
  struct LayerSeries {
    prometheus::Counter* hits;
    prometheus::Counter* misses;
    prometheus::Gauge* resident;
    uint64_t last_hits = 0;
    uint64_t last_misses = 0;
  };
  std::vector<LayerSeries> layers_ ABSL_GUARDED_BY(mu_);
};

// Sum of the two phases' statistics.
cache::CachePhaseStats TotalStats(const cache::ExpertCache& cache);

}  // namespace moe::cached

#endif  // MOECACHE_SERVICES_MOE_CACHED_CACHE_METRICS_H_
