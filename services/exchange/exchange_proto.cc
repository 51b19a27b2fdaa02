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

void ToProto(const MemberDemands& m, v1::MemberDemands* out) {
  out->set_request(m.request);
  out->set_prefill(m.prefill);
  ToProtoList<ExpertDemand>(m.demands, out->mutable_experts());
}

void ToProto(const AcquireResult& r, v1::AcquireResponse* out) {
  ToProtoList<SlotLease>(r.leases, out->mutable_leases());
  for (const ExpertKey& k : r.host) out->add_host_experts(k.expert);
  out->set_hits(r.usage.hits);
  out->set_misses(r.usage.misses);
  out->set_stall_seconds(r.usage.stall_seconds());
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

MemberDemands FromProto(const v1::MemberDemands& m) {
  MemberDemands out;
  out.request = m.request();
  out.prefill = m.prefill();
  out.demands = FromProtoList<ExpertDemand>(m.experts());
  return out;
}

AcquireResult AcquireResultFromProto(const v1::AcquireResponse& r, int layer) {
  AcquireResult out;
  out.leases = FromProtoList<SlotLease>(r.leases());
  for (int32_t e : r.host_experts()) out.host.push_back({layer, e});
  out.usage.hits = r.hits();
  out.usage.misses = r.misses();
  out.usage.host = r.host_experts_size();
  out.usage.stall_ns = PeerStallNsFromSeconds(r.stall_seconds());
  return out;
}

}  // namespace moe
