#include "services/cache/prefetcher.h"

#include <algorithm>

namespace moe::cache {

double ChunkWaitSeconds(uint64_t chunk_bytes, uint64_t expert_bytes,
                        double link_bytes_per_sec) {
  if (!(link_bytes_per_sec > 0)) return 0.0;
  return static_cast<double>(std::min(chunk_bytes, expert_bytes)) /
         link_bytes_per_sec;
}

Prefetcher::Prefetcher(const PrefetcherOptions& o)
    : options_(o),
      max_lag_(std::max(
          1, std::min(o.num_experts > 64 ? 1 : o.max_lag, o.num_layers - 1))) {
  const size_t e = o.num_experts;
  aff_.assign(static_cast<size_t>(max_lag_) * o.num_layers * e * e, 0.0f);
  aff_from_.assign(static_cast<size_t>(max_lag_) * o.num_layers * e, 0.0f);
}

size_t Prefetcher::AffIndex(int lag, int layer, int a, int b) const {
  const size_t e = options_.num_experts;
  return ((static_cast<size_t>(lag - 1) * options_.num_layers + layer) * e +
          a) *
             e +
         b;
}

Prefetcher::OwnerState& Prefetcher::State(const RequestOwner& owner) {
  OwnerState& s = owners_[owner];
  if (s.routed.empty()) {
    s.routed.resize(options_.num_layers);
    s.hints.resize(options_.num_layers);
  }
  return s;
}

void Prefetcher::BeginIteration(const RequestOwner& owner, Phase phase) {
  for (auto& r : State(owner).routed) r.clear();
}

void Prefetcher::OnRoute(const RequestOwner& owner, int layer, Phase phase,
                         absl::Span<const ExpertDemand> demands) {
  OwnerState& s = State(owner);
  auto& routed = s.routed[layer];
  routed.clear();
  for (const auto& d : demands) routed.push_back(d.expert);
  for (int32_t h : s.hints[layer]) {
    hint_total_ += 1;
    if (std::find(routed.begin(), routed.end(), h) != routed.end())
      hint_hits_ += 1;
  }
  s.hints[layer].clear();  // consumed
  if (phase != Phase::kDecode) return;
  const size_t e = options_.num_experts;
  for (int lag = 1; lag <= max_lag_ && layer - lag >= 0; ++lag) {
    const int from = layer - lag;
    for (int32_t a : s.routed[from]) {
      aff_from_[(static_cast<size_t>(lag - 1) * options_.num_layers + from) *
                    e +
                a] += 1;
      for (int32_t b : routed) aff_[AffIndex(lag, from, a, b)] += 1;
    }
  }
}

void Prefetcher::AddHint(const RequestOwner& owner, const ExpertHint& hint) {
  State(owner).hints[hint.layer].push_back(hint.expert);
}

std::vector<ExpertHint> Prefetcher::Candidates(
    const RequestOwner& owner, int target, const std::vector<ExpertHint>& proposals) const {
  auto it = owners_.find(owner);
  const OwnerState* s = it == owners_.end() ? nullptr : &it->second;
  const size_t e = options_.num_experts;
  std::vector<ExpertHint> best(e);
  for (size_t b = 0; b < e; ++b)
    best[b] = {target, static_cast<int32_t>(b), 0.0f, HintSource::kPolicy};
  auto offer = [&](int32_t b, float p, HintSource src) {
    if (p > best[b].probability) {
      best[b].probability = p;
      best[b].source = src;
    }
  };
  const float hp = static_cast<float>(hint_precision());
  if (s != nullptr) {
    for (int32_t h : s->hints[target]) offer(h, hp, HintSource::kHint);
  }
  for (int lag = 1; s != nullptr && lag <= max_lag_ && target - lag >= 0; ++lag) {
    const int from = target - lag;
    for (int32_t a : s->routed[from]) {
      const float n = aff_from_
          [(static_cast<size_t>(lag - 1) * options_.num_layers + from) * e + a];
      if (n < 4) continue;  // too little evidence
      for (size_t b = 0; b < e; ++b) {
        offer(static_cast<int32_t>(b),
              Affinity(lag, from, a, static_cast<int>(b)) / n,
              HintSource::kAffinity);
      }
    }
    if (!s->routed[from].empty()) break;  // the closest routed layer only
  }
  for (const ExpertHint& h : proposals) {
    if (h.layer == target) offer(h.expert, h.probability, HintSource::kPolicy);
  }
  std::vector<ExpertHint> out;
  for (const ExpertHint& h : best) {
    if (h.probability > 0) out.push_back(h);
  }
  std::sort(out.begin(), out.end(), [](const ExpertHint& x, const ExpertHint& y) {
    return x.probability != y.probability ? x.probability > y.probability
                                          : x.expert < y.expert;
  });
  return out;
}

double Prefetcher::accuracy_scale(HintSource source) const {
  // Hints carry their measured precision already (hint_precision()).
  if (source == HintSource::kHint) return 1.0;
  const int s = static_cast<int>(source);
  // Prior: one unit of predicted probability, used.
  return std::clamp((used_[s] + 1.0) / (predicted_sum_[s] + 1.0), 0.0, 1.5);
}

double Prefetcher::Calibrated(const ExpertHint& c) const {
  return std::clamp(c.probability * accuracy_scale(c.source), 0.0, 1.0);
}

bool Prefetcher::Gate(const ExpertHint& candidate, double victim_value) const {
  if (!options_.gate) return candidate.probability > 0;
  const double p = Calibrated(candidate);
  const double x = options_.transfer_seconds;
  const double t = layer_seconds();
  return p * std::min(x, t) >
         (1.0 - p) * victim_value * x + options_.chunk_seconds;
}

void Prefetcher::ObserveLayerSeconds(double seconds) {
  if (options_.layer_seconds > 0 || !(seconds >= 0)) return;
  layer_ewma_ = layer_samples_++ == 0
                    ? seconds
                    : layer_ewma_ + kLayerEwmaWeight * (seconds - layer_ewma_);
}

void Prefetcher::OnIssued(const ExpertHint& c) {
  predicted_sum_[static_cast<int>(c.source)] += c.probability;
}

void Prefetcher::OnOutcome(HintSource source, bool used) {
  used_[static_cast<int>(source)] += used ? 1 : 0;
}

void Prefetcher::ExportLearned(LearnedState* state) const {
  state->affinity_lags = max_lag_;
  state->affinity = aff_;
  state->affinity_from = aff_from_;
}

void Prefetcher::ImportLearned(const LearnedState& state) {
  if (state.affinity.empty()) return;
  const int lags = std::min(max_lag_, state.affinity_lags);
  // Layout [lag-1][...]: the first `lags` lags are a prefix of both arrays.
  const size_t from =
      static_cast<size_t>(lags) * options_.num_layers * options_.num_experts;
  if (state.affinity_from.size() < from ||
      state.affinity.size() < from * options_.num_experts) {
    return;
  }
  std::copy(state.affinity.begin(),
            state.affinity.begin() + from * options_.num_experts, aff_.begin());
  std::copy(state.affinity_from.begin(), state.affinity_from.begin() + from,
            aff_from_.begin());
}

}  // namespace moe::cache
