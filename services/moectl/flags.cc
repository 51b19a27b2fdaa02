#include "services/moectl/flags.h"

#include <utility>

namespace moe::moectl {

FlagSet::FlagSet(const std::string& command, std::string synopsis)
    : flags::FlagSet("moectl " + command, std::move(synopsis)) {}

void DeclareGenerationFlags(FlagSet& f) {
  f.String("prompt-ids", "", "prompt as comma-separated token ids");
  f.Int("max-new-tokens", 16, "tokens to generate at most");
  f.Int("top-logprobs", 0, "alternatives per token with their log-probs");
  f.Bool("json", false, "one JSON object per token, then a summary object");
}

}  // namespace moe::moectl
