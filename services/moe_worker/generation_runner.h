// Runs Generate requests on one engine (one model, one backend, one expert
// provider), one at a time, in arrival order, from a bounded queue.
//
//   GenerationRunner runner(model, provider, tokenizer, metrics, options);
//   RETURN_IF_ERROR(runner.Start());
//   RETURN_IF_ERROR(runner.Submit(request, deadline, sink));  // or an error
//   ...
//   runner.Stop(absl::Seconds(5));
//
// Each accepted request gets one GenerateResponse per generated token on its
// sink; the last one carries finish_reason and usage; then Finish(status).
// TTFT counts from Submit (queue time included: what a client sees).
//
// Thread-safe: Submit and Stop may be called from any thread. Sinks are
// called from the engine thread only.
#ifndef MOECACHE_SERVICES_MOE_WORKER_GENERATION_RUNNER_H_
#define MOECACHE_SERVICES_MOE_WORKER_GENERATION_RUNNER_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "moe/v1/inference.pb.h"
#include "services/engine/generator.h"
#include "services/engine/moe_model.h"
#include "services/engine/tokenizer.h"
#include "services/engine/trace_recorder.h"
#include "services/moe_worker/metered_provider.h"
#include "services/moe_worker/worker_metrics.h"

namespace moe::worker {

// One request's outgoing stream.
class ResponseSink {
 public:
  virtual ~ResponseSink() = default;
  virtual void Write(v1::GenerateResponse response) = 0;
  // Called exactly once, after the last Write.
  virtual void Finish(const absl::Status& status) = 0;
  // True once the client has gone away (cancelled, disconnected).
  virtual bool Cancelled() const = 0;
};

struct RunnerOptions {
  // Requests waiting beyond the running one; more get RESOURCE_EXHAUSTED.
  int max_queue = 16;
  // Longest accepted prompt; 0 = only the context window limits it.
  int max_prompt_tokens = 0;
  // When set (not owned), every completed request's routing is appended.
  TraceRecorder* recorder = nullptr;
  // Pre-gating: after each layer, the next MoE layer's router is applied to
  // the hidden state and its top experts go to the provider as prefetch
  // hints (decode iterations).
  bool pregate_hints = false;
  // How many layers ahead the hints predict (Session::set_pregate_distance).
  int pregate_distance = 1;
};

class GenerationRunner {
 public:
  // Not owned; all must outlive the runner. `tokenizer` may be null (then
  // only prompt_token_ids are accepted and `text` stays empty). `metrics`
  // may be null.
  GenerationRunner(const MoeModel& model, ExpertProvider* experts,
                   const Tokenizer* tokenizer, WorkerMetrics* metrics,
                   RunnerOptions options);
  ~GenerationRunner();  // Stop(ZeroDuration()) if still running
  GenerationRunner(const GenerationRunner&) = delete;
  GenerationRunner& operator=(const GenerationRunner&) = delete;

  // Starts the engine thread.
  absl::Status Start();

  // Validates `request` and queues it. On error nothing is queued and the
  // sink is never called: INVALID_ARGUMENT (bad request),
  // RESOURCE_EXHAUSTED (queue full), UNAVAILABLE (stopping).
  absl::Status Submit(const v1::GenerateRequest& request, absl::Time deadline,
                      std::shared_ptr<ResponseSink> sink);

  // Refuses new requests, fails queued ones with UNAVAILABLE, lets the
  // running one go on until `grace` has passed, then cancels it (UNAVAILABLE)
  // and joins the engine thread. Idempotent.
  void Stop(absl::Duration grace);

  // The prompt ids `request` stands for, validated against the model and
  // the options (INVALID_ARGUMENT with the reason).
  absl::StatusOr<GenerateOptions> BuildOptions(
      const v1::GenerateRequest& request) const;

  int queued() const;

 private:
  struct Job {
    GenerateOptions options;
    absl::Time deadline;
    absl::Time submitted;
    std::shared_ptr<ResponseSink> sink;
    std::vector<std::string> stop_strings;  // GenerateRequest.stop
  };

  void Loop();
  void Run(Job& job);
  // `finish` gets "stop" or "length" once the last token is out.
  absl::Status RunGenerate(Job& job, int* generated, double* ttft,
                           double* tpot, std::string* finish);
  void Record(const absl::Status& status, int generated, double ttft,
              double tpot);
  // Running-request gauges (and prompt tokens) for `running`; null: idle.
  void SetRunningMetrics(const GenerateOptions* running);

  const MoeModel& model_;
  MeteredProvider experts_;
  const Tokenizer* tokenizer_;
  WorkerMetrics* metrics_;
  const RunnerOptions options_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;  // guarded by mu_
  bool accepting_ = false;  // guarded by mu_
  bool stopping_ = false;   // guarded by mu_
  bool busy_ = false;       // a request is running; guarded by mu_
  uint64_t next_request_id_ = 1;  // guarded by mu_
  // Absolute time (ns since epoch) after which the running request is
  // cancelled; int64 max while not stopping.
  std::atomic<int64_t> cancel_after_ns_;
  std::thread thread_;
};

}  // namespace moe::worker

#endif  // MOECACHE_SERVICES_MOE_WORKER_GENERATION_RUNNER_H_
