// A hostile worker writing its shared-memory channel by hand: well-formed
// messages with bad fields, replies with bogus sequence numbers, and raw
// garbage over the request ring. The daemon must answer every message it can
// parse with a clear status, end a session whose ring is corrupt (never
// hang on it), and keep serving every other session and the worker.
#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "services/channel/residency_view.h"
#include "services/channel/shm_channel.h"
#include "services/moe_cached/fd_broker.h"
#include "tests/common/test_util.h"
#include "tests/fuzz/service_fuzz_env.h"

namespace moe::fuzz {
namespace {

using channel::kMaxItems;
using channel::kRingSlots;
using channel::MsgType;
using channel::RequestMsg;
using channel::ResponseMsg;

// The channel layout of services/channel/shm_channel.cc (struct Shared): a
// header line, the `closed` word's line, the request ring (head, tail and
// two wait flags on a 64-byte line each, then its slots), the response ring.
// Checked against ChannelBytes() and a live round trip before use.
constexpr size_t RoundUp(size_t n) { return (n + 63) / 64 * 64; }
constexpr size_t kClosedOff = 64;
constexpr size_t kReqHeadOff = 128;
constexpr size_t kReqTailOff = kReqHeadOff + 64;
constexpr size_t kReqSlotsOff = kReqHeadOff + 256;
constexpr size_t kRespHeadOff = kReqHeadOff + RoundUp(256 + kRingSlots * sizeof(RequestMsg));
constexpr size_t kRespTailOff = kRespHeadOff + 64;
constexpr size_t kChannelEnd = RoundUp(kRespHeadOff + 256 + kRingSlots * sizeof(ResponseMsg));

constexpr absl::Duration kWait = absl::Seconds(10);

// One session of this process with its channel mapped read-write.
class RingSession {
 public:
  RingSession(uint64_t id, void* mem) : id_(id), mem_(static_cast<uint8_t*>(mem)), client_(mem) {}
  ~RingSession() { ::munmap(mem_, channel::ChannelBytes()); }

  uint64_t id() const { return id_; }
  channel::ChannelClient& client() { return client_; }
  uint32_t Load(size_t off) const {
    return __atomic_load_n(reinterpret_cast<uint32_t*>(mem_ + off), __ATOMIC_SEQ_CST);
  }
  void Store(size_t off, uint32_t v) {
    __atomic_store_n(reinterpret_cast<uint32_t*>(mem_ + off), v, __ATOMIC_SEQ_CST);
  }
  uint8_t* at(size_t off) { return mem_ + off; }
  void WakeDaemon() {
    ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(mem_ + kReqHeadOff), FUTEX_WAKE, INT_MAX,
              nullptr, nullptr, 0);
  }
  bool Closed() const { return Load(kClosedOff) != 0; }
  // Waits until the daemon has consumed every request or closed the
  // channel; false if it did neither in time (a hang).
  bool WaitSettled() {
    return moe::testing::WaitFor(
        kWait, [&] { return Closed() || Load(kReqTailOff) == Load(kReqHeadOff); });
  }

 private:
  uint64_t id_;
  uint8_t* mem_;
  channel::ChannelClient client_;
};

class ShmRingFuzzTest : public ServiceFuzzTest {
 protected:
  std::unique_ptr<RingSession> Open() {
    auto a = Attach();
    EXPECT_TRUE(a.ok()) << a.status();
    if (!a.ok()) return nullptr;
    // The daemon passes [arena, channel] memfds to our pid.
    auto fds = cached::FetchFds(a->fd_socket(), a->fd_token());
    EXPECT_TRUE(fds.ok()) << fds.status();
    if (!fds.ok() || fds->size() != 2) return nullptr;
    void* mem = ::mmap(nullptr, channel::ChannelBytes(), PROT_READ | PROT_WRITE, MAP_SHARED,
                       (*fds)[1].get(), 0);
    EXPECT_NE(mem, MAP_FAILED);
    if (mem == MAP_FAILED) return nullptr;
    return std::make_unique<RingSession>(a->session_id(), mem);
  }

