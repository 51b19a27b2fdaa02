// The serving executor: runs what the scheduler planned on the engine. It
// owns the metered expert provider every request goes through, makes the
// sessions, runs a StepPlan as one BatchStep (any number of sequences), and
// runs a lone request with the engine's Generate (max_batch 1).
//
//   Executor x(model, experts, kv_block_tokens);
//   RETURN_IF_ERROR(x.NewSession(seq, observer));
//   RETURN_IF_ERROR(x.Run(plan));
//   sampler.Next(x.logits(i));   // plan.entries[i]
//
// Thread-compatible: the engine thread drives it.
#ifndef MOECACHE_SERVICES_SERVING_EXECUTOR_H_
#define MOECACHE_SERVICES_SERVING_EXECUTOR_H_

#include <functional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "services/engine/batch_step.h"
#include "services/engine/expert_provider.h"
#include "services/engine/generator.h"
#include "services/engine/moe_model.h"
#include "services/serving/metered_provider.h"
#include "services/serving/scheduler.h"

namespace moe::serving {

class Executor {
 public:
  // `model` and `experts` are not owned and must outlive the executor.
  // `kv_block_tokens`: positions per KV block of the sessions it makes.
  Executor(const MoeModel& model, ExpertProvider* experts, int kv_block_tokens);

  MeteredProvider& experts() { return experts_; }

  // A fresh session for `seq` (prompt + max_new_tokens positions, KV
  // blocks, pre-gating as its options say); `observer` (may be null) sees
  // its routing. INVALID_ARGUMENT for a bad pre-gating distance.
  absl::Status NewSession(Sequence& seq, RoutingObserver observer);

  // Runs every entry of `plan` in one forward step. On error no sequence
  // has advanced.
  absl::Status Run(const StepPlan& plan);
  // Entry i's last-token logits from the last Run, valid until the next.
  absl::Span<const float> logits(size_t i) const { return step_.logits(i); }

  // One request alone, start to end (the engine's Generate).
  // `on_done` as moe::Generate's.
  absl::StatusOr<GenerateSummary> Generate(
      const GenerateOptions& options,
      const std::function<bool(const SampledToken&)>& on_token, RoutingObserver observer,
      const std::function<void(const Session&)>& on_done = nullptr);

 private:
  const MoeModel& model_;
  MeteredProvider experts_;
  const int kv_block_tokens_;
  BatchStep step_;
};

}  // namespace moe::serving

#endif  // MOECACHE_SERVICES_SERVING_EXECUTOR_H_
