#include "services/moe_worker/daemon_provider.h"

#include "kernels/backend.h"
#include "kernels/device_memory.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/quant.h"
#include "common/row_interleave.h"
#include "common/status_macros.h"

namespace moe::worker {

absl::StatusOr<std::unique_ptr<DaemonExpertProvider>>
DaemonExpertProvider::Connect(const MoeModel& model,
                              const client::CacheClientOptions& options) {
  client::CacheClientOptions o = options;
  if (model.backend().Info().is_device) {
    // Experts must be in device memory: map the daemon's CUDA arena (IPC)
    // through the same module the CUDA backend uses.
    absl::StatusOr<std::unique_ptr<DeviceMemory>> memory = CreateDeviceMemory("cuda");
    if (!memory.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("worker computes on a device but the CUDA module is unavailable: ",
                       memory.status().message()));
    }
    o.cuda = std::move(*memory);
  } else {
    // A CPU backend computes from host memory anyway: a miss the daemon
    // answers "run on host" costs no copy, and the same kernel on the same
    // bytes gives the same bits.
    o.host_execution = true;
  }
  std::unique_ptr<DaemonExpertProvider> p(new DaemonExpertProvider(model, o));
  if (model.backend().Info().is_device && o.host_execution) {
    ASSIGN_OR_RETURN(p->host_backend_, CreateBackend("cpu"));
  }
  RETURN_IF_ERROR(p->Attach());
  return p;
}

namespace {

// [offset, offset + nbytes) inside a slot of `slot_bytes`, without forming
// offset + nbytes (the daemon's offset could be near 2^64 and wrap).
bool FitsInSlot(uint64_t offset, uint64_t nbytes, uint64_t slot_bytes) {
  return offset <= slot_bytes && nbytes <= slot_bytes - offset;
}

}  // namespace

absl::Status CheckSlotTensor(const client::SlotTensor& t, const TensorView& mine,
                             const char* role, uint64_t slot_bytes) {
  const bool known = t.dtype == mine.dtype || IsFloatDType(t.dtype) || IsQuantDType(t.dtype);
  const int64_t want = known && mine.shape.size() == 2
                           ? WeightBytes(t.dtype, mine.shape[0], mine.shape[1])
                           : -1;
  if (!known || t.shape != mine.shape || want < 0 ||
      t.nbytes != static_cast<uint64_t>(want) || !FitsInSlot(t.offset, t.nbytes, slot_bytes)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "moe-cached's expert layout does not match this model for the ", role,
        " tensor: it holds ", DTypeName(t.dtype), " [", absl::StrJoin(t.shape, ", "),
        "] in ", t.nbytes, " bytes; this model's is ", DTypeName(mine.dtype), " [",
        absl::StrJoin(mine.shape, ", "), "]"));
  }
  return absl::OkStatus();
}