  // OK (alive) or NOT_FOUND (ended) for a session, asked over gRPC.
  grpc::StatusCode SessionState(uint64_t id) {
    moe::v1::BeginRequestRequest req;
    req.set_session_id(id);
    req.set_request(1);  // beginning it again restarts it: harmless
    moe::v1::BeginRequestResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
    return cache_stub_->BeginRequest(&ctx, req, &resp).error_code();
  }

  // Another session still gets experts.
  void ExpectOthersServed(const std::string& after) {
    ASSERT_FALSE(daemon_.process().Exited()) << after << "\n" << daemon_.stderr_text();
    std::vector<ExpertDemand> want = {{1, 1}};
    auto a = good_client_->Acquire({.layer = 0, .demands = want});
    ASSERT_TRUE(a.ok()) << "after " << after << ": " << a.status();
    ASSERT_TRUE(good_client_->Release(a->leases).ok());
  }

  template <typename T>
  T Pick(std::initializer_list<T> v) {
    return *(v.begin() + rng_() % v.size());
  }

  // A message with a plausible header and hostile fields.
  void BadMessage(RequestMsg* m) {
    std::memset(m, 0, sizeof(*m));
    const int32_t L = world_.num_layers, E = world_.num_experts;
    m->type = Pick<uint32_t>({1, 1, 1, 2, 2, 3, 4, 5, 5, 6, 7, 7, 8, 8, 9, 9, 0, 10, 77,
                              UINT32_MAX});
    m->layer = Pick<int32_t>({0, 1, L - 1, L, -1, INT_MIN, INT_MAX});
    m->count = Pick<uint32_t>({0, 1, 2, 3, 8, 9, kMaxItems, kMaxItems + 1, UINT32_MAX,
                               static_cast<uint32_t>(rng_() % 16)});
    m->flags = static_cast<uint32_t>(rng_());  // kFlagContinues among them
    m->part = Pick<uint32_t>({0, 0, 1, 2, static_cast<uint32_t>(E),
                              static_cast<uint32_t>(E) + 1, 0x80000000u, UINT32_MAX});
    m->request_id = rng_();
    const uint32_t n = std::min(m->count, kMaxItems);
    for (uint32_t i = 0; i < n; ++i) {
      const int32_t expert = Pick<int32_t>({0, 1, 2, 3, E - 1, E, -1, INT_MIN, INT_MAX});
      switch (static_cast<MsgType>(m->type)) {
        case MsgType::kRelease:
          m->leases[i] = {
              expert, Pick<uint32_t>({0, 1, world_.slot_count, 0x80000000u, UINT32_MAX}),
              Pick<uint64_t>({0, 1, 2, UINT64_MAX, rng_()})};
          break;
        case MsgType::kHints:
          m->hints[i] = {Pick<int32_t>({0, L - 1, L, -1}), expert,
                         Pick<float>({0.5f, 1.0f, -1.0f, 2.0f, NAN, INFINITY}), 0};
          break;
        case MsgType::kHostRuns:
          if (i == 0) {
            m->host_runs[0] = {Pick<int32_t>({1, 4, 0, -1, INT_MAX}), Pick<int32_t>({0, 1, 5, -1}),
                               Pick<int64_t>({1, 4, 0, -1, INT64_MAX}),
                               Pick<int64_t>({1, 1000000, 0, -1, INT64_MAX})};
          }
          break;
        default:
          m->demands[i] = {expert, Pick<int32_t>({1, 2, 0, -1, 1 << 24, (1 << 24) + 1, INT_MAX})};
      }
    }
  }

  std::mt19937_64 rng_{20261130};
  int inputs_ = 0;
};

bool ClearRefusal(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kOk:
      return true;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kResourceExhausted:
      return !s.message().empty();
    default:
      return false;
  }
}

