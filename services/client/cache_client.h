// CacheClient: a worker's connection to moe-cached for one model.
//
//   CacheClientOptions o;
//   o.address = "unix:/run/moe-cached/moe-cached.sock";
//   o.model = "mixtral";
//   o.worker_id = "worker-0";
//   ASSIGN_OR_RETURN(auto client, CacheClient::Connect(o));
//   client->BeginRequest("req-1");
//   ASSIGN_OR_RETURN(AcquireReply r, client->Acquire(layer, {{3, 5}, {7, 1}}, false));
//   for (const ExpertLease& l : r.leases) ... read l.data (client->layout()) ...
//   client->Release(r.leases);
//   client->EndRequest("req-1");
//
// Connect attaches over gRPC, maps the model's arena read-only (CPU arena:
// a shared-memory region named by Attach) and opens the worker's
// shared-memory channel. Acquire/Release/BeginRequest/EndRequest then go over
// that channel (a few microseconds per round trip); with use_shm = false, or
// per call with Transport::kGrpc, they go over gRPC instead.
//
// Contract:
//  - An acquire returns only when every demanded expert's copy is complete
//    (design invariant 2); each lease pins its slot until Release
//    (invariant 1). Read slot bytes only between Acquire and Release.
//  - `ExpertLease::data` points at the slot in the read-only mapping; the
//    expert's tensors lie at layout()[i].offset within it.
//  - The daemon's death is noticed while waiting (pidfd on the daemon's pid,
//    and the channel's closed flag on an orderly shutdown): calls fail with
//    UNAVAILABLE, never hang. After that the client is unusable; connect
//    again.
//  - Errors from the daemon come back with their codes (INVALID_ARGUMENT for
//    bad layers/experts/duplicates, RESOURCE_EXHAUSTED when every slot is
//    leased, NOT_FOUND for an unknown model, ...).
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
};

enum class Transport { kDefault, kShm, kGrpc };

// An expert demanded at one layer, with the tokens routed to it (iEAM entry).
struct ExpertRequest {
  int32_t expert = 0;
  int32_t tokens = 1;
};

// A prediction that `expert` of `layer` will be needed soon.
struct ExpertHint {
  int32_t layer = 0;
  int32_t expert = 0;
  float probability = 1;
};

// Where one tensor of an expert lies inside a slot.
struct SlotTensor {
  std::string role;  // "gate", "up", "down"
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t offset = 0;
  uint64_t nbytes = 0;
};

struct ExpertLease {
  int32_t expert = 0;
  uint32_t slot = 0;
  uint64_t generation = 0;
  const uint8_t* data = nullptr;  // slot start, read-only, slot_bytes() long
};

struct AcquireReply {
  std::vector<ExpertLease> leases;  // in demand order
  int hits = 0;
  int misses = 0;
  double stall_seconds = 0;
};

class CacheClient {
 public:
  static absl::StatusOr<std::unique_ptr<CacheClient>> Connect(const CacheClientOptions& options);
  ~CacheClient();
  CacheClient(const CacheClient&) = delete;
  CacheClient& operator=(const CacheClient&) = delete;

  absl::StatusOr<AcquireReply> Acquire(int layer, absl::Span<const ExpertRequest> experts,
                                       bool prefill, absl::Span<const ExpertHint> hints = {},
                                       Transport transport = Transport::kDefault);
  // Prefetch hints on their own, as soon as the worker has them (pre-gating
  // predicts layer l+1 while layer l finishes). Over shm they are posted
  // without a reply; without shm they are kept and sent with the next
  // Acquire. INVALID_ARGUMENT for out-of-range hints.
  absl::Status Hint(absl::Span<const ExpertHint> hints);
  // Over shm a release is posted without waiting for an answer; the daemon
  // logs bad leases. Over gRPC errors come back.
  absl::Status Release(absl::Span<const ExpertLease> leases,
                       Transport transport = Transport::kDefault);
  absl::Status BeginRequest(const std::string& request_id,
                            Transport transport = Transport::kDefault);
  absl::Status EndRequest(const std::string& request_id,
                          Transport transport = Transport::kDefault);
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
  const std::vector<SlotTensor>& layout() const { return layout_; }
  bool shm_enabled() const;
  // REQUIRES: slot < slot_count(). A device pointer when options.cuda was
  // set (the CUDA arena), else host memory mapped read-only.
  const uint8_t* SlotData(uint32_t slot) const;

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
  std::vector<SlotTensor> layout_;
};

}  // namespace moe::client

#endif  // MOECACHE_SERVICES_CLIENT_CACHE_CLIENT_H_
