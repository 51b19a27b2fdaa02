// The gRPC face of moe-cached: moe.v1.ExpertCache. Handlers only translate
// messages and call SessionManager (which validates and does the work);
// statuses become grpc::Status through rpc::ToGrpcStatus only.
//
// Thread-safety: handlers run concurrently on gRPC's threads; the service
// holds no state of its own beyond pointers fixed at construction.
#ifndef MOECACHE_SERVICES_MOE_CACHED_SERVICE_H_
#define MOECACHE_SERVICES_MOE_CACHED_SERVICE_H_

#include <vector>

#include "moe/v1/expert_cache.grpc.pb.h"
#include "services/moe_cached/cached_model.h"
#include "services/moe_cached/sessions.h"

namespace moe::cached {

class ExpertCacheService final : public moe::v1::ExpertCache::Service {
 public:
  // Not owned; must outlive the service.
  ExpertCacheService(SessionManager* sessions, std::vector<CachedModel*> models)
      : sessions_(sessions), models_(std::move(models)) {}

  grpc::Status Attach(grpc::ServerContext*, const moe::v1::AttachRequest* req,
                      moe::v1::AttachResponse* resp) override;
  grpc::Status Detach(grpc::ServerContext*, const moe::v1::DetachRequest* req,
                      moe::v1::DetachResponse* resp) override;
  grpc::Status BeginRequest(grpc::ServerContext*, const moe::v1::BeginRequestRequest* req,
                            moe::v1::BeginRequestResponse* resp) override;
  grpc::Status EndRequest(grpc::ServerContext*, const moe::v1::EndRequestRequest* req,
                          moe::v1::EndRequestResponse* resp) override;
  grpc::Status Acquire(grpc::ServerContext*, const moe::v1::AcquireRequest* req,
                       moe::v1::AcquireResponse* resp) override;
  grpc::Status Release(grpc::ServerContext*, const moe::v1::ReleaseRequest* req,
                       moe::v1::ReleaseResponse* resp) override;
  grpc::Status GetStats(grpc::ServerContext*, const moe::v1::GetStatsRequest* req,
                        moe::v1::GetStatsResponse* resp) override;

 private:
  SessionManager* const sessions_;
  const std::vector<CachedModel*> models_;
};

}  // namespace moe::cached

#endif  // MOECACHE_SERVICES_MOE_CACHED_SERVICE_H_
