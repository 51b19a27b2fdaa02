// The hot-path transport between one moe-worker and moe-cached: two
// single-producer single-consumer rings in one shared-memory region (requests
// worker -> daemon, responses daemon -> worker), with futex wake-ups so an
// idle side sleeps in the kernel and a busy side never makes a syscall.
//
// The region is untrusted input for the daemon: a buggy or hostile worker can
// write anything into it. Every index and count read from it is validated;
// a violation puts the channel into a broken state with a clear status, never
// out-of-bounds access. (The worker trusts the daemon.)
//
// Thread-safety: each endpoint is used by one thread at a time (one producer
// and one consumer per ring). Different endpoints may live in different
// processes.
#ifndef MOECACHE_SERVICES_CHANNEL_SHM_CHANNEL_H_
#define MOECACHE_SERVICES_CHANNEL_SHM_CHANNEL_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "services/exchange/expert_exchange.h"

namespace moe::channel {

inline constexpr uint32_t kChannelMagic = 0x43454f4d;  // "MOEC"
// 2: leases carry their layer; 3: host-run reports; 4: members of batched
// acquires; 5: local hits, and the residency view after the rings
// (residency_view.h); 6: 64 slots a ring, not 16; 7: acquires in parts
// (RequestMsg::part, kFlagContinues); 8: a kMember message packs members
// (MemberWire)
inline constexpr uint32_t kChannelVersion = 8;
// A power of two. A batched step posts its members' rows and the acquire
// for each layer (two messages a layer since members are packed; before,
// a message a member: ~100 a step of 16 sequences over six layers, for
// which 16 slots made the worker wait for moe-cached to drain the ring at
// every layer). ~0.8 MB of shared memory a session.
inline constexpr uint32_t kRingSlots = 64;
inline constexpr uint32_t kMaxItems = 256;  // experts per message

enum class MsgType : uint32_t {
  kAcquire = 1,       // layer + demands -> leases (reply)
  kRelease = 2,       // leases (no reply)
  kBeginRequest = 3,  // request_id (reply)
  kEndRequest = 4,    // request_id (reply)
  kHints = 5,         // hints (no reply)
  kPing = 6,          // (reply) liveness and latency probe
  kHostRuns = 7,      // one host-run report (no reply)
  // Members of the next (batched) acquire: layer, and for each member its
  // MemberWire then its own demands, packed in `demands` (PackMembers;
  // no reply). A batch whose members do not fit in one message posts
  // several. The daemon keeps the members until an acquire with
  // kFlagMembers takes them; errors come back on it.
  kMember = 8,
  // An acquire the worker served itself from slots it pinned through the
  // residency view (residency_view.h): layer, demands, kFlagPrefill,
  // kFlagMembers as kAcquire, for the daemon's accounts (no reply).
  kLocalHits = 9,
};

inline constexpr uint32_t kFlagPrefill = 1u << 0;
// On kAcquire: its members were posted just before it (kMember messages).
inline constexpr uint32_t kFlagMembers = 1u << 1;
// On kAcquire: AcquireCall::continues.
inline constexpr uint32_t kFlagContinues = 1u << 2;
// Set by Post(kLazy): nobody waits on this message (ChannelServer::Receive
// does not learn to spin for such messages).
inline constexpr uint32_t kFlagLazy = 1u << 3;

// Fixed-layout images of the exchange types (expert_exchange.h) as they lie
// in the shared ring. Only the converters below translate between the two.
struct DemandWire {
  int32_t expert;
  int32_t tokens;
};

struct LeaseWire {
  int32_t expert;
  uint32_t slot;
  uint64_t generation;
  int32_t layer;
  uint32_t flags;  // kLeaseRunOnHost: an acquire's "run on host" answer
};
inline constexpr uint32_t kLeaseRunOnHost = 1u << 0;

struct HintWire {
  int32_t layer;
  int32_t expert;
  float probability;
  uint32_t reserved;
};
struct HostRunWire {
  int32_t experts;
  int32_t host_experts;
  int64_t tokens;
  int64_t nanoseconds;
};
// A kMember message's header of one member, in the place of two
// DemandWires; its `demands` DemandWires follow it.
struct MemberWire {
  uint64_t request;
  uint32_t demands;
  uint32_t flags;  // kFlagPrefill
};
inline constexpr uint32_t kMemberWireItems = 2;  // DemandWires a MemberWire takes
static_assert(sizeof(DemandWire) == 8 && sizeof(LeaseWire) == 24 && sizeof(HintWire) == 16 &&
              sizeof(HostRunWire) == 24 &&
              sizeof(MemberWire) == kMemberWireItems * sizeof(DemandWire));

struct RequestMsg {
  uint32_t type;  // MsgType
  uint32_t seq;
  int32_t layer;
  uint32_t count;  // items used in the union below
  uint32_t flags;
  uint32_t part;  // kAcquire: AcquireCall::part (0 otherwise)
  uint64_t request_id;
  union {
    DemandWire demands[kMaxItems];
    LeaseWire leases[kMaxItems];
    HintWire hints[kMaxItems];
    HostRunWire host_runs[1];
  };
};

struct ResponseMsg {
  uint32_t seq;
  int32_t status_code;  // absl::StatusCode
  uint32_t count;
  int32_t hits;
  int32_t misses;
  uint32_t reserved;
  uint64_t stall_ns;
  char error[160];  // NUL-terminated message when status_code != 0
  LeaseWire leases[kMaxItems];
};

// The one converter between the exchange types and the ring. ToWire
// REQUIRES items.size() <= kMaxItems. FromWire does not validate (the
// daemon's SessionManager does); a slot id beyond int32 becomes -1.
void ToWire(absl::Span<const ExpertDemand> items, DemandWire* out);
void ToWire(absl::Span<const ExpertHint> items, HintWire* out);
void ToWire(absl::Span<const SlotLease> items, LeaseWire* out);
void FromWire(const DemandWire* items, uint32_t count, ExpertDemand* out);
void FromWire(const HintWire* items, uint32_t count, ExpertHint* out);
void FromWire(const LeaseWire* items, uint32_t count, SlotLease* out);
HostRunWire ToWire(const HostRunReport& report);
HostRunReport FromWire(const HostRunWire& wire);
// kMember's payload. PackMembers writes as many members from the front of
// `members` as fit in one message (at least one) into `req->demands`, sets
// `req->count` to the items used and returns how many it packed; the caller
// sets type, layer and flags. REQUIRES: !members.empty(), and each member's
// demands <= kMaxItems - kMemberWireItems. UnpackMembers appends a
// message's members to `out`: INVALID_ARGUMENT, `out` as it was, when a
// header or a member's demands run past `count` items or none is packed.
size_t PackMembers(absl::Span<const MemberDemands> members, RequestMsg* req);
absl::Status UnpackMembers(const RequestMsg& req, std::vector<MemberDemands>* out);
// A whole acquire answer: leases, then the host answers (flagged), and the
// usage. REQUIRES leases + host <= kMaxItems.
void ToWire(const AcquireResult& result, ResponseMsg* out);
AcquireResult AcquireResultFromWire(const ResponseMsg& msg);

// Bytes of shared memory one channel needs.
size_t ChannelBytes();

// Writes an empty channel into `mem` (ChannelBytes() bytes, zeroed or not).
void InitChannel(void* mem);

// Checks magic and version of a mapped channel.
absl::Status ValidateChannel(const void* mem, size_t size);

// Liveness of the other side, polled while waiting. Returns a non-OK status
// (e.g. UNAVAILABLE "worker 123 exited") to abort the wait.
using PeerCheck = std::function<absl::Status()>;

// Daemon side.
class ChannelServer {
 public:
  // REQUIRES: `mem` holds an initialised channel and outlives this object.
  explicit ChannelServer(void* mem);

