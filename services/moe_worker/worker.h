// moe-worker as one component: loads the model on a backend, builds the
// expert provider named by --cache, and serves moe.v1.Inference (with health
// and reflection) plus /metrics.
//
//   ASSIGN_OR_RETURN(auto worker, Worker::Start(options));  // SERVING
//   signals.Wait();
//   worker->Stop();  // NOT_SERVING, drain with options.shutdown_grace
//
// With --cache, health is NOT_SERVING while moe-cached is down (every
// Generate would fail UNAVAILABLE) and SERVING again once it serves; the
// next request then reattaches.
//
// Thread-compatible: Start and Stop from one thread (main).
#ifndef MOECACHE_SERVICES_MOE_WORKER_WORKER_H_
#define MOECACHE_SERVICES_MOE_WORKER_WORKER_H_

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/dtype.h"
#include "kernels/backend.h"
#include "services/engine/expert_provider.h"
#include "services/engine/moe_model.h"
#include "services/engine/tokenizer.h"
#include "services/engine/trace_recorder.h"
#include "services/moe_worker/cache_watch.h"
#include "services/moe_worker/generation_runner.h"
#include "services/moe_worker/http_server.h"
#include "services/moe_worker/inference_service.h"
#include "services/moe_worker/worker_metrics.h"
#include "services/rpc/metrics_server.h"
#include "services/openai/chat_template.h"
#include "services/rpc/rpc_util.h"
#include "services/rpc/startup_log.h"

namespace moe::worker {

inline constexpr char kDefaultListen[] = "unix:/tmp/moe-worker.sock";
inline constexpr char kDefaultMetricsAddr[] = "127.0.0.1:9465";

struct WorkerOptions {
  std::string model_dir;
  std::vector<std::string> listen;  // empty: kDefaultListen
  std::string backend = "auto";     // cpu, cuda or auto
  // Threads of its CPU backends (kernels/backend.h SetCpuThreads); 0: the
  // default, the CPUs this process may use.
  int cpu_threads = 0;
  std::string cache = "none";       // none or unix:PATH (moe-cached)
  // With cache "none": the format the worker holds the experts in
  // (InMemoryExpertProvider; nullopt: as moe-cached would, DefaultHeldFormat).
  // Set with a daemon: INVALID_ARGUMENT (the daemon's --expert-format).
  std::optional<DType> expert_format;
  // The model's name at moe-cached; "": the model directory's basename
  // (the daemon's default name too).
  std::string cache_model;
  // How long Start waits for moe-cached to serve (it may still be starting
  // or loading), retrying with a bounded backoff. Zero: one try.
  absl::Duration cache_wait = absl::Seconds(60);
  // Bearer token for moe-cached (--cache-auth-token-file); "" : none.
  std::string cache_auth_token_file;
  rpc::SecurityOptions security;  // this worker's server (see security.h)
  // The worker's defaults: RunnerOptions' but for a 1 GiB prefix cache and
  // auto batching (max_batch 0: serving::ResolveAutoBatch at start, from
  // the model's KV bytes per token and the KV budget).
  RunnerOptions runner = [] {
    RunnerOptions r;
    r.prefix_cache_bytes = int64_t{1} << 30;
    r.max_batch = 0;
    return r;
  }();
  // A device (CUDA) worker offers host execution to moe-cached: misses it is
  // answered "run on host" run on its CPU beside the GPU, rounding within
  // the backend parity tolerance (--device-host-experts). A CPU worker
  // always offers it (same kernel, same bits).
  bool device_host_experts = false;
  // With moe-cached: experts leased at once when a layer routes to more
  // (--lease-part; docs/architecture.md, "A layer in parts"); 0: whole
  // layers.
  int lease_part = 0;
  std::string metrics_addr = kDefaultMetricsAddr;  // "" disables
  std::string record_trace;                        // "" disables
  // When set, {"grpc_port":N,"metrics_port":M} is written here (atomically)
  // before health turns SERVING: how tests and scripts learn the ports of
  // HOST:0 addresses.
  std::string port_file;
  absl::Duration shutdown_grace = absl::Seconds(10);
  // Prompt tokens of the throwaway request run before serving (0: none):
  // the first client's prompt then finds the engine's buffers, the thread
  // pool and moe-cached's cost model as a second one would (Worker::WarmUp).
  int warmup_tokens = 256;
  // The OpenAI-compatible HTTP API (--http-listen); off when listen is "".
  HttpOptions http;
  // --chat-template: a built-in name or a file; "" = the model's, else
  // ChatML (openai::ChatTemplate::Resolve).
  std::string chat_template;
};

// The expert provider for `cache`: "none" keeps every expert in backend
// memory (held as `expert_format`); "unix:PATH" attaches to moe-cached
// there for its model `model_name` (DaemonExpertProvider). INVALID_ARGUMENT
// for anything else. `lease_part`: DaemonExpertProvider::set_lease_part.
absl::StatusOr<std::unique_ptr<ExpertProvider>> MakeExpertProvider(
    const std::string& cache, const std::string& model_name,
    const MoeModel& model, const rpc::ClientSecurity& cache_security = {},
    bool device_host_experts = false, std::optional<DType> expert_format = std::nullopt,
    int lease_part = 0);

// How a worker with --cache none holds the experts: `format`, else as
// moe-cached would by default (DefaultHeldFormat; a GGUF file's blocks as
// stored). INVALID_ARGUMENT when their rows are not whole blocks of `format`.
absl::StatusOr<rpc::HeldExperts> InProcessExperts(const ModelDescription& desc,
                                                  std::optional<DType> format);

class Worker {
 public:
  static absl::StatusOr<std::unique_ptr<Worker>> Start(
      const WorkerOptions& options);
  // --dry-run: every check Start makes before loading (flags, paths,
  // ports, permissions, the checkpoint's tensors, the backend, the
  // tokenizer and chat template), then the plan (what goes where, in
  // bytes) and the start line, as text. Loads no expert, binds nothing.
  static absl::StatusOr<std::string> DryRun(const WorkerOptions& options);
  ~Worker();

