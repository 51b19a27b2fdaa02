// serving::Runner: runs generation requests on one engine (one model, one
// backend, one expert provider), from any transport. It ties the pieces of
// the serving core together: Validate (request.h) at Submit, the Scheduler
// (queue, admission, KV budget, preemption, step plans), the Executor (the
// engine), and one OutputStream per request (sampling, stops,
// detokenizing, usage, interruption).
//
// One at a time (max_batch 1, the default) each request runs alone with
// the engine's Generate; with max_batch > 1 up to max_batch sequences share
// each forward step (continuous batching): a queued request joins at the
// next step when a place and its KV cache fit, its prompt in chunks of
// prefill_chunk tokens; a finished, stopped, cancelled or expired sequence
// leaves at once. A sequence's tokens are bit-identical to running it
// alone (CPU backend).
//
//   Runner runner(model, provider, tokenizer, metrics, options);
//   RETURN_IF_ERROR(runner.Start());
//   RETURN_IF_ERROR(runner.Submit(request, deadline, sink));  // or an error
//   ...
//   runner.Stop(absl::Seconds(5));
//
// Each accepted request gets one Output per generated token on its sink;
// the last one carries finish_reason and usage; then Finish(status). TTFT
// counts from Submit (queue time included: what a client sees).
//
// Thread-safe: Submit and Stop may be called from any thread. Sinks are
// called from the engine thread only (and from Stop's, for queued ones).
#ifndef MOECACHE_SERVICES_SERVING_RUNNER_H_
#define MOECACHE_SERVICES_SERVING_RUNNER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/base/call_once.h"
#include "absl/time/time.h"
#include "services/engine/expert_provider.h"
#include "services/engine/generator.h"
#include "services/engine/moe_model.h"
#include "services/engine/tokenizer.h"
#include "services/engine/trace_recorder.h"
#include "services/serving/executor.h"
#include "services/serving/metrics.h"
#include "services/serving/output_stream.h"
#include "services/serving/prefix_cache.h"
#include "services/serving/request.h"
#include "services/serving/scheduler.h"
#include "services/serving/structured_output.h"

namespace moe::serving {

// One request's outgoing stream.
class OutputSink {
 public:
  virtual ~OutputSink() = default;
  virtual void Write(Output output) = 0;
  // Called exactly once, after the last Write.
  virtual void Finish(const absl::Status& status) = 0;
  // True once the client has gone away (cancelled, disconnected).
  virtual bool Cancelled() const = 0;
};

struct RunnerOptions {
  // Requests waiting beyond the running ones; more get RESOURCE_EXHAUSTED.
  int max_queue = 16;
  // Sequences per forward step; 1 runs requests one at a time; 0 (auto,
  // moe-worker's default) is not a runner value: ResolveAutoBatch first.
  int max_batch = 1;
  // With max_batch > 1: prompt tokens a joining sequence runs per step;
  // 0: the whole prompt in one step.
  int prefill_chunk = 0;
  // With max_batch > 1: KV cache bytes the running sequences may hold
  // together. Each sequence's cache grows in blocks of kv_block_tokens
  // positions as it runs; a request joins when its prompt's blocks fit
  // beside what the others hold, with a block of headroom for each running
  // sequence (fewer preemptions: 27 -> 7 in docs/benchmarks.md); when a
  // step needs a block that does not fit, the youngest sequences give
  // theirs up (preempted: they wait at the head and resume by recomputing
  // their positions, with the same tokens) until it fits. One that could
  // never fit alone (prompt + max_new_tokens) is refused
  // (RESOURCE_EXHAUSTED). 0: no limit beyond max_batch.
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
  // Prefix cache (prefix_cache.h): host memory for the keys and values of
  // finished sequences, reused by requests whose prompts begin with the same
  // blocks of prefix_block_tokens tokens; 0: off. Off too while `recorder`
  // is set (a trace must see every position's routing).
  int64_t prefix_cache_bytes = 0;
  int prefix_block_tokens = 16;
  // One INFO line per finished request ("request N finished: ..."); off
  // for moe-worker's warm-up runner, whose request no client sent.
  bool log_requests = true;
};

// Auto batching (max_batch 0, moe-worker's default): the KV budget
// (kv_budget_bytes, else kAutoKvBudgetBytes, which then becomes the
// budget) divided by what one sequence of kAutoSequenceTokens positions (at
// most `max_context`) holds, between 1 and kAutoMaxBatch. Sequences hold
// blocks as they grow, so more shorter ones fit, and a step that runs out
// preempts (above). Options with max_batch >= 1 come back unchanged.
// REQUIRES: kv_bytes_per_token > 0, max_context > 0.
inline constexpr int kAutoMaxBatch = 16;
inline constexpr int64_t kAutoKvBudgetBytes = int64_t{2} << 30;
inline constexpr int64_t kAutoSequenceTokens = 2048;
RunnerOptions ResolveAutoBatch(RunnerOptions options, int64_t kv_bytes_per_token,
                               int64_t max_context);

class Runner {
 public:
  // Not owned; all must outlive the runner. `tokenizer` may be null (then
  // only prompt ids are accepted and outputs carry no text). `metrics` may
  // be null.
  Runner(const MoeModel& model, ExpertProvider* experts, const Tokenizer* tokenizer,
         ServingMetrics* metrics, RunnerOptions options);
  ~Runner();  // Stop(ZeroDuration()) if still running
  Runner(const Runner&) = delete;
  Runner& operator=(const Runner&) = delete;