absl::Status CheckBackendRunsFormat(const BackendInfo& backend, DType format) {
  const bool runs = IsFloatDType(format) ||
                    (format == DType::kQ8 && backend.supports_q8) ||
                    (format == DType::kQ4 && backend.supports_q4) ||
                    (format == DType::kMxfp4 && backend.supports_mxfp4) ||
                    (IsGgufBlockDType(format) && backend.supports_gguf_blocks) ||
                    (RowMajorOf(format) != format && backend.supports_rows16);
  if (runs) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "moe-cached holds the experts as ", ExpertFormatName(format), " but this worker's ",
      backend.name, " backend has no ", ExpertFormatName(format),
      " kernels; restart moe-cached with --expert-format bf16, or run the worker with a "
      "backend that has them (--backend cpu runs bf16, q8, q4 and mxfp4)"));
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
  std::vector<LayerSlots> layers(static_cast<size_t>(c.num_moe_layers()));
  for (int l = 0; l < c.num_moe_layers(); ++l) {
    const client::SlotLayout& layout = client->layout(l);
    LayerSlots& mine_l = layers[static_cast<size_t>(l)];
    uint64_t* offsets[] = {&mine_l.offsets.gate, &mine_l.offsets.up, &mine_l.offsets.down};
    DType* dtypes[] = {&mine_l.dtypes.gate, &mine_l.dtypes.up, &mine_l.dtypes.down};
    for (int r = 0; r < 3; ++r) {
      ASSIGN_OR_RETURN(TensorView mine, d.Expert(l, 0, roles[r].second));
      const client::SlotTensor* found = nullptr;
      for (const client::SlotTensor& t : layout.tensors) {
        if (t.role == roles[r].first) found = &t;
      }
      if (found == nullptr) {
        return absl::FailedPreconditionError(absl::StrCat(
            "moe-cached's expert layout of MoE layer ", l, " has no ", roles[r].first,
            " tensor"));
      }
      RETURN_IF_ERROR(CheckSlotTensor(*found, mine, roles[r].first, layout.block_bytes));
      RETURN_IF_ERROR(CheckBackendRunsFormat(model_.backend().Info(), found->dtype));
      *dtypes[r] = found->dtype;
      *offsets[r] = found->offset;
    }
    RETURN_IF_ERROR(FindBiasOffsets(layout, &mine_l.offsets));
  }
  std::vector<ExpertDTypes> formats;
  for (const LayerSlots& l : layers) formats.push_back(l.dtypes);
  MOE_LOG(INFO) << "attached to moe-cached at " << options_.address
                << " for model '" << client->model() << "': "
                << client->slot_count() << " slots of "
                << ExpertFormatsName(formats) << " experts, hot path over "
                << (client->shm_enabled() ? "shared memory" : "gRPC")
                << (client->host_execution() ? "; misses may run here from its host copy" : "");
  layers_ = std::move(layers);
  client_ = std::move(client);
  return absl::OkStatus();
}

absl::Status DaemonExpertProvider::FindBiasOffsets(const client::SlotLayout& layout,
                                                   RoleOffsets* out) {
  const ModelConfig& c = model_.config();
  has_biases_ = c.has_expert_biases();
  if (!has_biases_) return absl::OkStatus();
  const std::pair<const char*, int64_t> want[] = {{"gate_bias", c.moe_intermediate_size},
                                                  {"up_bias", c.moe_intermediate_size},
                                                  {"down_bias", c.hidden_size}};
  uint64_t* offsets[] = {&out->gate_bias, &out->up_bias, &out->down_bias};
  for (int r = 0; r < 3; ++r) {
    const client::SlotTensor* found = nullptr;
    for (const client::SlotTensor& t : layout.tensors) {
      if (t.role == want[r].first) found = &t;
    }
    const uint64_t nbytes = sizeof(float) * static_cast<uint64_t>(want[r].second);
    if (found == nullptr || found->dtype != DType::kF32 ||
        found->shape != std::vector<int64_t>{want[r].second} || found->nbytes != nbytes ||
        !FitsInSlot(found->offset, nbytes, layout.block_bytes) ||
        found->offset % sizeof(float) != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "moe-cached's expert layout has no F32 ", want[r].first, " [", want[r].second,
          "] tensor, which this model's experts carry"));
    }
    *offsets[r] = found->offset;
  }
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

