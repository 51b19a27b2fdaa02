// Token sampling from logits: one sampler chain shared by every transport
// (gRPC, HTTP, moectl), seeded and reproducible across runs and machines
// (own xoshiro256** generator), plus log-probabilities.
//
// The chain, in order (each step is off at its neutral value):
//   0. constraint (structured output): tokens the request's TokenConstraint
//      does not allow next get logit -inf (so no later step can pick them);
//   1. logit_bias: adds a bias to chosen token ids' logits;
//   2. repetition_penalty r (CTRL / Hugging Face): every token seen in the
//      prompt or the output so far has its logit l divided by r when l > 0,
//      multiplied by r otherwise;
//   3. presence_penalty a, frequency_penalty f (OpenAI): a token generated c
//      times so far (output only, not the prompt) loses a * (c > 0) + f * c;
//   4. temperature 0: argmax of the adjusted logits (ties -> lower id), done;
//   5. temperature T > 0: probabilities softmax(l / T);
//   6. top_k: keeps the k most probable (ties -> lower id);
//   7. top_p: keeps the smallest prefix of those whose mass reaches p;
//   8. min_p: keeps those with probability >= min_p * the most probable's;
//   9. one draw from what is left, renormalized.
//
// Each Sampler has its own generator and its own token counts, so a
// sequence's tokens depend only on its logits, its parameters and its seed,
// never on what it is batched with.
//
// Log-probabilities are those of the model's distribution (log-softmax of the
// raw logits, temperature 1), whatever the sampling settings: they describe
// the model, not the sampler.
//
// Thread-compatible: one Sampler per request.
#ifndef MOECACHE_SERVICES_ENGINE_SAMPLER_H_
#define MOECACHE_SERVICES_ENGINE_SAMPLER_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/types/span.h"

namespace moe {

inline constexpr int kMaxTopLogprobs = 20;

// Which tokens may come next in one sequence (structured output: a JSON
// schema's grammar over the tokens' bytes, services/serving). The sampler
// asks Allowed before each draw and hands the drawn token to Accept.
// Thread-compatible: one per sequence.
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Resizes *allowed to the vocabulary it knows and sets (*allowed)[id] = 1
  // for each token that may come next (ids past its size are not allowed).
  // All zero only when the constraint cannot be continued with this
  // vocabulary; the sampler then ends the sequence (SampledToken::ends).
  virtual void Allowed(std::vector<uint8_t>* allowed) const = 0;
  // Takes the drawn token, one Allowed permitted.
  virtual void Accept(int32_t token) = 0;
  // Nothing may follow the tokens accepted so far: the sequence ends.
  virtual bool Done() const = 0;
};

// Makes a sequence's TokenConstraint; immutable and shared (SamplingParams
// is copied). Thread-safe.
class TokenConstraintFactory {
 public:
  virtual ~TokenConstraintFactory() = default;
  virtual std::unique_ptr<TokenConstraint> Start() const = 0;
};

// The defaults below are every interface's defaults (HTTP, gRPC, moectl
// generate/run/chat): greedy, no truncation, no penalties, and a random
// seed when none is given (serving::Request).
struct SamplingParams {
  float temperature = 0.0f;         // 0 = greedy (argmax, ties -> lower id)
  int top_k = 0;                    // 0 = off
  float top_p = 1.0f;               // 0 or >= 1: no truncation
  float min_p = 0.0f;               // 0 = off
  float repetition_penalty = 1.0f;  // 1 = off; > 0
  float presence_penalty = 0.0f;    // 0 = off
  float frequency_penalty = 0.0f;   // 0 = off
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token id, bias)
  uint64_t seed = 0;
  int top_logprobs = 0;             // 0..kMaxTopLogprobs alternatives per token
  // Structured output (step 0); null: none.
  std::shared_ptr<const TokenConstraintFactory> constraint;
};

// INVALID_ARGUMENT for NaN or negative temperature, top_p or min_p outside
// [0, 1], negative top_k, a repetition_penalty that is not > 0, non-finite
// penalties or biases, negative logit_bias ids, top_logprobs outside
// [0, kMaxTopLogprobs]. (Request::Validate holds the tighter bounds the
// transports accept; this guards the engine.)
absl::Status ValidateSamplingParams(const SamplingParams& params);

struct SampledToken {
  int32_t token = 0;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top_logprobs;  // descending
  // The constraint is satisfied and allows nothing more: this token is the
  // sequence's last (finish reason "stop"), as after a stop token.
  bool ends = false;
};

// xoshiro256** seeded through splitmix64: small, fast, and identical on every
// platform (std::mt19937's distributions are not).
class Rng {
 public:
  explicit Rng(uint64_t seed);
  uint64_t Next();
  double Uniform();  // [0, 1) with 53 random bits

 private:
  uint64_t s_[4];
};

class Sampler {
 public:
  // `prompt`: the tokens repetition_penalty counts besides the output.
  // REQUIRES: ValidateSamplingParams(params).ok()
  explicit Sampler(const SamplingParams& params, absl::Span<const int32_t> prompt = {});

  // Samples the next token and counts it as output (for the penalties).
  SampledToken Next(absl::Span<const float> logits);

  // The logits after steps 0-3 of the chain, given the tokens so far.
  std::vector<float> AdjustedLogits(absl::Span<const float> logits) const;

 private:
  bool Adjusts() const;
  int32_t Draw(absl::Span<const float> logits);
  // Steps 6-8 on scratch_ (probabilities, sorted when truncating); returns
  // how many of scratch_ are kept and sets *total to their mass.
  size_t Truncate(absl::Span<const float> logits, double* total);

  SamplingParams params_;
  std::unique_ptr<TokenConstraint> constraint_;  // from params_.constraint
  mutable std::vector<uint8_t> allowed_;         // constraint_'s mask, reused
  Rng rng_;
  absl::flat_hash_set<int32_t> seen_;             // prompt + output
  absl::flat_hash_map<int32_t, int64_t> output_counts_;
  std::vector<std::pair<float, int32_t>> scratch_;
};

}  // namespace moe

#endif  // MOECACHE_SERVICES_ENGINE_SAMPLER_H_
