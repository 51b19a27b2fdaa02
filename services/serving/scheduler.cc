#include "services/serving/scheduler.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace moe::serving {

ExpertCounters Sequence::Counters() const {
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

Scheduler::Scheduler(const MoeModel& model, SchedulerOptions options, ServingMetrics* metrics)
    : model_(model), options_(options), metrics_(metrics) {}

bool Scheduler::Open() {
  absl::MutexLock lock(&mu_);
  if (open_ || closed_) return false;
  open_ = true;
  return true;
}

std::deque<std::unique_ptr<Sequence>> Scheduler::Close() {
  std::deque<std::unique_ptr<Sequence>> dropped;
  absl::MutexLock lock(&mu_);
  open_ = false;
  closed_ = true;
  dropped.swap(queue_);
  if (metrics_ != nullptr) metrics_->SetQueueDepth(0);
  cv_.SignalAll();
  return dropped;
}

bool Scheduler::closed() const {
  absl::MutexLock lock(&mu_);
  return closed_;
}

absl::Status Scheduler::Enqueue(std::unique_ptr<Sequence> seq) {
  const GenerateOptions& o = seq->options;
  absl::MutexLock lock(&mu_);
  if (!open_) return absl::UnavailableError("worker is not serving");
  if (static_cast<int>(queue_.size()) + (busy_ ? 1 : 0) + live_ >
      options_.max_queue + std::max(options_.max_batch, 1) - 1) {
    return absl::ResourceExhaustedError(
        absl::StrCat("request queue full (", options_.max_queue, " waiting); retry later"));
  }
  const int64_t kv = Session::KvCacheBytes(model_, seq->Limit());
  if (options_.max_batch > 1 && options_.kv_budget_bytes > 0 && kv > options_.kv_budget_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "this request's KV cache (", kv, " bytes for ", o.prompt.size(), " prompt + ",
        o.max_new_tokens, " new tokens) exceeds the worker's --kv-budget-mb (",
        options_.kv_budget_bytes, " bytes); lower max_new_tokens or the prompt"));
  }
  seq->options.request_id = next_request_id_++;
  queue_.push_back(std::move(seq));
  if (metrics_ != nullptr) metrics_->SetQueueDepth(static_cast<int64_t>(queue_.size()));
  cv_.SignalAll();
  return absl::OkStatus();
}

int Scheduler::queued() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(queue_.size());
}

std::unique_ptr<Sequence> Scheduler::TakeNext() {
  absl::MutexLock lock(&mu_);
  while (!closed_ && queue_.empty()) cv_.Wait(&mu_);
  if (queue_.empty()) return nullptr;  // closed with nothing left
  std::unique_ptr<Sequence> seq = std::move(queue_.front());
  queue_.pop_front();
  busy_ = true;
  if (metrics_ != nullptr) metrics_->SetQueueDepth(static_cast<int64_t>(queue_.size()));
  return seq;
}

void Scheduler::FinishTaken() {
  absl::MutexLock lock(&mu_);
  busy_ = false;
}

bool Scheduler::WaitForQueued() {
  absl::MutexLock lock(&mu_);
  while (!closed_ && queue_.empty()) cv_.Wait(&mu_);
  return !queue_.empty();
}

int64_t Scheduler::FirstBlocks(int64_t tokens, int64_t limit) const {
  // A joining sequence reserves its first step's blocks (all its prompt, or
  // its recomputed positions, plus the first token).
  return Session::KvBlockBytes(model_, tokens + 1, options_.kv_block_tokens,
                               std::min(limit, model_.max_context()));
}

void Scheduler::Admit(const std::function<bool(Sequence&, bool)>& start) {
  const bool budget = options_.kv_budget_bytes > 0;
  std::vector<Sequence*> resumed;
  std::vector<Sequence*> joined;
  {
    absl::MutexLock lock(&mu_);
    int64_t wanted = 0;  // the joining ones' first blocks
    // Headroom: a block of growth for every sequence that would then run,
    // so that a join does not preempt someone at the next block boundary.
    const int64_t block_bytes = Session::KvCacheBytes(model_, std::max(0, options_.kv_block_tokens));
    auto room = [&](int64_t kv) {
      const int64_t running = static_cast<int64_t>(running_.size()) + 1;
      return !budget || kv_held_ + wanted + kv + running * block_bytes <= options_.kv_budget_bytes ||
             running_.empty();
    };
    // Preempted sequences are older than anything queued: they go first,
    // and nothing queued overtakes them.
    while (!preempted_.empty() && static_cast<int>(running_.size()) < options_.max_batch) {
      Sequence& p = *preempted_.front();
      const int64_t kv = FirstBlocks(static_cast<int64_t>(p.Feed().size()), p.Limit());
      if (!room(kv)) break;
      wanted += kv;
      resumed.push_back(&p);
      running_.push_back(std::move(preempted_.front()));
      preempted_.pop_front();
    }
    // First come, first served: the head waits for room rather than being
    // overtaken by smaller requests (no starvation).
    while (preempted_.empty() && !queue_.empty() &&
           static_cast<int>(running_.size()) < options_.max_batch) {
      const Sequence& head = *queue_.front();
      const int64_t prompt = static_cast<int64_t>(head.options.prompt.size());
      const int64_t kv = FirstBlocks(prompt, head.Limit());
      if (!room(kv)) break;  // waits until running sequences free their caches
      wanted += kv;
      queue_.front()->order = next_order_++;
      joined.push_back(queue_.front().get());
      running_.push_back(std::move(queue_.front()));
      queue_.pop_front();
      ++live_;
    }
    if (metrics_ != nullptr) metrics_->SetQueueDepth(static_cast<int64_t>(queue_.size()));
  }
  for (Sequence* s : resumed) (void)start(*s, /*resumed=*/true);
  for (Sequence* s : joined) (void)start(*s, /*resumed=*/false);
  // Admission order (oldest first), so the youngest is last.
  std::stable_sort(running_.begin(), running_.end(),
                   [](const std::unique_ptr<Sequence>& x, const std::unique_ptr<Sequence>& y) {
                     return x->order < y->order;
                   });
  if (metrics_ != nullptr) metrics_->SetRunning(static_cast<int64_t>(running_.size()));
}

