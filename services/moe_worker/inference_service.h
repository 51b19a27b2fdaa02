// moe.v1.Inference on the gRPC callback API: each Generate call becomes a
// ResponseSink submitted to the GenerationRunner; responses are written one
// at a time as the engine produces them (unwritten ones wait in memory,
// at most max_new_tokens of them). The engine thread only queues them: a
// StreamStarter thread starts each stream's writes, and gRPC's own threads
// the writes that follow (OnWriteDone), so the engine never sends.
//
// Thread-safe.
#ifndef MOECACHE_SERVICES_MOE_WORKER_INFERENCE_SERVICE_H_
#define MOECACHE_SERVICES_MOE_WORKER_INFERENCE_SERVICE_H_

#include <deque>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "moe/v1/inference.grpc.pb.h"
#include "services/moe_worker/generation_runner.h"
#include "services/rpc/process_metrics.h"

namespace moe::worker {

class CallStream;  // inference_service.cc: one Generate call's stream

// One thread that starts gRPC writes and finishes for streams the engine
// queued (CallStream::Write and Finish hand it the stream when no write of
// it is in flight). Destroyed after the server: it starts whatever is still
// queued (every finish the runner asked for), then joins.
class StreamStarter {
 public:
  StreamStarter();
  ~StreamStarter();
  StreamStarter(const StreamStarter&) = delete;
  StreamStarter& operator=(const StreamStarter&) = delete;

  void Schedule(std::shared_ptr<CallStream> stream);

 private:
  void Loop();

  absl::Mutex mu_;
  std::deque<std::shared_ptr<CallStream>> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: started once the rest is built
};

class InferenceService final : public v1::Inference::CallbackService {
 public:
  // `runner` and `metrics` are not owned and must outlive the service's
  // server. `metrics` may be null (GetMetrics is then UNAVAILABLE).
  explicit InferenceService(GenerationRunner* runner,
                            const rpc::ProcessMetrics* metrics = nullptr)
      : runner_(runner), metrics_(metrics) {}

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context,
      const v1::GenerateRequest* request) override;

  grpc::ServerUnaryReactor* GetMetrics(grpc::CallbackServerContext* context,
                                       const v1::GetMetricsRequest* request,
                                       v1::GetMetricsResponse* response) override;

 private:
  GenerationRunner* runner_;
  const rpc::ProcessMetrics* metrics_;
  StreamStarter starter_;
};

}  // namespace moe::worker

#endif  // MOECACHE_SERVICES_MOE_WORKER_INFERENCE_SERVICE_H_
