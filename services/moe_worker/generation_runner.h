// The worker's side of the serving core: serving::Runner (queue, admission,
// KV budget, preemption, batching, streaming; services/serving/runner.h)
// behind the moe.v1 messages the transports speak. gRPC Generate and the
// OpenAI HTTP API submit here; each accepted request gets one
// GenerateResponse per generated token on its sink, the last carrying
// finish_reason and usage, then Finish(status).
//
//   GenerationRunner runner(model, provider, tokenizer, metrics, options);
//   RETURN_IF_ERROR(runner.Start());
//   RETURN_IF_ERROR(runner.Submit(request, deadline, sink));  // or an error
//   ...
//   runner.Stop(absl::Seconds(5));
//
// Thread-safe: Submit and Stop may be called from any thread. Sinks are
// called from the engine thread only (and from Stop's, for queued ones).
#ifndef MOECACHE_SERVICES_MOE_WORKER_GENERATION_RUNNER_H_
#define MOECACHE_SERVICES_MOE_WORKER_GENERATION_RUNNER_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "moe/v1/inference.pb.h"
#include "services/engine/expert_provider.h"
#include "services/engine/moe_model.h"
#include "services/engine/tokenizer.h"
#include "services/moe_worker/worker_metrics.h"
#include "services/serving/request.h"
#include "services/serving/runner.h"

namespace moe::worker {

using RunnerOptions = serving::RunnerOptions;

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

class GenerationRunner {
 public:
  // Not owned; all must outlive the runner. `tokenizer` may be null (then
  // only prompt_token_ids are accepted and `text` stays empty). `metrics`
  // may be null.
  GenerationRunner(const MoeModel& model, ExpertProvider* experts, const Tokenizer* tokenizer,
                   WorkerMetrics* metrics, RunnerOptions options)
      : runner_(model, experts, tokenizer, metrics, options) {}

  // Starts the engine thread.
  absl::Status Start() { return runner_.Start(); }

  // serving::Runner::Submit, the responses as moe.v1 messages.
  // INVALID_ARGUMENT (bad request, naming the field as the request's
  // transport spells it), RESOURCE_EXHAUSTED (queue full), UNAVAILABLE
  // (stopping); then the sink is never called.
  absl::Status Submit(serving::Request request, absl::Time deadline,
                      std::shared_ptr<ResponseSink> sink);
  // A gRPC Generate request (serving::FromProto, Transport::kGrpc).
  absl::Status Submit(const v1::GenerateRequest& request, absl::Time deadline,
                      std::shared_ptr<ResponseSink> sink);

  // serving::Runner::Stop: queued requests fail, running ones get `grace`.
  void Stop(absl::Duration grace) { runner_.Stop(grace); }

  int queued() const { return runner_.queued(); }
  const serving::PrefixCache& prefix_cache() const { return runner_.prefix_cache(); }

 private:
  serving::Runner runner_;
};

}  // namespace moe::worker

#endif  // MOECACHE_SERVICES_MOE_WORKER_GENERATION_RUNNER_H_