TEST_F(ShmRingFuzzTest, LayoutAssumptionsHold) {
  ASSERT_EQ(channel::ChannelBytes(), kChannelEnd) << "shm_channel.cc's layout changed";
  auto s = Open();
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->Load(0), channel::kChannelMagic);
  auto req = std::make_unique<RequestMsg>();
  auto reply = std::make_unique<ResponseMsg>();
  std::memset(req.get(), 0, sizeof(*req));
  req->type = static_cast<uint32_t>(MsgType::kPing);
  ASSERT_TRUE(s->client().Call(*req, reply.get(), kWait).ok());
  for (size_t off : {kReqHeadOff, kReqTailOff, kRespHeadOff, kRespTailOff}) {
    EXPECT_EQ(s->Load(off), 1u) << off;
  }
  EXPECT_FALSE(s->Closed());
}

// Well-formed messages with bad fields: each gets a clear answer and the
// session goes on (Release, Hints, HostRuns, Member and LocalHits have no
// answer: a Ping after them must succeed; members' errors come back on the
// next acquire).
TEST_F(ShmRingFuzzTest, BadFieldsGetClearRepliesAndTheSessionGoesOn) {
  ASSERT_EQ(channel::ChannelBytes(), kChannelEnd);
  auto req = std::make_unique<RequestMsg>();
  auto reply = std::make_unique<ResponseMsg>();
  auto ping = std::make_unique<RequestMsg>();
  std::memset(ping.get(), 0, sizeof(*ping));
  ping->type = static_cast<uint32_t>(MsgType::kPing);
  std::map<absl::StatusCode, int> codes;
  const int sessions = Scaled(40);
  for (int i = 0; i < sessions; ++i) {
    auto s = Open();
    ASSERT_NE(s, nullptr);
    for (int k = 0; k < 25; ++k, ++inputs_) {
      BadMessage(req.get());
      const auto type = static_cast<MsgType>(req->type);
      const std::string what = absl::StrCat("message type ", req->type, " layer ", req->layer,
                                            " count ", req->count);
      if (type == MsgType::kRelease || type == MsgType::kHints || type == MsgType::kHostRuns ||
          type == MsgType::kMember || type == MsgType::kLocalHits) {
        ASSERT_TRUE(s->client().Post(*req, kWait).ok()) << what;
        ASSERT_TRUE(s->client().Call(*ping, reply.get(), kWait).ok()) << "ping after " << what;
        continue;
      }
      absl::Status st = s->client().Call(*req, reply.get(), kWait);
      ++codes[st.code()];
      ASSERT_TRUE(ClearRefusal(st)) << what << ": " << st;
      if (st.ok() && type == MsgType::kAcquire) {  // give the leases back
        req->type = static_cast<uint32_t>(MsgType::kRelease);
        req->count = reply->count;
        std::memcpy(req->leases, reply->leases, reply->count * sizeof(channel::LeaseWire));
        ASSERT_TRUE(s->client().Post(*req, kWait).ok());
      }
    }
    // Replies with sequence numbers nobody waits for: written by hand.
    const uint32_t head = s->Load(kReqHeadOff);
    for (uint32_t j = 0; j < 4; ++j, ++inputs_) {
      BadMessage(req.get());
      req->type = static_cast<uint32_t>(Pick<MsgType>({MsgType::kPing, MsgType::kAcquire}));
      req->seq = 0x80000000u + static_cast<uint32_t>(rng_() % 1000000);
      std::memcpy(s->at(kReqSlotsOff + ((head + j) % kRingSlots) * sizeof(RequestMsg)), req.get(),
                  sizeof(RequestMsg));
    }
    s->Store(kReqHeadOff, head + 4);
    s->WakeDaemon();
    ASSERT_TRUE(s->WaitSettled());
    ASSERT_TRUE(s->client().Call(*ping, reply.get(), kWait).ok()) << "after bogus seqs";
    EXPECT_FALSE(s->Closed());
    Detach(s->id());
    ExpectOthersServed(absl::StrCat(inputs_, " ring messages"));
    if (HasFatalFailure()) return;
  }
  ExpectStillServing("bad ring messages");
  std::printf("ring messages with bad fields: %d; replies:", inputs_);
  for (const auto& [code, n] : codes) {
    std::printf(" %s=%d", absl::StatusCodeToString(code).c_str(), n);
  }
  std::printf("\n");
}

