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

namespace moe::worker {
namespace {

}  // namespace

struct GenerationRunner::Active {
  Job job;
  std::unique_ptr<Session> session;
  std::optional<Sampler> sampler;
  std::optional<serving::OutputStream> stream;  // from Join on
  std::optional<RequestRecording> recording;
  int64_t kv_bytes = 0;  // KV cache bytes accounted to it in kv_held_
  size_t fed = 0;    // tokens of Feed() run so far
  int32_t last = 0;  // the token the next decode step runs
  uint64_t order = 0;            // admission order: preemption takes the youngest
  std::vector<int32_t> output;   // the tokens sent so far
  // A resumed sequence's positions to recompute (prompt + output but the
  // last, which the next decode step runs); empty otherwise.
  std::vector<int32_t> replay;
  ExpertCounters carried;  // expert usage of the sessions it gave up

  int generated() const { return static_cast<int>(output.size()); }
  // Positions its session may hold: prompt + max_new_tokens.
  int64_t Limit() const {
    return static_cast<int64_t>(job.options.prompt.size()) + job.options.max_new_tokens;
  }
  const std::vector<int32_t>& Feed() const {
    return replay.empty() ? job.options.prompt : replay;
  }
  ExpertCounters Counters() const {
    ExpertCounters c = carried;
    if (session != nullptr) {
      const SessionStats& st = session->stats();
      c.hits += st.expert_hits;
      c.misses += st.expert_misses;
      c.stall_seconds += st.expert_stall_seconds;
      c.wait_seconds += st.expert_wait_seconds;
    }
    return c;
  }
  bool begun = false;  // the provider's BeginRequest succeeded
};

void GenerationRunner::Admit(std::vector<std::unique_ptr<Active>>& active,
                             std::deque<std::unique_ptr<Active>>& preempted) {
  const bool budget = options_.kv_budget_bytes > 0;
  // A joining sequence reserves its first step's blocks (all its prompt,
  // or its recomputed positions, plus the first token).
  auto first_blocks = [&](int64_t tokens, int64_t limit) {
    return Session::KvBlockBytes(model_, tokens + 1, options_.kv_block_tokens,
                                 std::min(limit, model_.max_context()));
  };
  std::vector<std::unique_ptr<Active>> joined;
  std::vector<std::unique_ptr<Active>> resumed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    int64_t wanted = 0;  // the joining ones' first blocks
    // Headroom: a block of growth for every sequence that would then run,
    // so that a join does not preempt someone at the next block boundary.
    const int64_t block_bytes =
        Session::KvCacheBytes(model_, std::max(0, options_.kv_block_tokens));
    auto room = [&](int64_t kv) {
      const int64_t running =
          static_cast<int64_t>(active.size() + joined.size() + resumed.size()) + 1;
      const int64_t headroom = running * block_bytes;
      return !budget || kv_held_ + wanted + kv + headroom <= options_.kv_budget_bytes ||
             (active.empty() && joined.empty() && resumed.empty());
    };
    // Preempted sequences are older than anything queued: they go first,
    // and nothing queued overtakes them.
    while (!preempted.empty() &&
           static_cast<int>(active.size() + resumed.size()) < options_.max_batch) {
      Active& p = *preempted.front();
      const int64_t kv = first_blocks(static_cast<int64_t>(p.Feed().size()), p.Limit());
      if (!room(kv)) break;
      wanted += kv;
      resumed.push_back(std::move(preempted.front()));
      preempted.pop_front();
    }
    // First come, first served: the head waits for room rather than being
    // overtaken by smaller requests (no starvation).
    while (preempted.empty() && !queue_.empty() &&
           static_cast<int>(active.size() + resumed.size() + joined.size()) <
               options_.max_batch) {
      const Job& head = queue_.front();
      const int64_t prompt = static_cast<int64_t>(head.options.prompt.size());
      const int64_t kv = first_blocks(prompt, prompt + head.options.max_new_tokens);
      if (!room(kv)) break;  // waits until running sequences free their caches
      wanted += kv;
      auto a = std::make_unique<Active>();
      a->job = std::move(queue_.front());
      queue_.pop_front();
      a->order = next_order_++;
      ++running_;
      joined.push_back(std::move(a));
    }
    if (metrics_ != nullptr) metrics_->SetQueueDepth(queue_.size());
  }
  for (std::unique_ptr<Active>& a : resumed) {
    (void)NewSession(*a);  // its settings were accepted when it joined
    active.push_back(std::move(a));
  }
  for (std::unique_ptr<Active>& a : joined) {
    if (Join(*a)) active.push_back(std::move(a));
  }
  // Admission order (oldest first), so the youngest is last.
  std::stable_sort(active.begin(), active.end(),
                   [](const std::unique_ptr<Active>& x, const std::unique_ptr<Active>& y) {
                     return x->order < y->order;
                   });
  if (metrics_ != nullptr) {
    metrics_->SetRunning(static_cast<int64_t>(active.size()));
  }
}

