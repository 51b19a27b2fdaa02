// moe.v1.GenerateRequest <-> serving::Request: the only place the serving
// core's request meets the wire message (gRPC Generate; the OpenAI
// translation fills a GenerateRequest too). Kept out of moe_serving so the
// core does not depend on the protos.
#ifndef MOECACHE_SERVICES_SERVING_REQUEST_PROTO_H_
#define MOECACHE_SERVICES_SERVING_REQUEST_PROTO_H_

#include "moe/v1/inference.pb.h"
#include "services/serving/request.h"

namespace moe::serving {

// Every field copied; `transport` names the fields in errors.
Request FromProto(const v1::GenerateRequest& message, Transport transport);

// REQUIRES: Validate(request, ...).ok() (the numbers fit the message's
// 32-bit fields).
void ToProto(const Request& request, v1::GenerateRequest* message);

}  // namespace moe::serving

#endif  // MOECACHE_SERVICES_SERVING_REQUEST_PROTO_H_
