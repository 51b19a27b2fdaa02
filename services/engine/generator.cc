#include "services/engine/generator.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace moe {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

std::vector<int32_t> StopTokens(const GenerateOptions& o,
                                const std::vector<int64_t>& eos_token_ids) {
  std::vector<int32_t> stops = o.stop_token_ids;
  if (o.stop_at_eos) {
    for (int64_t id : eos_token_ids) stops.push_back(static_cast<int32_t>(id));
  }
  return stops;
}

absl::Status ValidateGenerateOptions(const MoeModel& model,
                                     const GenerateOptions& o) {
  const ModelConfig& c = model.config();
  if (o.prompt.empty()) return absl::InvalidArgumentError("empty prompt");
  for (int32_t id : o.prompt) {
    if (id < 0 || id >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "prompt token id ", id, " outside the vocabulary [0, ",
          c.vocab_size, ")"));
    }
  }
  if (o.max_new_tokens < 1 || o.max_new_tokens > kMaxNewTokensLimit) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_new_tokens must be in [1, ", kMaxNewTokensLimit, "], got ",
        o.max_new_tokens));
  }
  const int64_t need = static_cast<int64_t>(o.prompt.size()) + o.max_new_tokens;
  if (need > model.max_context()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt of ", o.prompt.size(), " tokens + max_new_tokens ",
        o.max_new_tokens, " exceeds the context window of ",
        model.max_context()));
  }
  return ValidateSamplingParams(o.sampling);
}

absl::StatusOr<GenerateSummary> Generate(
    const MoeModel& model, ExpertProvider* experts,
    const GenerateOptions& o,
    const std::function<bool(const SampledToken&)>& on_token,
    RoutingObserver observer, const std::function<void(const Session&)>& on_done) {
  RETURN_IF_ERROR(ValidateGenerateOptions(model, o));
  if (o.prefix_positions != 0 &&
      (o.prefix == nullptr || o.prefix_positions < 0 ||
       o.prefix_positions >= static_cast<int64_t>(o.prompt.size()))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prefix of ", o.prefix_positions, " positions for a prompt of ", o.prompt.size()));
  }
  const ModelConfig& c = model.config();
  const std::vector<int32_t> stops = StopTokens(o, c.eos_token_ids);
  Session session(model, experts,
                  static_cast<int64_t>(o.prompt.size()) + o.max_new_tokens);
  session.set_routing_observer(std::move(observer));
  session.set_pregate_hints(o.pregate_hints);
  RETURN_IF_ERROR(session.set_pregate_distance(o.pregate_distance));
  Sampler sampler(o.sampling, o.prompt);
  GenerateSummary summary;
  summary.prompt_tokens = static_cast<int>(o.prompt.size());
  summary.finish_reason = "length";

  absl::Span<const int32_t> input(o.prompt);
  if (o.prefix_positions > 0) {
    RETURN_IF_ERROR(session.LoadKv(*o.prefix, o.prefix_positions));
    input = input.subspan(static_cast<size_t>(o.prefix_positions));
  }
  RETURN_IF_ERROR(experts->BeginRequest(o.request_id));
  const Clock::time_point start = Clock::now();
  Clock::time_point first;
  absl::Status status;
  int32_t token = 0;
  for (int i = 0; i < o.max_new_tokens; ++i) {
    auto logits = session.Forward(input, /*prefill=*/i == 0);
    if (!logits.ok()) {
      status = logits.status();
      break;
    }
    SampledToken sampled = sampler.Next(*logits);
    token = sampled.token;
    if (i == 0) first = Clock::now();
    ++summary.generated_tokens;
    const bool stop =
        sampled.ends || std::find(stops.begin(), stops.end(), token) != stops.end();
    if (!on_token(sampled)) {
      summary.finish_reason = "cancelled";
      break;
    }
    if (stop) {
      summary.finish_reason = "stop";
      break;
    }
    input = absl::Span<const int32_t>(&token, 1);
  }
  const Clock::time_point end = Clock::now();
  absl::Status ended = experts->EndRequest(o.request_id);
  RETURN_IF_ERROR(status);
  RETURN_IF_ERROR(ended);
  if (on_done) on_done(session);
  if (summary.generated_tokens > 0) {
    summary.ttft_seconds = Seconds(first - start);
    if (summary.generated_tokens > 1) {
      summary.tpot_seconds =
          Seconds(end - first) / (summary.generated_tokens - 1);
    }
  }
  summary.stats = session.stats();
  return summary;
}

}  // namespace moe
