// Token sampling from logits: greedy, temperature and nucleus (top-p), seeded
// and reproducible across runs and machines (own xoshiro256** generator), plus
// log-probabilities.
//
// Log-probabilities are those of the model's distribution (log-softmax of the
// raw logits, temperature 1), whatever the sampling settings: they describe
// the model, not the sampler.
//
// Thread-compatible: one Sampler per request.
#ifndef MOECACHE_SERVICES_ENGINE_SAMPLER_H_
#define MOECACHE_SERVICES_ENGINE_SAMPLER_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace moe {

inline constexpr int kMaxTopLogprobs = 20;

struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy (argmax, ties -> lower id)
  float top_p = 1.0f;        // 0 or >= 1: no truncation
  uint64_t seed = 0;
  int top_logprobs = 0;      // 0..kMaxTopLogprobs alternatives per token
};

// INVALID_ARGUMENT for NaN or negative temperature, top_p outside [0, 1],
// top_logprobs outside [0, kMaxTopLogprobs].
absl::Status ValidateSamplingParams(const SamplingParams& params);

struct SampledToken {
  int32_t token = 0;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top_logprobs;  // descending
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
  // REQUIRES: ValidateSamplingParams(params).ok()
  explicit Sampler(const SamplingParams& params);

  SampledToken Next(absl::Span<const float> logits);

 private:
  int32_t Draw(absl::Span<const float> logits);

  SamplingParams params_;
  Rng rng_;
  std::vector<std::pair<float, int32_t>> scratch_;
};

}  // namespace moe

#endif  // MOECACHE_SERVICES_ENGINE_SAMPLER_H_