// Raw garbage over the request ring (indices and slots) and the response
// ring's tail: the daemon consumes what it can parse or ends the session,
// within bounded time, and everyone else is still served.
TEST_F(ShmRingFuzzTest, GarbageInTheRingEndsOnlyThatSession) {
  ASSERT_EQ(channel::ChannelBytes(), kChannelEnd);
  auto req = std::make_unique<RequestMsg>();
  auto reply = std::make_unique<ResponseMsg>();
  int ended = 0, survived = 0;
  const int trials = Scaled(150);
  for (int i = 0; i < trials; ++i) {
    auto s = Open();
    ASSERT_NE(s, nullptr);
    // Hold a lease, to see it reclaimed.
    std::memset(req.get(), 0, sizeof(*req));
    req->type = static_cast<uint32_t>(MsgType::kAcquire);
    req->count = 1;
    req->demands[0] = {static_cast<int32_t>(i % world_.num_experts), 1};
    ASSERT_TRUE(s->client().Call(*req, reply.get(), kWait).ok());
    const uint32_t head = s->Load(kReqHeadOff);
    const int mode = i % 4;
    bool must_end = false;
    if (mode == 0) {  // indices more than a ring apart: corrupt for sure
      s->Store(kReqHeadOff, head + Pick<uint32_t>({kRingSlots + 1, 1000, 0x80000000u, UINT32_MAX}));
      must_end = true;
    } else if (mode == 1) {  // random bytes over random stretches of the ring
      for (int k = 1 + rng_() % 8; k > 0; --k) {
        const size_t off = kReqHeadOff + rng_() % (kRespHeadOff - kReqHeadOff - 64);
        const size_t len = std::min<size_t>(1 + rng_() % 512, kRespHeadOff - off);
        for (size_t b = 0; b < len; ++b) *s->at(off + b) = static_cast<uint8_t>(rng_());
      }
    } else if (mode == 2) {  // garbage slots published as up to a ring of messages
      const uint32_t n = 1 + static_cast<uint32_t>(rng_() % kRingSlots);
      for (uint32_t j = 0; j < n; ++j) {
        uint8_t* slot = s->at(kReqSlotsOff + ((head + j) % kRingSlots) * sizeof(RequestMsg));
        for (size_t b = 0; b < sizeof(RequestMsg); b += 4) {
          const uint32_t w = static_cast<uint32_t>(rng_());
          std::memcpy(slot + b, &w, 4);
        }
      }
      s->Store(kReqHeadOff, head + n);
    } else {  // a scribbled response-ring tail, then a message that needs a reply
      s->Store(kRespTailOff, static_cast<uint32_t>(rng_()));
      std::memcpy(s->at(kReqSlotsOff + (head % kRingSlots) * sizeof(RequestMsg)), req.get(),
                  sizeof(RequestMsg));
      s->Store(kReqHeadOff, head + 1);
    }
    ++inputs_;
    s->WakeDaemon();
    ASSERT_TRUE(s->WaitSettled()) << "trial " << i << " (mode " << mode
                                  << "): the daemon neither consumed the ring nor ended the "
                                     "session";
    const grpc::StatusCode state = SessionState(s->id());
    if (must_end || s->Closed()) {
      // Ended: Closed() is set first, the session is dropped right after.
      grpc::StatusCode now = state;
      moe::testing::WaitFor(kWait, [&] {
        if (now != grpc::StatusCode::NOT_FOUND) now = SessionState(s->id());
        return now == grpc::StatusCode::NOT_FOUND;
      });
      ASSERT_EQ(now, grpc::StatusCode::NOT_FOUND) << "trial " << i << ": session not ended";
      ASSERT_TRUE(s->Closed());
      ++ended;
    } else {
      ASSERT_EQ(state, grpc::StatusCode::OK) << "trial " << i;
      ++survived;
    }
    Detach(s->id());
    ExpectOthersServed(absl::StrCat("ring garbage trial ", i, " (mode ", mode, ")"));
    if (HasFatalFailure()) return;
  }
  ExpectStillServing("ring garbage");
  // Every garbage session's leases were reclaimed. (A release over shm is
  // posted, not awaited: the known-good client's last one may be in flight.)
  moe::v1::ModelStats m;
  const absl::Time end = absl::Now() + kWait;
  do {
    auto stats = good_client_->GetStats(world_.model);
    ASSERT_TRUE(stats.ok());
    m = stats->models(0);
  } while (m.leases_held() != 0 && absl::Now() < end);
  EXPECT_EQ(m.sessions(), 3u);  // worker, known-good client, fuzz session
  EXPECT_EQ(m.leases_held(), 0u);
  EXPECT_GE(ended, trials / 4);
  std::printf("ring garbage writes: %d; sessions ended: %d, survived: %d\n", inputs_, ended,
              survived);
}