  // Starts the engine thread.
  absl::Status Start();

  // Validates `request` (Validate: errors name the fields as its transport
  // spells them) and queues it. On error nothing is queued and the sink is
  // never called: INVALID_ARGUMENT (bad request), RESOURCE_EXHAUSTED (queue
  // full), UNAVAILABLE (stopping).
  absl::Status Submit(Request request, absl::Time deadline, std::shared_ptr<OutputSink> sink);

  // Refuses new requests, fails queued ones with UNAVAILABLE, lets the
  // running ones go on until `grace` has passed, then cancels them
  // (UNAVAILABLE) and joins the engine thread. Idempotent.
  void Stop(absl::Duration grace);

  // The engine options `request` stands for (its text prompt encoded),
  // validated against the model and the options; a json_schema becomes the
  // sampler's constraint (structured_output.h). Thread-safe.
  absl::StatusOr<GenerateOptions> BuildOptions(Request& request) const;

  int queued() const { return scheduler_.queued(); }
  const PrefixCache& prefix_cache() const { return prefix_cache_; }

 private:
  struct Job;  // a Sequence with its sink, stream, sampler and recording

  void Loop();
  void Run(Job& job);  // one at a time
  absl::Status RunGenerate(Job& job);
  void BatchLoop();
  // Starts a sequence the scheduler admitted (or resumed); false when it
  // already failed (and left).
  bool StartSequence(Job& job, bool resumed);
  // Runs one planned step and streams its tokens.
  void Step();
  // Leaves every running and waiting sequence that was interrupted.
  void LeaveInterrupted();
  // Ends a batched sequence: provider request, trace, sink, metrics, log.
  void Leave(Job& job, absl::Status status);
  void Finished(const Job& job, const absl::Status& status, const ExpertCounters& counters);
  absl::Status Interrupted(const Job& job) const;
  void Record(const absl::Status& status, int generated, double ttft, double tpot);
  void SetRunningMetrics(const GenerateOptions* running);
  // Keeps what `session` ran for `job` (its prompt, then its output) in the
  // prefix cache; a failure is logged, never the request's.
  void KeepPrefix(const Job& job, const Session& session);
  // The tokenizer's TokenVocabulary, built on first use (a constrained
  // request); any thread.
  std::shared_ptr<const TokenVocabulary> Vocabulary() const;

  const MoeModel& model_;
  const Tokenizer* tokenizer_;
  ServingMetrics* metrics_;
  const RunnerOptions options_;
  Scheduler scheduler_;
  Executor executor_;
  PrefixCache prefix_cache_;  // the engine thread's
  std::vector<std::pair<Job*, Output>> sampled_;  // Step's scratch (engine thread)
  mutable absl::once_flag vocabulary_once_;
  mutable std::shared_ptr<const TokenVocabulary> vocabulary_;
  // Absolute time (ns since epoch) after which running requests are
  // cancelled; int64 max while not stopping.
  std::atomic<int64_t> cancel_after_ns_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace moe::serving

#endif  // MOECACHE_SERVICES_SERVING_RUNNER_H_
