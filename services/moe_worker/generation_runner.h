// Runs Generate requests on one engine (one model, one backend, one expert
// provider) from a bounded first-come-first-served queue: one at a time
// (max_batch 1, the default), or with continuous batching (max_batch > 1):
// up to max_batch sequences share each forward step (BatchStep: one expert
// acquire per MoE layer for the union of their experts); a queued request
// joins at the next step when a place and its KV cache fit, its prompt in
// chunks of prefill_chunk tokens so the running decodes keep going; a
// finished, stopped, cancelled or expired sequence leaves at once. A
// sequence's tokens are bit-identical to running it alone (CPU backend).
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
#include "services/moe_worker/worker_metrics.h"
#include "services/serving/metered_provider.h"
#include "services/serving/output_stream.h"
#include "services/serving/request.h"

namespace moe::worker {

using serving::ExpertCounters;
using serving::MeteredProvider;

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
  // Requests waiting beyond the running ones; more get RESOURCE_EXHAUSTED.
  int max_queue = 16;
  // Sequences per forward step; 1 runs requests one at a time.
  int max_batch = 1;
  // With max_batch > 1: prompt tokens a joining sequence runs per step;
  // 0: the whole prompt in one step.
  int prefill_chunk = 0;
  // With max_batch > 1: KV cache bytes the running sequences may hold
  // together. Each sequence's cache grows in blocks of kv_block_tokens
  // positions as it runs; a request joins when its prompt's blocks fit
  // beside what the others hold, with a block of headroom for each running
  // sequence (fewer preemptions: 27 -> 7 in docs/benchmarks.md); when a step needs a block that does not
  // fit, the youngest sequences give theirs up (preempted: they wait at the
  // head and resume by recomputing their positions, with the same tokens)
  // until it fits. One that could never fit alone (prompt + max_new_tokens)
  // is refused (RESOURCE_EXHAUSTED). 0: no limit beyond max_batch.
  int64_t kv_budget_bytes = 0;
  // With max_batch > 1: positions per KV cache block (> 0).
  int kv_block_tokens = 64;
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

  // Validates `request` (serving::Validate: errors name the fields as its
  // transport spells them) and queues it. On error nothing is queued and
  // the sink is never called: INVALID_ARGUMENT (bad request),
  // RESOURCE_EXHAUSTED (queue full), UNAVAILABLE (stopping).
  absl::Status Submit(serving::Request request, absl::Time deadline,
                      std::shared_ptr<ResponseSink> sink);
  // A gRPC Generate request (serving::FromProto, Transport::kGrpc).
  absl::Status Submit(const v1::GenerateRequest& request, absl::Time deadline,
                      std::shared_ptr<ResponseSink> sink);

  // Refuses new requests, fails queued ones with UNAVAILABLE, lets the
  // running one go on until `grace` has passed, then cancels it (UNAVAILABLE)
  // and joins the engine thread. Idempotent.
  void Stop(absl::Duration grace);

  // The engine options `request` stands for (its text prompt encoded),
  // validated against the model and the options (INVALID_ARGUMENT naming
  // the field).
  absl::StatusOr<GenerateOptions> BuildOptions(serving::Request& request) const;

  int queued() const;

 private:
  struct Job {
    GenerateOptions options;
    absl::Time deadline;
    absl::Time submitted;
    std::shared_ptr<ResponseSink> sink;
    std::vector<std::string> stop_strings;  // GenerateRequest.stop
  };

  // One sequence of the batched loop (generation_batch.cc).
  struct Active;

  void Loop();
  void Run(Job& job);
  // The continuous-batching loop (max_batch > 1), generation_batch.cc.
  void BatchLoop();
  // Moves queued jobs into `active` while places and KV budget allow
  // (preempted sequences first, oldest first).
  void Admit(std::vector<std::unique_ptr<Active>>& active,
             std::deque<std::unique_ptr<Active>>& preempted);
  // Starts a joined sequence; false when it already failed (and finished).
  bool Join(Active& a);
  // A fresh session for `a` (at Join, and when a preempted one resumes);
  // an error for a bad pre-gating distance.
  absl::Status NewSession(Active& a);
  // The tokens `a` runs in the next step (a prompt chunk, the replay of a
  // resumed sequence's positions, or its last token).
  absl::Span<const int32_t> NextTokens(Active& a, bool* prefill) const;
  // Grows every sequence's KV reservation for the next step within the
  // budget, preempting the youngest into `preempted` when it is full.
  void FitKv(std::vector<std::unique_ptr<Active>>& active,
             std::deque<std::unique_ptr<Active>>& preempted);
  // Sends one sampled token; false when the sequence leaves after it.
  bool Emit(Active& a, const SampledToken& t);
  // Ends a sequence: provider request, trace, sink, metrics, log line.
  void Leave(Active& a, absl::Status status);
  // Why a running sequence must stop now (cancel, deadline, shutdown).
  absl::Status Interrupted(const Job& job) const;
  void LogFinished(const Job& job, const absl::Status& status, int generated,
                   double ttft, double tpot, const ExpertCounters& counters,
                   std::string finish);
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
  int running_ = 0;         // batched sequences running; guarded by mu_
  int64_t kv_held_ = 0;     // their KV cache bytes; guarded by mu_
  uint64_t next_order_ = 0;  // admission order of batched sequences (BatchLoop only)
  uint64_t next_request_id_ = 1;  // guarded by mu_
  // Absolute time (ns since epoch) after which the running request is
  // cancelled; int64 max while not stopping.
  std::atomic<int64_t> cancel_after_ns_;
  std::thread thread_;
};

}  // namespace moe::worker

#endif  // MOECACHE_SERVICES_MOE_WORKER_GENERATION_RUNNER_H_
