#include "services/moe_worker/worker.h"

#include <malloc.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/base/call_once.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "kernels/cpu_threads.h"
#include "services/engine/in_memory_provider.h"
#include "services/engine/session.h"
#include "services/exchange/expert_exchange.h"
#include "services/moe_worker/daemon_provider.h"
#include "services/plan/plan.h"
#include "services/rpc/build_info.h"
#include "services/rpc/startup_log.h"

namespace moe::worker {

absl::StatusOr<std::unique_ptr<ExpertProvider>> MakeExpertProvider(
    const std::string& cache, const std::string& model_name,
    const MoeModel& model, const rpc::ClientSecurity& cache_security,
    bool device_host_experts, std::optional<DType> expert_format, int lease_part) {
  if (cache == "none") {
    ASSIGN_OR_RETURN(std::unique_ptr<InMemoryExpertProvider> p,
                     InMemoryExpertProvider::Create(model, expert_format));
    return std::unique_ptr<ExpertProvider>(std::move(p));
  }
  if (absl::StartsWith(cache, "unix:")) {
    client::CacheClientOptions o;
    o.address = cache;
    o.model = model_name;
    o.worker_id = absl::StrCat("moe-worker-", ::getpid());
    o.security = cache_security;
    o.host_execution = device_host_experts;  // a CPU backend sets it anyway
    absl::StatusOr<std::unique_ptr<DaemonExpertProvider>> p =
        DaemonExpertProvider::Connect(model, o);
    if (!p.ok()) {
      return absl::Status(p.status().code(),
                          absl::StrCat("--cache ", cache, " (model '",
                                       model_name, "'): ", p.status().message()));
    }
    (*p)->set_lease_part(lease_part);
    return std::unique_ptr<ExpertProvider>(*std::move(p));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("bad --cache '", cache, "': want none or unix:PATH"));
}

absl::StatusOr<rpc::HeldExperts> InProcessExperts(const ModelDescription& desc,
                                                  std::optional<DType> format) {
  ASSIGN_OR_RETURN(plan::ModelFigures m,
                   plan::ComputeFigures(desc.config(), plan::StoredFormatsFromWeights(desc),
                                        format));
  return rpc::HeldExperts{m.held_name, static_cast<uint64_t>(m.expert_bytes),
                          static_cast<uint64_t>(m.all_expert_bytes)};
}

absl::StatusOr<std::unique_ptr<Worker>> Worker::Start(
    const WorkerOptions& options) {
  std::unique_ptr<Worker> worker(new Worker(options));
  RETURN_IF_ERROR(worker->Init());
  return worker;
}

absl::Status Worker::Preflight(const std::vector<rpc::ListenAddress>& listen) {
  RETURN_IF_ERROR(CheckOptions(listen));
  if (!options_.metrics_addr.empty()) {
    ASSIGN_OR_RETURN(metrics_server_,
                     rpc::MetricsServer::Start(options_.metrics_addr,
                                               metrics_.exposed()));
  }
  return absl::OkStatus();
}

absl::Status Worker::CheckOptions(const std::vector<rpc::ListenAddress>& listen) const {
  if (options_.model_dir.empty()) {
    return absl::InvalidArgumentError("--model DIR is required");
  }
  const bool gguf = absl::EndsWith(options_.model_dir, ".gguf") &&
                    std::filesystem::is_regular_file(options_.model_dir);
  if (!gguf && !std::filesystem::is_directory(options_.model_dir)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--model ", options_.model_dir, ": not a directory (nor a .gguf file)"));
  }
  if (options_.runner.max_queue < 0 || options_.runner.max_prompt_tokens < 0) {
    return absl::InvalidArgumentError(
        "--max-queue and --max-prompt-tokens must be >= 0");
  }
  if (options_.runner.max_batch < 0 || options_.runner.max_batch > kMaxRequestsPerSession ||
      options_.runner.prefill_chunk < 0 || options_.runner.kv_budget_bytes < 0 ||
      options_.runner.kv_block_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-batch must be in [0 (auto), ", kMaxRequestsPerSession, "] (got ",
        options_.runner.max_batch,
        "); --prefill-chunk and --kv-budget-mb must be >= 0, --kv-block-tokens >= 1"));
  }
  if (options_.cache != "none" && options_.expert_format.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--expert-format is for a worker that holds the experts (--cache none); with --cache ",
        options_.cache, " moe-cached holds them: give it moe-cached"));
  }
  if (options_.cache != "none") {
    absl::StatusOr<rpc::ListenAddress> cache = rpc::ParseListenAddress(options_.cache);
    if (!cache.ok() || !cache->is_unix) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad --cache '", options_.cache, "': want none or unix:PATH"));
    }
    rpc::ClientSecurity cache_security;
    cache_security.auth_token_file = options_.cache_auth_token_file;
    if (absl::Status s = rpc::LoadClientCredentials(cache_security, true).status(); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("--cache-auth-token-file ",
                                                 options_.cache_auth_token_file, ": ",
                                                 s.message()));
    }
  }
  if (!options_.record_trace.empty()) {
    std::filesystem::path dir = std::filesystem::path(options_.record_trace).parent_path();
    if (dir.empty()) dir = ".";
    if (::access(dir.c_str(), W_OK | X_OK) != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--record-trace ", options_.record_trace, ": cannot write in ", dir.string(), ": ",
          std::strerror(errno)));
    }
  }
  rpc::ServerOptions server_options;
  server_options.listen = listen;
  server_options.security = options_.security;
  RETURN_IF_ERROR(rpc::CheckServerOptions(server_options));
  if (!options_.http.listen.empty()) {
    RETURN_IF_ERROR(CheckHttpOptions(options_.http, options_.security));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<rpc::ListenAddress>> Worker::ListenAddresses() const {
  std::vector<rpc::ListenAddress> listen;
  std::vector<std::string> addrs = options_.listen;
  if (addrs.empty()) addrs.push_back(kDefaultListen);
  for (const std::string& a : addrs) {
    absl::StatusOr<rpc::ListenAddress> parsed = rpc::ParseListenAddress(a);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--listen: ", parsed.status().message()));
    }
    listen.push_back(*parsed);
  }
  return listen;
}

