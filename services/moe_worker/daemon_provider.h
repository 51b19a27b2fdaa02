// The ExpertProvider of moe-worker with --cache unix:PATH: routed experts
// come from moe-cached's arena. Each Acquire goes to the daemon (over the
// shared-memory channel, gRPC as fallback) with the layer's demands and
// token counts (the iEAM row) plus any pending pre-gating hints, and returns
// views into the leased slots; Release hands the leases back. Request
// boundaries are passed on as BeginRequest/EndRequest.
//
// The daemon going away fails the call in progress with UNAVAILABLE; the
// next request attaches again (and fails with UNAVAILABLE while the daemon
// is still gone). A request that starts on a session from before a daemon
// restart reattaches instead of failing.
//
// With a CPU backend the slots are read in place from the shared-memory
// arena; with a device backend the daemon's CUDA arena is mapped over CUDA
// IPC and the views are device pointers.
//
// With host execution (a CPU backend), the time from an Acquire's answer to
// its Release is the CPU running that layer's experts (slots and host
// answers alike: the same kernel on host memory). It is summed and reported
// to the daemon (CacheClient::ReportHostRuns) about every
// kHostReportInterval, so the daemon's miss cost model follows this
// machine's real expert speed instead of its start-up calibration.
//
// Thread-compatible: driven by the engine thread.
#ifndef MOECACHE_SERVICES_MOE_WORKER_DAEMON_PROVIDER_H_
#define MOECACHE_SERVICES_MOE_WORKER_DAEMON_PROVIDER_H_

#include <memory>
#include <string>
#include <vector>

#include "services/engine/expert_provider.h"
#include "services/engine/moe_model.h"
#include "services/client/cache_client.h"

namespace moe::worker {

// One tensor of the expert layout moe-cached reports at Attach, against this
// model's view of it. The daemon holds experts in the checkpoint's dtype or in
// its --expert-format (the worker learns the format here): the shape must be
// this model's and the byte size exactly what that dtype needs, else reading
// the slot would be garbage. FAILED_PRECONDITION naming both layouts.
absl::Status CheckSlotTensor(const client::SlotTensor& t, const TensorView& mine,
                             const char* role, uint64_t slot_bytes);

// OK when `backend` has kernels for experts held as `format`, else
// FAILED_PRECONDITION saying what to change (the daemon's --expert-format
// or the worker's --backend).
absl::Status CheckBackendRunsFormat(const BackendInfo& backend, DType format);

class DaemonExpertProvider : public ExpertProvider {
 public:
  // Attaches to the daemon and checks that its expert layout matches
  // `model` (same experts, dtype and tensor sizes): FAILED_PRECONDITION
  // naming the difference. `model` must outlive the provider. A CPU-backend
  // worker always offers host execution; a device-backend worker when
  // `options.host_execution` says so: its "run on host" answers are then
  // computed by a CPU backend of the provider beside the device
  // (AcquiredExperts::host_backend).
  static absl::StatusOr<std::unique_ptr<DaemonExpertProvider>> Connect(
      const MoeModel& model, const client::CacheClientOptions& options);

  absl::Status BeginRequest(uint64_t request_id) override;
  absl::Status EndRequest(uint64_t request_id) override;
  absl::StatusOr<AcquiredExperts> Acquire(int moe_layer,
                                      absl::Span<const ExpertDemand> demands,
                                      bool prefill) override;
  // A batch's acquire carries each member's own row (the daemon's
  // per-request state, moe-infinity's activation matrices and the
  // prefetcher, follows each request) and is made for the request with the
  // most of its tokens (the earliest member among equals), whose session
  // holds the leases.
  absl::StatusOr<AcquiredExperts> AcquireBatch(int moe_layer,
                                               absl::Span<const ExpertDemand> demands,
                                               absl::Span<const MemberDemands> members,
                                               bool prefill) override;
  // With lease_part() > 0 the daemon answers a layer in parts of at most
  // that many misses (AcquireCall::part), the rest through AcquireRest.
  absl::StatusOr<AcquiredExperts> AcquireRest(int moe_layer,
                                              absl::Span<const ExpertDemand> rest,
                                              bool prefill) override;
  void Release(AcquiredExperts& acquired) override;
  void Hint(absl::Span<const ExpertHint> hints) override;
  // Over shm posted for `request` (the next batched acquire names its own
  // request again); without shm they ride on the next acquire, as Hint's.
  void HintFor(uint64_t request, absl::Span<const ExpertHint> hints) override;

