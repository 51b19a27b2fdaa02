#include "services/moe_cached/cache_metrics.h"

namespace moe::cached {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;
using prometheus::Labels;

prometheus::Counter& Counter(prometheus::Registry& r, const char* name, const char* help,
                             const Labels& labels) {
  return BuildCounter().Name(name).Help(help).Register(r).Add(labels);
}

prometheus::Gauge& Gauge(prometheus::Registry& r, const char* name, const char* help,
                         const Labels& labels) {
  return BuildGauge().Name(name).Help(help).Register(r).Add(labels);
}

// 1 us .. ~4 s in factors of 2: a shm hit lands in the first buckets, a
// paced miss of a large expert in the last ones.
prometheus::Histogram::BucketBoundaries AcquireBuckets() {
  prometheus::Histogram::BucketBoundaries b;
  for (double v = 1e-6; v < 5; v *= 2) b.push_back(v);
  return b;
}

}  // namespace

CacheMetrics::CacheMetrics(prometheus::Registry& r, const std::string& model, int capacity)
    : hits_(Counter(r, "moe_cache_hits_total", "Demanded experts ready when routed",
                    {{"model", model}})),
      misses_(Counter(r, "moe_cache_misses_total", "Demanded experts not ready when routed",
                      {{"model", model}})),
      prefetch_issued_(Counter(r, "moe_cache_prefetch_issued_total", "Prefetches started",
                               {{"model", model}})),
      prefetch_used_(Counter(r, "moe_cache_prefetch_used_total",
                             "Prefetched experts demanded before eviction", {{"model", model}})),
      prefetch_wasted_(Counter(r, "moe_cache_prefetch_wasted_total",
                               "Prefetched experts evicted or cancelled unused",
                               {{"model", model}})),
      stall_seconds_(Counter(r, "moe_cache_stall_seconds_total",
                             "Time acquires waited for expert copies", {{"model", model}})),
      bytes_copied_(Counter(r, "moe_cache_bytes_copied_total",
                            "Bytes copied host -> arena (demand and prefetch)",
                            {{"model", model}})),
      host_executions_(Counter(r, "moe_cache_host_executions_total",
                               "Misses answered 'run on host' (--miss-mode host or auto)",
                               {{"model", model}})),
      host_seconds_(Counter(r, "moe_cache_host_seconds_total",
                            "Time workers spent running host-answered experts (their share of "
                            "the CPU expert time workers report)",
                            {{"model", model}})),
      host_read_gbps_(Gauge(r, "moe_cache_host_read_gbps",
                            "Host read bandwidth the miss cost model uses now (tracked online)",
                            {{"model", model}})),
      host_gflops_(Gauge(r, "moe_cache_host_gflops",
                         "Host FLOP rate the miss cost model uses now (tracked online)",
                         {{"model", model}})),
      acquire_seconds_(BuildHistogram()
                           .Name("moe_cache_acquire_seconds")
                           .Help("Acquire latency inside the daemon (0 for an acquire a worker served "
                                 "itself from slots it pinned)")
                           .Register(r)
                           .Add({{"model", model}}, AcquireBuckets())),
      resident_(Gauge(r, "moe_cache_resident_experts", "Experts ready in the arena",
                      {{"model", model}})),
      capacity_(Gauge(r, "moe_cache_capacity_experts", "Arena slots", {{"model", model}})),
      eamc_entries_(Gauge(r, "moe_eamc_entries", "Expert activation matrices learned",
                          {{"model", model}})),
      prefetch_stride_(Gauge(r, "moe_prefetch_stride",
                             "Layers ahead that prefetch looks (0 with prefetch off)",
                             {{"model", model}})),
      model_(model),
      layer_hits_family_(BuildCounter()
                             .Name("moe_cache_layer_hits_total")
                             .Help("Demanded experts ready when routed, per MoE layer")
                             .Register(r)),
      layer_misses_family_(BuildCounter()
                               .Name("moe_cache_layer_misses_total")
                               .Help("Demanded experts not ready when routed, per MoE layer")
                               .Register(r)),
      layer_resident_family_(BuildGauge()
                                 .Name("moe_cache_layer_resident_experts")
                                 .Help("Experts ready in the arena, per MoE layer")
                                 .Register(r)) {
  capacity_.Set(capacity);
}

void CacheMetrics::RecordAcquire(double seconds, double stall_seconds) {
  acquire_seconds_.Observe(seconds);
  if (stall_seconds > 0) stall_seconds_.Increment(stall_seconds);
}

void CacheMetrics::RecordHostRuns(const HostRunReport& r) {
  if (r.host_experts > 0) {
    host_seconds_.Increment(static_cast<double>(r.nanoseconds) * 1e-9 * r.host_experts /
                            r.experts);
  }
}

void CacheMetrics::Sync(const cache::CachePhaseStats& s,
                        const cache::ExpertCache::Gauges& gauges) {
  absl::MutexLock lock(&mu_);
  auto add = [](prometheus::Counter& c, uint64_t now, uint64_t& last) {
    if (now > last) c.Increment(static_cast<double>(now - last));
    last = now;
  };
  add(hits_, s.hits, last_.hits);
  add(misses_, s.misses, last_.misses);
  add(prefetch_issued_, s.prefetches_issued, last_.prefetches_issued);
  add(prefetch_used_, s.prefetches_used, last_.prefetches_used);
  add(prefetch_wasted_, s.prefetches_wasted, last_.prefetches_wasted);
  add(bytes_copied_, s.bytes_moved, last_.bytes_moved);
  add(host_executions_, s.host_runs, last_.host_runs);
  resident_.Set(gauges.resident);
  host_read_gbps_.Set(gauges.host.read_bytes_per_sec / 1e9);
  host_gflops_.Set(gauges.host.flops_per_sec / 1e9);
  eamc_entries_.Set(gauges.eamc_entries);
  prefetch_stride_.Set(gauges.prefetch_stride);
  const size_t num_layers = gauges.layer_resident.size();
  while (layers_.size() < num_layers) {
    const Labels labels{{"model", model_}, {"layer", std::to_string(layers_.size())}};
    layers_.push_back(LayerSeries{&layer_hits_family_.Add(labels),
                                  &layer_misses_family_.Add(labels),
                                  &layer_resident_family_.Add(labels)});
  }
  for (size_t l = 0; l < num_layers; ++l) {
    LayerSeries& ls = layers_[l];
    ls.resident->Set(gauges.layer_resident[l]);
    if (l < gauges.layer_hits.size()) add(*ls.hits, gauges.layer_hits[l], ls.last_hits);
    if (l < gauges.layer_misses.size()) add(*ls.misses, gauges.layer_misses[l], ls.last_misses);
  }
}

cache::CachePhaseStats TotalStats(const cache::ExpertCache& cache) {
  cache::CachePhaseStats a = cache.GetStats(cache::Phase::kPrefill);
  cache::CachePhaseStats b = cache.GetStats(cache::Phase::kDecode);
  a.hits += b.hits;
  a.misses += b.misses;
  a.prefetches_issued += b.prefetches_issued;
  a.prefetches_used += b.prefetches_used;
  a.prefetches_wasted += b.prefetches_wasted;
  a.bytes_moved += b.bytes_moved;
  a.host_runs += b.host_runs;
  a.iterations += b.iterations;
  return a;
}

}  // namespace moe::cached