  // Waits up to `timeout` for the next request and copies it into `*out`
  // (validated: type known, count <= kMaxItems). Returns false on timeout.
  // It spins a while before it sleeps, as long as the recent hand-offs it
  // waited for took (SpinGovernor); waits that ended in a kFlagLazy message
  // do not count: a batched step's local hits, dozens a layer that nobody
  // waits on, kept a daemon whose every expert hit spinning between layers
  // (half its CPU time in a 16-stream decode of the trained model).
  // A malformed ring or message gives DATA_LOSS / INVALID_ARGUMENT; after a
  // DATA_LOSS the channel is broken and every later call fails.
  absl::StatusOr<bool> Receive(RequestMsg* out, absl::Duration timeout);

  // Sends a reply. Fails with RESOURCE_EXHAUSTED if the worker stopped
  // consuming replies (its ring is full).
  absl::Status Reply(const ResponseMsg& msg);

  // Marks the channel closed; a worker waiting on it wakes with UNAVAILABLE.
  void Close();

 private:
  void* mem_;
  bool broken_ = false;
};

// Worker side.
class ChannelClient {
 public:
  // REQUIRES: `mem` holds an initialised channel and outlives this object.
  explicit ChannelClient(void* mem);

  // Sends `req` (seq is assigned here) and waits for its reply. `peer_check`
  // is polled every few milliseconds while waiting.
  absl::Status Call(RequestMsg& req, ResponseMsg* reply, absl::Duration timeout,
                    const PeerCheck& peer_check = nullptr);

  // Sends a message that gets no reply (Release, Hints). kLazy: a sleeping
  // daemon is not woken for it while the ring is less than half full (it
  // takes it at its next poll slice, within 5 ms, or with the next eager
  // message, in order): for messages nobody waits on (local hits); the
  // message carries kFlagLazy.
  enum class Wake { kEager, kLazy };
  absl::Status Post(RequestMsg& req, absl::Duration timeout, Wake wake = Wake::kEager);

  // Size of the used prefix of a message, for callers that build messages.
  static size_t RequestBytes(const RequestMsg& req);

 private:
  void* mem_;
  uint32_t next_seq_ = 1;
};

}  // namespace moe::channel

#endif  // MOECACHE_SERVICES_CHANNEL_SHM_CHANNEL_H_
