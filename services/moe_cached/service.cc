#include "services/moe_cached/service.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "services/exchange/exchange_proto.h"
#include "services/rpc/rpc_util.h"

namespace moe::cached {
namespace {

using rpc::ToGrpcStatus;

absl::Status CheckLength(int n, const char* what) {
  if (n > kMaxWireItems) {
    return absl::InvalidArgumentError(absl::StrCat("too many ", what, " (", n, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

grpc::Status ExpertCacheService::Attach(grpc::ServerContext*, const moe::v1::AttachRequest* req,
                                        moe::v1::AttachResponse* resp) {
  absl::StatusOr<AttachResult> r =
      sessions_->Attach(req->model(), req->worker_id(), req->pid(), req->host_execution(),
                        req->arena_kind());
  if (!r.ok()) return ToGrpcStatus(r.status());
  const CachedModel& m = *r->model;
  const ExpertStore& store = m.store();
  resp->set_session_id(r->session_id);
  if (const CudaArena* cuda = m.cuda_arena(); cuda != nullptr) {
    resp->set_arena_kind(moe::v1::ARENA_KIND_CUDA_IPC);
    resp->set_cuda_ipc_handle(cuda->ipc_handle());
    resp->set_cuda_device(cuda->device());
  } else {
    resp->set_arena_kind(moe::v1::ARENA_KIND_HOST_SHM);
    resp->set_shm_name(m.arena().name());
  }
  resp->set_arena_bytes(m.arena_bytes());
  resp->set_slot_bytes(store.slot_bytes());
  resp->set_slot_count(static_cast<uint32_t>(m.options().cache.capacity));
  for (int layer = 0; layer < store.num_layers(); ++layer) {
    const ExpertLayerLayout& from = store.layer(layer);
    moe::v1::LayerLayout* to = resp->add_layer_layout();
    to->set_block_bytes(from.block_bytes);
    for (const ExpertTensorLayout& t : from.tensors) {
      moe::v1::TensorLayout* l = to->add_tensors();
      l->set_role(t.role);
      l->set_dtype(std::string(DTypeName(t.dtype)));
      for (int64_t d : t.shape) l->add_shape(d);
      l->set_offset(t.offset);
      l->set_nbytes(t.nbytes);
    }
  }
  resp->set_channel_name(r->channel_name);
  resp->set_miss_mode(MissModeName(m.options().cache.miss_mode));
  resp->set_routing_feeds_prefetch(m.options().cache.prefetch &&
                                   m.options().cache.capacity <
                                       store.num_layers() * store.num_experts());
  if (r->host_execution) resp->set_store_bytes(store.total_bytes());
  resp->set_fd_socket(r->fd_socket);
  resp->set_fd_token(r->fd_token);
  resp->set_num_layers(store.num_layers());
  resp->set_num_experts(store.num_experts());
  resp->set_top_k(store.top_k());
  resp->set_daemon_pid(::getpid());
  resp->set_model(m.name());
  return grpc::Status::OK;
}

grpc::Status ExpertCacheService::Detach(grpc::ServerContext*, const moe::v1::DetachRequest* req,
                                        moe::v1::DetachResponse*) {
  return ToGrpcStatus(sessions_->Detach(req->session_id()));
}

grpc::Status ExpertCacheService::BeginRequest(grpc::ServerContext*,
                                              const moe::v1::BeginRequestRequest* req,
                                              moe::v1::BeginRequestResponse*) {
  return ToGrpcStatus(sessions_->BeginRequest(req->session_id(), req->request()));
}

grpc::Status ExpertCacheService::EndRequest(grpc::ServerContext*,
                                            const moe::v1::EndRequestRequest* req,
                                            moe::v1::EndRequestResponse*) {
  return ToGrpcStatus(sessions_->EndRequest(req->session_id(), req->request()));
}

grpc::Status ExpertCacheService::Acquire(grpc::ServerContext*, const moe::v1::AcquireRequest* req,
                                         moe::v1::AcquireResponse* resp) {
  absl::Status len = CheckLength(req->experts_size(), "experts");
  if (len.ok()) len = CheckLength(req->hints_size(), "hints");
  if (len.ok()) len = CheckLength(req->members_size(), "members");
  for (const moe::v1::MemberDemands& m : req->members()) {
    if (len.ok()) len = CheckLength(m.experts_size(), "member experts");
  }
  if (!len.ok()) return ToGrpcStatus(len);
  const std::vector<ExpertDemand> demands = FromProtoList<ExpertDemand>(req->experts());
  const std::vector<ExpertHint> hints = FromProtoList<ExpertHint>(req->hints());
  const std::vector<MemberDemands> members = FromProtoList<MemberDemands>(req->members());
  absl::StatusOr<AcquireResult> r =
      sessions_->Acquire(req->session_id(), req->request(),
                         {.layer = req->layer(),
                          .demands = demands,
                          .prefill = req->prefill(),
                          .members = members,
                          .hints = hints,
                          .part = WirePart(req->lease_part()),
                          .continues = req->continues()});
  if (!r.ok()) return ToGrpcStatus(r.status());
  ToProto(*r, resp);
  return grpc::Status::OK;
}

grpc::Status ExpertCacheService::Release(grpc::ServerContext*, const moe::v1::ReleaseRequest* req,
                                         moe::v1::ReleaseResponse*) {
  absl::Status len = CheckLength(req->leases_size(), "leases");
  if (!len.ok()) return ToGrpcStatus(len);
  // Slot ids beyond int32 become -1, which SlotTable refuses.
  return ToGrpcStatus(
      sessions_->Release(req->session_id(), FromProtoList<SlotLease>(req->leases())));
}

grpc::Status ExpertCacheService::GetStats(grpc::ServerContext*,
                                          const moe::v1::GetStatsRequest* req,
                                          moe::v1::GetStatsResponse* resp) {
  bool found = false;
  for (CachedModel* m : models_) {
    if (!req->model().empty() && req->model() != m->name()) continue;
    found = true;
    m->SyncMetrics();
    const cache::CachePhaseStats s = TotalStats(m->cache());
    const SessionCounts c = sessions_->Counts(m);
    moe::v1::ModelStats* out = resp->add_models();
    out->set_model(m->name());
    out->set_hits(s.hits);
    out->set_misses(s.misses);
    out->set_prefetch_issued(s.prefetches_issued);
    out->set_prefetch_used(s.prefetches_used);
    out->set_prefetch_wasted(s.prefetches_wasted);
    out->set_host_runs(s.host_runs);
    out->set_miss_mode(MissModeName(m->options().cache.miss_mode));
    out->set_bytes_copied(s.bytes_moved);
    out->set_stall_seconds(m->metrics().stall_seconds());
    out->set_resident_experts(static_cast<uint32_t>(m->ResidentExperts()));
    out->set_capacity_experts(
        static_cast<uint32_t>(m->options().cache.capacity));
    out->set_eamc_entries(static_cast<uint32_t>(m->eamc_entries()));
    out->set_prefetch_stride(m->prefetch_stride());
    out->set_policy(m->cache().policy_name());
    out->set_sessions(c.sessions);
    out->set_leases_held(c.leases_held);
  }
  if (!found) {
    return ToGrpcStatus(
        absl::NotFoundError(absl::StrCat("no model '", ClipName(req->model()), "'")));
  }
  return grpc::Status::OK;
}

}  // namespace moe::cached
