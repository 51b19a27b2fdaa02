#include "services/engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/splitmix64.h"

namespace moe {
namespace {

uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

// log(sum(exp(x))) computed in double for stable log-probs.
double LogSumExp(absl::Span<const float> x) {
  float max = -std::numeric_limits<float>::infinity();
  for (float v : x) max = std::max(max, v);
  if (!std::isfinite(max)) return max;
  double sum = 0.0;
  for (float v : x) sum += std::exp(static_cast<double>(v) - max);
  return max + std::log(sum);
}

}  // namespace

absl::Status ValidateSamplingParams(const SamplingParams& p) {
  if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature)) {
    return absl::InvalidArgumentError(
        absl::StrCat("temperature must be >= 0, got ", p.temperature));
  }
  if (!(p.top_p >= 0.0f && p.top_p <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_p must be in [0, 1], got ", p.top_p));
  }
  if (p.top_logprobs < 0 || p.top_logprobs > kMaxTopLogprobs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "top_logprobs must be in [0, ", kMaxTopLogprobs, "], got ",
        p.top_logprobs));
  }
  return absl::OkStatus();
}

Rng::Rng(uint64_t seed) {
  uint64_t x = seed;
  for (uint64_t& s : s_) s = SplitMix64(x);
}

uint64_t Rng::Next() {
  uint64_t result = Rotl(s_[1] * 5, 7) * 9;
  uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = Rotl(s_[3], 45);
  return result;
}

double Rng::Uniform() { return (Next() >> 11) * 0x1.0p-53; }

Sampler::Sampler(const SamplingParams& params)
    : params_(params), rng_(params.seed) {}

int32_t Sampler::Draw(absl::Span<const float> logits) {
  const int32_t n = static_cast<int32_t>(logits.size());
  if (params_.temperature == 0.0f) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; ++i) {
      if (logits[i] > logits[best]) best = i;
    }
    return best;
  }
  // Probabilities at temperature T, sorted descending for the nucleus.
  const double inv_t = 1.0 / params_.temperature;
  float max = *std::max_element(logits.begin(), logits.end());
  scratch_.clear();
  scratch_.reserve(n);
  double total = 0.0;
  for (int32_t i = 0; i < n; ++i) {
    float p = static_cast<float>(std::exp((logits[i] - max) * inv_t));
    scratch_.emplace_back(p, i);
    total += p;
  }
  size_t keep = scratch_.size();
  bool truncate = params_.top_p > 0.0f && params_.top_p < 1.0f;
  if (truncate) {
    std::sort(scratch_.begin(), scratch_.end(), [](const auto& a, const auto& b) {
      return a.first != b.first ? a.first > b.first : a.second < b.second;
    });
    double cum = 0.0;
    const double target = params_.top_p * total;
    for (keep = 0; keep < scratch_.size();) {
      cum += scratch_[keep++].first;
      if (cum >= target) break;
    }
    total = cum;
  }
  double u = rng_.Uniform() * total;
  double cum = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    cum += scratch_[i].first;
    if (u < cum) return scratch_[i].second;
  }
  return scratch_[keep - 1].second;  // rounding at the top end
}

SampledToken Sampler::Next(absl::Span<const float> logits) {
  SampledToken out;
  out.token = Draw(logits);
  const double lse = LogSumExp(logits);
  out.logprob = static_cast<float>(logits[out.token] - lse);
  if (params_.top_logprobs > 0) {
    int k = std::min<int>(params_.top_logprobs, logits.size());
    std::vector<int32_t> ids(logits.size());
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(),
                      [&](int32_t a, int32_t b) {
                        return logits[a] != logits[b] ? logits[a] > logits[b]
                                                      : a < b;
                      });
    for (int i = 0; i < k; ++i) {
      out.top_logprobs.emplace_back(ids[i],
                                    static_cast<float>(logits[ids[i]] - lse));
    }
  }
  return out;
}

}  // namespace moe
