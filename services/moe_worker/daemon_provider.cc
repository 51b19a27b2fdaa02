#include "services/moe_worker/daemon_provider.h"

#include "kernels/cuda_module.h"

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace moe::worker {
namespace {

std::string RequestName(uint64_t id) { return absl::StrCat("req-", id); }

}  // namespace

absl::StatusOr<std::unique_ptr<DaemonExpertProvider>>
DaemonExpertProvider::Connect(const MoeModel& model,
                              const client::CacheClientOptions& options) {
  client::CacheClientOptions o = options;
  if (model.backend().Info().is_device) {
    // Experts must be in device memory: map the daemon's CUDA arena (IPC)
    // through the same module the CUDA backend uses.
    absl::StatusOr<const MoeCudaModuleApi*> api = LoadCudaModule();
    if (!api.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("worker computes on a device but the CUDA module is unavailable: ",
                       api.status().message()));
    }
    o.cuda = *api;
  }
  std::unique_ptr<DaemonExpertProvider> p(new DaemonExpertProvider(model, o));
  RETURN_IF_ERROR(p->Attach());
  return p;
}

absl::Status DaemonExpertProvider::Attach() {
  ASSIGN_OR_RETURN(std::unique_ptr<client::CacheClient> client,
                   client::CacheClient::Connect(options_));
  const ModelConfig& c = model_.config();
  if (client->num_layers() != c.num_moe_layers() ||
      client->num_experts() != c.num_experts) {
    return absl::FailedPreconditionError(absl::StrCat(
        "moe-cached's model '", client->model(), "' has ",
        client->num_layers(), " MoE layers x ", client->num_experts(),
        " experts; this worker's model has ", c.num_moe_layers(), " x ",
        c.num_experts));
  }
  const ModelDescription& d = model_.description();
  const std::pair<const char*, TensorRole> roles[] = {
      {"gate", TensorRole::kExpertGate},
      {"up", TensorRole::kExpertUp},
      {"down", TensorRole::kExpertDown}};
  uint64_t* offsets[] = {&offsets_.gate, &offsets_.up, &offsets_.down};
  for (int r = 0; r < 3; ++r) {
    ASSIGN_OR_RETURN(TensorView mine, d.Expert(0, 0, roles[r].second));
    const client::SlotTensor* found = nullptr;
    for (const client::SlotTensor& t : client->layout()) {
      if (t.role == roles[r].first) found = &t;
    }
    if (found == nullptr || found->dtype != mine.dtype ||
        found->nbytes != mine.nbytes ||
        found->offset + found->nbytes > client->slot_bytes()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "moe-cached's expert layout does not match this model for the ",
          roles[r].first, " tensor (dtype or size differ, or missing)"));
    }
    *offsets[r] = found->offset;
  }
  MOE_LOG(INFO) << "attached to moe-cached at " << options_.address
                << " for model '" << client->model() << "': "
                << client->slot_count() << " slots, hot path over "
                << (client->shm_enabled() ? "shared memory" : "gRPC");
  client_ = std::move(client);
  return absl::OkStatus();
}

absl::Status DaemonExpertProvider::EnsureAttached() {
  if (client_ != nullptr) return absl::OkStatus();
  absl::Status s = Attach();
  if (!s.ok()) {
    return absl::UnavailableError(
        absl::StrCat("moe-cached is not reachable: ", s.message()));
  }
  ++reattaches_;
  MOE_LOG(INFO) << "reattached to moe-cached at " << options_.address;
  return absl::OkStatus();
}

absl::Status DaemonExpertProvider::Check(absl::Status status) {
  if (absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status)) {
    MOE_LOG(WARNING) << "moe-cached went away: " << status;
    client_.reset();
    return absl::UnavailableError(
        absl::StrCat("moe-cached went away: ", status.message()));
  }
  return status;
}

absl::Status DaemonExpertProvider::BeginRequest(uint64_t request_id) {
  const bool had_client = client_ != nullptr;
  RETURN_IF_ERROR(EnsureAttached());
  absl::Status s = Check(client_->BeginRequest(RequestName(request_id)));
  if (had_client && absl::IsUnavailable(s)) {
    // The session predates a daemon restart (the worker's health already
    // said SERVING again). Nothing of this request ran: attach afresh once.
    RETURN_IF_ERROR(EnsureAttached());
    s = Check(client_->BeginRequest(RequestName(request_id)));
  }
  return s;
}

absl::Status DaemonExpertProvider::EndRequest(uint64_t request_id) {
  hints_.clear();
  if (client_ == nullptr) return absl::OkStatus();  // nothing to end
  return Check(client_->EndRequest(RequestName(request_id)));
}

void DaemonExpertProvider::Hint(absl::Span<const ExpertHint> hints) {
  std::vector<client::ExpertHint> now;
  now.reserve(hints.size());
  for (const ExpertHint& h : hints) now.push_back({h.moe_layer, h.expert, h.probability});
  // Over shm the hints go at once, so the daemon can prefetch while this
  // layer's attention runs; otherwise they ride on the next Acquire.
  if (client_ != nullptr && client_->shm_enabled() && client_->Hint(now).ok()) return;
  hints_.insert(hints_.end(), now.begin(), now.end());
}

absl::StatusOr<ExpertLease> DaemonExpertProvider::Acquire(
    int moe_layer, absl::Span<const ExpertDemand> demands, bool prefill) {
  RETURN_IF_ERROR(EnsureAttached());
  std::vector<client::ExpertRequest> want;
  want.reserve(demands.size());
  for (const ExpertDemand& d : demands) want.push_back({d.expert, d.tokens});
  absl::StatusOr<client::AcquireReply> reply =
      client_->Acquire(moe_layer, want, prefill, hints_);
  hints_.clear();
  if (!reply.ok()) return Check(reply.status());
  if (reply->leases.size() != demands.size()) {
    client_->Release(reply->leases).IgnoreError();
    return absl::InternalError("moe-cached answered a different expert count");
  }
  ExpertLease lease;
  lease.moe_layer = moe_layer;
  lease.hits = reply->hits;
  lease.misses = reply->misses;
  lease.stall_seconds = reply->stall_seconds;
  const DType dtype = model_.description().expert_dtype();
  for (const client::ExpertLease& l : reply->leases) {
    lease.views.push_back({l.expert, l.data + offsets_.gate,
                           l.data + offsets_.up, l.data + offsets_.down,
                           dtype});
    lease.handles.push_back(l.slot);
    lease.handles.push_back(l.generation);
  }
  return lease;
}

void DaemonExpertProvider::Release(ExpertLease& lease) {
  if (client_ == nullptr || lease.views.empty()) return;  // daemon gone
  std::vector<client::ExpertLease> leases;
  for (size_t i = 0; i < lease.views.size(); ++i) {
    leases.push_back({lease.views[i].expert,
                      static_cast<uint32_t>(lease.handles[2 * i]),
                      lease.handles[2 * i + 1], nullptr});
  }
  absl::Status s = client_->Release(leases);
  if (!s.ok()) MOE_LOG(WARNING) << "releasing experts: " << s;
  lease.views.clear();
  lease.handles.clear();
}

}  // namespace moe::worker
