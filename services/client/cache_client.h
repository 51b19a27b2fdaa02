// CacheClient: a worker's connection to moe-cached for one model.
//
//   CacheClientOptions o;
//   o.address = "unix:/run/moe-cached/moe-cached.sock";
//   o.model = "mixtral";
//   o.worker_id = "worker-0";
//   ASSIGN_OR_RETURN(auto client, CacheClient::Connect(o));
//   client->BeginRequest(1);
//   ASSIGN_OR_RETURN(AcquireResult r, client->Acquire({.layer = l, .demands =
//   d})); for (const SlotLease& l : r.leases) ... read client->SlotData(l.slot)
//                                            (tensors at client->layout()) ...
//   client->Release(r.leases);
//   client->EndRequest(1);
//
// Connect attaches over gRPC, maps the model's arena read-only (CPU arena:
// a shared-memory region named by Attach) and opens the worker's
// shared-memory channel. Acquire/Release/BeginRequest/EndRequest then go over
// that channel (a few microseconds per round trip); with use_shm = false, or
// per call with Transport::kGrpc, they go over gRPC instead. Over the
// channel, an acquire whose experts are all resident makes no round trip:
// their slots are pinned through the channel's residency view and the
// daemon is told after (kLocalLeaseGeneration).
//
// Demands, hints, leases and usage are the exchange types
// (services/exchange/expert_exchange.h); the daemon validates them.
//
// Requests: BeginRequest(id) makes `id` the client's current request; every
// Acquire and Hint until EndRequest(id) is for it (the daemon keeps the
// request's cache state under (session, id)). Without a begun request, calls
// are for the session's default request 0.
//
// Contract:
//  - An acquire returns only when every demanded expert's copy is complete
//    (design invariant 2); each lease pins its slot until Release
//    (invariant 1). Read slot bytes only between Acquire and Release.
//  - SlotData(lease.slot) points at the slot in the read-only mapping; the
//    expert's tensors lie at layout()[i].offset within it.
//  - AcquireResult::usage is that acquire's own hits, misses and stall, exact
//    whatever other workers do at the same time.
//  - The daemon's death is noticed while waiting (pidfd on the daemon's pid,
//    and the channel's closed flag on an orderly shutdown): calls fail with
//    UNAVAILABLE, never hang. After that the client is unusable; connect
//    again.
//  - Errors from the daemon come back with their codes (INVALID_ARGUMENT for
//    bad layers/experts/duplicates, RESOURCE_EXHAUSTED when every slot is
//    leased or too many requests are live, NOT_FOUND for an unknown model,
//    FAILED_PRECONDITION for a request that was not begun, ...).
//  - The destructor detaches (best effort); the daemon also reclaims the
//    leases of a worker process that dies without detaching.
//
// Thread-safety: all methods are thread-safe; calls are serialized (one
// channel per client). Use one client per thread for parallel acquires.
#ifndef MOECACHE_SERVICES_CLIENT_CACHE_CLIENT_H_
#define MOECACHE_SERVICES_CLIENT_CACHE_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "moe/v1/expert_cache.pb.h"
#include "kernels/device_memory.h"
#include "services/exchange/expert_exchange.h"
#include "services/rpc/security.h"

namespace moe::client {

struct CacheClientOptions {
  std::string address = "unix:/tmp/moe-cached.sock";  // as rpc::ParseListenAddress
  std::string model;
  std::string worker_id;
  bool use_shm = true;  // false: every call over gRPC
  rpc::ClientSecurity security;  // bearer token (and TLS for TCP addresses)
  // The caller computes on CUDA (this is its device's memory): the arena must
  // then be the daemon's CUDA arena, mapped through CUDA IPC, and SlotData
  // returns device pointers. Null: a host arena (shared memory) is required.
  std::shared_ptr<DeviceMemory> cuda;
  absl::Duration timeout = absl::Seconds(60);  // per call
  // The caller can run experts from host memory: the daemon (with
  // --miss-mode host or auto) may then answer misses "run on host"
  // (AcquireResult::host), to be computed from HostData().
  bool host_execution = false;
};

enum class Transport { kDefault, kShm, kGrpc };

// The generation of a lease the client took itself: over the shared-memory
// channel an acquire whose experts are all resident pins their slots
// through the channel's residency view (services/channel/residency_view.h)
// and posts the acquire as local hits instead of waiting for the daemon;
// Release drops such pins here. Never a generation the daemon hands out.
inline constexpr uint64_t kLocalLeaseGeneration = ~uint64_t{0};

// The arena layout moe-cached reports at Attach.
struct ArenaGeometry {
  uint64_t arena_bytes = 0;
  uint64_t slot_bytes = 0;
  uint32_t slot_count = 0;
  uint64_t store_bytes = 0;  // the host copy; 0 when none was granted
  int32_t num_layers = 0;
  int32_t num_experts = 0;
  // One per MoE layer: its blocks' bytes (LayerLayout::block_bytes).
  std::vector<uint64_t> layer_block_bytes;
};

// FAILED_PRECONDITION unless slot_bytes > 0, slot_count slots of slot_bytes
// fit in arena_bytes, there is one block size per layer (num_layers > 0),
// each in (0, slot_bytes], and a host copy (store_bytes > 0) holds every
// layer's num_experts blocks (num_experts > 0). The sums and products are
// overflow-checked: the numbers come from another process, and a product
// that wraps would pass a plain comparison.
absl::Status CheckArenaGeometry(const ArenaGeometry& g);

// Where one tensor of an expert lies inside a slot.
struct SlotTensor {
  std::string role;  // "gate", "up", "down"
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t offset = 0;
  uint64_t nbytes = 0;
};

// One MoE layer's experts, as moe-cached reported them at Attach.
struct SlotLayout {
  std::vector<SlotTensor> tensors;  // each inside block_bytes
  uint64_t block_bytes = 0;         // <= slot_bytes()
  uint64_t store_offset = 0;        // the layer's first block in the host copy
};

class CacheClient {
 public:
  static absl::StatusOr<std::unique_ptr<CacheClient>> Connect(const CacheClientOptions& options);
  ~CacheClient();
  CacheClient(const CacheClient&) = delete;
  CacheClient& operator=(const CacheClient&) = delete;

