#include "services/channel/shm_channel.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/spin_wait.h"

namespace moe::channel {
namespace {

struct alignas(64) Word {
  std::atomic<uint32_t> value;
};

template <typename Msg>
struct Ring {
  Word head;           // messages ever pushed (producer writes)
  Word tail;           // messages ever popped (consumer writes)
  Word reader_asleep;  // consumer is (about to be) in FUTEX_WAIT on head
  Word writer_asleep;  // producer is (about to be) in FUTEX_WAIT on tail
  Msg slots[kRingSlots];
};

struct Shared {
  uint32_t magic;
  uint32_t version;
  uint32_t ring_slots;
  uint32_t max_items;
  Word closed;
  Ring<RequestMsg> requests;
  Ring<ResponseMsg> responses;
};

static_assert(std::atomic<uint32_t>::is_always_lock_free,
              "cross-process atomics need lock-free words");
static_assert((kRingSlots & (kRingSlots - 1)) == 0, "power of two");

Shared* AsShared(void* mem) { return static_cast<Shared*>(mem); }

// The most either side spins before it sleeps on the futex (SpinGovernor
// shortens it to twice the recent hand-off latency, and to nothing when the
// machine is oversubscribed, issue 32). On an idle machine it outlasts a
// small model's layer (tens of microseconds of compute between a worker's
// acquires): 20 us let the daemon fall asleep before every acquire, and each
// futex wake-up (a cross-CPU interrupt, costly in a VM) made the trained
// model's served TPOT 0.87-1.06 ms against 0.55-0.79 ms with 200 us
// (docs/benchmarks.md, "Daemon hot path").
constexpr absl::Duration kSpinFor = absl::Microseconds(200);
constexpr absl::Duration kPollSlice = absl::Milliseconds(5);

// Waits until `word` differs from `value`, the deadline passes, `stop`
// returns non-OK, or the channel closes. Returns OK when it changed.
template <typename Stop>
absl::Status WaitChange(Word& word, Word& asleep, uint32_t value, absl::Time deadline,
                        SpinGovernor& governor, const Stop& stop) {
  absl::Status s = WaitWordChange(word.value, asleep.value, value, deadline, governor, stop,
                                  kPollSlice);
  if (absl::IsDeadlineExceeded(s)) {
    return absl::DeadlineExceededError("shared-memory channel: timed out");
  }
  return s;
}

// Per waiting thread (each endpoint is used by one thread at a time, and a
// daemon serves each worker from a thread of its own): it learns that
// thread's hand-off latency.
SpinGovernor& Governor() {
  thread_local SpinGovernor governor(kSpinFor);
  return governor;
}

void Publish(Word& word, Word& asleep, uint32_t value) {
  PublishWord(word.value, asleep.value, value);
}

size_t RequestItemBytes(uint32_t type) {
  switch (static_cast<MsgType>(type)) {
    case MsgType::kAcquire:
    case MsgType::kMember:
    case MsgType::kLocalHits:
      return sizeof(DemandWire);
    case MsgType::kRelease:
      return sizeof(LeaseWire);
    case MsgType::kHints:
      return sizeof(HintWire);
    case MsgType::kHostRuns:
      return sizeof(HostRunWire);
    default:
      return 0;
  }
}

bool KnownType(uint32_t type) {
  return type >= static_cast<uint32_t>(MsgType::kAcquire) &&
         type <= static_cast<uint32_t>(MsgType::kLocalHits);
}

absl::Status ClosedStatus() {
  return absl::UnavailableError("shared-memory channel closed by the daemon");
}

}  // namespace

size_t ChannelBytes() { return sizeof(Shared); }

void InitChannel(void* mem) {
  std::memset(mem, 0, sizeof(Shared));
  Shared* s = AsShared(mem);
  s->magic = kChannelMagic;
  s->version = kChannelVersion;
  s->ring_slots = kRingSlots;
  s->max_items = kMaxItems;
}

absl::Status ValidateChannel(const void* mem, size_t size) {
  if (size < sizeof(Shared)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "channel region is ", size, " bytes, need ", sizeof(Shared)));
  }
  const Shared* s = static_cast<const Shared*>(mem);
  if (s->magic != kChannelMagic || s->version != kChannelVersion ||
      s->ring_slots != kRingSlots || s->max_items != kMaxItems) {
    return absl::FailedPreconditionError(
        "channel region has a foreign magic, version or geometry");
  }
  return absl::OkStatus();
}

