#include "services/cache/moe_infinity_policy.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "services/cache/eamc_store.h"

namespace moe::cache {

MoeInfinityOptions MoeInfinityOptions::Improved() {
  MoeInfinityOptions o;
  o.fair_share = true;
  o.lrfu = true;
  o.next_visit = true;
  o.unused_first = true;
  o.confidence = true;
  o.layer_factor = false;
  return o;
}

absl::Status ParseMoeInfinityOptions(const std::string& text, MoeInfinityOptions* o) {
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
    const std::string& k = kv.first;
    const std::string& v = kv.second;
    bool* flag = k == "fair_share"        ? &o->fair_share
                 : k == "lrfu"            ? &o->lrfu
                 : k == "next_visit"      ? &o->next_visit
                 : k == "unused_first"    ? &o->unused_first
                 : k == "confidence"      ? &o->confidence
                 : k == "layer_factor"    ? &o->layer_factor
                 : k == "lazy_prediction" ? &o->lazy_prediction
                                          : nullptr;
    if (flag != nullptr) {
      if (v == "1" || v == "on" || v == "true") {
        *flag = true;
      } else if (v == "0" || v == "off" || v == "false") {
        *flag = false;
      } else {
        return absl::InvalidArgumentError(absl::StrCat("bad boolean for ", k, ": \"", v, "\""));
      }
      continue;
    }
    int* num = k == "match_top_k"             ? &o->match_top_k
               : k == "eamc_capacity"         ? &o->eamc_capacity
               : k == "max_experts_per_layer" ? &o->max_experts_per_layer
               : k == "prefetch_layers"       ? &o->prefetch_layers
                                              : nullptr;
    if (num != nullptr) {
      if (!absl::SimpleAtoi(v, num) || *num < 0 || (*num == 0 && k != "max_experts_per_layer") ||
          (k == "eamc_capacity" && *num > Eamc::kMaxCapacity)) {
        return absl::InvalidArgumentError(absl::StrCat("bad value for ", k, ": \"", v, "\""));
      }
      continue;
    }
    if (k == "query_mass") {
      if (!absl::SimpleAtod(v, &o->query_mass) || !(o->query_mass > 0 && o->query_mass <= 1)) {
        return absl::InvalidArgumentError(absl::StrCat("bad query_mass (0, 1]: \"", v, "\""));
      }
      continue;
    }
    if (k == "half_life") {
      if (!absl::SimpleAtod(v, &o->half_life) || !(o->half_life > 0)) {
        return absl::InvalidArgumentError(absl::StrCat("bad half_life: \"", v, "\""));
      }
      continue;
    }
    return absl::InvalidArgumentError(absl::StrCat("unknown moe-infinity option \"", k, "\""));
  }
  return absl::OkStatus();
}

MoeInfinityPolicy::MoeInfinityPolicy(const MoeInfinityOptions& options, std::string name)
    : options_(options), name_(std::move(name)) {}

void MoeInfinityPolicy::Configure(const PolicyConfig& config) {
  TrackingPolicy::Configure(config);
  PredictorOptions po;
  po.num_layers = config.num_layers;
  po.num_experts = config.num_experts;
  po.eamc_capacity = options_.eamc_capacity;
  po.match_top_k = options_.match_top_k;
  po.query_mass = options_.query_mass;
  po.max_experts_per_layer = options_.max_experts_per_layer > 0 ? options_.max_experts_per_layer
                             : config.num_experts <= 16         ? 0
                                                                : 2 * config.top_k;
  predictor_ = std::make_unique<Predictor>(po);
  decay_per_token_ = std::pow(0.5, 1.0 / options_.half_life);
  requests_.clear();
  reuse_hits_.assign(config.num_layers, 0);
  reuse_total_.assign(config.num_layers, 0);
}

MoeInfinityPolicy::RequestState& MoeInfinityPolicy::State(const RequestOwner& owner) {
  std::unique_ptr<RequestState>& r = requests_[owner];
  if (r == nullptr) {
    r = std::make_unique<RequestState>();
    r->activity = predictor_->NewActivity();
    r->lrfu.assign(cells(), 0);
    r->lrfu_token.assign(cells(), 0);
    r->decode_used.assign(cells(), 0);
    r->last_decode_token.assign(cells(), -10);
    r->prev_decode.assign(config_.num_layers, {});
  }
  return *r;
}

