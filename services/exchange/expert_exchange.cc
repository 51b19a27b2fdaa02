#include "services/exchange/expert_exchange.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace moe {

std::string ExpertKey::ToString() const { return absl::StrCat("L", layer, "/E", expert); }

const char* MissModeName(MissMode mode) {
  switch (mode) {
    case MissMode::kFetch:
      return "fetch";
    case MissMode::kHost:
      return "host";
    case MissMode::kAuto:
      return "auto";
  }
  return "?";
}

absl::Status ParseMissMode(absl::string_view text, MissMode* mode) {
  for (MissMode m : {MissMode::kFetch, MissMode::kHost, MissMode::kAuto}) {
    if (text == MissModeName(m)) {
      *mode = m;
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("miss mode \"", text, "\" is not fetch, host or auto"));
}

absl::Status ValidateDemands(const ExchangeShape& shape, int layer,
                             absl::Span<const ExpertDemand> demands) {
  if (layer < 0 || layer >= shape.num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer ", layer, " out of range [0, ", shape.num_layers, ")"));
  }
  if (demands.empty() || demands.size() > static_cast<size_t>(shape.num_experts)) {
    return absl::InvalidArgumentError(absl::StrCat("an acquire names 1 to ", shape.num_experts,
                                                   " experts, got ", demands.size()));
  }
  // Experts seen in this call, by stamp: no allocation per call (both sides
  // check every acquire, a batched one once per member).
  thread_local std::vector<uint32_t> seen;
  thread_local uint32_t stamp = 0;
  if (seen.size() < static_cast<size_t>(shape.num_experts)) {
    seen.assign(shape.num_experts, 0);
    stamp = 0;
  }
  if (++stamp == 0) {  // wrapped: start the stamps over
    std::fill(seen.begin(), seen.end(), 0);
    stamp = 1;
  }
  for (const ExpertDemand& d : demands) {
    if (d.expert < 0 || d.expert >= shape.num_experts) {
      return absl::InvalidArgumentError(
          absl::StrCat("expert ", d.expert, " out of range [0, ", shape.num_experts, ")"));
    }
    if (std::exchange(seen[d.expert], stamp) == stamp) {
      return absl::InvalidArgumentError(absl::StrCat("expert ", d.expert, " demanded twice"));
    }
    if (d.tokens < 1 || d.tokens > kMaxDemandTokens) {
      return absl::InvalidArgumentError(
          absl::StrCat("expert ", d.expert, ": token count ", d.tokens, " not in [1, 2^24]"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateParts(const ExchangeShape& shape, const AcquireCall& call) {
  if (call.part < 0 || call.part > shape.num_experts) {
    return absl::InvalidArgumentError(absl::StrCat("lease part ", call.part, " out of [0, ",
                                                   shape.num_experts, "]"));
  }
  if (call.continues && (!call.members.empty() || !call.hints.empty() || call.part != 0)) {
    return absl::InvalidArgumentError(
        "a call that continues a layer carries no members, hints or part of its own");
  }
  return absl::OkStatus();
}

absl::Status ValidateMembers(const ExchangeShape& shape, int layer,
                             absl::Span<const ExpertDemand> demands,
                             absl::Span<const MemberDemands> members) {
  if (members.empty() || members.size() > static_cast<size_t>(kMaxRequestsPerSession)) {
    return absl::InvalidArgumentError(absl::StrCat("a batched acquire names 1 to ",
                                                   kMaxRequestsPerSession, " members, got ",
                                                   members.size()));
  }
  absl::flat_hash_map<int32_t, int64_t> left;  // expert -> union tokens not yet claimed
  for (const ExpertDemand& d : demands) left[d.expert] = d.tokens;
  for (size_t i = 0; i < members.size(); ++i) {
    const MemberDemands& m = members[i];
    for (size_t j = 0; j < i; ++j) {  // at most kMaxRequestsPerSession members
      if (members[j].request == m.request) {
        return absl::InvalidArgumentError(
            absl::StrCat("request ", m.request, " is a member of the acquire twice"));
      }
    }
    absl::Status own = ValidateDemands(shape, layer, m.demands);
    if (!own.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("member request ", m.request, ": ", own.message()));
    }
    for (const ExpertDemand& d : m.demands) {
      auto it = left.find(d.expert);
      if (it == left.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "member request ", m.request, " names expert ", d.expert, " outside the acquire"));
      }
      it->second -= d.tokens;
    }
  }
  for (const ExpertDemand& d : demands) {
    if (left[d.expert] != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("expert ", d.expert, ": the members' tokens add up to ",
                       d.tokens - left[d.expert], ", the acquire names ", d.tokens));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateHints(const ExchangeShape& shape, absl::Span<const ExpertHint> hints) {
  if (hints.size() > static_cast<size_t>(kMaxHintsPerCall)) {
    return absl::InvalidArgumentError(
        absl::StrCat("too many hints (", hints.size(), ", at most ", kMaxHintsPerCall, ")"));
  }
  for (const ExpertHint& h : hints) {
    if (h.layer < 0 || h.layer >= shape.num_layers || h.expert < 0 ||
        h.expert >= shape.num_experts) {
      return absl::InvalidArgumentError(
          absl::StrCat("hint for L", h.layer, "/E", h.expert, " out of range"));
    }
    if (!std::isfinite(h.probability) || h.probability < 0 || h.probability > 1) {
      return absl::InvalidArgumentError(absl::StrCat("hint for L", h.layer, "/E", h.expert,
                                                     ": probability not in [0, 1]"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateHostRunReport(const HostRunReport& r) {
  if (r.experts < 1 || r.experts > (1 << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("host-run report of ", r.experts, " experts not in [1, 2^20]"));
  }
  if (r.host_experts < 0 || r.host_experts > r.experts) {
    return absl::InvalidArgumentError(absl::StrCat(
        "host-run report: ", r.host_experts, " host answers of ", r.experts, " experts"));
  }
  if (r.tokens < r.experts || r.tokens > static_cast<int64_t>(r.experts) * kMaxDemandTokens) {
    return absl::InvalidArgumentError(absl::StrCat("host-run report: ", r.tokens,
                                                   " tokens for ", r.experts, " experts"));
  }
  if (r.nanoseconds < 1 || r.nanoseconds > 1000000000000) {
    return absl::InvalidArgumentError(
        absl::StrCat("host-run report: ", r.nanoseconds, " ns not in [1, 10^12]"));
  }
  return absl::OkStatus();
}

int64_t PeerStallNsFromSeconds(double seconds) {
  if (!(seconds > 0)) return 0;  // NaN too
  if (seconds >= static_cast<double>(kMaxPeerStallNs) * 1e-9) return kMaxPeerStallNs;
  return std::min<int64_t>(kMaxPeerStallNs, std::llround(seconds * 1e9));
}

int64_t PeerStallNsFromNs(uint64_t nanoseconds) {
  return static_cast<int64_t>(
      std::min<uint64_t>(nanoseconds, static_cast<uint64_t>(kMaxPeerStallNs)));
}

}  // namespace moe
