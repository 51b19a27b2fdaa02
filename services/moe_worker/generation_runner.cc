#include "services/moe_worker/generation_runner.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "services/moe_worker/generate_responses.h"
#include "services/serving/request_proto.h"

namespace moe::worker {
namespace {

constexpr int64_t kNever = std::numeric_limits<int64_t>::max();

}  // namespace

GenerationRunner::GenerationRunner(const MoeModel& model,
                                   ExpertProvider* experts,
                                   const Tokenizer* tokenizer,
                                   WorkerMetrics* metrics,
                                   RunnerOptions options)
    : model_(model),
      experts_(experts),
      tokenizer_(tokenizer),
      metrics_(metrics),
      options_(options),
      cancel_after_ns_(kNever) {}

GenerationRunner::~GenerationRunner() { Stop(absl::ZeroDuration()); }

absl::Status GenerationRunner::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  if (accepting_ || stopping_) {
    return absl::FailedPreconditionError("runner already started");
  }
  accepting_ = true;
  thread_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

absl::StatusOr<GenerateOptions> GenerationRunner::BuildOptions(
    serving::Request& r) const {
  RETURN_IF_ERROR(serving::EncodePrompt(&r, tokenizer_));
  RETURN_IF_ERROR(serving::Validate(
      r, serving::LimitsFor(model_, tokenizer_ != nullptr, options_.max_prompt_tokens)));
  GenerateOptions o = serving::ToGenerateOptions(r);
  o.pregate_hints = options_.pregate_hints;
  o.pregate_distance = options_.pregate_distance;
  return o;
}

absl::Status GenerationRunner::Submit(const v1::GenerateRequest& request, absl::Time deadline,
                                      std::shared_ptr<ResponseSink> sink) {
  return Submit(serving::FromProto(request, serving::Transport::kGrpc), deadline,
                std::move(sink));
}

absl::Status GenerationRunner::Submit(serving::Request request, absl::Time deadline,
                                      std::shared_ptr<ResponseSink> sink) {
  absl::StatusOr<GenerateOptions> options = BuildOptions(request);
  std::vector<std::string> stop_strings = std::move(request.stop);
  absl::Status status = options.status();
  if (status.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!accepting_) {
      status = absl::UnavailableError("worker is not serving");
    } else if (static_cast<int>(queue_.size()) + (busy_ ? 1 : 0) + running_ >
               options_.max_queue + std::max(options_.max_batch, 1) - 1) {
      status = absl::ResourceExhaustedError(absl::StrCat(
          "request queue full (", options_.max_queue,
          " waiting); retry later"));
    } else if (const int64_t kv = Session::KvCacheBytes(
                   model_, static_cast<int64_t>(options->prompt.size()) +
                               options->max_new_tokens);
               options_.max_batch > 1 && options_.kv_budget_bytes > 0 &&
               kv > options_.kv_budget_bytes) {
      status = absl::ResourceExhaustedError(absl::StrCat(
          "this request's KV cache (", kv, " bytes for ",
          options->prompt.size(), " prompt + ", options->max_new_tokens,
          " new tokens) exceeds the worker's --kv-budget-mb (",
          options_.kv_budget_bytes, " bytes); lower max_new_tokens or the prompt"));
    } else {
      options->request_id = next_request_id_++;
      queue_.push_back(
          Job{*std::move(options), deadline, absl::Now(), std::move(sink),
              std::move(stop_strings)});
      if (metrics_ != nullptr) metrics_->SetQueueDepth(queue_.size());
      cv_.notify_all();
      return absl::OkStatus();
    }
  }
  Record(status, 0, 0, 0);
  return status;
}

void GenerationRunner::Stop(absl::Duration grace) {
  std::deque<Job> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    accepting_ = false;
    if (!stopping_) {
      stopping_ = true;
      cancel_after_ns_ = absl::ToUnixNanos(absl::Now() + grace);
    }
    dropped.swap(queue_);
    if (metrics_ != nullptr) metrics_->SetQueueDepth(0);
    cv_.notify_all();
  }
  for (Job& job : dropped) {
    absl::Status status = absl::UnavailableError("worker is shutting down");
    job.sink->Finish(status);
    Record(status, 0, 0, 0);
  }
  if (thread_.joinable()) thread_.join();
}

int GenerationRunner::queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(queue_.size());
}

void GenerationRunner::Loop() {
  if (options_.max_batch > 1) return BatchLoop();
  while (true) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping with nothing left
      job = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      if (metrics_ != nullptr) metrics_->SetQueueDepth(queue_.size());
    }
    Run(job);
    std::lock_guard<std::mutex> lock(mu_);
    busy_ = false;
  }
}