const Predictor::Activity& MoeInfinityPolicy::Prediction(const RequestState& r) const {
  predictor_->Resolve(r.activity);
  return r.activity;
}

void MoeInfinityPolicy::ResolveAll() {
  for (auto& [owner, r] : requests_) predictor_->Resolve(r->activity);
}

const Predictor::Activity* MoeInfinityPolicy::ActivityForTest(const RequestOwner& owner) const {
  auto it = requests_.find(owner);
  return it == requests_.end() ? nullptr : &Prediction(*it->second);
}

void MoeInfinityPolicy::OnBeginRequest(const RequestOwner& owner) {
  requests_.erase(owner);
  State(owner);
}

void MoeInfinityPolicy::OnEndRequest(const RequestOwner& owner) {
  auto it = requests_.find(owner);
  if (it == requests_.end()) return;
  ResolveAll();  // the others' pending matches see the EAMC they were asked of
  predictor_->EndRequest(it->second->activity);
  requests_.erase(it);
}

void MoeInfinityPolicy::OnBeginIteration(const RequestOwner& owner, Phase phase) {
  RequestState& r = State(owner);
  ++r.token;
  if (options_.lazy_prediction) {
    predictor_->Prepare(r.activity, phase);
  } else {
    predictor_->Refresh(r.activity, phase);
  }
}

void MoeInfinityPolicy::OnRoute(const RequestOwner& owner, int layer, Phase phase,
                                absl::Span<const ExpertDemand> demands) {
  RequestState& r = State(owner);
  double total_tokens = 0;
  for (const auto& d : demands) total_tokens += d.tokens;
  const double tokens_in_pass = std::max(1.0, total_tokens / config_.top_k);
  for (const auto& d : demands) {
    const int cell = layer * config_.num_experts + d.expert;
    predictor_->Record(r.activity, layer, d.expert, static_cast<float>(d.tokens), phase);
    const double w = phase == Phase::kDecode ? 1.0 : d.tokens / tokens_in_pass;
    r.lrfu[cell] = Lrfu(r, cell) + w;
    r.lrfu_token[cell] = r.token;
    if (phase == Phase::kDecode) {
      r.decode_used[cell] = 1;
      r.last_decode_token[cell] = r.token;
    }
  }
  if (phase != Phase::kDecode) return;
  auto& prev = r.prev_decode[layer];
  for (int32_t e : prev) {
    reuse_total_[layer] += 1;
    for (const auto& d : demands) {
      if (d.expert == e) {
        reuse_hits_[layer] += 1;
        break;
      }
    }
  }
  prev.clear();
  for (const auto& d : demands) prev.push_back(d.expert);
}

double MoeInfinityPolicy::Lrfu(const RequestState& r, int cell) const {
  return r.lrfu[cell] * std::pow(decay_per_token_, static_cast<double>(r.token - r.lrfu_token[cell]));
}

double MoeInfinityPolicy::Value(const RequestState& r, const ExpertKey& key) const {
  const int cell = Index(key);
  double f = 0;
  if (options_.lrfu) f = std::min(1.0, Lrfu(r, cell) * (1.0 - decay_per_token_));
  double c = 0, pred = 0;
  const Predictor::Activity& a = Prediction(r);
  if (a.has_prediction) {
    c = options_.confidence ? a.confidence : 1.0;
    pred = std::min(1.0, static_cast<double>(a.Predicted(key.layer, key.expert)) * config_.top_k);
  }
  double v = (1.0 - c) * f + c * pred;
  if (options_.next_visit && r.last_decode_token[cell] >= r.token - 1) {
    // A small bonus: the learned chance of reuse at this layer's next token.
    const double p = (reuse_hits_[key.layer] + 1.0) / (reuse_total_[key.layer] + 2.0);
    v += 0.25 * p;
  }
  return v;
}

