// SessionManager: the attached workers of moe-cached and every operation they
// may perform, whichever transport carried it (the gRPC service and the
// per-worker shared-memory channel both call in here; neither holds logic).
//
// A session is one Attach: a model, the worker's pid (watched with a pidfd),
// an owner id for its leases (the session id, 64 random bits), and a
// shared-memory channel (mode 0600, unguessable name) served by one thread,
// with the model's residency view after its rings (ResidencyBoard: the
// worker's own hit path, its pins counted as leases are).
// That thread also notices the worker's death (within kPeerPollInterval),
// or a corrupt channel, and then drops every lease the session held
// (ExpertCache::ReleaseOwner: design invariant 3).
//
// Everything from the wire is validated here, once, by the exchange rules
// (ValidateDemands / ValidateHints in services/exchange/expert_exchange.h):
// layer and expert ranges, duplicates, token counts, hint values, list
// lengths -> INVALID_ARGUMENT; unknown or ended sessions -> NOT_FOUND. The
// cache below treats these as preconditions.
//
// Requests: a session's worker names the request each call is for. Request
// 0 is the session's default and needs no BeginRequest; any other id must be
// begun (FAILED_PRECONDITION otherwise) and at most kMaxRequestsPerSession
// may be live at once (RESOURCE_EXHAUSTED). Per-request cache state lives
// under (session, request) until EndRequest or the session's end.
//
// Thread-safety: all public methods are thread-safe.
#ifndef MOECACHE_SERVICES_MOE_CACHED_SESSIONS_H_
#define MOECACHE_SERVICES_MOE_CACHED_SESSIONS_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "moe/v1/expert_cache.pb.h"
#include "services/cache/expert_cache.h"
#include "services/cache/shm_region.h"
#include "services/channel/shm_channel.h"
#include "services/moe_cached/cached_model.h"
#include "services/moe_cached/fd_broker.h"
#include "services/moe_cached/pid_watch.h"

namespace moe::cached {

inline constexpr absl::Duration kPeerPollInterval = absl::Milliseconds(50);
// Bound on list lengths accepted from the wire (gRPC; the channel has its own).
inline constexpr int kMaxWireItems = kMaxHintsPerCall;
// Live sessions at once unless --max-sessions says otherwise: each costs a
// thread and a ~135 KB channel.
inline constexpr int kDefaultMaxSessions = 64;

// A client-supplied name (model, worker id) as quoted in error messages and
// logs: cut to 64 bytes, so a huge name cannot blow gRPC's metadata limit
// (the client would see RESOURCE_EXHAUSTED instead of the real status) or
// flood the log.
std::string ClipName(absl::string_view name);

struct AttachResult {
  uint64_t session_id = 0;
  CachedModel* model = nullptr;
  std::string channel_name;  // empty when descriptors are passed
  // Set when the arena and channel go through the FdBroker.
  std::string fd_socket;
  std::string fd_token;
  // Misses may be answered "run on host"; the grant then holds a third
  // descriptor, the model's host store.
  bool host_execution = false;
};

struct SessionCounts {
  uint32_t sessions = 0;
  uint64_t leases_held = 0;
};

class SessionManager {
 public:
  // `models` are not owned and must outlive the manager. At most
  // `max_sessions` sessions are live at once (ended ones do not count).
  explicit SessionManager(std::vector<CachedModel*> models,
                          int max_sessions = kDefaultMaxSessions);
  ~SessionManager();  // Stop()

  // From now on, sessions on models whose arena is an unnamed memfd get an
  // unnamed channel, and both descriptors are granted to the attaching pid
  // through `broker` (not owned; must outlive the manager).
  void set_fd_broker(FdBroker* broker) { broker_ = broker; }