  int64_t reattaches() const { return reattaches_; }

  // Misses answered in one part of a layer (moe-worker's --lease-part;
  // docs/architecture.md, "A layer in parts"); 0, the default: whole
  // layers. REQUIRES: part >= 0.
  void set_lease_part(int part) { lease_part_ = part; }
  int lease_part() const { return lease_part_; }

  // Host-only mode, for moe-worker's warm-up before it serves: every
  // acquire is answered from the daemon's host copy without a message (the
  // daemon counts no request, hit or miss and learns no activation), hints
  // are dropped and request boundaries are not sent; the CPU time of the
  // experts is still reported (CacheClient::ReportHostRuns), so that the
  // daemon's miss cost model starts from this machine's speed. Turning it
  // off reports what is left of that time. FAILED_PRECONDITION when there
  // is no host copy to read or the experts run on a device (a CUDA worker):
  // nothing could be warmed without the daemon.
  absl::Status SetHostOnly(bool on);

  // Least CPU expert time summed into one host-run report.
  static constexpr int64_t kHostReportIntervalNs = 20'000'000;

 private:
  // Acquire, with the members of a batched one (empty: not batched), or
  // (`continues`) the next part of the open layer: views of the prefix of
  // `demands` the daemon answered.
  absl::StatusOr<AcquiredExperts> AcquireFor(int moe_layer,
                                             absl::Span<const ExpertDemand> demands,
                                             absl::Span<const MemberDemands> members,
                                             bool prefill, bool continues);

  // Host-only mode's acquire (SetHostOnly).
  AcquiredExperts AcquireOnHost(int moe_layer, absl::Span<const ExpertDemand> demands);
  // An answered acquire's experts start running on this CPU: its share of
  // the next host-run report.
  void StartComputing(absl::Span<const ExpertDemand> demands, int32_t host_experts);
  // The view of an expert of `moe_layer` whose block starts at `data`.
  ExpertView ViewOf(const uint8_t* data, int moe_layer, int expert, bool on_host) const;

  struct RoleOffsets {
    uint64_t gate = 0, up = 0, down = 0;
    uint64_t gate_bias = 0, up_bias = 0, down_bias = 0;  // expert biases
  };
  // Where an expert's tensors lie in a slot of one MoE layer, and what they
  // hold (from Attach).
  struct LayerSlots {
    RoleOffsets offsets;
    ExpertDTypes dtypes;
  };
  DaemonExpertProvider(const MoeModel& model, client::CacheClientOptions o)
      : model_(model), options_(std::move(o)) {}
  absl::Status Attach();
  absl::Status EnsureAttached();
  // Drops the client after UNAVAILABLE so that the next call reattaches.
  absl::Status Check(absl::Status status);

  const MoeModel& model_;
  const client::CacheClientOptions options_;
  std::unique_ptr<client::CacheClient> client_;
  // With expert biases: the F32 biases each slot carries after the weights.
  absl::Status FindBiasOffsets(const client::SlotLayout& layout, RoleOffsets* out);

  std::vector<LayerSlots> layers_;  // one per MoE layer
  bool has_biases_ = false;
  std::vector<ExpertHint> hints_;  // sent with the next Acquire
  int64_t reattaches_ = 0;
  bool host_only_ = false;
  int lease_part_ = 0;
  // The request whose session holds the layer being answered in parts (the
  // lead of the batch that opened it; 0: the current request's own).
  uint64_t open_lead_ = 0;
  // The acquire being computed (answered, not yet released) and the sum of
  // those not yet reported.
  int64_t answered_ns_ = 0;
  HostRunReport computing_;
  HostRunReport unreported_;
  // A device worker's CPU backend for "run on host" answers (null otherwise).
  std::unique_ptr<Backend> host_backend_;
};

}  // namespace moe::worker

#endif  // MOECACHE_SERVICES_MOE_WORKER_DAEMON_PROVIDER_H_
