// Structured output, the cost of the token mask per generated token
// (issue 27 item 5): on a model (default: the trained deploy/models/kjv-moe),
// greedy decoding with a JSON schema against the same number of tokens
// without one, alternating, repeated (medians and ranges of the time per
// token), and the mask alone replayed over the constrained output, for the
// model's vocabulary and for a synthetic one of Qwen's size (151,936
// tokens: the model's plus random words).
//   build/bin/structured_bench [MODEL_DIR] [REPS]
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "common/threads.h"
#include "kernels/backend.h"
#include "nlohmann/json.hpp"
#include "services/engine/generator.h"
#include "services/engine/in_memory_provider.h"
#include "services/engine/moe_model.h"
#include "services/engine/tokenizer.h"
#include "services/serving/json_constraint.h"
#include "services/serving/json_schema.h"
#include "services/serving/structured_output.h"

namespace moe {
namespace {

using Clock = std::chrono::steady_clock;

constexpr char kSchema[] = R"({"type": "object", "properties": {
  "book": {"type": "string", "enum": ["Genesis", "Exodus", "Psalms"]},
  "chapter": {"type": "integer", "minimum": 1, "maximum": 150},
  "words": {"type": "string", "maxLength": 60},
  "names": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 4}},
  "required": ["book", "chapter", "words", "names"], "additionalProperties": false})";

struct Stat {
  double median, lo, hi, mean, p90;
};
Stat Summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  return {v[v.size() / 2], v.front(), v.back(), sum / v.size(), v[v.size() * 9 / 10]};
}

// Per-token mask time (µs) replaying `tokens` under `grammar`.
std::vector<double> MaskTimes(const serving::JsonGrammar& grammar,
                              const serving::TokenVocabulary& vocab,
                              const std::vector<std::string>& token_text) {
  serving::JsonMatcher m(grammar);
  std::vector<uint8_t> mask;
  std::vector<double> us;
  for (const std::string& t : token_text) {
    const Clock::time_point a = Clock::now();
    m.AllowedTokens(vocab.trie(), &mask);
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - a).count());
    if (!m.Advance(t)) break;
  }
  return us;
}

int Main(int argc, char** argv) {
  SkipLockOrderChecks();  // before any lock: they all pay for the checks
  const std::string dir = argc > 1 ? argv[1] : "deploy/models/kjv-moe";
  const int reps = argc > 2 ? std::atoi(argv[2]) : 5;
  auto backend = CreateBackend("cpu");
  auto model = MoeModel::Load(dir, backend->get());
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", model.status().ToString().c_str());
    return 1;
  }
  auto experts = InMemoryExpertProvider::Create(**model);
  auto tokenizer = Tokenizer::FromFile(dir + "/tokenizer.json");
  if (!experts.ok() || !tokenizer.ok()) return 1;
  const Clock::time_point built = Clock::now();
  auto vocab = std::make_shared<const serving::TokenVocabulary>(**tokenizer);
  const double build_ms = std::chrono::duration<double, std::milli>(Clock::now() - built).count();
  auto grammar = std::make_shared<const serving::JsonGrammar>(
      *serving::CompileJsonSchema(nlohmann::json::parse(kSchema)));

  GenerateOptions o;
  o.prompt = (*tokenizer)->Encode(
      "And he said unto him, Who begat Enos? Answer as JSON.\nAnd he answered and said,", true);
  o.stop_at_eos = false;
  o.max_new_tokens = 400;
  o.sampling.constraint = serving::JsonTokenConstraint(grammar, vocab, {});
  std::vector<int32_t> constrained;
  std::vector<double> with_us, without_us;
  for (int rep = 0; rep < reps; ++rep) {
    // Alternating: constrained, then the same number of tokens free.
    std::vector<int32_t> got;
    auto a = Generate(**model, experts->get(), o, [&](const SampledToken& t) {
      got.push_back(t.token);
      return true;
    });
    if (!a.ok()) return 1;
    constrained = got;
    // The same options but the schema (the same session size), stopped
    // after as many tokens.
    GenerateOptions free = o;
    free.sampling.constraint = nullptr;
    size_t n = 0;
    auto b = Generate(**model, experts->get(), free,
                      [&](const SampledToken&) { return ++n < got.size(); });
    if (!b.ok()) return 1;
    with_us.push_back(a->tpot_seconds * 1e6);
    without_us.push_back(b->tpot_seconds * 1e6);
  }
  std::vector<std::string> text;
  for (int32_t id : constrained) text.push_back(vocab->bytes()[id]);
  std::string joined;
  for (const std::string& t : text) joined += t;

  // A vocabulary of Qwen's size: the model's tokens plus random words, most
  // of letters (as most of a BPE vocabulary is), one in ten with
  // punctuation, quotes and brackets included.
  std::vector<std::string> big = vocab->bytes();
  std::mt19937 rng(7);
  const std::string letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
  const std::string punctuation = ",.:;\"'{}[]()0123456789-_!?";
  while (big.size() < 151936) {
    std::string w = rng() % 2 ? " " : "";
    for (int n = 1 + static_cast<int>(rng() % 9); n > 0; --n) w += letters[rng() % letters.size()];
    if (rng() % 10 == 0) w.insert(rng() % (w.size() + 1), 1, punctuation[rng() % punctuation.size()]);
    big.push_back(w);
  }
  const serving::TokenVocabulary big_vocab(big);

  const Stat with = Summarize(with_us), without = Summarize(without_us);
  const Stat mask = Summarize(MaskTimes(*grammar, *vocab, text));
  const Stat big_mask = Summarize(MaskTimes(*grammar, big_vocab, text));
  std::printf("model %s: vocabulary %zu tokens (TokenVocabulary built in %.1f ms), %d reps, "
              "%zu tokens constrained then the same number free, alternating\n",
              dir.c_str(), vocab->bytes().size(), build_ms, reps, constrained.size());
  std::printf("output: %s\n", joined.c_str());
  std::printf("| | median | range |\n|---|---|---|\n");
  std::printf("| time per token, with the schema (µs) | %.0f | %.0f-%.0f |\n", with.median, with.lo,
              with.hi);
  std::printf("| time per token, without (µs) | %.0f | %.0f-%.0f |\n", without.median, without.lo,
              without.hi);
  std::printf("| with / without | %.3f | |\n", with.median / without.median);
  std::printf("| the mask alone, this vocabulary (µs per token) | %.1f | %.1f-%.1f (mean %.1f, "
              "p90 %.1f) |\n",
              mask.median, mask.lo, mask.hi, mask.mean, mask.p90);
  std::printf("| the mask alone, 151,936 tokens (µs per token) | %.1f | %.1f-%.1f (mean %.1f, "
              "p90 %.1f) |\n",
              big_mask.median, big_mask.lo, big_mask.hi, big_mask.mean, big_mask.p90);
  if (std::getenv("MASK_TRACE") != nullptr) {
    const std::vector<double> t = MaskTimes(*grammar, big_vocab, text);
    std::string so_far;
    for (size_t i = 0; i < t.size(); ++i) {
      std::printf("%8.1f µs after %s\n", t[i], nlohmann::json(so_far).dump().c_str());
      so_far += text[i];
    }
  }
  return 0;
}

}  // namespace
}  // namespace moe

int main(int argc, char** argv) { return moe::Main(argc, argv); }