absl::Status DaemonExpertProvider::SetHostOnly(bool on) {
  if (!on) {
    if (host_only_ && client_ != nullptr && unreported_.experts > 0) {
      absl::Status s = client_->ReportHostRuns(unreported_);
      if (!s.ok()) MOE_LOG(WARNING) << "reporting host runs: " << s;
    }
    unreported_ = HostRunReport{};
    host_only_ = false;
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(EnsureAttached());
  if (!client_->host_execution() || host_backend_ != nullptr) {
    return absl::FailedPreconditionError(
        "host-only acquires need moe-cached's host copy and a CPU worker");
  }
  host_only_ = true;
  return absl::OkStatus();
}

absl::Status DaemonExpertProvider::BeginRequest(uint64_t request_id) {
  if (host_only_) return absl::OkStatus();
  const bool had_client = client_ != nullptr;
  RETURN_IF_ERROR(EnsureAttached());
  absl::Status s = Check(client_->BeginRequest(request_id));
  if (had_client && absl::IsUnavailable(s)) {
    // The session predates a daemon restart (the worker's health already
    // said SERVING again). Nothing of this request ran: attach afresh once.
    RETURN_IF_ERROR(EnsureAttached());
    s = Check(client_->BeginRequest(request_id));
  }
  return s;
}

absl::Status DaemonExpertProvider::EndRequest(uint64_t request_id) {
  hints_.clear();
  if (host_only_) return absl::OkStatus();
  if (client_ == nullptr) return absl::OkStatus();  // nothing to end
  return Check(client_->EndRequest(request_id));
}

void DaemonExpertProvider::Hint(absl::Span<const ExpertHint> hints) {
  if (host_only_) return;
  // Over shm the hints go at once, so the daemon can prefetch while this
  // layer's attention runs; otherwise they ride on the next Acquire.
  if (client_ != nullptr && client_->shm_enabled() && client_->Hint(hints).ok()) return;
  hints_.insert(hints_.end(), hints.begin(), hints.end());
}

void DaemonExpertProvider::HintFor(uint64_t request, absl::Span<const ExpertHint> hints) {
  if (client_ != nullptr && client_->shm_enabled()) client_->SetCurrentRequest(request);
  Hint(hints);
}

absl::StatusOr<AcquiredExperts> DaemonExpertProvider::Acquire(
    int moe_layer, absl::Span<const ExpertDemand> demands, bool prefill) {
  open_lead_ = 0;
  return AcquireFor(moe_layer, demands, {}, prefill, /*continues=*/false);
}

absl::StatusOr<AcquiredExperts> DaemonExpertProvider::AcquireRest(
    int moe_layer, absl::Span<const ExpertDemand> rest, bool prefill) {
  RETURN_IF_ERROR(EnsureAttached());
  if (host_only_) return AcquireOnHost(moe_layer, rest);
  if (lease_part_ <= 0) return absl::FailedPreconditionError("no layer is being leased in parts");
  if (open_lead_ != 0) client_->SetCurrentRequest(open_lead_);
  return AcquireFor(moe_layer, rest, {}, prefill, /*continues=*/true);
}

absl::StatusOr<AcquiredExperts> DaemonExpertProvider::AcquireFor(
    int moe_layer, absl::Span<const ExpertDemand> demands,
    absl::Span<const MemberDemands> members, bool prefill, bool continues) {
  RETURN_IF_ERROR(EnsureAttached());
  if (host_only_) return AcquireOnHost(moe_layer, demands);
  AcquireCall call{.layer = moe_layer, .demands = demands, .prefill = prefill};
  if (continues) {  // the next part: no members, hints or part of its own
    call.continues = true;
  } else {
    call.members = members;
    call.hints = hints_;
    call.part = lease_part_;
  }
  absl::StatusOr<AcquireResult> reply = client_->Acquire(call);
  if (!continues) hints_.clear();
  if (!reply.ok()) return Check(reply.status());
  // All of the call's demands, or (a layer in parts) a prefix of them.
  const size_t answered = reply->leases.size() + reply->host.size();
  if (answered == 0 || answered > demands.size() ||
      (lease_part_ == 0 && answered != demands.size())) {
    client_->Release(reply->leases).IgnoreError();
    return absl::InternalError("moe-cached answered a different expert count");
  }
  demands = demands.first(answered);
  AcquiredExperts out;
  out.moe_layer = moe_layer;
  out.usage = reply->usage;
  // Leases and host answers each keep demand order: merge them back.
  size_t li = 0, hi = 0;
  for (const ExpertDemand& d : demands) {
    const uint8_t* data = nullptr;
    bool on_host = false;
    if (li < reply->leases.size() && reply->leases[li].key.expert == d.expert) {
      data = client_->SlotData(reply->leases[li++].slot);
    } else if (hi < reply->host.size() && reply->host[hi].expert == d.expert) {
      data = client_->HostData(reply->host[hi++]);  // run where it lies
      on_host = true;
    } else {
      client_->Release(reply->leases).IgnoreError();
      return absl::InternalError(
          absl::StrCat("moe-cached did not answer expert ", d.expert, " in demand order"));
    }
    out.views.push_back(ViewOf(data, moe_layer, d.expert, on_host));
  }
  out.leases = std::move(reply->leases);
  if (!reply->host.empty()) out.host_backend = host_backend_.get();  // null on the CPU
  // A CPU worker's expert time is all host time: reported for the cost model.
  if (client_->host_execution() && host_backend_ == nullptr) {
    StartComputing(demands, static_cast<int32_t>(reply->host.size()));
  }
  return out;
}

ExpertView DaemonExpertProvider::ViewOf(const uint8_t* data, int moe_layer, int expert,
                                        bool on_host) const {
  const LayerSlots& l = layers_[static_cast<size_t>(moe_layer)];
  ExpertView view{expert, data + l.offsets.gate, data + l.offsets.up, data + l.offsets.down,
                  l.dtypes};
  view.on_host = on_host;
  if (has_biases_) {
    view.gate_bias = reinterpret_cast<const float*>(data + l.offsets.gate_bias);
    view.up_bias = reinterpret_cast<const float*>(data + l.offsets.up_bias);
    view.down_bias = reinterpret_cast<const float*>(data + l.offsets.down_bias);
  }
  return view;
}

void DaemonExpertProvider::StartComputing(absl::Span<const ExpertDemand> demands,
                                          int32_t host_experts) {
  computing_ = HostRunReport{static_cast<int32_t>(demands.size()), host_experts, 0, 0};
  for (const ExpertDemand& d : demands) computing_.tokens += d.tokens;
  answered_ns_ = absl::GetCurrentTimeNanos();
}

AcquiredExperts DaemonExpertProvider::AcquireOnHost(int moe_layer,
                                                    absl::Span<const ExpertDemand> demands) {
  AcquiredExperts out;
  out.moe_layer = moe_layer;
  for (const ExpertDemand& d : demands) {
    out.views.push_back(ViewOf(client_->HostData(ExpertKey{moe_layer, d.expert}), moe_layer,
                               d.expert, /*on_host=*/true));
  }
  out.usage.misses = out.usage.host = static_cast<int32_t>(demands.size());
  StartComputing(demands, static_cast<int32_t>(demands.size()));
  return out;
}

absl::StatusOr<AcquiredExperts> DaemonExpertProvider::AcquireBatch(
    int moe_layer, absl::Span<const ExpertDemand> demands, absl::Span<const MemberDemands> members,
    bool prefill) {
  RETURN_IF_ERROR(EnsureAttached());
  const MemberDemands* lead = nullptr;
  int64_t lead_tokens = 0;
  for (const MemberDemands& m : members) {
    const int64_t n = m.tokens();
    if (lead == nullptr || n > lead_tokens) {
      lead = &m;
      lead_tokens = n;
    }
  }
  if (lead != nullptr) client_->SetCurrentRequest(lead->request);
  open_lead_ = lead != nullptr ? lead->request : 0;
  // A batch of one is that request's own acquire: no member rows to send.
  return AcquireFor(moe_layer, demands,
                    members.size() > 1 ? members : absl::Span<const MemberDemands>(), prefill,
                    /*continues=*/false);
}

void DaemonExpertProvider::Release(AcquiredExperts& acquired) {
  if (client_ != nullptr && computing_.experts > 0) {
    unreported_.experts += computing_.experts;
    unreported_.host_experts += computing_.host_experts;
    unreported_.tokens += computing_.tokens;
    unreported_.nanoseconds += std::max<int64_t>(1, absl::GetCurrentTimeNanos() - answered_ns_);
    computing_ = HostRunReport{};
    if (unreported_.nanoseconds >= kHostReportIntervalNs) {
      absl::Status s = client_->ReportHostRuns(unreported_);
      if (!s.ok()) MOE_LOG(WARNING) << "reporting host runs: " << s;
      unreported_ = HostRunReport{};
    }
  }
  if (client_ != nullptr && !acquired.leases.empty()) {  // else the daemon is gone
    absl::Status s = client_->Release(acquired.leases);
    if (!s.ok()) MOE_LOG(WARNING) << "releasing experts: " << s;
  }
  acquired.views.clear();
  acquired.leases.clear();
}

}  // namespace moe::worker