void GenerationRunner::Run(Job& job) {
  int generated = 0;
  double ttft = 0, tpot = 0;
  std::string finish;
  bool ran = false;
  absl::Status status;
  status = serving::QueuedInterruption(job.sink->Cancelled(), job.deadline);
  if (status.ok()) {
    ran = true;
    SetRunningMetrics(&job.options);
    status = RunGenerate(job, &generated, &ttft, &tpot, &finish);
    SetRunningMetrics(nullptr);
  }
  job.sink->Finish(status);
  Record(status, generated, ttft, tpot);
  LogFinished(job, status, generated, ttft, tpot,
              ran ? experts_.request() : ExpertCounters{}, finish);
}

void GenerationRunner::LogFinished(const Job& job, const absl::Status& status,
                                   int generated, double ttft, double tpot,
                                   const ExpertCounters& counters,
                                   std::string finish) {
  // One line per finished request, for operators (journalctl) and scripts.
  if (!status.ok()) finish = absl::AsciiStrToLower(absl::StatusCodeToString(status.code()));
  MOE_LOG(INFO) << "request " << job.options.request_id
                << " finished: prompt_tokens=" << job.options.prompt.size()
                << " generated_tokens=" << generated
                << absl::StrFormat(" ttft_ms=%.1f tpot_ms=%.2f", ttft * 1e3, tpot * 1e3)
                << " expert_hits=" << counters.hits << " expert_misses=" << counters.misses
                << absl::StrFormat(" stall_ms=%.1f", counters.stall_seconds * 1e3)
                << " finish=" << finish
                << (status.ok() ? "" : absl::StrCat(" error=\"", status.message(), "\""));
}

absl::Status GenerationRunner::RunGenerate(Job& job, int* generated,
                                           double* ttft, double* tpot,
                                           std::string* finish) {
  const GenerateOptions& o = job.options;
  serving::OutputStream stream(o, model_.config().eos_token_ids, tokenizer_,
                               std::move(job.stop_strings), job.submitted);
  absl::Status stop_reason;  // why we cancelled, when we did
  auto on_token = [&](const SampledToken& t) {
    job.sink->Write(ToResponse(stream.Push(t, experts_.request())));
    *generated = stream.generated();
    *ttft = stream.ttft_seconds();
    *tpot = stream.tpot_seconds();
    *finish = stream.finish_reason();
    // The engine stops by itself after a stop token or the length; a stop
    // string is for us to stop on (no error).
    if (stream.matched_stop_string()) return false;
    stop_reason = Interrupted(job);
    return stop_reason.ok();
  };
  std::optional<RequestRecording> recording;
  RoutingObserver observer;
  if (options_.recorder != nullptr) {
    recording.emplace(options_.recorder->header(),
                      absl::StrCat("req-", o.request_id));
    observer = recording->Observer();
  }
  absl::StatusOr<GenerateSummary> summary =
      Generate(model_, &experts_, o, on_token, std::move(observer));
  if (recording.has_value() && summary.ok() && recording->iterations() > 0) {
    if (absl::Status s = options_.recorder->Append(*recording); !s.ok()) {
      MOE_LOG(WARNING) << "trace not recorded: " << s;
    }
  }
  if (metrics_ != nullptr) {
    const ExpertCounters& c = experts_.request();
    metrics_->AddExpertOutcome(c.hits, c.misses, c.wait_seconds,
                               c.stall_seconds);
  }
  if (!summary.ok()) return summary.status();
  if (!stop_reason.ok()) return stop_reason;
  return absl::OkStatus();
}

absl::Status GenerationRunner::Interrupted(const Job& job) const {
  return serving::Interruption(job.sink->Cancelled(), job.deadline,
                               absl::FromUnixNanos(cancel_after_ns_.load()));
}

void GenerationRunner::SetRunningMetrics(const GenerateOptions* running) {
  if (metrics_ == nullptr) return;
  metrics_->SetRunning(running != nullptr ? 1 : 0);
  if (running == nullptr) {
    metrics_->SetKvCacheBytes(0);
    return;
  }
  const int64_t prompt = static_cast<int64_t>(running->prompt.size());
  metrics_->AddPromptTokens(prompt);
  // The session Generate makes holds prompt + max_new_tokens positions.
  metrics_->SetKvCacheBytes(Session::KvCacheBytes(model_, prompt + running->max_new_tokens));
}

void GenerationRunner::Record(const absl::Status& status, int generated,
                              double ttft, double tpot) {
  if (metrics_ == nullptr) return;
  metrics_->RecordRequest(status);
  metrics_->AddTokens(generated);
  if (generated >= 1) metrics_->ObserveTtft(ttft);
  if (generated >= 2) metrics_->ObserveTpot(tpot);
}

}  // namespace moe::worker
