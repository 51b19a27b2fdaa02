// The one converter between the exchange vocabulary (expert_exchange.h) and
// the gRPC messages of moe.v1.ExpertCache. Conversion only: FromProto does
// not validate (SessionManager does, once), except that values a C++ type
// cannot hold become values the validator refuses (a slot id beyond int32
// becomes -1).
#ifndef MOECACHE_SERVICES_EXCHANGE_EXCHANGE_PROTO_H_
#define MOECACHE_SERVICES_EXCHANGE_EXCHANGE_PROTO_H_

#include <vector>

#include "google/protobuf/repeated_field.h"
#include "moe/v1/expert_cache.pb.h"
#include "services/exchange/expert_exchange.h"

namespace moe {

void ToProto(const ExpertDemand& d, v1::ExpertDemand* out);
void ToProto(const ExpertHint& h, v1::ExpertHint* out);
void ToProto(const SlotLease& l, v1::Lease* out);
void ToProto(const MemberDemands& m, v1::MemberDemands* out);
// A whole answer (leases, host experts, usage).
void ToProto(const AcquireResult& r, v1::AcquireResponse* out);

ExpertDemand FromProto(const v1::ExpertDemand& d);
// Hints from the wire are the worker's own predictions (HintSource::kHint).
ExpertHint FromProto(const v1::ExpertHint& h);
SlotLease FromProto(const v1::Lease& l);
MemberDemands FromProto(const v1::MemberDemands& m);
// The answer to an acquire of `layer`.
AcquireResult AcquireResultFromProto(const v1::AcquireResponse& r, int layer);

// Whole repeated fields.
template <typename T, typename P>
std::vector<T> FromProtoList(const google::protobuf::RepeatedPtrField<P>& items) {
  std::vector<T> out;
  out.reserve(items.size());
  for (const P& p : items) out.push_back(FromProto(p));
  return out;
}
template <typename T, typename P>
void ToProtoList(absl::Span<const T> items, google::protobuf::RepeatedPtrField<P>* out) {
  out->Reserve(static_cast<int>(items.size()));
  for (const T& t : items) ToProto(t, out->Add());
}

}  // namespace moe

#endif  // MOECACHE_SERVICES_EXCHANGE_EXCHANGE_PROTO_H_
