// GenerationRunner's continuous-batching loop (max_batch > 1): admission
// from the queue, one BatchStep per iteration over every running sequence,
// sampling and streaming per sequence, and leaving.
#include <algorithm>
#include <chrono>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "services/engine/batch_step.h"
#include "services/moe_worker/generate_responses.h"
#include "services/moe_worker/generation_runner.h"
#include "services/moe_worker/stop_strings.h"

namespace moe::worker {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

struct GenerationRunner::Active {
  Job job;
  std::unique_ptr<Session> session;
  std::optional<Sampler> sampler;
  std::vector<int32_t> stops;
  std::unique_ptr<StreamDecoder> decoder;
  std::optional<StopStringMatcher> stop_strings;
  std::optional<RequestRecording> recording;
  int64_t kv_bytes = 0;
  size_t fed = 0;    // prompt tokens run so far
  int32_t last = 0;  // the token the next decode step runs
  int generated = 0;
  double ttft = 0, tpot = 0;
  std::string finish;
  Clock::time_point start, first;
  bool begun = false;  // the provider's BeginRequest succeeded
};

absl::Status GenerationRunner::Interrupted(const Job& job) const {
  if (job.sink->Cancelled())
    return absl::CancelledError("cancelled by the client");
  if (absl::Now() >= job.deadline)
    return absl::DeadlineExceededError("deadline exceeded");
  if (absl::ToUnixNanos(absl::Now()) >= cancel_after_ns_.load()) {
    return absl::UnavailableError("worker is shutting down; request cancelled");
  }
  return absl::OkStatus();
}

void GenerationRunner::Admit(std::vector<std::unique_ptr<Active>>& active) {
  std::vector<std::unique_ptr<Active>> joined;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // First come, first served: the head waits for room rather than being
    // overtaken by smaller requests (no starvation).
    while (!queue_.empty() && static_cast<int>(active.size() + joined.size()) <
                                  options_.max_batch) {
      const Job& head = queue_.front();
      const int64_t kv = Session::KvCacheBytes(
          model_, static_cast<int64_t>(head.options.prompt.size()) +
                      head.options.max_new_tokens);
      if (options_.kv_budget_bytes > 0 &&
          kv_held_ + kv > options_.kv_budget_bytes &&
          !(active.empty() && joined.empty())) {
        break;  // waits until running sequences free their caches
      }
      auto a = std::make_unique<Active>();
      a->job = std::move(queue_.front());
      queue_.pop_front();
      a->kv_bytes = kv;
      kv_held_ += kv;
      ++running_;
      joined.push_back(std::move(a));
    }
    if (metrics_ != nullptr) metrics_->SetQueueDepth(queue_.size());
  }
  for (std::unique_ptr<Active>& a : joined) {
    if (Join(*a)) active.push_back(std::move(a));
  }
  if (metrics_ != nullptr) {
    int64_t kv = 0;
    for (const auto& a : active) kv += a->kv_bytes;
    metrics_->SetRunning(static_cast<int64_t>(active.size()));
    metrics_->SetKvCacheBytes(kv);
  }
}

bool GenerationRunner::Join(Active& a) {
  const GenerateOptions& o = a.job.options;
  if (a.job.sink->Cancelled()) {
    Leave(a, absl::CancelledError("cancelled by the client while queued"));
    return false;
  }
  if (absl::Now() >= a.job.deadline) {
    Leave(a, absl::DeadlineExceededError("deadline passed while queued"));
    return false;
  }
  a.start =
      Clock::now() - absl::ToChronoNanoseconds(absl::Now() - a.job.submitted);
  a.stops = o.stop_token_ids;
  if (o.stop_at_eos) {
    for (int64_t id : model_.config().eos_token_ids)
      a.stops.push_back(static_cast<int32_t>(id));
  }
  if (tokenizer_ != nullptr) {
    a.decoder =
        std::make_unique<StreamDecoder>(*tokenizer_, /*skip_special=*/true);
  }
  a.stop_strings.emplace(a.job.stop_strings);
  a.sampler.emplace(o.sampling);
  a.session = std::make_unique<Session>(
      model_, &experts_,
      static_cast<int64_t>(o.prompt.size()) + o.max_new_tokens);
  a.session->set_pregate_hints(o.pregate_hints);
  absl::Status s = a.session->set_pregate_distance(o.pregate_distance);
  if (options_.recorder != nullptr) {
    a.recording.emplace(options_.recorder->header(),
                        absl::StrCat("req-", o.request_id));
    a.session->set_routing_observer(a.recording->Observer());
  }
  if (s.ok()) s = experts_.BeginRequest(o.request_id);
  if (!s.ok()) {
    Leave(a, s);
    return false;
  }
  a.begun = true;
  if (metrics_ != nullptr)
    metrics_->AddPromptTokens(static_cast<int64_t>(o.prompt.size()));
  return true;
}

