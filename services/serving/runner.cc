#include "services/serving/runner.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/threads.h"

namespace moe::serving {
namespace {

constexpr int64_t kNever = std::numeric_limits<int64_t>::max();

SchedulerOptions SchedulerOptionsFor(const RunnerOptions& o) {
  SchedulerOptions s;
  s.max_queue = o.max_queue;
  s.max_batch = o.max_batch;
  s.prefill_chunk = o.prefill_chunk;
  s.kv_budget_bytes = o.kv_budget_bytes;
  s.kv_block_tokens = o.kv_block_tokens;
  return s;
}

}  // namespace

RunnerOptions ResolveAutoBatch(RunnerOptions o, int64_t kv_bytes_per_token, int64_t max_context) {
  if (o.max_batch != 0) return o;
  if (o.kv_budget_bytes <= 0) o.kv_budget_bytes = kAutoKvBudgetBytes;
  const int64_t sequence =
      std::max<int64_t>(1, kv_bytes_per_token * std::min(max_context, kAutoSequenceTokens));
  o.max_batch = static_cast<int>(std::clamp<int64_t>(o.kv_budget_bytes / sequence, 1,
                                                     kAutoMaxBatch));
  return o;
}

struct Runner::Job : Sequence {
  absl::Time deadline;
  absl::Time submitted;
  std::shared_ptr<OutputSink> sink;
  std::vector<std::string> stop_strings;  // until the stream takes them
  std::optional<OutputStream> stream;     // from the start on
  std::optional<Sampler> sampler;         // batched
  std::optional<RequestRecording> recording;
  bool begun = false;  // batched: the provider's BeginRequest succeeded

