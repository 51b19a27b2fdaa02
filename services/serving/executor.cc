#include "services/serving/executor.h"

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

namespace moe::serving {

Executor::Executor(const MoeModel& model, ExpertProvider* experts, int kv_block_tokens)
    : model_(model),
      experts_(experts),
      kv_block_tokens_(std::max(0, kv_block_tokens)),
      step_(model, &experts_) {}

absl::Status Executor::NewSession(Sequence& seq, RoutingObserver observer) {
  const GenerateOptions& o = seq.options;
  seq.session = std::make_unique<Session>(model_, &experts_, seq.Limit());
  // A fresh session has run nothing: the block size is accepted.
  (void)seq.session->set_kv_block_tokens(kv_block_tokens_);
  seq.session->set_pregate_hints(o.pregate_hints);
  if (observer) seq.session->set_routing_observer(std::move(observer));
  return seq.session->set_pregate_distance(o.pregate_distance);
}

absl::Status Executor::Run(const StepPlan& plan) {
  std::vector<BatchStep::Entry> entries;
  entries.reserve(plan.entries.size());
  for (const StepPlan::Entry& e : plan.entries) {
    BatchStep::Entry b;
    b.session = e.sequence->session.get();
    b.request = e.sequence->options.request_id;
    b.tokens = e.tokens;
    b.prefill = e.prefill;
    entries.push_back(b);
  }
  return step_.Run(entries);
}

absl::StatusOr<GenerateSummary> Executor::Generate(
    const GenerateOptions& options, const std::function<bool(const SampledToken&)>& on_token,
    RoutingObserver observer, const std::function<void(const Session&)>& on_done) {
  return moe::Generate(model_, &experts_, options, on_token, std::move(observer), on_done);
}

}  // namespace moe::serving
