// One generation request end to end: prefill of the whole prompt in one
// pass, then token-by-token decode with sampling, stop conditions and
// timing. Used by `moectl run` and by moe-worker's Generate.
#ifndef MOECACHE_SERVICES_ENGINE_GENERATOR_H_
#define MOECACHE_SERVICES_ENGINE_GENERATOR_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/engine/expert_provider.h"
#include "services/engine/moe_model.h"
#include "services/engine/sampler.h"
#include "services/engine/session.h"

namespace moe {

// Hard ceiling on max_new_tokens, whatever the context allows.
inline constexpr int kMaxNewTokensLimit = 1 << 16;

struct GenerateOptions {
  std::vector<int32_t> prompt;
  int max_new_tokens = 16;
  SamplingParams sampling;
  std::vector<int32_t> stop_token_ids;
  bool stop_at_eos = true;  // also stop at the config's eos ids
  uint64_t request_id = 0;
  bool pregate_hints = false;
  int pregate_distance = 1;  // Session::set_pregate_distance
  // Prefix reuse (serving's prefix cache): the first `prefix_positions`
  // positions of the prompt are loaded from `prefix` (Session::LoadKv; not
  // owned, it must outlive the call) instead of being run; 0 (none) or
  // 0 < prefix_positions < prompt.size(). The tokens are the same either way.
  const KvSnapshot* prefix = nullptr;
  int64_t prefix_positions = 0;
};

struct GenerateSummary {
  int prompt_tokens = 0;
  int generated_tokens = 0;
  double ttft_seconds = 0.0;  // start to first token
  double tpot_seconds = 0.0;  // mean time per token after the first
  std::string finish_reason;  // "length", "stop" or "cancelled"
  SessionStats stats;
};

// The tokens that end a request: its stop ids, then the model's eos ids
// unless it ignores them (stop_at_eos false).
std::vector<int32_t> StopTokens(const GenerateOptions& options,
                                const std::vector<int64_t>& eos_token_ids);

// Checks a request against the model before any work: non-empty prompt,
// ids in the vocabulary, 1 <= max_new_tokens <= kMaxNewTokensLimit, prompt
// + max_new_tokens within the context, sampling parameters.
// INVALID_ARGUMENT with the reason.
absl::Status ValidateGenerateOptions(const MoeModel& model,
                                     const GenerateOptions& options);

// Runs one request. `on_token` sees each token as it is produced (a stop
// token is delivered too, as the last one, and so is a token that ends a
// constraint: SampledToken::ends) and returns false to cancel.
// `observer` (optional) sees every MoE layer's routing. `on_done`
// (optional) sees the session once the last token is out, before it goes
// (a prefix cache saves its positions then); not called on error.
absl::StatusOr<GenerateSummary> Generate(
    const MoeModel& model, ExpertProvider* experts,
    const GenerateOptions& options,
    const std::function<bool(const SampledToken&)>& on_token,
    RoutingObserver observer = nullptr,
    const std::function<void(const Session&)>& on_done = nullptr);

}  // namespace moe

#endif  // MOECACHE_SERVICES_ENGINE_GENERATOR_H_