  // Its routing observer for a new session: none while it recomputes
  // positions already recorded (the observer comes back after them).
  RoutingObserver Observer() {
    if (!recording.has_value() || !replay.empty()) return nullptr;
    return recording->Observer();
  }
};

Runner::Runner(const MoeModel& model, ExpertProvider* experts, const Tokenizer* tokenizer,
               ServingMetrics* metrics, RunnerOptions options)
    : model_(model),
      tokenizer_(tokenizer),
      metrics_(metrics),
      options_(options),
      scheduler_(model, SchedulerOptionsFor(options), metrics),
      executor_(model, experts, options.kv_block_tokens),
      prefix_cache_(options.recorder == nullptr ? options.prefix_cache_bytes : 0,
                    options.prefix_block_tokens),
      cancel_after_ns_(kNever) {}

Runner::~Runner() { Stop(absl::ZeroDuration()); }

absl::Status Runner::Start() {
  if (!scheduler_.Open()) return absl::FailedPreconditionError("runner already started");
  thread_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

absl::StatusOr<GenerateOptions> Runner::BuildOptions(Request& r) const {
  RETURN_IF_ERROR(EncodePrompt(&r, tokenizer_));
  RETURN_IF_ERROR(
      Validate(r, LimitsFor(model_, tokenizer_ != nullptr, options_.max_prompt_tokens)));
  GenerateOptions o = ToGenerateOptions(r);
  o.pregate_hints = options_.pregate_hints;
  o.pregate_distance = options_.pregate_distance;
  ASSIGN_OR_RETURN(std::shared_ptr<const JsonGrammar> grammar, GrammarFor(r));
  if (grammar != nullptr) {
    // Once the value is complete, the tokens the output stream stops at may
    // end it.
    o.sampling.constraint = JsonTokenConstraint(std::move(grammar), Vocabulary(),
                                                StopTokens(o, model_.config().eos_token_ids));
  }
  return o;
}

std::shared_ptr<const TokenVocabulary> Runner::Vocabulary() const {
  absl::call_once(vocabulary_once_, [this] {
    vocabulary_ = std::make_shared<const TokenVocabulary>(*tokenizer_);
  });
  return vocabulary_;
}

absl::Status Runner::Submit(Request request, absl::Time deadline,
                            std::shared_ptr<OutputSink> sink) {
  absl::StatusOr<GenerateOptions> options = BuildOptions(request);
  absl::Status status = options.status();
  if (status.ok()) {
    auto job = std::make_unique<Job>();
    job->options = *std::move(options);
    job->deadline = deadline;
    job->submitted = absl::Now();
    job->sink = std::move(sink);
    job->stop_strings = std::move(request.stop);
    status = scheduler_.Enqueue(std::move(job));
    if (status.ok()) return status;
  }
  Record(status, 0, 0, 0);
  return status;
}

void Runner::Stop(absl::Duration grace) {
  if (!stopping_.exchange(true)) cancel_after_ns_ = absl::ToUnixNanos(absl::Now() + grace);
  for (std::unique_ptr<Sequence>& seq : scheduler_.Close()) {
    absl::Status status = absl::UnavailableError("worker is shutting down");
    static_cast<Job&>(*seq).sink->Finish(status);
    Record(status, 0, 0, 0);
  }
  if (thread_.joinable()) thread_.join();
}

void Runner::Loop() {
  NameThisThread("moe-engine");
  if (options_.max_batch > 1) return BatchLoop();
  while (std::unique_ptr<Sequence> seq = scheduler_.TakeNext()) {
    Run(static_cast<Job&>(*seq));
    scheduler_.FinishTaken();
  }
}

void Runner::Run(Job& job) {
  absl::Status status = QueuedInterruption(job.sink->Cancelled(), job.deadline);
  const bool ran = status.ok();
  if (ran) {
    SetRunningMetrics(&job.options);
    status = RunGenerate(job);
    SetRunningMetrics(nullptr);
  }
  job.sink->Finish(status);
  Finished(job, status, ran ? executor_.experts().request() : ExpertCounters{});
}

absl::Status Runner::RunGenerate(Job& job) {
  const GenerateOptions& o = job.options;
  job.stream.emplace(o, model_.config().eos_token_ids, tokenizer_, std::move(job.stop_strings),
                     job.submitted);
  GenerateOptions run = o;
  // Holds the snapshot while Generate loads from it.
  const std::optional<PrefixCache::Hit> hit = prefix_cache_.Lookup(o.prompt);
  if (hit.has_value()) {
    run.prefix = hit->snapshot.get();
    run.prefix_positions = hit->positions;
    job.stream->set_cached_prompt_tokens(static_cast<int>(hit->positions));
  }
  absl::Status stop_reason;  // why we cancelled, when we did
  auto on_token = [&](const SampledToken& t) {
    job.Append(t.token);
    job.sink->Write(job.stream->Push(t, executor_.experts().request()));
    // The engine stops by itself after a stop token or the length; a stop
    // string is for us to stop on (no error).
    if (job.stream->matched_stop_string()) return false;
    stop_reason = Interrupted(job);
    return stop_reason.ok();
  };
  RoutingObserver observer;
  if (options_.recorder != nullptr) {
    job.recording.emplace(options_.recorder->header(), absl::StrCat("req-", o.request_id));
    observer = job.recording->Observer();
  }
  absl::StatusOr<GenerateSummary> summary = executor_.Generate(
      run, on_token, std::move(observer), [&](const Session& s) { KeepPrefix(job, s); });
  if (job.recording.has_value() && summary.ok() && job.recording->iterations() > 0) {
    if (absl::Status s = options_.recorder->Append(*job.recording); !s.ok()) {
      MOE_LOG(WARNING) << "trace not recorded: " << s;
    }
  }
  if (metrics_ != nullptr) {
    const ExpertCounters& c = executor_.experts().request();
    metrics_->AddExpertOutcome(c.hits, c.misses, c.wait_seconds, c.stall_seconds);
  }
  if (!summary.ok()) return summary.status();
  return stop_reason;
}

void Runner::BatchLoop() {
  while (true) {
    scheduler_.Admit([this](Sequence& seq, bool resumed) {
      return StartSequence(static_cast<Job&>(seq), resumed);
    });
    if (scheduler_.running().empty() && scheduler_.preempted().empty()) {
      if (!scheduler_.WaitForQueued()) return;  // stopping with nothing left
      continue;
    }
    // Leave before the step when the client went away, the deadline
    // passed or the shutdown grace is over (waiting preempted ones too).
    LeaveInterrupted();
    if (scheduler_.running().empty()) continue;
    Step();
  }
}

bool Runner::StartSequence(Job& job, bool resumed) {
  if (resumed) {
    (void)executor_.NewSession(job, job.Observer());  // accepted when it joined
    return true;
  }
  const GenerateOptions& o = job.options;
  if (absl::Status s = QueuedInterruption(job.sink->Cancelled(), job.deadline); !s.ok()) {
    Leave(job, s);
    return false;
  }
  job.stream.emplace(o, model_.config().eos_token_ids, tokenizer_, std::move(job.stop_strings),
                     job.submitted);
  job.sampler.emplace(o.sampling, o.prompt);
  if (options_.recorder != nullptr) {
    job.recording.emplace(options_.recorder->header(), absl::StrCat("req-", o.request_id));
  }
  absl::Status s = executor_.NewSession(job, job.Observer());
  if (s.ok()) s = executor_.experts().BeginRequest(o.request_id);
  if (!s.ok()) {
    Leave(job, s);
    return false;
  }
  job.begun = true;
  // A prefix cache hit: those positions are loaded, the rest of the prompt
  // runs (a preempted sequence recomputes all of its positions instead).
  if (std::optional<PrefixCache::Hit> hit = prefix_cache_.Lookup(o.prompt)) {
    if (absl::Status loaded = job.session->LoadKv(*hit->snapshot, hit->positions); loaded.ok()) {
      job.fed = static_cast<size_t>(hit->positions);
      job.position = hit->positions;
      job.stream->set_cached_prompt_tokens(static_cast<int>(hit->positions));
    } else {
      MOE_LOG(WARNING) << "prefix cache: not loaded: " << loaded;
    }
  }
  if (metrics_ != nullptr) metrics_->AddPromptTokens(static_cast<int64_t>(o.prompt.size()));
  return true;
}

void Runner::LeaveInterrupted() {
  std::vector<Sequence*> all;
  for (const auto& s : scheduler_.running()) all.push_back(s.get());
  for (const auto& s : scheduler_.preempted()) all.push_back(s.get());
  for (Sequence* seq : all) {
    Job& job = static_cast<Job&>(*seq);
    if (absl::Status s = Interrupted(job); !s.ok()) Leave(job, s);
  }
}

void Runner::Step() {
  const absl::Time start = absl::Now();
  const StepPlan plan = scheduler_.Plan();
  for (Sequence* seq : plan.preempted) {
    Job& job = static_cast<Job&>(*seq);
    // Still in its prompt: it runs it again, recorded afresh.
    if (job.output.empty() && job.recording.has_value()) {
      job.recording.emplace(options_.recorder->header(),
                            absl::StrCat("req-", job.options.request_id));
    }
  }
  for (const StepPlan::Entry& e : plan.entries) {
    Job& job = static_cast<Job&>(*e.sequence);
    if (e.prefill && job.fed > 0 && job.replay.empty() && job.recording.has_value()) {
      job.recording->ContinuePrefill();
    }
  }
  if (metrics_ != nullptr) metrics_->ObserveBatchStep(static_cast<int64_t>(plan.entries.size()));
  if (absl::Status status = executor_.Run(plan); !status.ok()) {
    // The step is shared: an engine or provider error fails every
    // sequence in it (none advanced).
    for (const StepPlan::Entry& e : plan.entries) Leave(static_cast<Job&>(*e.sequence), status);
    return;
  }
  // Sample every sequence first, then write the step's tokens in one burst
  // (a transport that hands writes to another thread wakes it once a step,
  // not once a sequence), then let the finished ones leave.
  sampled_.clear();
  for (size_t i = 0; i < plan.entries.size(); ++i) {
    Job& job = static_cast<Job&>(*plan.entries[i].sequence);
    switch (scheduler_.Advance(plan.entries[i])) {
      case StepOutcome::kPrefilling:
        break;
      case StepOutcome::kResumed:
        // From here on its routing is recorded again.
        if (job.recording.has_value()) job.session->set_routing_observer(job.recording->Observer());
        break;
      case StepOutcome::kSample: {
        const SampledToken t = job.sampler->Next(executor_.logits(i));
        job.Append(t.token);
        sampled_.emplace_back(&job, job.stream->Push(t, job.Counters()));
        break;
      }
    }
  }
  for (auto& [job, output] : sampled_) job->sink->Write(std::move(output));
  const bool decode_only =
      std::none_of(plan.entries.begin(), plan.entries.end(),
                   [](const StepPlan::Entry& e) { return e.prefill; });
  if (metrics_ != nullptr && decode_only) {
    metrics_->ObserveDecodeStep(static_cast<int64_t>(plan.entries.size()),
                                absl::ToDoubleSeconds(absl::Now() - start));
  }
  for (auto& [job, output] : sampled_) {
    if (job->stream->done()) Leave(*job, absl::OkStatus());
  }
}

void Runner::Leave(Job& job, absl::Status status) {
  const ExpertCounters c = job.Counters();
  if (status.ok() && job.session != nullptr) KeepPrefix(job, *job.session);
  if (job.begun) {
    absl::Status ended = executor_.experts().EndRequest(job.options.request_id);
    if (status.ok()) status = ended;
    if (job.recording.has_value() && job.recording->iterations() > 0 &&
        (status.ok() || !absl::IsUnavailable(status))) {
      if (absl::Status s = options_.recorder->Append(*job.recording); !s.ok()) {
        MOE_LOG(WARNING) << "trace not recorded: " << s;
      }
    }
    if (metrics_ != nullptr) {
      metrics_->AddExpertOutcome(c.hits, c.misses, c.wait_seconds, c.stall_seconds);
    }
  }
  Finished(job, status, c);
  // The gauges (running, KV) follow the removal at once, and the client
  // hears the end after them: a scrape after the last token sees it done.
  const std::shared_ptr<OutputSink> sink = job.sink;
  scheduler_.Remove(&job);  // the job is gone from here on
  sink->Finish(status);
}

void Runner::Finished(const Job& job, const absl::Status& status, const ExpertCounters& counters) {
  const bool streamed = job.stream.has_value();
  const int generated = streamed ? job.stream->generated() : 0;
  const double ttft = streamed ? job.stream->ttft_seconds() : 0;
  const double tpot = streamed ? job.stream->tpot_seconds() : 0;
  Record(status, generated, ttft, tpot);
  if (metrics_ != nullptr && streamed && job.stream->cached_prompt_tokens() > 0) {
    metrics_->AddCachedPromptTokens(job.stream->cached_prompt_tokens());
  }
  // One line per finished request, for operators (journalctl) and scripts.
  if (!options_.log_requests) return;
  const std::string finish = !status.ok()
                                 ? absl::AsciiStrToLower(absl::StatusCodeToString(status.code()))
                                 : (streamed ? job.stream->finish_reason() : "");
  MOE_LOG(INFO) << "request " << job.options.request_id
                << " finished: prompt_tokens=" << job.options.prompt.size()
                << " generated_tokens=" << generated
                << absl::StrFormat(" ttft_ms=%.1f tpot_ms=%.2f", ttft * 1e3, tpot * 1e3)
                << " expert_hits=" << counters.hits << " expert_misses=" << counters.misses
                << absl::StrFormat(" stall_ms=%.1f wait_ms=%.1f", counters.stall_seconds * 1e3,
                                   counters.wait_seconds * 1e3)
                << " cached_tokens=" << (streamed ? job.stream->cached_prompt_tokens() : 0)
                << " finish=" << finish
                << (status.ok() ? "" : absl::StrCat(" error=\"", status.message(), "\""));
}

absl::Status Runner::Interrupted(const Job& job) const {
  return Interruption(job.sink->Cancelled(), job.deadline,
                      absl::FromUnixNanos(cancel_after_ns_.load()));
}

void Runner::SetRunningMetrics(const GenerateOptions* running) {
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

void Runner::KeepPrefix(const Job& job, const Session& session) {
  if (!prefix_cache_.enabled()) return;
  std::vector<int32_t> ran = job.options.prompt;  // the prompt, then the output
  ran.insert(ran.end(), job.output.begin(), job.output.end());
  if (absl::Status s = prefix_cache_.Insert(ran, session); !s.ok()) {
    MOE_LOG(WARNING) << "prefix cache: not kept: " << s;
  }
}

void Runner::Record(const absl::Status& status, int generated, double ttft, double tpot) {
  if (metrics_ == nullptr) return;
  metrics_->RecordRequest(status);
  metrics_->AddTokens(generated);
  if (generated >= 1) metrics_->ObserveTtft(ttft);
  if (generated >= 2) metrics_->ObserveTpot(tpot);
}

}  // namespace moe::serving