size_t ChannelClient::RequestBytes(const RequestMsg& req) {
  return offsetof(RequestMsg, demands) +
         RequestItemBytes(req.type) * std::min(req.count, kMaxItems);
}

ChannelServer::ChannelServer(void* mem) : mem_(mem) {}

absl::StatusOr<bool> ChannelServer::Receive(RequestMsg* out,
                                            absl::Duration timeout) {
  if (broken_) return absl::DataLossError("channel is broken");
  Ring<RequestMsg>& ring = AsShared(mem_)->requests;
  uint32_t tail = ring.tail.value.load(std::memory_order_relaxed);
  SpinGovernor& governor = Governor();
  const WordWait waited =
      WaitWordChangeUnrecorded(ring.head.value, ring.reader_asleep.value, tail,
                               absl::Now() + timeout, governor,
                               [] { return absl::OkStatus(); }, kPollSlice);
  if (!waited.status.ok()) {
    governor.Record(waited.waited_ns, waited.spun);
    if (absl::IsDeadlineExceeded(waited.status)) return false;
    return waited.status;
  }
  uint32_t head = ring.head.value.load(std::memory_order_acquire);
  if (head - tail > kRingSlots) {
    broken_ = true;
    return absl::DataLossError(absl::StrCat(
        "request ring indices corrupt (head ", head, ", tail ", tail, ")"));
  }
  const RequestMsg& slot = ring.slots[tail % kRingSlots];
  // Copy first, validate the copy: the worker may still be writing.
  std::memcpy(out, &slot, offsetof(RequestMsg, demands));
  absl::Status status;
  if (!KnownType(out->type)) {
    status = absl::InvalidArgumentError(
        absl::StrCat("unknown message type ", out->type));
  } else if (out->count > kMaxItems) {
    status = absl::InvalidArgumentError(absl::StrCat(
        "message carries ", out->count, " items, at most ", kMaxItems));
  } else {
    std::memcpy(out->demands, slot.demands,
                RequestItemBytes(out->type) * out->count);
  }
  Publish(ring.tail, ring.writer_asleep, tail + 1);
  if (status.ok() && (out->flags & kFlagLazy) != 0) {
    governor.RecordNotHandOff(waited.spun);
  } else {
    governor.Record(waited.waited_ns, waited.spun);
  }
  if (!status.ok()) return status;
  return true;
}

absl::Status ChannelServer::Reply(const ResponseMsg& msg) {
  if (broken_) return absl::DataLossError("channel is broken");
  Ring<ResponseMsg>& ring = AsShared(mem_)->responses;
  uint32_t head = ring.head.value.load(std::memory_order_relaxed);
  uint32_t tail = ring.tail.value.load(std::memory_order_acquire);
  if (head - tail >= kRingSlots) {
    // The worker does not drain replies (or scribbled on tail).
    return absl::ResourceExhaustedError("worker is not reading replies");
  }
  ResponseMsg& slot = ring.slots[head % kRingSlots];
  size_t n = std::min(msg.count, kMaxItems);
  std::memcpy(&slot, &msg, offsetof(ResponseMsg, leases));
  std::memcpy(slot.leases, msg.leases, n * sizeof(LeaseWire));
  Publish(ring.head, ring.reader_asleep, head + 1);
  return absl::OkStatus();
}

void ChannelServer::Close() {
  Shared* s = AsShared(mem_);
  s->closed.value.store(1, std::memory_order_seq_cst);
  WakeAllOnWord(s->responses.head.value);
  WakeAllOnWord(s->requests.tail.value);
}

ChannelClient::ChannelClient(void* mem) : mem_(mem) {}

