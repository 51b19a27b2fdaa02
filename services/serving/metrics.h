// The serving core's metrics and tracing hooks, as an interface the worker
// implements (moe_worker/worker_metrics.h, over prometheus-cpp), so the core
// depends on no metrics library. Every method defaults to doing nothing.
//
// Thread-safety: implementations must accept calls from any thread
// (Submit's caller and the engine thread).
#ifndef MOECACHE_SERVICES_SERVING_METRICS_H_
#define MOECACHE_SERVICES_SERVING_METRICS_H_

#include <cstdint>

#include "absl/status/status.h"

namespace moe::serving {

class ServingMetrics {
 public:
  virtual ~ServingMetrics() = default;

  // One finished request (accepted or refused) under its status code.
  virtual void RecordRequest(const absl::Status& status) {}
  virtual void AddTokens(int64_t n) {}
  virtual void ObserveTtft(double seconds) {}
  virtual void ObserveTpot(double seconds) {}
  virtual void AddExpertOutcome(int64_t hits, int64_t misses, double wait_seconds,
                                double stall_seconds) {}
  virtual void AddPromptTokens(int64_t n) {}
  // Prompt tokens a finished request loaded from the prefix cache.
  virtual void AddCachedPromptTokens(int64_t n) {}
  // Requests waiting for the engine, and running on it.
  virtual void SetQueueDepth(int64_t n) {}
  virtual void SetRunning(int64_t n) {}
  // KV cache bytes held by the running requests.
  virtual void SetKvCacheBytes(int64_t n) {}
  // A running sequence gave up its KV cache (it resumes by recomputing).
  virtual void AddKvPreemption() {}
  // One batched forward step of `sequences` sequences.
  virtual void ObserveBatchStep(int64_t sequences) {}
  // A batched step in which every sequence decoded a token (no prompt
  // chunk beside them): its wall time from the plan to the tokens handed
  // to the transports. What a decode step costs at that batch, without the
  // prompts that join a running batch (a client's TPOT counts those).
  virtual void ObserveDecodeStep(int64_t sequences, double seconds) {}
};

}  // namespace moe::serving

#endif  // MOECACHE_SERVICES_SERVING_METRICS_H_