  // NOT_FOUND for an unknown model (naming the known ones); INVALID_ARGUMENT
  // for a bad pid; RESOURCE_EXHAUSTED (naming the limit) when max_sessions
  // sessions are live; FAILED_PRECONDITION after Stop.
  // `host_execution`: the worker can run experts from the host store.
  // `arena_kind`: the arena the worker can map (UNSPECIFIED: not said);
  // FAILED_PRECONDITION, logged here too, when the model's is the other
  // kind, and when the model's cache is smaller than a layer and the worker
  // cannot run misses on the host.
  absl::StatusOr<AttachResult> Attach(
      const std::string& model, const std::string& worker_id, int pid,
      bool host_execution = false,
      moe::v1::ArenaKind arena_kind = moe::v1::ARENA_KIND_UNSPECIFIED);
  absl::Status Detach(uint64_t session_id);

  // INVALID_ARGUMENT for request 0; RESOURCE_EXHAUSTED beyond
  // kMaxRequestsPerSession live requests. Beginning a live request restarts
  // it.
  absl::Status BeginRequest(uint64_t session_id, uint64_t request);
  // Ends a begun request (or the default request 0): the cache learns from
  // it. FAILED_PRECONDITION for a request that is not live.
  absl::Status EndRequest(uint64_t session_id, uint64_t request);
  // Blocks until every demanded expert is ready; the leases pin their slots
  // until Release. `hints` (may be empty) go to the cache first. The result's
  // usage is this acquire's own. `members` (empty: not batched) are the rows
  // of the requests sharing a batched acquire: ValidateMembers, each a live
  // request of the session (FAILED_PRECONDITION otherwise) and `request`
  // one of them (INVALID_ARGUMENT otherwise); the cache keeps each one's
  // per-request state from its own row.
  // `call.host_ok` is ignored: the session's registration decides it.
  absl::StatusOr<AcquireResult> Acquire(uint64_t session_id, uint64_t request,
                                        AcquireCall call);
  // An acquire the worker served itself from slots it pinned through its
  // channel's residency view (every demand a hit; nothing leased): checked
  // as Acquire, then recorded (ExpertCache::RecordLocalHits).
  absl::Status RecordLocalHits(uint64_t session_id, uint64_t request, const AcquireCall& call);
  absl::Status Release(uint64_t session_id, absl::Span<const SlotLease> leases);
  absl::Status AddHints(uint64_t session_id, uint64_t request,
                        absl::Span<const ExpertHint> hints);
  // A worker's measured host runs (ValidateHostRunReport), for the cost
  // model's online host figures. FAILED_PRECONDITION for a session that did
  // not ask for host execution.
  absl::Status ReportHostRuns(uint64_t session_id, const HostRunReport& report);

  // Joins the threads of sessions that ended (worker died, channel broke).
  void Reap();
  SessionCounts Counts(const CachedModel* model);

  // Closes every channel (waiting workers wake with UNAVAILABLE), joins the
  // threads and drops all leases. Idempotent.
  void Stop();

 private:
  struct Session;
  absl::StatusOr<std::shared_ptr<Session>> Find(uint64_t session_id);
  // The owner for `request` of `session`: request 0, or a live request.
  absl::StatusOr<RequestOwner> OwnerOf(Session& session, uint64_t request);
  // Acquire's checks of `call` from outside (ranges, members); its owner.
  absl::StatusOr<RequestOwner> CheckCall(Session& session, uint64_t request,
                                         const AcquireCall& call);
  void Serve(std::shared_ptr<Session> session);
  void HandleMessage(Session& session, channel::ChannelServer& server,
                     const channel::RequestMsg& req);
  // A shm acquire, with the members staged before it (StageMember); the
  // reply's leases are filled on success. Null `reply`: local hits
  // (kLocalHits), recorded, not acquired.
  absl::Status ShmAcquire(Session& session, const channel::RequestMsg& req,
                          channel::ResponseMsg* reply);
  // Keeps a posted member row for the acquire that follows (or the error
  // that acquire will get).
  void StageMember(Session& session, const channel::RequestMsg& req);
  void EndSession(Session& session, const std::string& why);

  absl::flat_hash_map<std::string, CachedModel*> models_;
  FdBroker* broker_ = nullptr;
  const int max_sessions_;
  absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Session>> sessions_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  int attaching_ ABSL_GUARDED_BY(mu_) = 0;  // places reserved by Attach in progress
};

}  // namespace moe::cached

#endif  // MOECACHE_SERVICES_MOE_CACHED_SESSIONS_H_