// Garbage over a session's residency view (residency_view.h), the part of
// the region the daemon writes and only reads pins from: the daemon goes on
// serving (its worst is slots that look pinned, refused as leases would
// be), and once the session ends every slot is everyone's again.
TEST_F(ShmRingFuzzTest, GarbageInTheResidencyViewHarmsNoOneElse) {
  for (int trial = 0; trial < Scaled(20); ++trial) {
    auto a = Attach();
    ASSERT_TRUE(a.ok()) << a.status();
    auto fds = cached::FetchFds(a->fd_socket(), a->fd_token());
    ASSERT_TRUE(fds.ok() && fds->size() == 2) << fds.status();
    const channel::ResidencyShape shape{static_cast<uint32_t>(a->num_layers()),
                                        static_cast<uint32_t>(a->num_experts()),
                                        a->slot_count()};
    const size_t bytes = channel::ChannelRegionBytes(shape);
    void* mem = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, (*fds)[1].get(), 0);
    ASSERT_NE(mem, MAP_FAILED);
    uint8_t* view = static_cast<uint8_t*>(mem) + channel::ResidencyOffset();
    const size_t view_bytes = channel::ResidencyBytes(shape);
    if (trial % 2 == 0) {
      for (size_t b = 0; b < view_bytes; ++b) view[b] = static_cast<uint8_t>(rng_());
    } else {
      std::memset(view, 0xff, view_bytes);  // every pin at its maximum
    }
    ++inputs_;
    // Others: served, or refused clearly while the garbage pins slots.
    std::vector<ExpertDemand> want = {{static_cast<int32_t>(trial % world_.num_experts), 1}};
    auto got = good_client_->Acquire({.layer = trial % world_.num_layers, .demands = want});
    ASSERT_TRUE(got.ok() || absl::IsResourceExhausted(got.status())) << got.status();
    if (got.ok()) {
      ASSERT_TRUE(good_client_->Release(got->leases).ok());
    }
    ASSERT_FALSE(daemon_.process().Exited()) << daemon_.stderr_text();
    Detach(a->session_id());
    ::munmap(mem, bytes);
    ExpectOthersServed(absl::StrCat("residency garbage trial ", trial));
    if (HasFatalFailure()) return;
  }
  ExpectStillServing("residency garbage");
}

}  // namespace
}  // namespace moe::fuzz
