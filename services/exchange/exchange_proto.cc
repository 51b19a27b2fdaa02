#include "services/exchange/exchange_proto.h"

#include <cmath>

namespace moe {

void ToProto(const ExpertDemand& d, v1::ExpertDemand* out) {
  out->set_expert(d.expert);
  out->set_tokens(d.tokens);
}

void ToProto(const ExpertHint& h, v1::ExpertHint* out) {
  out->set_layer(h.layer);
  out->set_expert(h.expert);
  out->set_probability(h.probability);
}

void ToProto(const SlotLease& l, v1::Lease* out) {
  out->set_layer(l.key.layer);
  out->set_expert(l.key.expert);
  out->set_slot(static_cast<uint32_t>(l.slot));
  out->set_generation(l.generation);
}

void ToProto(const AcquireUsage& u, v1::AcquireResponse* out) {
  out->set_hits(u.hits);
  out->set_misses(u.misses);
  out->set_stall_seconds(u.stall_seconds());
}

ExpertDemand FromProto(const v1::ExpertDemand& d) { return {d.expert(), d.tokens()}; }

ExpertHint FromProto(const v1::ExpertHint& h) {
  return {h.layer(), h.expert(), h.probability(), HintSource::kHint};
}

SlotLease FromProto(const v1::Lease& l) {
  SlotLease out;
  out.key = {l.layer(), l.expert()};
  out.slot = l.slot() > 0x7fffffffu ? -1 : static_cast<SlotId>(l.slot());
  out.generation = l.generation();
  return out;
}

AcquireUsage UsageFromProto(const v1::AcquireResponse& r) {
  AcquireUsage u;
  u.hits = r.hits();
  u.misses = r.misses();
  const double s = r.stall_seconds();
  u.stall_ns = std::isfinite(s) && s > 0 ? static_cast<int64_t>(std::llround(s * 1e9)) : 0;
  return u;
}

}  // namespace moe
