// The serving scheduler: owns the waiting queue, admission, the KV cache
// budget and preemption, and turns each step of the continuous-batching
// loop into a StepPlan (which sequences run which tokens). It runs nothing:
// the Executor runs a plan on the engine, the Runner ties the two together
// and streams the outputs.
//
//   Scheduler s(model, options, metrics);
//   s.Open();
//   s.Enqueue(std::move(seq));                 // any thread
//   // engine thread, batched (max_batch > 1):
//   while (true) {
//     s.Admit(start);       // start(seq): new session (joined or resumed)
//     if (s.running().empty() && s.preempted().empty()) {
//       if (!s.WaitForQueued()) break;
//       continue;
//     }
//     ... s.Remove(seq) for any that was interrupted ...
//     StepPlan plan = s.Plan();  // KV fitted; plan.preempted gave theirs up
//     ... executor.Run(plan) ...; s.Advance(entry) per entry ...
//   }
//   // one at a time (max_batch 1): s.TakeNext() ... s.FinishTaken()
//
// Admission is first come, first served: the head of the queue waits for a
// place and for its first KV blocks (plus a block of headroom for every
// sequence that would then run) rather than be overtaken; preempted
// sequences are older than anything queued and go first. When a step needs
// a block that does not fit, the youngest sequences give theirs up (they
// wait at the head and resume by recomputing their positions).
//
// Thread-safety: Open, Close, Enqueue and queued may be called from any
// thread; everything else from the engine thread only.
#ifndef MOECACHE_SERVICES_SERVING_SCHEDULER_H_
#define MOECACHE_SERVICES_SERVING_SCHEDULER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "services/engine/generator.h"
#include "services/engine/moe_model.h"
#include "services/engine/session.h"
#include "services/serving/metered_provider.h"
#include "services/serving/metrics.h"

namespace moe::serving {

struct SchedulerOptions {
  // Requests waiting beyond the running ones; more get RESOURCE_EXHAUSTED.
  int max_queue = 16;
  // Sequences per forward step; 1 runs requests one at a time.
  int max_batch = 1;
  // Prompt tokens a joining sequence runs per step; 0: all at once.
  int prefill_chunk = 0;
  // KV cache bytes the running sequences may hold together; 0: no limit.
  int64_t kv_budget_bytes = 0;
  // Positions per KV cache block (> 0).
  int kv_block_tokens = 64;
};

// One request as the scheduler and the executor see it. The runner derives
// its own per-request state (sink, output stream, sampler) from it.
struct Sequence {
  virtual ~Sequence() = default;

  GenerateOptions options;  // validated; request_id set
  // The executor's: the session running it (null while preempted), and
  // the expert usage of the sessions it gave up.
  std::unique_ptr<Session> session;
  ExpertCounters carried;
  // The scheduler's.
  uint64_t order = 0;            // admission order: preemption takes the youngest
  int64_t kv_bytes = 0;          // KV cache bytes accounted to it
  int64_t position = 0;          // positions its session holds after the steps run
  size_t fed = 0;                // tokens of Feed() run so far
  int32_t last = 0;              // the token the next decode step runs
  std::vector<int32_t> output;   // the tokens sampled so far
  // A resumed sequence's positions to recompute (prompt + output but the
  // last, which the next decode step runs); empty otherwise.
  std::vector<int32_t> replay;

