#include "services/engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/splitmix64.h"
#include "kernels/cpu_matmul.h"
#include "kernels/cpu_ops.h"

namespace moe {
namespace {

uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

SimdLevel Level() {
  static const SimdLevel level = DetectSimdLevel();
  return level;
}

// log(sum(exp(x))), the sum in double for stable log-probs, of every
// token's logits (cpu::MaxValue and cpu::SumExp: vector code where the CPU
// has AVX-512; a scalar maximum was two thirds of a greedy token's sampling).
double LogSumExp(absl::Span<const float> x) {
  const int64_t n = static_cast<int64_t>(x.size());
  const float max = cpu::MaxValue(Level(), x.data(), n);
  if (!std::isfinite(max)) return max;
  return max + std::log(cpu::SumExp(Level(), x.data(), n, max));
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
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("min_p must be in [0, 1], got ", p.min_p));
  }
  if (p.top_k < 0) {
    return absl::InvalidArgumentError(absl::StrCat("top_k must be >= 0, got ", p.top_k));
  }
  if (!(p.repetition_penalty > 0.0f) || !std::isfinite(p.repetition_penalty)) {
    return absl::InvalidArgumentError(
        absl::StrCat("repetition_penalty must be > 0, got ", p.repetition_penalty));
  }
  if (!std::isfinite(p.presence_penalty) || !std::isfinite(p.frequency_penalty)) {
    return absl::InvalidArgumentError("presence_penalty and frequency_penalty must be finite");
  }
  for (const auto& [id, bias] : p.logit_bias) {
    if (id < 0 || !std::isfinite(bias)) {
      return absl::InvalidArgumentError(
          absl::StrCat("logit_bias needs token ids >= 0 and finite biases, got ", id, ": ", bias));
    }
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

Sampler::Sampler(const SamplingParams& params, absl::Span<const int32_t> prompt)
    : params_(params), rng_(params.seed) {
  if (params_.repetition_penalty != 1.0f) seen_.insert(prompt.begin(), prompt.end());
  if (params_.constraint != nullptr) constraint_ = params_.constraint->Start();
}

bool Sampler::Adjusts() const {
  return constraint_ != nullptr || !params_.logit_bias.empty() ||
         params_.repetition_penalty != 1.0f || params_.presence_penalty != 0.0f ||
         params_.frequency_penalty != 0.0f;
}

std::vector<float> Sampler::AdjustedLogits(absl::Span<const float> logits) const {
  std::vector<float> out(logits.begin(), logits.end());
  const int32_t n = static_cast<int32_t>(out.size());
  if (constraint_ != nullptr) {
    constraint_->Allowed(&allowed_);
    const int32_t known = std::min<int32_t>(n, static_cast<int32_t>(allowed_.size()));
    constexpr float kNever = -std::numeric_limits<float>::infinity();
    for (int32_t id = 0; id < known; ++id) {
      if (allowed_[id] == 0) out[id] = kNever;
    }
    std::fill(out.begin() + known, out.end(), kNever);
  }
  for (const auto& [id, bias] : params_.logit_bias) {
    if (id < n) out[id] += bias;
  }
  if (params_.repetition_penalty != 1.0f) {
    const float r = params_.repetition_penalty;
    for (int32_t id : seen_) {
      if (id >= 0 && id < n) out[id] = out[id] > 0.0f ? out[id] / r : out[id] * r;
    }
  }
  for (const auto& [id, count] : output_counts_) {
    if (id < 0 || id >= n) continue;
    out[id] -= params_.presence_penalty + params_.frequency_penalty * static_cast<float>(count);
  }
  return out;
}

size_t Sampler::Truncate(absl::Span<const float> logits, double* total) {
  const size_t n = scratch_.size();
  const bool top_k = params_.top_k > 0 && static_cast<size_t>(params_.top_k) < n;
  const bool top_p = params_.top_p > 0.0f && params_.top_p < 1.0f;
  const bool min_p = params_.min_p > 0.0f;
  if (!top_k && !top_p && !min_p) return n;
  // By logit, not by rounded probability, so that top_k = 1 is the argmax.
  std::sort(scratch_.begin(), scratch_.end(), [&](const auto& a, const auto& b) {
    const float la = logits[a.second], lb = logits[b.second];
    return la != lb ? la > lb : a.second < b.second;
  });
  size_t keep = n;
  auto mass = [&](size_t k) {
    double sum = 0.0;
    for (size_t i = 0; i < k; ++i) sum += scratch_[i].first;
    return sum;
  };
  if (top_k) {
    keep = static_cast<size_t>(params_.top_k);
    *total = mass(keep);
  }
  if (top_p) {
    double cum = 0.0;
    const double target = params_.top_p * *total;
    size_t k = 0;
    while (k < keep) {
      cum += scratch_[k++].first;
      if (cum >= target) break;
    }
    keep = k;
    *total = cum;
  }
  if (min_p) {
    const float floor = params_.min_p * scratch_[0].first;
    size_t k = 1;
    while (k < keep && scratch_[k].first >= floor) ++k;
    if (k < keep) {
      keep = k;
      *total = mass(keep);
    }
  }
  return keep;
}

int32_t Sampler::Draw(absl::Span<const float> logits) {
  const int32_t n = static_cast<int32_t>(logits.size());
  if (params_.temperature == 0.0f) {  // the first largest (ties -> lower id)
    return static_cast<int32_t>(cpu::ArgmaxRow(Level(), logits.data(), n));
  }
  // Probabilities at temperature T (unnormalized).
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
  const size_t keep = Truncate(logits, &total);
  double u = rng_.Uniform() * total;
  double cum = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    cum += scratch_[i].first;
    if (u < cum) return scratch_[i].second;
  }
  // Rounding at the top end: the last one that could be drawn (never one of
  // probability 0, which a constraint or a bias of -inf excluded).
  size_t last = keep - 1;
  while (last > 0 && scratch_[last].first == 0.0f) --last;
  return scratch_[last].second;
}

SampledToken Sampler::Next(absl::Span<const float> logits) {
  SampledToken out;
  if (Adjusts()) {
    const std::vector<float> adjusted = AdjustedLogits(logits);
    if (constraint_ != nullptr &&
        std::none_of(allowed_.begin(), allowed_.end(), [](uint8_t a) { return a != 0; })) {
      // Nothing may come next (a vocabulary without the bytes the grammar
      // needs): the sequence ends here, on the model's own choice (which
      // the constraint did not allow, so its owner sees an incomplete value).
      out.token = Draw(logits);
      out.ends = true;
    } else {
      out.token = Draw(adjusted);
      if (constraint_ != nullptr) {
        constraint_->Accept(out.token);
        out.ends = constraint_->Done();
      }
    }
  } else {
    out.token = Draw(logits);
  }
  if (params_.repetition_penalty != 1.0f) seen_.insert(out.token);
  if (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) {
    ++output_counts_[out.token];
  }
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
