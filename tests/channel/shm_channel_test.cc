#include "services/channel/shm_channel.h"

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <thread>

#include "gtest/gtest.h"

namespace moe::channel {
namespace {

// A shared anonymous mapping: visible to a forked child as well.
class Region {
 public:
  Region() {
    mem_ = mmap(nullptr, ChannelBytes(), PROT_READ | PROT_WRITE,
                MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    EXPECT_NE(mem_, MAP_FAILED);
    InitChannel(mem_);
  }
  ~Region() { munmap(mem_, ChannelBytes()); }
  void* get() { return mem_; }

 private:
  void* mem_;
};

// Serves `n` requests: acquires get one lease per demand (slot = 100 +
// expert, generation = layer); pings get an empty reply; releases none.
void Serve(void* mem, int n) {
  ChannelServer server(mem);
  auto req = std::make_unique<RequestMsg>();
  auto resp = std::make_unique<ResponseMsg>();
  for (int served = 0; served < n;) {
    auto got = server.Receive(req.get(), absl::Seconds(10));
    if (!got.ok() || !*got) return;
    ++served;
    if (req->type == static_cast<uint32_t>(MsgType::kRelease)) continue;
    std::memset(resp.get(), 0, sizeof(ResponseMsg));
    resp->seq = req->seq;
    if (req->type == static_cast<uint32_t>(MsgType::kAcquire)) {
      resp->count = req->count;
      for (uint32_t i = 0; i < req->count; ++i) {
        resp->leases[i] = {req->demands[i].expert,
                           100u + static_cast<uint32_t>(req->demands[i].expert),
                           static_cast<uint64_t>(req->layer)};
      }
    }
    ASSERT_TRUE(server.Reply(*resp).ok());
  }
}

std::unique_ptr<RequestMsg> Acquire(int layer, std::vector<int> experts) {
  auto req = std::make_unique<RequestMsg>();
  std::memset(req.get(), 0, sizeof(RequestMsg));
  req->type = static_cast<uint32_t>(MsgType::kAcquire);
  req->layer = layer;
  req->count = experts.size();
  for (size_t i = 0; i < experts.size(); ++i) {
    req->demands[i] = {experts[i], 1};
  }
  return req;
}

TEST(ShmChannelTest, RoundTripAcrossProcesses) {
  Region region;
  constexpr int kCalls = 200;
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    Serve(region.get(), kCalls);
    _exit(0);
  }
  ChannelClient client(region.get());
  auto reply = std::make_unique<ResponseMsg>();
  for (int i = 0; i < kCalls; ++i) {
    auto req = Acquire(i % 7, {i % 5, 7, 250});
    ASSERT_TRUE(client.Call(*req, reply.get(), absl::Seconds(10)).ok());
    ASSERT_EQ(reply->count, 3u);
    EXPECT_EQ(reply->leases[0].slot, 100u + i % 5);
    EXPECT_EQ(reply->leases[2].expert, 250);
    EXPECT_EQ(reply->leases[1].generation, static_cast<uint64_t>(i % 7));
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

TEST(ShmChannelTest, PostedMessagesKeepOrderWithCalls) {
  Region region;
  std::thread server([&] { Serve(region.get(), 2 * 40); });
  ChannelClient client(region.get());
  auto reply = std::make_unique<ResponseMsg>();
  for (int i = 0; i < 40; ++i) {
    auto rel = Acquire(0, {1});
    rel->type = static_cast<uint32_t>(MsgType::kRelease);
    ASSERT_TRUE(client.Post(*rel, absl::Seconds(5)).ok());
    auto req = Acquire(1, {i});
    ASSERT_TRUE(client.Call(*req, reply.get(), absl::Seconds(5)).ok());
    EXPECT_EQ(reply->seq, req->seq);
    EXPECT_EQ(reply->leases[0].expert, i);
  }
  server.join();
}

// A lazy post says so on the wire (the daemon does not learn to spin for
// it); an eager post of the same message clears the mark, and the
// message's own flags pass unchanged either way.
TEST(ShmChannelTest, LazyPostsAreMarked) {
  Region region;
  ChannelClient client(region.get());
  ChannelServer server(region.get());
  auto msg = Acquire(2, {3});
  msg->type = static_cast<uint32_t>(MsgType::kLocalHits);
  msg->flags = kFlagPrefill;
  auto got = std::make_unique<RequestMsg>();
  const ChannelClient::Wake order[] = {ChannelClient::Wake::kLazy, ChannelClient::Wake::kEager,
                                       ChannelClient::Wake::kLazy};
  for (ChannelClient::Wake wake : order) {
    ASSERT_TRUE(client.Post(*msg, absl::Seconds(5), wake).ok());
    auto received = server.Receive(got.get(), absl::Seconds(5));
    ASSERT_TRUE(received.ok() && *received);
    EXPECT_EQ(got->flags & kFlagLazy, wake == ChannelClient::Wake::kLazy ? kFlagLazy : 0u);
    EXPECT_EQ(got->flags & ~kFlagLazy, kFlagPrefill);
    EXPECT_EQ(got->demands[0].expert, 3);
  }
}

// kMember's payload: members packed as many to a message as fit, in order,
// each with its request, prefill flag and demands; a batch that does not fit
// in one message goes in several; the round trip is exact.
TEST(ShmChannelTest, MembersPackAndUnpackExactly) {
  std::vector<MemberDemands> members;
  for (int i = 0; i < 70; ++i) {
    MemberDemands m;
    m.request = 0x100000000ull * static_cast<uint64_t>(i + 1) + static_cast<uint64_t>(i);
    m.prefill = i % 3 == 0;
    for (int e = 0; e <= i % 5; ++e) m.demands.push_back({e * 2 + i % 2, 1 + i + e});
    members.push_back(m);
  }
  auto req = std::make_unique<RequestMsg>();
  std::vector<MemberDemands> back;
  std::vector<size_t> per_message;
  for (absl::Span<const MemberDemands> left(members); !left.empty();) {
    std::memset(req.get(), 0xab, sizeof(*req));  // nothing stale may leak in
    const size_t packed = PackMembers(left, req.get());
    ASSERT_GT(packed, 0u);
    ASSERT_LE(req->count, kMaxItems);
    per_message.push_back(packed);
    ASSERT_TRUE(UnpackMembers(*req, &back).ok());
    left.remove_prefix(packed);
  }
  EXPECT_GT(per_message.size(), 1u);  // 70 members of 1-5 demands: more than 256 items
  EXPECT_GE(per_message[0], 40u);     // and most of them in the first message
  ASSERT_EQ(back.size(), members.size());
  for (size_t i = 0; i < members.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(back[i].request, members[i].request);
    EXPECT_EQ(back[i].prefill, members[i].prefill);
    ASSERT_EQ(back[i].demands.size(), members[i].demands.size());
    for (size_t d = 0; d < members[i].demands.size(); ++d) {
      EXPECT_EQ(back[i].demands[d].expert, members[i].demands[d].expert);
      EXPECT_EQ(back[i].demands[d].tokens, members[i].demands[d].tokens);
    }
  }
}

// What a worker may write instead: a header cut off, a member's demands
// running past the message, nothing at all, too many items. Each is refused
// and leaves what was unpacked before as it was.
TEST(ShmChannelTest, MalformedMembersAreRefused) {
  MemberDemands m;
  m.request = 7;
  m.demands = {{1, 2}, {3, 4}};
  auto req = std::make_unique<RequestMsg>();
  ASSERT_EQ(PackMembers({m, m}, req.get()), 2u);
  ASSERT_EQ(req->count, 2 * (kMemberWireItems + 2));
  std::vector<MemberDemands> out(1);  // one from an earlier message
  const uint32_t full = req->count;
  for (uint32_t count : {full - 1, full - 2 - 1, kMemberWireItems - 1, 0u, kMaxItems + 1}) {
    req->count = count;
    const absl::Status s = UnpackMembers(*req, &out);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << count << ": " << s;
    EXPECT_EQ(out.size(), 1u) << count;
  }
  req->count = full;
  MemberWire huge{9, 0xffffffffu, 0};
  std::memcpy(&req->demands[kMemberWireItems + 2], &huge, sizeof(huge));
  EXPECT_EQ(UnpackMembers(*req, &out).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out.size(), 1u);
}

// Fuzz: random payloads and counts (headers mostly small, to reach deep
// into a message) either unpack into members that account for every item,
// or are refused with `out` untouched; never a read past the message.
TEST(ShmChannelTest, RandomMemberPayloadsUnpackOrAreRefused) {
  std::mt19937 rng(29);
  auto req = std::make_unique<RequestMsg>();
  int accepted = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    auto* words = reinterpret_cast<uint32_t*>(req->demands);
    for (size_t i = 0; i < kMaxItems * 2; ++i) {
      words[i] = rng() % 4 == 0 ? rng() : rng() % 6;
    }
    req->count = rng() % 8 == 0 ? rng() : rng() % (kMaxItems + 2);
    std::vector<MemberDemands> out(2);
    const absl::Status s = UnpackMembers(*req, &out);
    if (!s.ok()) {
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
      EXPECT_EQ(out.size(), 2u);
      continue;
    }
    ++accepted;
    uint32_t items = 0;
    for (size_t i = 2; i < out.size(); ++i) items += kMemberWireItems + out[i].demands.size();
    EXPECT_EQ(items, req->count);
  }
  std::printf("member payloads accepted: %d of 20000\n", accepted);
  EXPECT_GT(accepted, 100) << "the generator should reach valid messages too";
}

TEST(ShmChannelTest, ServerTimesOutWhenIdle) {
  Region region;
  ChannelServer server(region.get());
  auto req = std::make_unique<RequestMsg>();
  auto got = server.Receive(req.get(), absl::Milliseconds(20));
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(*got);
}

TEST(ShmChannelTest, CloseWakesWaitingClient) {
  Region region;
  ChannelServer server(region.get());
  std::thread closer([&] {
    auto req = std::make_unique<RequestMsg>();
    auto got = server.Receive(req.get(), absl::Seconds(10));
    ASSERT_TRUE(got.ok() && *got);
    server.Close();  // received, never answered
  });
  ChannelClient client(region.get());
  auto reply = std::make_unique<ResponseMsg>();
  auto req = Acquire(0, {1});
  absl::Status s = client.Call(*req, reply.get(), absl::Seconds(10));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  closer.join();
}

TEST(ShmChannelTest, PeerCheckAbortsWait) {
  Region region;
  ChannelClient client(region.get());
  auto reply = std::make_unique<ResponseMsg>();
  auto req = Acquire(0, {1});
  int polls = 0;
  absl::Status s = client.Call(*req, reply.get(), absl::Seconds(30), [&] {
    return ++polls >= 3 ? absl::UnavailableError("daemon exited")
                        : absl::OkStatus();
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), "daemon exited");
}

TEST(ShmChannelTest, ErrorRepliesBecomeStatuses) {
  Region region;
  std::thread server([&] {
    ChannelServer srv(region.get());
    auto req = std::make_unique<RequestMsg>();
    ASSERT_TRUE(*srv.Receive(req.get(), absl::Seconds(10)));
    auto resp = std::make_unique<ResponseMsg>();
    std::memset(resp.get(), 0, sizeof(ResponseMsg));
    resp->seq = req->seq;
    resp->status_code = static_cast<int>(absl::StatusCode::kInvalidArgument);
    std::strcpy(resp->error, "expert 99 out of range");
    ASSERT_TRUE(srv.Reply(*resp).ok());
  });
  ChannelClient client(region.get());
  auto reply = std::make_unique<ResponseMsg>();
  auto req = Acquire(0, {99});
  absl::Status s = client.Call(*req, reply.get(), absl::Seconds(10));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "expert 99 out of range");
  server.join();
}

// Garbage written by a hostile worker: never a crash; bad messages are
// refused one by one, corrupt indices break the channel.
TEST(ShmChannelTest, GarbageInTheRingIsRefused) {
  Region region;
  ChannelServer server(region.get());
  auto* bytes = static_cast<uint8_t*>(region.get());
  auto req = std::make_unique<RequestMsg>();
  // A message with an unknown type and one with too many items.
  ChannelClient client(region.get());
  auto bad = Acquire(0, {1});
  bad->type = 77;
  ASSERT_TRUE(client.Post(*bad, absl::Seconds(1)).ok());
  auto big = Acquire(0, {1});
  ASSERT_TRUE(client.Post(*big, absl::Seconds(1)).ok());
  auto good = Acquire(3, {4});
  ASSERT_TRUE(client.Post(*good, absl::Seconds(1)).ok());
  // Scribble count of the second message after posting.
  // (The request ring starts after the header words; find it by content.)
  size_t count_off = 0;
  for (size_t off = 0; off + sizeof(RequestMsg) <= ChannelBytes(); off += 8) {
    auto* m = reinterpret_cast<RequestMsg*>(bytes + off);
    if (m->type == 1 && m->seq == big->seq && m->count == 1) {
      count_off = off + offsetof(RequestMsg, count);
      break;
    }
  }
  ASSERT_NE(count_off, 0u);
  uint32_t huge = 1u << 30;
  std::memcpy(bytes + count_off, &huge, sizeof(huge));

  auto r1 = server.Receive(req.get(), absl::Seconds(1));
  EXPECT_EQ(r1.status().code(), absl::StatusCode::kInvalidArgument);
  auto r2 = server.Receive(req.get(), absl::Seconds(1));
  EXPECT_EQ(r2.status().code(), absl::StatusCode::kInvalidArgument);
  auto r3 = server.Receive(req.get(), absl::Seconds(1));
  ASSERT_TRUE(r3.ok() && *r3);
  EXPECT_EQ(req->layer, 3);

  // Random garbage over the whole region: every call returns, none crashes.
  std::mt19937 rng(7);
  int broken = 0;
  for (int round = 0; round < 200; ++round) {
    for (size_t i = 0; i < 512; ++i) {
      bytes[rng() % ChannelBytes()] = static_cast<uint8_t>(rng());
    }
    ChannelServer fresh(region.get());
    auto got = fresh.Receive(req.get(), absl::Milliseconds(1));
    if (!got.ok()) ++broken;
  }
  EXPECT_GT(broken, 0);
}

}  // namespace
}  // namespace moe::channel