  // A sampled token: sent, and the next decode step's input.
  void Append(int32_t token) {
    output.push_back(token);
    last = token;
  }
  int generated() const { return static_cast<int>(output.size()); }
  // Positions its session may hold: prompt + max_new_tokens.
  int64_t Limit() const {
    return static_cast<int64_t>(options.prompt.size()) + options.max_new_tokens;
  }
  const std::vector<int32_t>& Feed() const { return replay.empty() ? options.prompt : replay; }
  // Its expert usage so far, over every session it had.
  ExpertCounters Counters() const;
};

// One forward step: the sequences that run and their tokens, in admission
// order (oldest first).
struct StepPlan {
  struct Entry {
    Sequence* sequence;
    absl::Span<const int32_t> tokens;  // a prompt chunk, a replay chunk or the last token
    bool prefill;
  };
  std::vector<Entry> entries;
  // Sequences that gave their KV blocks up to fit this step (their
  // sessions are gone; they wait at the head of the preempted queue).
  std::vector<Sequence*> preempted;
};

// What Advance found after a step ran an entry.
enum class StepOutcome {
  kPrefilling,  // more of its prompt (or replay) to run
  kResumed,     // its replay is done: the next step decodes its last token
  kSample,      // sample its next token from this step's logits
};

class Scheduler {
 public:
  // `model` and `metrics` (may be null) are not owned and must outlive the
  // scheduler.
  Scheduler(const MoeModel& model, SchedulerOptions options, ServingMetrics* metrics);

  // Starts accepting (false when already opened or closed); Close stops
  // for good and hands back what was queued.
  bool Open();
  std::deque<std::unique_ptr<Sequence>> Close();
  bool closed() const;

  // Queues `seq` and gives it the next request id (options.request_id,
  // from 1): UNAVAILABLE when not open, RESOURCE_EXHAUSTED when the queue
  // is full or (batched, with a budget) its KV cache could never fit alone
  // (prompt + max_new_tokens); then nothing is queued and no id used.
  absl::Status Enqueue(std::unique_ptr<Sequence> seq);
  int queued() const;

  // One at a time: blocks until a sequence is queued (then takes it) or
  // the scheduler is closed with nothing queued (null).
  std::unique_ptr<Sequence> TakeNext();
  // The taken sequence finished: its place is free.
  void FinishTaken();

  // Batched: blocks until something is queued; false once closed with
  // nothing queued.
  bool WaitForQueued();
  // Moves preempted (first) and queued sequences into the running set
  // while places and the KV budget allow, and calls `start` on each
  // (`resumed`: it was preempted); `start` returns false when the sequence
  // failed to start, after taking it out with Remove. Running sequences
  // are then in admission order.
  void Admit(const std::function<bool(Sequence& seq, bool resumed)>& start);
  // Running sequences, oldest first, and preempted ones, oldest first.
  const std::vector<std::unique_ptr<Sequence>>& running() const { return running_; }
  const std::deque<std::unique_ptr<Sequence>>& preempted() const { return preempted_; }
  // Takes `seq` (running or preempted) out and frees its KV cache; the
  // caller owns it from then on.
  std::unique_ptr<Sequence> Remove(Sequence* seq);
  // Grows every running sequence's KV reservation for the next step within
  // the budget, preempting the youngest when it is full, and plans the step.
  StepPlan Plan();
  // After the step ran `entry`: its progress.
  StepOutcome Advance(const StepPlan::Entry& entry);

 private:
  absl::Span<const int32_t> NextTokens(const Sequence& s, bool* prefill) const;
  int64_t FirstBlocks(int64_t tokens, int64_t limit) const;
  // Takes the youngest running sequence's KV blocks away.
  void PreemptYoungest() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const MoeModel& model_;
  const SchedulerOptions options_;
  ServingMetrics* const metrics_;

  mutable absl::Mutex mu_;
  absl::CondVar cv_;  // queue_ or closed_ changed
  std::deque<std::unique_ptr<Sequence>> queue_ ABSL_GUARDED_BY(mu_);
  bool open_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool busy_ ABSL_GUARDED_BY(mu_) = false;  // one at a time: a sequence is taken
  int live_ ABSL_GUARDED_BY(mu_) = 0;       // batched: admitted and not removed
  uint64_t next_request_id_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t kv_held_ ABSL_GUARDED_BY(mu_) = 0;  // their KV cache bytes
  // Engine thread only.
  uint64_t next_order_ = 0;
  std::vector<std::unique_ptr<Sequence>> running_;
  std::deque<std::unique_ptr<Sequence>> preempted_;
};

}  // namespace moe::serving

#endif  // MOECACHE_SERVICES_SERVING_SCHEDULER_H_