  // `members`: a batched acquire's rows, one per request sharing it (their
  // tokens add up to `experts`; ValidateMembers); empty for a request's own
  // acquire. The acquire itself is for the current request (SetCurrentRequest),
  // which should be one of the members.
  // `call.host_ok` is not sent: the session's registration decides it.
  absl::StatusOr<AcquireResult> Acquire(
      const AcquireCall& call, Transport transport = Transport::kDefault);
  // Prefetch hints on their own, as soon as the worker has them (pre-gating
  // predicts layer l+1 while layer l finishes). Over shm they are posted
  // without a reply; without shm they are kept and sent with the next
  // Acquire. INVALID_ARGUMENT for out-of-range hints.
  absl::Status Hint(absl::Span<const ExpertHint> hints);
  // Over shm a release is posted without waiting for an answer; the daemon
  // logs bad leases. Over gRPC errors come back.
  absl::Status Release(absl::Span<const SlotLease> leases,
                       Transport transport = Transport::kDefault);
  // Reports what running experts on this worker's CPU took, so that the
  // daemon's miss cost model follows the real host speed. Posted without a
  // reply over shm (checked here with ValidateHostRunReport, as hints are);
  // FAILED_PRECONDITION without the shm channel or without host_execution().
  absl::Status ReportHostRuns(const HostRunReport& report);
  // `request` != 0 (0 is the session's default request).
  absl::Status BeginRequest(uint64_t request, Transport transport = Transport::kDefault);
  absl::Status EndRequest(uint64_t request, Transport transport = Transport::kDefault);
  // Makes `request` the current request without a message: the following
  // Acquire and Hint calls are for it (the daemon refuses one that is not
  // begun: FAILED_PRECONDITION). A batched worker points each shared acquire
  // at the request it mostly serves. 0: the session's default request.
  void SetCurrentRequest(uint64_t request);
  // Leaves the session (its leases are dropped). Later calls fail.
  absl::Status Detach();
  // Statistics of `model` (empty: all models of the daemon).
  absl::StatusOr<moe::v1::GetStatsResponse> GetStats(const std::string& model = "");

  const std::string& model() const { return model_; }
  int num_layers() const { return num_layers_; }
  int num_experts() const { return num_experts_; }
  int top_k() const { return top_k_; }
  uint64_t slot_bytes() const { return slot_bytes_; }
  uint32_t slot_count() const { return slot_count_; }
  // REQUIRES: 0 <= layer < num_layers().
  const SlotLayout& layout(int layer) const { return layouts_[static_cast<size_t>(layer)]; }
  bool shm_enabled() const;
  // The daemon granted its host copy: acquires may answer "run on host".
  bool host_execution() const;
  // The expert's block in the daemon's host copy (laid out as a slot),
  // mapped read-only. REQUIRES: host_execution(), key in range.
  const uint8_t* HostData(const ExpertKey& key) const;
  // REQUIRES: 0 <= slot < slot_count(). A device pointer when options.cuda
  // was set (the CUDA arena), else host memory mapped read-only.
  const uint8_t* SlotData(SlotId slot) const;

 private:
  struct Impl;
  explicit CacheClient(std::unique_ptr<Impl> impl);
  absl::Status CheckHints(absl::Span<const ExpertHint> hints) const;

  std::unique_ptr<Impl> impl_;
  std::string model_;
  int num_layers_ = 0;
  int num_experts_ = 0;
  int top_k_ = 0;
  uint64_t slot_bytes_ = 0;
  uint32_t slot_count_ = 0;
  std::vector<SlotLayout> layouts_;  // one per MoE layer
};

}  // namespace moe::client

#endif  // MOECACHE_SERVICES_CLIENT_CACHE_CLIENT_H_