absl::Status GenerationRunner::NewSession(Active& a) {
  const GenerateOptions& o = a.job.options;
  a.session = std::make_unique<Session>(
      model_, &experts_,
      static_cast<int64_t>(o.prompt.size()) + o.max_new_tokens);
  // A fresh session has run nothing: the block size is accepted.
  (void)a.session->set_kv_block_tokens(std::max(0, options_.kv_block_tokens));
  a.session->set_pregate_hints(o.pregate_hints);
  // A resumed sequence's recomputed positions were recorded the first time:
  // its observer comes back after them (BatchLoop).
  if (a.recording.has_value() && a.replay.empty()) {
    a.session->set_routing_observer(a.recording->Observer());
  }
  return a.session->set_pregate_distance(o.pregate_distance);
}

absl::Span<const int32_t> GenerationRunner::NextTokens(Active& a, bool* prefill) const {
  const std::vector<int32_t>& feed = a.Feed();
  if (a.fed < feed.size()) {
    size_t take = feed.size() - a.fed;
    if (options_.prefill_chunk > 0) take = std::min<size_t>(take, options_.prefill_chunk);
    *prefill = true;
    return absl::Span<const int32_t>(feed.data() + a.fed, take);
  }
  *prefill = false;
  return absl::Span<const int32_t>(&a.last, 1);
}

void GenerationRunner::FitKv(std::vector<std::unique_ptr<Active>>& active,
                             std::deque<std::unique_ptr<Active>>& preempted) {
  // What each sequence holds after the next step.
  auto after = [&](Active& a) {
    bool prefill = false;
    const int64_t t = static_cast<int64_t>(NextTokens(a, &prefill).size());
    return std::max(a.kv_bytes, a.session->KvBytesAfter(t));
  };
  std::lock_guard<std::mutex> lock(mu_);
  while (true) {
    int64_t growth = 0;
    for (auto& a : active) growth += after(*a) - a->kv_bytes;
    if (options_.kv_budget_bytes <= 0 || active.size() <= 1 ||
        kv_held_ + growth <= options_.kv_budget_bytes) {
      for (auto& a : active) {
        const int64_t kv = after(*a);
        kv_held_ += kv - a->kv_bytes;
        a->kv_bytes = kv;
      }
      break;
    }
    // The youngest gives its blocks up and waits at the head, to recompute
    // its positions when there is room again (tokens unchanged: the same
    // kernels over the same rows).
    std::unique_ptr<Active> y = std::move(active.back());
    active.pop_back();
    y->carried = y->Counters();
    y->session.reset();
    kv_held_ -= y->kv_bytes;
    y->kv_bytes = 0;
    if (!y->output.empty()) {
      y->replay = y->job.options.prompt;
      y->replay.insert(y->replay.end(), y->output.begin(), y->output.end() - 1);
    } else {
      // Still in its prompt: it runs it again, recorded afresh.
      y->replay.clear();
      if (y->recording.has_value()) {
        y->recording.emplace(options_.recorder->header(),
                             absl::StrCat("req-", y->job.options.request_id));
      }
    }
    y->fed = 0;
    if (metrics_ != nullptr) metrics_->AddKvPreemption();
    // Oldest first at the head (the youngest was taken first).
    preempted.push_front(std::move(y));
  }
  if (metrics_ != nullptr) metrics_->SetKvCacheBytes(kv_held_);
}