  // Health NOT_SERVING, refuse new requests, let the running one finish
  // within shutdown_grace (then cancel it), stop the server and /metrics.
  void Stop();

  // The one line logged when serving starts: version, model, family,
  // dtypes, backend, listen and metrics addresses, and where the experts
  // are ("experts: in-process, 1.25 GiB" or "experts: moe-cached at ...").
  std::string StartupLine() const;

  int grpc_port() const;     // first TCP listen address, 0 if none
  int metrics_port() const;  // 0 when metrics are disabled
  int http_port() const;     // 0 when --http-listen is off
  const MoeModel& model() const { return *model_; }

 private:
  explicit Worker(WorkerOptions options) : options_(std::move(options)) {}
  absl::Status Init();
  // Every flag, path, port and permission, before the model loads; starts
  // /metrics (so a port in use is reported at once).
  absl::Status Preflight(const std::vector<rpc::ListenAddress>& listen);
  // Preflight's checks alone: nothing started.
  absl::Status CheckOptions(const std::vector<rpc::ListenAddress>& listen) const;
  absl::StatusOr<std::vector<rpc::ListenAddress>> ListenAddresses() const;
  // Init's steps: the backend, model, tokenizer and chat template; then the
  // gRPC and HTTP servers (not yet serving) and the port file.
  absl::Status LoadModel();
  absl::Status StartServers(const std::vector<rpc::ListenAddress>& listen);
  // Runs one prompt of options_.warmup_tokens tokens (capped by the
  // context and --max-prompt-tokens) and one generated token through a runner shaped like `shape`
  // (no metrics, trace or prefix cache: no client sees it), then stops
  // that runner: the engine thread's allocations, the CPU thread pool and
  // the daemon's host-run cost model are warm for the first request (issue
  // 29: cold first prompts ran at 0.4-0.5x of the second). Through
  // moe-cached it reads the experts from the daemon's host copy unasked
  // (DaemonExpertProvider::SetHostOnly: the daemon's statistics and
  // activation matrices do not see it), else, on the CPU, from the worker's
  // mapping of the checkpoint; a CUDA worker without the daemon's host copy
  // skips it, with an INFO line. A warm-up that fails (e.g. a KV budget
  // too small for it) is logged as a warning; the worker serves anyway.
  absl::Status WarmUp(const RunnerOptions& shape);
  std::string ModelName() const;  // last component of the model directory

  WorkerOptions options_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<MoeModel> model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<ExpertProvider> provider_;
  std::unique_ptr<TraceRecorder> recorder_;
  WorkerMetrics metrics_;
  std::unique_ptr<GenerationRunner> runner_;
  std::unique_ptr<InferenceService> service_;
  std::unique_ptr<rpc::Server> server_;
  std::unique_ptr<rpc::MetricsServer> metrics_server_;
  // With --cache unix:PATH: the daemon's health, mirrored into ours.
  std::unique_ptr<CacheWatch> cache_watch_;
  // With --http-listen: the model's chat template (null: none) and the
  // server, on the same runner as gRPC.
  std::unique_ptr<openai::ChatTemplate> chat_template_;
  std::unique_ptr<HttpServer> http_;
  std::atomic<bool> serving_{false};  // what gRPC health says; for /health
  bool stopped_ = false;
};

}  // namespace moe::worker

#endif  // MOECACHE_SERVICES_MOE_WORKER_WORKER_H_
