// moe-worker's Prometheus metrics, built once and owned by the worker. Safe
// to update from any thread (prometheus-cpp metrics are atomic).
#ifndef MOECACHE_SERVICES_MOE_WORKER_WORKER_METRICS_H_
#define MOECACHE_SERVICES_MOE_WORKER_WORKER_METRICS_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "services/rpc/process_metrics.h"
#include "services/serving/metrics.h"

namespace moe::worker {

// The serving core's hooks (serving::ServingMetrics) over Prometheus.
class WorkerMetrics : public serving::ServingMetrics {
 public:
  WorkerMetrics();

  const std::shared_ptr<prometheus::Registry>& registry() const {
    return registry_;
  }
  // What /metrics (and Inference.GetMetrics) serve: the registry, with
  // moe_build_info and the process_* series refreshed at each collection.
  const std::shared_ptr<rpc::ProcessMetrics>& exposed() const { return process_; }

  // Counts one finished request under status="ok", "cancelled",
  // "invalid_argument", ... (the lower-case gRPC code name).
  void RecordRequest(const absl::Status& status) override;
  void AddTokens(int64_t n) override { tokens_->Increment(static_cast<double>(n)); }
  void ObserveTtft(double seconds) override { ttft_->Observe(seconds); }
  void ObserveTpot(double seconds) override { tpot_->Observe(seconds); }
  void AddExpertOutcome(int64_t hits, int64_t misses, double wait_seconds,
                        double stall_seconds) override;
  void AddPromptTokens(int64_t n) override { prompt_tokens_->Increment(static_cast<double>(n)); }
  void AddCachedPromptTokens(int64_t n) override {
    cached_prompt_tokens_->Increment(static_cast<double>(n));
  }
  // Requests waiting for the engine (also exported as the older
  // moe_worker_queue_depth) and running on it.
  void SetQueueDepth(int64_t n) override;
  void SetRunning(int64_t n) override { running_->Set(static_cast<double>(n)); }
  // KV cache bytes held by the running requests, and their share of the
  // capacity (moe_worker_kv_cache_usage_ratio, in [0, 1]: what a cluster
  // router such as the Gateway API Inference Extension reads).
  void SetKvCacheBytes(int64_t n) override;
  // The KV bytes the worker may hold: --kv-budget-mb, else every batch
  // place at the full context. Set once before serving; <= 0: ratio 0.
  void SetKvCacheCapacity(int64_t bytes) { kv_capacity_.store(bytes); }

  // A running sequence gave up its KV cache for the oldest ones to grow
  // (it resumes by recomputing its positions).
  void AddKvPreemption() override { kv_preemptions_->Increment(); }

  // One batched forward step of `sequences` sequences.
  void ObserveBatchStep(int64_t sequences) override {
    batch_size_->Set(static_cast<double>(sequences));
    batch_steps_->Increment();
    batch_sequences_->Increment(static_cast<double>(sequences));
  }
  void ObserveDecodeStep(int64_t sequences, double seconds) override {
    decode_step_->Observe(seconds);
    decode_step_sequences_->Increment(static_cast<double>(sequences));
  }

  // The lower-case name of a status code ("ok", "resource_exhausted").
  static std::string CodeLabel(absl::StatusCode code);

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>* requests_ = nullptr;
  prometheus::Counter* tokens_ = nullptr;
  prometheus::Histogram* ttft_ = nullptr;
  prometheus::Histogram* tpot_ = nullptr;
  prometheus::Counter* expert_wait_ = nullptr;
  prometheus::Counter* expert_stall_ = nullptr;
  prometheus::Counter* expert_hits_ = nullptr;
  prometheus::Counter* expert_misses_ = nullptr;
  prometheus::Gauge* queue_depth_ = nullptr;
  prometheus::Counter* prompt_tokens_ = nullptr;
  prometheus::Counter* cached_prompt_tokens_ = nullptr;
  prometheus::Gauge* waiting_ = nullptr;
  prometheus::Gauge* running_ = nullptr;
  prometheus::Gauge* kv_bytes_ = nullptr;
  prometheus::Gauge* kv_usage_ = nullptr;
  std::atomic<int64_t> kv_capacity_{0};
  prometheus::Counter* kv_preemptions_ = nullptr;
  prometheus::Gauge* batch_size_ = nullptr;
  prometheus::Counter* batch_steps_ = nullptr;
  prometheus::Counter* batch_sequences_ = nullptr;
  prometheus::Histogram* decode_step_ = nullptr;
  prometheus::Counter* decode_step_sequences_ = nullptr;
  std::shared_ptr<rpc::ProcessMetrics> process_;
};

}  // namespace moe::worker

#endif  // MOECACHE_SERVICES_MOE_WORKER_WORKER_METRICS_H_