bool GenerationRunner::Emit(Active& a, const SampledToken& t) {
  const GenerateOptions& o = a.job.options;
  const Clock::time_point now = Clock::now();
  if (a.generated == 0) a.first = now;
  ++a.generated;
  a.ttft = Seconds(a.first - a.start);
  if (a.generated > 1) a.tpot = Seconds(now - a.first) / (a.generated - 1);
  v1::GenerateResponse r = TokenResponse(t);
  const bool stop_token =
      std::find(a.stops.begin(), a.stops.end(), t.token) != a.stops.end();
  bool last = stop_token || a.generated == o.max_new_tokens;
  if (a.decoder != nullptr) {
    std::string text = a.decoder->Push(t.token);
    if (last) text += a.decoder->Flush();
    if (!a.job.stop_strings.empty()) {
      text = a.stop_strings->Push(text);
      if (a.stop_strings->matched()) {
        last = true;
      } else if (last) {
        text += a.stop_strings->Flush();
      }
    }
    r.set_text(std::move(text));
  }
  if (last) {
    a.finish = stop_token || a.stop_strings->matched() ? "stop" : "length";
    r.set_finish_reason(a.finish);
    const SessionStats& st = a.session->stats();
    ExpertCounters c{st.expert_hits, st.expert_misses, st.expert_stall_seconds,
                     st.expert_wait_seconds};
    FillUsage(static_cast<int>(o.prompt.size()), a.generated, a.ttft, a.tpot, c,
              r.mutable_usage());
  }
  a.job.sink->Write(std::move(r));
  a.last = t.token;
  return !last;
}

void GenerationRunner::Leave(Active& a, absl::Status status) {
  const GenerateOptions& o = a.job.options;
  ExpertCounters c;
  if (a.session != nullptr) {
    const SessionStats& st = a.session->stats();
    c = {st.expert_hits, st.expert_misses, st.expert_stall_seconds,
         st.expert_wait_seconds};
  }
  if (a.begun) {
    absl::Status ended = experts_.EndRequest(o.request_id);
    if (status.ok()) status = ended;
    if (a.recording.has_value() && a.recording->iterations() > 0 &&
        (status.ok() || !absl::IsUnavailable(status))) {
      if (absl::Status s = options_.recorder->Append(*a.recording); !s.ok()) {
        MOE_LOG(WARNING) << "trace not recorded: " << s;
      }
    }
    if (metrics_ != nullptr) {
      metrics_->AddExpertOutcome(c.hits, c.misses, c.wait_seconds,
                                 c.stall_seconds);
    }
  }
  a.job.sink->Finish(status);
  Record(status, a.generated, a.ttft, a.tpot);
  LogFinished(a.job, status, a.generated, a.ttft, a.tpot, c, a.finish);
  std::lock_guard<std::mutex> lock(mu_);
  kv_held_ -= a.kv_bytes;
  --running_;
  cv_.notify_all();
}

void GenerationRunner::BatchLoop() {
  std::vector<std::unique_ptr<Active>> active;
  BatchStep step(model_, &experts_);
  const int chunk = options_.prefill_chunk;
  while (true) {
    Admit(active);
    if (active.empty()) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping with nothing left
      continue;
    }
    // Leave before the step when the client went away, the deadline
    // passed or the shutdown grace is over.
    for (auto& a : active) {
      if (absl::Status s = Interrupted(a->job); !s.ok()) {
        Leave(*a, s);
        a.reset();
      }
    }
    active.erase(std::remove(active.begin(), active.end(), nullptr),
                 active.end());
    if (active.empty()) continue;
    std::vector<BatchStep::Entry> entries;
    for (auto& a : active) {
      const std::vector<int32_t>& prompt = a->job.options.prompt;
      BatchStep::Entry e;
      e.session = a->session.get();
      e.request = a->job.options.request_id;
      if (a->fed < prompt.size()) {
        size_t take = prompt.size() - a->fed;
        if (chunk > 0) take = std::min<size_t>(take, chunk);
        e.tokens = absl::Span<const int32_t>(prompt.data() + a->fed, take);
        e.prefill = true;
        if (a->fed > 0 && a->recording.has_value())
          a->recording->ContinuePrefill();
      } else {
        e.tokens = absl::Span<const int32_t>(&a->last, 1);
      }
      entries.push_back(e);
    }
    if (metrics_ != nullptr)
      metrics_->ObserveBatchStep(static_cast<int64_t>(entries.size()));
    absl::Status status = step.Run(entries);
    if (!status.ok()) {
      // The step is shared: an engine or provider error fails every
      // sequence in it (none advanced).
      for (auto& a : active) Leave(*a, status);
      active.clear();
      continue;
    }
    for (size_t i = 0; i < active.size(); ++i) {
      Active& a = *active[i];
      if (entries[i].prefill) {
        a.fed += entries[i].tokens.size();
        if (a.fed < a.job.options.prompt.size())
          continue;  // more prompt to run
      }
      if (!Emit(a, a.sampler->Next(step.logits(i)))) {
        Leave(a, absl::OkStatus());
        active[i].reset();
      }
    }
    active.erase(std::remove(active.begin(), active.end(), nullptr),
                 active.end());
  }
}

}  // namespace moe::worker
