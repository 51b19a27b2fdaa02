#include "services/moectl/sampling_flags.h"

#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace moe::moectl {

void DeclareSamplingFlags(FlagSet& f) {
  const serving::Request d;
  f.Double("temperature", d.temperature, "0 = greedy");
  f.Int("top-k", d.top_k, "keep the k most probable tokens (0 = off)");
  f.Double("top-p", d.top_p, "nucleus sampling threshold (1 = off)");
  f.Double("min-p", d.min_p, "drop tokens below min-p x the most probable's probability (0 = off)");
  f.Double("repetition-penalty", d.repetition_penalty,
           "divide the logits of prompt and output tokens by this (1 = off)");
  f.Double("presence-penalty", d.presence_penalty, "OpenAI's presence penalty (0 = off)");
  f.Double("frequency-penalty", d.frequency_penalty, "OpenAI's frequency penalty (0 = off)");
  f.StringList("logit-bias", "ID:BIAS added to a token's logit (repeatable)");
  f.Int("seed", -1, "sampling seed (-1 = random)");
  f.Bool("ignore-eos", d.ignore_eos, "do not stop at the model's eos tokens");
}

absl::Status SamplingFromFlags(const FlagSet& f, serving::Request* r) {
  r->temperature = f.GetDouble("temperature");
  r->top_k = f.GetInt("top-k");
  r->top_p = f.GetDouble("top-p");
  r->min_p = f.GetDouble("min-p");
  r->repetition_penalty = f.GetDouble("repetition-penalty");
  r->presence_penalty = f.GetDouble("presence-penalty");
  r->frequency_penalty = f.GetDouble("frequency-penalty");
  r->ignore_eos = f.GetBool("ignore-eos");
  const int64_t seed = f.GetInt("seed");
  if (seed < -1) return absl::InvalidArgumentError("--seed must be >= 0, or -1 for a random seed");
  if (seed >= 0) r->seed = static_cast<uint64_t>(seed);
  r->logit_bias.clear();
  for (const std::string& entry : f.GetList("logit-bias")) {
    std::vector<std::string> parts = absl::StrSplit(entry, ':');
    int32_t id = 0;
    double bias = 0;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &id) ||
        !absl::SimpleAtod(parts[1], &bias)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--logit-bias wants TOKEN_ID:BIAS, got '", entry, "'"));
    }
    r->logit_bias.emplace_back(id, bias);
  }
  return absl::OkStatus();
}

nlohmann::ordered_json SamplingJson(const serving::Request& r) {
  nlohmann::ordered_json j = {{"temperature", r.temperature},
                              {"top_k", r.top_k},
                              {"top_p", r.top_p},
                              {"min_p", r.min_p},
                              {"repetition_penalty", r.repetition_penalty},
                              {"presence_penalty", r.presence_penalty},
                              {"frequency_penalty", r.frequency_penalty},
                              {"ignore_eos", r.ignore_eos}};
  if (!r.logit_bias.empty()) {
    nlohmann::ordered_json bias = nlohmann::ordered_json::object();
    for (const auto& [id, b] : r.logit_bias) bias[std::to_string(id)] = b;
    j["logit_bias"] = bias;
  }
  if (r.seed.has_value()) j["seed"] = *r.seed;
  return j;
}

}  // namespace moe::moectl