std::unique_ptr<Sequence> Scheduler::Remove(Sequence* seq) {
  std::unique_ptr<Sequence> out;
  auto take = [&](auto& list) {
    auto it = std::find_if(list.begin(), list.end(),
                           [seq](const std::unique_ptr<Sequence>& s) { return s.get() == seq; });
    if (it == list.end()) return false;
    out = std::move(*it);
    list.erase(it);
    return true;
  };
  if (!take(running_)) (void)take(preempted_);
  absl::MutexLock lock(&mu_);
  kv_held_ -= seq->kv_bytes;
  // The gauges follow a finished sequence at once, not at the next step (an
  // idle worker would show the last one forever).
  if (metrics_ != nullptr) {
    metrics_->SetKvCacheBytes(kv_held_);
    metrics_->SetRunning(static_cast<int64_t>(running_.size()));
  }
  --live_;
  cv_.SignalAll();
  return out;
}

absl::Span<const int32_t> Scheduler::NextTokens(const Sequence& s, bool* prefill) const {
  const std::vector<int32_t>& feed = s.Feed();
  if (s.fed < feed.size()) {
    size_t take = feed.size() - s.fed;
    if (options_.prefill_chunk > 0) take = std::min<size_t>(take, options_.prefill_chunk);
    *prefill = true;
    return absl::Span<const int32_t>(feed.data() + s.fed, take);
  }
  *prefill = false;
  return absl::Span<const int32_t>(&s.last, 1);
}

void Scheduler::PreemptYoungest() {
  // The youngest gives its blocks up and waits at the head, to recompute
  // its positions when there is room again (tokens unchanged: the same
  // kernels over the same rows). Called with mu_ held.
  std::unique_ptr<Sequence> y = std::move(running_.back());
  running_.pop_back();
  y->carried = y->Counters();
  y->session.reset();
  kv_held_ -= y->kv_bytes;
  y->kv_bytes = 0;
  if (!y->output.empty()) {
    y->replay = y->options.prompt;
    y->replay.insert(y->replay.end(), y->output.begin(), y->output.end() - 1);
  } else {
    y->replay.clear();  // still in its prompt: it runs it again
  }
  y->fed = 0;
  y->position = 0;  // its next session starts empty
  if (metrics_ != nullptr) metrics_->AddKvPreemption();
  // Oldest first at the head (the youngest was taken first).
  preempted_.push_front(std::move(y));
}

StepPlan Scheduler::Plan() {
  StepPlan plan;
  // What each sequence holds after the next step.
  auto after = [&](const Sequence& s) {
    bool prefill = false;
    const int64_t t = static_cast<int64_t>(NextTokens(s, &prefill).size());
    // As Session::KvBytesAfter: whole blocks, at most the session's size.
    return std::max(s.kv_bytes,
                    Session::KvBlockBytes(model_, s.position + t,
                                          std::max(0, options_.kv_block_tokens), s.Limit()));
  };
  {
    absl::MutexLock lock(&mu_);
    while (true) {
      int64_t growth = 0;
      for (const auto& s : running_) growth += after(*s) - s->kv_bytes;
      if (options_.kv_budget_bytes <= 0 || running_.size() <= 1 ||
          kv_held_ + growth <= options_.kv_budget_bytes) {
        for (auto& s : running_) {
          const int64_t kv = after(*s);
          kv_held_ += kv - s->kv_bytes;
          s->kv_bytes = kv;
        }
        break;
      }
      plan.preempted.push_back(running_.back().get());
      PreemptYoungest();
    }
    if (metrics_ != nullptr) metrics_->SetKvCacheBytes(kv_held_);
  }
  for (auto& s : running_) {
    StepPlan::Entry e{s.get(), {}, false};
    e.tokens = NextTokens(*s, &e.prefill);
    plan.entries.push_back(e);
  }
  return plan;
}

StepOutcome Scheduler::Advance(const StepPlan::Entry& entry) {
  Sequence& s = *entry.sequence;
  s.position += static_cast<int64_t>(entry.tokens.size());
  if (!entry.prefill) return StepOutcome::kSample;
  s.fed += entry.tokens.size();
  if (s.fed < s.Feed().size()) return StepOutcome::kPrefilling;
  if (s.replay.empty()) return StepOutcome::kSample;
  // Recomputed: the next step runs its last token, as before it gave its
  // blocks up.
  s.replay.clear();
  s.fed = s.options.prompt.size();
  return StepOutcome::kResumed;
}

}  // namespace moe::serving