absl::Status ChannelClient::Post(RequestMsg& req, absl::Duration timeout, Wake wake) {
  Shared* s = AsShared(mem_);
  if (s->closed.value.load(std::memory_order_acquire)) return ClosedStatus();
  Ring<RequestMsg>& ring = s->requests;
  uint32_t head = ring.head.value.load(std::memory_order_relaxed);
  uint32_t tail = ring.tail.value.load(std::memory_order_acquire);
  if (head - tail >= kRingSlots) {
    absl::Status waited = WaitChange(
        ring.tail, ring.writer_asleep, tail, absl::Now() + timeout, Governor(), [s] {
          return s->closed.value.load() ? ClosedStatus() : absl::OkStatus();
        });
    if (absl::IsDeadlineExceeded(waited)) {
      return absl::UnavailableError("daemon is not draining the channel");
    }
    if (!waited.ok()) return waited;
  }
  req.seq = next_seq_++;
  if (wake == Wake::kLazy) {
    req.flags |= kFlagLazy;
  } else {
    req.flags &= ~kFlagLazy;
  }
  std::memcpy(&ring.slots[head % kRingSlots], &req, RequestBytes(req));
  if (wake == Wake::kLazy && head + 1 - tail < kRingSlots / 2) {
    // A sleeping daemon finds it at its next poll slice or the next eager
    // message, whichever comes first.
    ring.head.value.store(head + 1, std::memory_order_release);
  } else {
    Publish(ring.head, ring.reader_asleep, head + 1);
  }
  return absl::OkStatus();
}

absl::Status ChannelClient::Call(RequestMsg& req, ResponseMsg* reply,
                                 absl::Duration timeout,
                                 const PeerCheck& peer_check) {
  absl::Time deadline = absl::Now() + timeout;
  absl::Status posted = Post(req, timeout);
  if (!posted.ok()) return posted;
  Shared* s = AsShared(mem_);
  Ring<ResponseMsg>& ring = s->responses;
  auto stop = [&]() -> absl::Status {
    if (s->closed.value.load()) return ClosedStatus();
    return peer_check ? peer_check() : absl::OkStatus();
  };
  while (true) {
    uint32_t tail = ring.tail.value.load(std::memory_order_relaxed);
    absl::Status waited =
        WaitChange(ring.head, ring.reader_asleep, tail, deadline, Governor(), stop);
    if (!waited.ok()) return waited;
    const ResponseMsg& slot = ring.slots[tail % kRingSlots];
    std::memcpy(reply, &slot, offsetof(ResponseMsg, leases));
    reply->count = std::min(reply->count, kMaxItems);
    std::memcpy(reply->leases, slot.leases, reply->count * sizeof(LeaseWire));
    reply->error[sizeof(reply->error) - 1] = '\0';
    Publish(ring.tail, ring.writer_asleep, tail + 1);
    if (reply->seq == req.seq) break;
    // A late reply to an earlier call that timed out: drop it.
  }
  if (reply->status_code != 0) {
    return absl::Status(static_cast<absl::StatusCode>(reply->status_code),
                        reply->error);
  }
  return absl::OkStatus();
}

void ToWire(absl::Span<const ExpertDemand> items, DemandWire* out) {
  MOE_CHECK(items.size() <= kMaxItems) << items.size() << " demands for one message";
  for (size_t i = 0; i < items.size(); ++i) out[i] = {items[i].expert, items[i].tokens};
}

void ToWire(absl::Span<const ExpertHint> items, HintWire* out) {
  MOE_CHECK(items.size() <= kMaxItems) << items.size() << " hints for one message";
  for (size_t i = 0; i < items.size(); ++i) {
    out[i] = {items[i].layer, items[i].expert, items[i].probability, 0};
  }
}

void ToWire(absl::Span<const SlotLease> items, LeaseWire* out) {
  MOE_CHECK(items.size() <= kMaxItems) << items.size() << " leases for one message";
  for (size_t i = 0; i < items.size(); ++i) {
    out[i] = {items[i].key.expert, static_cast<uint32_t>(items[i].slot), items[i].generation,
              items[i].key.layer, 0};
  }
}

void FromWire(const DemandWire* items, uint32_t count, ExpertDemand* out) {
  for (uint32_t i = 0; i < count; ++i) out[i] = {items[i].expert, items[i].tokens};
}