double MoeInfinityPolicy::BestValue(const ExpertKey& key) const {
  double v = 0;
  for (const auto& [owner, r] : requests_) v = std::max(v, Value(*r, key));
  if (options_.layer_factor) v *= 1.0 - static_cast<double>(key.layer) / config_.num_layers;
  return v;
}

double MoeInfinityPolicy::PaperPriority(const ExpertKey& key) const {
  double p = 0;
  for (const auto& [owner, r] : requests_) {
    const Predictor::Activity& a = Prediction(*r);
    if (a.has_prediction) {
      p = std::max(p, static_cast<double>(a.Predicted(key.layer, key.expert)));  // rows sum to 1
    } else {
      // Nothing matched yet: the request's own activations stand in.
      const Eam& own = a.decode.empty() ? a.prefill : a.decode;
      p = std::max(p, static_cast<double>(own.at(key.layer, key.expert)));
    }
  }
  return (p + options_.eps) * (1.0 - static_cast<double>(key.layer) / config_.num_layers);
}

size_t MoeInfinityPolicy::ChooseVictim(absl::Span<const ExpertKey> candidates,
                                       const VictimContext& context) {
  const int layer = options_.fair_share ? FairShareLayer(candidates, context.layer) : -1;
  const bool paper = !options_.fair_share && !options_.lrfu && !options_.next_visit &&
                     !options_.unused_first && !options_.confidence;
  if (paper) {
    return ArgMin(candidates, layer, [&](const ExpertKey& k) { return PaperPriority(k); });
  }
  const bool tiers = options_.unused_first && context.phase == Phase::kDecode;
  size_t pick = ArgMin(candidates, layer, [&](const ExpertKey& k) {
    double v = BestValue(k);
    if (tiers) {
      for (const auto& [owner, r] : requests_) {
        if (r->decode_used[Index(k)]) {
          v += 2.0;
          break;
        }
      }
    }
    return v;
  });
  return pick < candidates.size() ? pick : 0;
}

double MoeInfinityPolicy::RetentionValue(const ExpertKey& key) const {
  return std::clamp(BestValue(key), 0.0, 1.0);
}

void MoeInfinityPolicy::ProposePrefetch(const RequestOwner& owner, int routed_layer,
                                        std::vector<ExpertHint>* out) {
  auto it = requests_.find(owner);
  if (it == requests_.end()) return;
  const Predictor::Activity& a = Prediction(*it->second);
  if (!a.has_prediction) return;
  const int L = config_.num_layers;
  const double c = options_.confidence ? a.confidence : 1.0;
  for (int d = 1; d <= options_.prefetch_layers && routed_layer + d < L; ++d) {
    const int layer = routed_layer + d;
    const double w = 1.0 - static_cast<double>(d) / L;
    int best[2] = {-1, -1};
    for (int e = 0; e < config_.num_experts; ++e) {
      const float p = a.Predicted(layer, e);
      if (p <= 0) continue;
      if (best[0] < 0 || p > a.Predicted(layer, best[0])) {
        best[1] = best[0];
        best[0] = e;
      } else if (best[1] < 0 || p > a.Predicted(layer, best[1])) {
        best[1] = e;
      }
    }
    for (int e : best) {
      if (e < 0) continue;
      const double p = std::min(1.0, static_cast<double>(a.Predicted(layer, e)) * config_.top_k);
      out->push_back({layer, e, static_cast<float>(p * w * c), HintSource::kPolicy});
    }
  }
}

void MoeInfinityPolicy::ExportLearned(LearnedState* state) const {
  state->records = predictor_->eamc().records();
  state->reuse_hits = reuse_hits_;
  state->reuse_total = reuse_total_;
}

void MoeInfinityPolicy::ImportLearned(const LearnedState& state) {
  ResolveAll();
  Eamc& eamc = predictor_->eamc();
  eamc.Clear();
  for (const EamcRecord& r : state.records) eamc.AddRecord(r);
  if (state.reuse_hits.size() == reuse_hits_.size() &&
      state.reuse_total.size() == reuse_total_.size()) {
    reuse_hits_ = state.reuse_hits;
    reuse_total_ = state.reuse_total;
  }
}

}  // namespace moe::cache
