#include "services/moe_worker/worker_metrics.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace moe::worker {
namespace {

prometheus::Histogram::BucketBoundaries LatencyBuckets() {
  // 100 us .. ~100 s, roughly x2.5 apart: tiny CPU models decode in
  // milliseconds, huge offloaded ones in seconds.
  return {1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2,
          0.1,  0.25,   0.5,  1.0,  2.5,    5.0,  10.0, 25.0,   100.0};
}

}  // namespace

WorkerMetrics::WorkerMetrics()
    : registry_(std::make_shared<prometheus::Registry>()) {
  requests_ = &prometheus::BuildCounter()
                   .Name("moe_worker_requests_total")
                   .Help("Generate requests finished, by gRPC status")
                   .Register(*registry_);
  tokens_ = &prometheus::BuildCounter()
                 .Name("moe_worker_tokens_generated_total")
                 .Help("Tokens generated and streamed")
                 .Register(*registry_)
                 .Add({});
  ttft_ = &prometheus::BuildHistogram()
               .Name("moe_worker_ttft_seconds")
               .Help("Time from the start of a request to its first token")
               .Register(*registry_)
               .Add({}, LatencyBuckets());
  tpot_ = &prometheus::BuildHistogram()
               .Name("moe_worker_tpot_seconds")
               .Help("Mean time per output token after the first, per request")
               .Register(*registry_)
               .Add({}, LatencyBuckets());
  expert_wait_ = &prometheus::BuildCounter()
                      .Name("moe_worker_expert_wait_seconds_total")
                      .Help("Wall time spent waiting inside expert Acquire")
                      .Register(*registry_)
                      .Add({});
  expert_stall_ = &prometheus::BuildCounter()
                       .Name("moe_worker_expert_stall_seconds_total")
                       .Help("Stall time reported by the expert provider")
                       .Register(*registry_)
                       .Add({});
  expert_hits_ = &prometheus::BuildCounter()
                      .Name("moe_worker_expert_hits_total")
                      .Help("Experts that were resident when acquired")
                      .Register(*registry_)
                      .Add({});
  expert_misses_ = &prometheus::BuildCounter()
                        .Name("moe_worker_expert_misses_total")
                        .Help("Experts that had to be loaded when acquired")
                        .Register(*registry_)
                        .Add({});
  queue_depth_ = &prometheus::BuildGauge()
                      .Name("moe_worker_queue_depth")
                      .Help("Requests waiting for the engine")
                      .Register(*registry_)
                      .Add({});
  prompt_tokens_ = &prometheus::BuildCounter()
                        .Name("moe_worker_prompt_tokens_total")
                        .Help("Prompt tokens of the requests that ran")
                        .Register(*registry_)
                        .Add({});
  cached_prompt_tokens_ = &prometheus::BuildCounter()
                              .Name("moe_worker_prompt_tokens_cached_total")
                              .Help("Prompt tokens loaded from the prefix cache rather than run "
                                    "(part of moe_worker_prompt_tokens_total)")
                              .Register(*registry_)
                              .Add({});
  waiting_ = &prometheus::BuildGauge()
                  .Name("moe_worker_requests_waiting")
                  .Help("Requests queued, not yet running")
                  .Register(*registry_)
                  .Add({});
  running_ = &prometheus::BuildGauge()
                  .Name("moe_worker_requests_running")
                  .Help("Requests running on the engine")
                  .Register(*registry_)
                  .Add({});
  kv_bytes_ = &prometheus::BuildGauge()
                   .Name("moe_worker_kv_cache_bytes")
                   .Help("KV cache memory held by the running requests")
                   .Register(*registry_)
                   .Add({});
  kv_usage_ = &prometheus::BuildGauge()
                   .Name("moe_worker_kv_cache_usage_ratio")
                   .Help("KV cache held by the running requests over what the worker may hold "
                         "(--kv-budget-mb, else every batch place at the full context), in [0, 1]")
                   .Register(*registry_)
                   .Add({});
  kv_preemptions_ = &prometheus::BuildCounter()
                        .Name("moe_worker_kv_preemptions_total")
                        .Help("Running sequences that gave up their KV cache blocks to older ones "
                              "(--kv-budget-mb full) and resumed by recomputing them")
                        .Register(*registry_)
                        .Add({});
  batch_size_ = &prometheus::BuildGauge()
                     .Name("moe_worker_batch_size")
                     .Help("Sequences in the engine's last forward step (continuous batching)")
                     .Register(*registry_)
                     .Add({});
  batch_steps_ = &prometheus::BuildCounter()
                      .Name("moe_worker_batch_steps_total")
                      .Help("Batched forward steps run (--max-batch > 1)")
                      .Register(*registry_)
                      .Add({});
  batch_sequences_ = &prometheus::BuildCounter()
                          .Name("moe_worker_batch_sequences_total")
                          .Help("Sequences summed over batched forward steps (over steps_total: mean batch size)")
                          .Register(*registry_)
                          .Add({});
  decode_step_ = &prometheus::BuildHistogram()
                      .Name("moe_worker_decode_step_seconds")
                      .Help("Wall time of batched steps in which every sequence decoded a token "
                            "(no prompt chunk beside them)")
                      .Register(*registry_)
                      .Add({}, LatencyBuckets());
  decode_step_sequences_ =
      &prometheus::BuildCounter()
           .Name("moe_worker_decode_step_sequences_total")
           .Help("Sequences summed over those decode steps (over the histogram's count: their "
                 "mean batch size)")
           .Register(*registry_)
           .Add({});
  process_ = std::make_shared<rpc::ProcessMetrics>(registry_, "moe-worker");
}

void WorkerMetrics::SetQueueDepth(int64_t n) {
  queue_depth_->Set(static_cast<double>(n));
  waiting_->Set(static_cast<double>(n));
}

std::string WorkerMetrics::CodeLabel(absl::StatusCode code) {
  if (code == absl::StatusCode::kOk) return "ok";
  return absl::AsciiStrToLower(absl::StatusCodeToString(code));
}

void WorkerMetrics::RecordRequest(const absl::Status& status) {
  requests_->Add({{"status", CodeLabel(status.code())}}).Increment();
}

void WorkerMetrics::AddExpertOutcome(int64_t hits, int64_t misses,
                                     double wait_seconds,
                                     double stall_seconds) {
  expert_hits_->Increment(static_cast<double>(hits));
  expert_misses_->Increment(static_cast<double>(misses));
  expert_wait_->Increment(wait_seconds);
  expert_stall_->Increment(stall_seconds);
}

void WorkerMetrics::SetKvCacheBytes(int64_t n) {
  kv_bytes_->Set(static_cast<double>(n));
  const int64_t capacity = kv_capacity_.load();
  const double ratio = capacity > 0 ? static_cast<double>(n) / static_cast<double>(capacity) : 0.0;
  kv_usage_->Set(std::clamp(ratio, 0.0, 1.0));
}

}  // namespace moe::worker