size_t PackMembers(absl::Span<const MemberDemands> members, RequestMsg* req) {
  uint32_t used = 0;
  size_t packed = 0;
  for (const MemberDemands& m : members) {
    const uint32_t n = static_cast<uint32_t>(m.demands.size());
    if (used + kMemberWireItems + n > kMaxItems) break;
    const MemberWire header{m.request, n, m.prefill ? kFlagPrefill : 0u};
    std::memcpy(&req->demands[used], &header, sizeof(header));
    used += kMemberWireItems;
    ToWire(m.demands, &req->demands[used]);
    used += n;
    ++packed;
  }
  req->count = used;
  return packed;
}

absl::Status UnpackMembers(const RequestMsg& req, std::vector<MemberDemands>* out) {
  const size_t before = out->size();
  auto refuse = [&](absl::string_view why) {
    out->resize(before);
    return absl::InvalidArgumentError(absl::StrCat("members message of ", req.count, " items: ",
                                                   why));
  };
  if (req.count > kMaxItems) return refuse("too many items");
  uint32_t at = 0;
  while (at < req.count) {
    if (req.count - at < kMemberWireItems) return refuse("a member's header is cut off");
    MemberWire header;
    std::memcpy(&header, &req.demands[at], sizeof(header));
    at += kMemberWireItems;
    if (header.demands > req.count - at) {
      return refuse(absl::StrCat("a member of ", header.demands, " demands runs past the end"));
    }
    MemberDemands m;
    m.request = header.request;
    m.prefill = (header.flags & kFlagPrefill) != 0;
    m.demands.resize(header.demands);
    FromWire(&req.demands[at], header.demands, m.demands.data());
    at += header.demands;
    out->push_back(std::move(m));
  }
  if (out->size() == before) return refuse("no member");
  return absl::OkStatus();
}

void FromWire(const HintWire* items, uint32_t count, ExpertHint* out) {
  for (uint32_t i = 0; i < count; ++i) {
    out[i] = {items[i].layer, items[i].expert, items[i].probability, HintSource::kHint};
  }
}

void FromWire(const LeaseWire* items, uint32_t count, SlotLease* out) {
  for (uint32_t i = 0; i < count; ++i) {
    out[i].key = {items[i].layer, items[i].expert};
    out[i].slot = items[i].slot > 0x7fffffffu ? -1 : static_cast<SlotId>(items[i].slot);
    out[i].generation = items[i].generation;
  }
}

HostRunWire ToWire(const HostRunReport& r) {
  return HostRunWire{r.experts, r.host_experts, r.tokens, r.nanoseconds};
}

HostRunReport FromWire(const HostRunWire& w) {
  return HostRunReport{w.experts, w.host_experts, w.tokens, w.nanoseconds};
}

void ToWire(const AcquireResult& result, ResponseMsg* out) {
  const size_t n = result.leases.size() + result.host.size();
  MOE_CHECK(n <= kMaxItems) << n << " answers for one message";
  ToWire(result.leases, out->leases);
  LeaseWire* host = out->leases + result.leases.size();
  for (size_t i = 0; i < result.host.size(); ++i) {
    host[i] = {result.host[i].expert, UINT32_MAX, 0, result.host[i].layer, kLeaseRunOnHost};
  }
  out->count = static_cast<uint32_t>(n);
  out->hits = result.usage.hits;
  out->misses = result.usage.misses;
  out->stall_ns = static_cast<uint64_t>(std::max<int64_t>(0, result.usage.stall_ns));
}

AcquireResult AcquireResultFromWire(const ResponseMsg& msg) {
  AcquireResult r;
  const uint32_t n = std::min(msg.count, kMaxItems);
  for (uint32_t i = 0; i < n; ++i) {
    const LeaseWire& w = msg.leases[i];
    if (w.flags & kLeaseRunOnHost) {
      r.host.push_back({w.layer, w.expert});
    } else {
      SlotLease l;
      FromWire(&w, 1, &l);
      r.leases.push_back(l);
    }
  }
  r.usage.hits = msg.hits;
  r.usage.misses = msg.misses;
  r.usage.host = static_cast<int32_t>(r.host.size());
  r.usage.stall_ns = PeerStallNsFromNs(msg.stall_ns);
  return r;
}

}  // namespace moe::channel