namespace {

// glibc returns freed blocks above a (dynamic) 128 KiB-32 MiB threshold to
// the kernel, trims a heap's free top beyond 128 KiB, and gives each new
// thread an arena of its own, so each prompt's activation buffers (a few
// MiB) came back as fresh pages, faulted in on first touch, and the serving
// runner's thread did not inherit what the warm-up's thread had touched: the
// first request after a warm-up still took 1.3x the fourth (22-23 against
// 16-19 ms for 253 prompt tokens of the trained model). Blocks up to 256 MiB
// now come from the heap, up to 1 GiB of free heap stays mapped, and all
// threads share one arena (their small blocks still come from glibc's
// per-thread caches; 16 streams batched: 2455-2477 against 2256-2531 tok/s
// with the default arenas): the first request then takes 17.0-17.5 ms.
// Larger blocks (the KV cache) are still mapped apart and returned when
// freed.
void KeepFreedBuffersMapped() {
  static absl::once_flag once;
  absl::call_once(once, [] {
    mallopt(M_MMAP_THRESHOLD, 256 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
    mallopt(M_ARENA_MAX, 1);
  });
}

// Takes the warm-up request's end; its tokens are dropped.
class WarmUpSink : public ResponseSink {
 public:
  void Write(v1::GenerateResponse) override {}
  void Finish(const absl::Status& status) override {
    status_ = status;
    done_.Notify();
  }
  bool Cancelled() const override { return false; }
  absl::Status Wait() {
    done_.WaitForNotification();
    return status_;
  }

 private:
  absl::Notification done_;
  absl::Status status_;
};

}  // namespace

absl::Status Worker::Init() {
  KeepFreedBuffersMapped();
  ASSIGN_OR_RETURN(std::vector<rpc::ListenAddress> listen, ListenAddresses());
  RETURN_IF_ERROR(Preflight(listen));
  RETURN_IF_ERROR(LoadModel());
  const std::string cache_model =
      options_.cache_model.empty() ? ModelName() : options_.cache_model;
  rpc::ClientSecurity cache_security;
  cache_security.auth_token_file = options_.cache_auth_token_file;
  ASSIGN_OR_RETURN(provider_, WaitForCache(options_.cache, options_.cache_wait, [&] {
                     return MakeExpertProvider(options_.cache, cache_model, *model_,
                                               cache_security, options_.device_host_experts,
                                               options_.expert_format, options_.lease_part);
                   }));
  options_.runner = serving::ResolveAutoBatch(options_.runner, Session::KvCacheBytes(*model_, 1),
                                              model_->max_context());
  RunnerOptions runner_options = options_.runner;
  if (!options_.record_trace.empty()) {
    ASSIGN_OR_RETURN(recorder_,
                     TraceRecorder::Open(options_.record_trace,
                                         TraceHeaderFor(*model_, ModelName())));
    runner_options.recorder = recorder_.get();
  }
  metrics_.SetKvCacheCapacity(
      runner_options.kv_budget_bytes > 0
          ? runner_options.kv_budget_bytes
          : Session::KvCacheBytes(*model_, model_->max_context()) * runner_options.max_batch);
  RETURN_IF_ERROR(WarmUp(runner_options));
  runner_ = std::make_unique<GenerationRunner>(
      *model_, provider_.get(), tokenizer_.get(), &metrics_, runner_options);
  RETURN_IF_ERROR(runner_->Start());
  RETURN_IF_ERROR(StartServers(listen));
  server_->SetServing(true);
  serving_ = true;
  if (options_.cache != "none") {
    rpc::Server* server = server_.get();
    ASSIGN_OR_RETURN(cache_watch_,
                     CacheWatch::Start(options_.cache, cache_security, [this, server](bool up) {
                       server->SetServing(up);
                       serving_ = up;
                     }));
  }
  return absl::OkStatus();
}

absl::Status Worker::WarmUp(const RunnerOptions& shape) {
  const int64_t context = model_->max_context();
  int64_t cap = context - 1;
  if (shape.max_prompt_tokens > 0) cap = std::min<int64_t>(cap, shape.max_prompt_tokens);
  const int tokens = static_cast<int>(std::min<int64_t>(options_.warmup_tokens, cap));
  if (tokens <= 0) return absl::OkStatus();
  // Through moe-cached, the warm-up reads the experts from its host copy
  // without asking for them: the daemon counts no request and learns no
  // activation from it, but gets its host-run time (its cost model's).
  // Without a host copy (--miss-mode fetch, moe-cached's default) a CPU
  // worker reads them from its own mapping of the checkpoint.
  ExpertProvider* experts = provider_.get();
  std::unique_ptr<ExpertProvider> mapped;
  auto* daemon = dynamic_cast<DaemonExpertProvider*>(provider_.get());
  if (daemon != nullptr) {
    if (absl::Status s = daemon->SetHostOnly(true); !s.ok()) {
      daemon = nullptr;
      if (backend_->Info().is_device) {
        MOE_LOG(INFO) << "no warm-up: " << s.message();
        return absl::OkStatus();
      }
      ASSIGN_OR_RETURN(mapped, InMemoryExpertProvider::Create(*model_));
      experts = mapped.get();
    }
  }
  RunnerOptions o = shape;
  o.recorder = nullptr;
  o.prefix_cache_bytes = 0;
  o.log_requests = false;
  GenerationRunner warm(*model_, experts, nullptr, nullptr, o);
  RETURN_IF_ERROR(warm.Start());
  v1::GenerateRequest request;
  // Spread over the vocabulary, away from id 0 (often padding or <unk>).
  const int64_t vocab = model_->config().vocab_size;
  for (int i = 0; i < tokens; ++i) {
    request.add_prompt_token_ids(static_cast<int32_t>(1 + (int64_t{7919} * i) % (vocab - 1)));
  }
  request.set_max_new_tokens(1);
  request.set_ignore_eos(true);
  auto sink = std::make_shared<WarmUpSink>();
  const absl::Time start = absl::Now();
  absl::Status status = warm.Submit(request, absl::InfiniteFuture(), sink);
  if (status.ok()) status = sink->Wait();
  warm.Stop(absl::ZeroDuration());
  if (daemon != nullptr) daemon->SetHostOnly(false).IgnoreError();
  if (!status.ok()) {
    // Not the worker's end: client requests report what is wrong, if anything.
    MOE_LOG(WARNING) << "warm-up request of " << tokens << " tokens failed, serving without: "
                     << status;
    return absl::OkStatus();
  }
  MOE_LOG(INFO) << "warm-up: " << tokens << " prompt tokens in "
                << absl::FormatDuration(absl::Now() - start);
  return absl::OkStatus();
}

absl::Status Worker::LoadModel() {
  // Also the host-expert backend of a device worker (daemon_provider.cc).
  if (options_.cpu_threads > 0) SetCpuThreads(options_.cpu_threads);
  ASSIGN_OR_RETURN(backend_, CreateBackend(options_.backend));
  ASSIGN_OR_RETURN(model_, MoeModel::Load(options_.model_dir, backend_.get()));
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::ForModel(options_.model_dir);
  if (tokenizer.ok()) {
    tokenizer_ = *std::move(tokenizer);
  } else if (absl::IsNotFound(tokenizer.status())) {
    MOE_LOG(WARNING) << tokenizer.status().message() << ": only prompt_token_ids are accepted";
  } else {
    return tokenizer.status();
  }
  if (!options_.http.listen.empty()) {
    // A template this interpreter cannot render fails here, not later.
    bool fallback = false;
    std::string origin;
    ASSIGN_OR_RETURN(chat_template_, openai::ChatTemplate::Resolve(
                                         options_.chat_template, options_.model_dir, &fallback,
                                         &origin));
    if (fallback) {
      MOE_LOG(WARNING) << "no chat_template in " << options_.model_dir
                       << "/tokenizer_config.json: chat uses the built-in ChatML template, "
                          "which this model may not have been trained on (choose one with "
                          "--chat-template FILE|NAME)";
    } else {
      MOE_LOG(INFO) << "chat template: " << origin;
    }
  }
  return absl::OkStatus();
}

absl::Status Worker::StartServers(const std::vector<rpc::ListenAddress>& listen) {
  service_ = std::make_unique<InferenceService>(runner_.get(), metrics_.exposed().get());
  rpc::ServerOptions server_options;
  server_options.listen = listen;
  server_options.services.push_back(service_.get());
  server_options.service_names.push_back(v1::Inference::service_full_name());
  server_options.security = options_.security;
  ASSIGN_OR_RETURN(server_, rpc::Server::Start(server_options));
  if (!options_.http.listen.empty()) {
    openai::ModelInfo info{ModelName(), tokenizer_.get(), chat_template_.get(),
                           model_->config().max_position_embeddings, kMaxNewTokensLimit};
    HttpOptions http = options_.http;
    if (http.threads == 0) {
      http.threads = options_.runner.max_queue + options_.runner.max_batch + 3;
    }
    ASSIGN_OR_RETURN(http_, HttpServer::Start(http, options_.security, runner_.get(),
                                              std::move(info),
                                              [this] { return serving_.load(); }));
  }
  if (!options_.port_file.empty()) {
    RETURN_IF_ERROR(WriteFileAtomically(
        options_.port_file,
        absl::StrCat("{\"grpc_port\":", grpc_port(),
                     ",\"metrics_port\":", metrics_port(),
                     http_ != nullptr ? absl::StrCat(",\"http_port\":", http_port()) : "",
                     "}\n")));
  }
  return absl::OkStatus();
}

Worker::~Worker() { Stop(); }

void Worker::Stop() {
  if (stopped_) return;
  stopped_ = true;
  cache_watch_.reset();  // first: it must not turn health back to SERVING
  if (server_ != nullptr) server_->SetServing(false);
  serving_ = false;
  // The runner finishes every call it accepted, so the server's own
  // shutdown below has nothing left to wait for.
  // Each line only for what was started: a failed start reports its error
  // alone, not a shutdown that never began.
  if (runner_ != nullptr) {
    runner_->Stop(options_.shutdown_grace);
    MOE_LOG(INFO) << "requests drained";
  }
  if (http_ != nullptr) http_->Stop();
  if (server_ != nullptr) {
    server_->Shutdown(absl::Seconds(1));
    MOE_LOG(INFO) << "gRPC server stopped";
  }
  if (metrics_server_ != nullptr) {
    metrics_server_.reset();
    MOE_LOG(INFO) << "metrics server stopped";
  }
  if (recorder_ != nullptr) {
    if (absl::Status s = recorder_->Close(); !s.ok()) {
      MOE_LOG(WARNING) << "closing the trace: " << s;
    }
  }
}

std::string Worker::ModelName() const {
  std::string dir = options_.model_dir;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const size_t slash = dir.rfind('/');
  return slash == std::string::npos ? dir : dir.substr(slash + 1);
}

std::string Worker::StartupLine() const {
  std::string listen;
  std::vector<std::string> addrs = options_.listen;
  if (addrs.empty()) addrs.push_back(kDefaultListen);
  for (const std::string& a : addrs) {
    absl::StrAppend(&listen, listen.empty() ? "" : ", ", rpc::ShownAddress(a, grpc_port()));
  }
  const std::string metrics = metrics_server_ != nullptr
                                  ? rpc::ShownAddress(options_.metrics_addr, metrics_port())
                                  : "off";
  const ModelDescription& desc = model_->description();
  std::string experts;
  std::optional<rpc::HeldExperts> held;
  if (options_.cache == "none") {
    // Init held them so: the figures cannot fail here.
    if (absl::StatusOr<rpc::HeldExperts> h = InProcessExperts(desc, options_.expert_format);
        h.ok()) {
      held = *h;
    }
    experts = absl::StrFormat("in-process, %.2f GiB (--cache none)",
                              static_cast<double>(rpc::AllExpertBytes(desc, held ? &*held : nullptr)) /
                                  (1ull << 30));
  } else {
    experts = absl::StrCat("moe-cached at ", options_.cache, " (model '",
                           options_.cache_model.empty() ? ModelName() : options_.cache_model,
                           "')");
  }
  return absl::StrCat(VersionLine("moe-worker"), " serving model ", ModelName(), " (",
                      rpc::ModelSummary(desc, held ? &*held : nullptr), ") on ", listen,
                      ", backend ",
                      backend_->Info().name, ", metrics ", metrics, "; experts: ", experts);
}

int Worker::grpc_port() const {
  return server_ != nullptr ? server_->bound_port() : 0;
}

int Worker::http_port() const { return http_ != nullptr ? http_->port() : 0; }

int Worker::metrics_port() const {
  return metrics_server_ != nullptr ? metrics_server_->port() : 0;
}

}  // namespace moe::worker
