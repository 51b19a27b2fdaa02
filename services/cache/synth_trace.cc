#include "services/cache/synth_trace.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/checked_math.h"
#include "common/status_macros.h"

namespace moe::trace {
namespace {

using Rng = std::mt19937_64;

// Bounds on the options, so that no size overflows and a trace fits memory.
constexpr int kMaxRequests = 1 << 20;
constexpr int kMaxMeanTokens = 1 << 20;
constexpr int kMaxGroups = 1 << 16;
constexpr int64_t kMaxExpertChoices = int64_t{1} << 28;

absl::Status InRange(int v, int lo, int hi, const char* what) {
  if (v >= lo && v <= hi) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(what, " must be in [", lo, ", ", hi, "], got ", v));
}

double Uniform(Rng& rng) {
  return static_cast<double>(rng() >> 11) * (1.0 / 9007199254740992.0);
}

int UniformInt(Rng& rng, int n) {  // [0, n)
  return static_cast<int>(Uniform(rng) * n) % n;
}

// Samples an index from cumulative weights `cdf` (last element = total).
int SampleCdf(Rng& rng, const std::vector<double>& cdf) {
  double u = Uniform(rng) * cdf.back();
  auto it = std::upper_bound(cdf.begin(), cdf.end(), u);
  return static_cast<int>(std::min<size_t>(it - cdf.begin(), cdf.size() - 1));
}

struct Model {
  // Per layer: experts in popularity order and the cumulative Zipf weights.
  std::vector<std::vector<int>> popular;
  std::vector<double> zipf_cdf;
  // Per group, per layer: the core working set (ordered by weight).
  std::vector<std::vector<std::vector<int>>> cores;
  std::vector<double> set_cdf;  // Zipf over working-set ranks
};

std::vector<double> ZipfCdf(int n, double s) {
  std::vector<double> cdf(n);
  double acc = 0;
  for (int i = 0; i < n; ++i) {
    acc += 1.0 / std::pow(i + 1.0, s);
    cdf[i] = acc;
  }
  return cdf;
}

int DefaultWorkingSet(int num_experts) {
  double frac = num_experts <= 16 ? 0.25 : 0.05;
  return std::max(1, static_cast<int>(std::lround(frac * num_experts)));
}

Model BuildModel(const SynthOptions& o, int ws, Rng& rng) {
  Model m;
  m.zipf_cdf = ZipfCdf(o.num_experts, o.popularity_skew);
  m.set_cdf = ZipfCdf(ws, 1.0);
  m.popular.resize(o.num_layers);
  for (int l = 0; l < o.num_layers; ++l) {
    auto& p = m.popular[l];
    p.resize(o.num_experts);
    std::iota(p.begin(), p.end(), 0);
    std::shuffle(p.begin(), p.end(), rng);
  }
  m.cores.resize(o.groups);
  for (int g = 0; g < o.groups; ++g) {
    m.cores[g].resize(o.num_layers);
    for (int l = 0; l < o.num_layers; ++l) {
      auto& core = m.cores[g][l];
      // Rejection sampling; after many repeats (a set of nearly every expert
      // under a steep skew would take practically forever) the rest comes in
      // popularity order.
      std::vector<char> in_core(o.num_experts, 0);
      auto add = [&](int e) {
        if (!in_core[e]) core.push_back(e);
        const bool added = !in_core[e];
        in_core[e] = 1;
        return added;
      };
      int64_t repeats = 0;
      while (static_cast<int>(core.size()) < ws && repeats < 64 * int64_t{ws}) {
        if (!add(m.popular[l][SampleCdf(rng, m.zipf_cdf)])) ++repeats;
      }
      for (int i = 0; static_cast<int>(core.size()) < ws; ++i) add(m.popular[l][i]);
    }
  }
  return m;
}

// Picks `k` distinct experts for one token at one layer. `first` >= 0 forces
// the first choice.
std::vector<int32_t> PickExperts(const Model& m, const std::vector<int>& set, int layer,
                                 int k, int first, double in_set, Rng& rng) {
  std::vector<int32_t> out;
  out.reserve(k);
  auto add = [&](int e) {
    if (std::find(out.begin(), out.end(), e) != out.end()) return false;
    out.push_back(e);
    return true;
  };
  if (first >= 0) add(first);
  int guard = 0;
  while (static_cast<int>(out.size()) < k) {
    int e;
    if (Uniform(rng) < in_set && guard < 64) {
      e = set[SampleCdf(rng, m.set_cdf)];
    } else {
      e = m.popular[layer][SampleCdf(rng, m.zipf_cdf)];
    }
    if (!add(e)) ++guard;
    if (guard > 256) {  // tiny expert counts: fill deterministically
      for (int x = 0; static_cast<int>(out.size()) < k; ++x) add(x);
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<SynthOptions> SynthRegime(const std::string& name) {
  SynthOptions o;
  if (name == "mixtral-uniform") {
    o.model = "mixtral-uniform";
    o.num_layers = 32;
    o.num_experts = 8;
    o.top_k = 2;
    o.requests = 4;
    o.prefill_tokens = 0;
    o.decode_tokens = 150;
    o.popularity_skew = 0;  // no expert favoured across requests
    o.working_set = 4;      // half of a layer, reused ...
    o.in_set = 0.5;         // ... for half the choices
    o.set_noise = 0.5;
    o.repeat = 0.4;         // consecutive tokens share ~half their experts
    return o;
  }
  if (name == "wide-256") {
    o.model = "wide-256";
    o.num_layers = 40;
    o.num_experts = 256;
    o.top_k = 8;
    o.requests = 1;
    o.prefill_tokens = 30;
    o.decode_tokens = 130;
    return o;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown regime \"", name, "\" (mixtral-uniform, wide-256)"));
}

absl::Status ValidateSynthOptions(const SynthOptions& o) {
  TraceHeader h{o.model, o.num_layers, o.num_experts, o.top_k};
  RETURN_IF_ERROR(ValidateHeader(h));
  RETURN_IF_ERROR(InRange(o.requests, 1, kMaxRequests, "requests"));
  RETURN_IF_ERROR(InRange(o.prefill_tokens, 0, kMaxMeanTokens, "prefill_tokens"));
  RETURN_IF_ERROR(InRange(o.decode_tokens, 0, kMaxMeanTokens, "decode_tokens"));
  if (o.prefill_tokens + o.decode_tokens == 0) {
    return absl::InvalidArgumentError("need prefill_tokens + decode_tokens > 0");
  }
  RETURN_IF_ERROR(InRange(o.groups, 1, kMaxGroups, "groups"));
  // The trace's size: each request draws at most 3/2 of each mean, plus one.
  int64_t choices = 0;
  const int64_t tokens = (o.prefill_tokens + o.decode_tokens) * int64_t{3} / 2 + 1;
  if (!CheckedMul(tokens, int64_t{o.requests}, &choices) ||
      !CheckedMul(choices, int64_t{o.num_layers} * o.top_k, &choices) ||
      choices > kMaxExpertChoices) {
    return absl::InvalidArgumentError(absl::StrCat(
        "requests x tokens x num_layers x top_k expert choices exceed ", kMaxExpertChoices));
  }
  if (o.working_set < 0 || o.working_set > o.num_experts) {
    return absl::InvalidArgumentError("working_set must be in [0, num_experts]");
  }
  for (double p : {o.in_set, o.prefill_in_set, o.set_noise, o.repeat, o.layer_affinity,
                   o.stickiness, o.hint_accuracy}) {
    if (!(p >= 0.0 && p <= 1.0)) {
      return absl::InvalidArgumentError("probabilities must be in [0, 1]");
    }
  }
  if (!(o.popularity_skew >= 0.0 && o.popularity_skew <= 4.0)) {
    return absl::InvalidArgumentError("popularity_skew must be in [0, 4]");
  }
  return absl::OkStatus();
}

absl::StatusOr<Trace> GenerateSyntheticTrace(const SynthOptions& o) {
  RETURN_IF_ERROR(ValidateSynthOptions(o));
  Rng rng(o.seed);
  const int ws = o.working_set > 0 ? o.working_set : DefaultWorkingSet(o.num_experts);
  Model m = BuildModel(o, ws, rng);
  Trace trace;
  trace.header = TraceHeader{o.model, o.num_layers, o.num_experts, o.top_k};
  auto draw_len = [&](int mean) {
    if (mean == 0) return 0;
    int lo = std::max(1, mean / 2);
    return lo + UniformInt(rng, std::max(1, mean + 1));
  };
  int group = UniformInt(rng, o.groups);
  for (int r = 0; r < o.requests; ++r) {
    if (r > 0 && Uniform(rng) >= o.stickiness) group = UniformInt(rng, o.groups);
    // The request's working set: the group's core with noisy members.
    std::vector<std::vector<int>> set(o.num_layers);
    for (int l = 0; l < o.num_layers; ++l) {
      set[l] = m.cores[group][l];
      for (int& e : set[l]) {
        if (Uniform(rng) < o.set_noise) {
          int cand = UniformInt(rng, o.num_experts);
          if (std::find(set[l].begin(), set[l].end(), cand) == set[l].end()) e = cand;
        }
      }
    }
    TraceRequest req;
    req.id = absl::StrCat("r", r, "-g", group);
    const int prefill = draw_len(o.prefill_tokens);
    const int decode = std::max(prefill == 0 ? 1 : 0, draw_len(o.decode_tokens));
    std::vector<int> prev_first(o.num_layers, -1);
    for (int t = 0; t < prefill + decode; ++t) {
      const bool is_prefill = t < prefill;
      req.phase.push_back(is_prefill ? Phase::kPrefill : Phase::kDecode);
      const double in_set = is_prefill ? o.prefill_in_set : o.in_set;
      std::vector<std::vector<int32_t>> layers(o.num_layers);
      int prev_rank = -1;
      for (int l = 0; l < o.num_layers; ++l) {
        int first = -1;
        if (!is_prefill && prev_first[l] >= 0 && Uniform(rng) < o.repeat) {
          first = prev_first[l];
        } else if (prev_rank >= 0 && Uniform(rng) < o.layer_affinity) {
          first = set[l][prev_rank];
        }
        layers[l] = PickExperts(m, set[l], l, o.top_k, first, in_set, rng);
        prev_first[l] = layers[l][0];
        auto it = std::find(set[l].begin(), set[l].end(), layers[l][0]);
        prev_rank = it == set[l].end() ? -1 : static_cast<int>(it - set[l].begin());
      }
      if (o.hint_accuracy > 0) {
        std::vector<std::vector<int32_t>> hints(o.num_layers);
        for (int l = 0; l < o.num_layers; ++l) {
          for (int32_t e : layers[l]) {
            hints[l].push_back(Uniform(rng) < o.hint_accuracy
                                   ? e
                                   : UniformInt(rng, o.num_experts));
          }
        }
        req.hints.push_back(std::move(hints));
      }
      req.experts.push_back(std::move(layers));
    }
    RETURN_IF_ERROR(ValidateRequest(trace.header, req));
    trace.requests.push_back(std::move(req));
  }
  return trace;
}

}  // namespace moe::trace
