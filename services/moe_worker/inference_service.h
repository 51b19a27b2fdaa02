// moe.v1.Inference on the gRPC callback API: each Generate call becomes a
// ResponseSink submitted to the GenerationRunner; responses are written one
// at a time as the engine produces them (unwritten ones wait in memory,
// at most max_new_tokens of them).
//
// Thread-safe.
#ifndef MOECACHE_SERVICES_MOE_WORKER_INFERENCE_SERVICE_H_
#define MOECACHE_SERVICES_MOE_WORKER_INFERENCE_SERVICE_H_

#include "moe/v1/inference.grpc.pb.h"
#include "services/moe_worker/generation_runner.h"
#include "services/rpc/process_metrics.h"

namespace moe::worker {

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
};

}  // namespace moe::worker

#endif  // MOECACHE_SERVICES_MOE_WORKER_INFERENCE_SERVICE_H_