bool GenerationRunner::Join(Active& a) {
  const GenerateOptions& o = a.job.options;
  if (absl::Status s = serving::QueuedInterruption(a.job.sink->Cancelled(), a.job.deadline);
      !s.ok()) {
    Leave(a, s);
    return false;
  }
  a.stream.emplace(o, model_.config().eos_token_ids, tokenizer_, std::move(a.job.stop_strings),
                   a.job.submitted);
  a.sampler.emplace(o.sampling);
  if (options_.recorder != nullptr) {
    a.recording.emplace(options_.recorder->header(),
                        absl::StrCat("req-", o.request_id));
  }
  absl::Status s = NewSession(a);
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
  a.output.push_back(t.token);
  a.job.sink->Write(ToResponse(a.stream->Push(t, a.Counters())));
  a.last = t.token;
  return !a.stream->done();
}

void GenerationRunner::Leave(Active& a, absl::Status status) {
  const GenerateOptions& o = a.job.options;
  const ExpertCounters c = a.Counters();
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
  const double ttft = a.stream.has_value() ? a.stream->ttft_seconds() : 0;
  const double tpot = a.stream.has_value() ? a.stream->tpot_seconds() : 0;
  const std::string finish = a.stream.has_value() ? a.stream->finish_reason() : "";
  Record(status, a.generated(), ttft, tpot);
  LogFinished(a.job, status, a.generated(), ttft, tpot, c, finish);
  std::lock_guard<std::mutex> lock(mu_);
  kv_held_ -= a.kv_bytes;
  --running_;
  cv_.notify_all();
}

void GenerationRunner::BatchLoop() {
  std::vector<std::unique_ptr<Active>> active;
  // Sequences that gave their KV blocks up (FitKv), oldest first.
  std::deque<std::unique_ptr<Active>> preempted;
  BatchStep step(model_, &experts_);
  while (true) {
    Admit(active, preempted);
    if (active.empty() && preempted.empty()) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping with nothing left
      continue;
    }
    // Leave before the step when the client went away, the deadline
    // passed or the shutdown grace is over (waiting preempted ones too).
    auto leave_interrupted = [this](auto& sequences) {
      for (auto& a : sequences) {
        if (absl::Status s = Interrupted(a->job); !s.ok()) {
          Leave(*a, s);
          a.reset();
        }
      }
      sequences.erase(std::remove(sequences.begin(), sequences.end(), nullptr),
                      sequences.end());
    };
    leave_interrupted(active);
    leave_interrupted(preempted);
    if (active.empty()) continue;
    FitKv(active, preempted);
    std::vector<BatchStep::Entry> entries;
    for (auto& a : active) {
      BatchStep::Entry e;
      e.session = a->session.get();
      e.request = a->job.options.request_id;
      e.tokens = NextTokens(*a, &e.prefill);
      if (e.prefill && a->fed > 0 && a->replay.empty() && a->recording.has_value())
        a->recording->ContinuePrefill();
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
        if (a.fed < a.Feed().size()) continue;  // more to run
        if (!a.replay.empty()) {
          // Recomputed: the next step runs its last token, as before it
          // gave its blocks up; from here on its routing is recorded again.
          a.replay.clear();
          a.fed = a.job.options.prompt.size();
          if (a.recording.has_value())
            a.session->set_routing_observer(a.recording->Observer());
          continue;
        }
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
