#include "services/client/cache_client.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/checked_math.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "moe/v1/expert_cache.grpc.pb.h"
#include "services/cache/shm_region.h"
#include "services/channel/residency_view.h"
#include "services/channel/shm_channel.h"
#include "services/exchange/exchange_proto.h"
#include "services/moe_cached/pid_watch.h"
#include "services/moe_cached/cuda_ipc_mapping.h"
#include "services/moe_cached/fd_broker.h"
#include "services/rpc/rpc_util.h"

namespace moe::client {

using cached::CudaArenaMapping;
using cached::FetchFds;
using cached::PidWatch;
using cached::UniqueFd;

namespace {

// The channel must be writable by the worker, so it is not a read-only
// ShmRegion: map it read-write here.
class ChannelMapping {
 public:
  static absl::StatusOr<std::unique_ptr<ChannelMapping>> Open(const std::string& name,
                                                              size_t bytes) {
    int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) {
      return absl::UnavailableError(absl::StrCat("shm_open(", name, "): ", std::strerror(errno)));
    }
    UniqueFd owned(fd);
    return FromFd(fd, name, bytes);
  }
  // Maps the channel region of `bytes` behind `fd` (the caller keeps the
  // descriptor).
  static absl::StatusOr<std::unique_ptr<ChannelMapping>> FromFd(int fd, const std::string& name,
                                                                size_t bytes) {
    struct stat st;
    if (::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("channel ", name, " is smaller than ", bytes, " bytes"));
    }
    void* mem = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int err = errno;
    if (mem == MAP_FAILED) {
      return absl::UnavailableError(absl::StrCat("mmap(", name, "): ", std::strerror(err)));
    }
    auto m = std::unique_ptr<ChannelMapping>(new ChannelMapping(mem, bytes));
    RETURN_IF_ERROR(channel::ValidateChannel(mem, bytes));
    return m;
  }
  ~ChannelMapping() { ::munmap(mem_, bytes_); }
  void* mem() const { return mem_; }

 private:
  ChannelMapping(void* mem, size_t bytes) : mem_(mem), bytes_(bytes) {}
  void* mem_;
  size_t bytes_;
};

}  // namespace

struct CacheClient::Impl {
  CacheClientOptions options;
  std::unique_ptr<moe::v1::ExpertCache::Stub> stub;
  uint64_t session_id = 0;
  cache::ShmRegion store;                          // the daemon's host copy, if granted
  cache::ShmRegion arena;                          // host shared-memory arena, or
  std::unique_ptr<CudaArenaMapping> cuda_arena;   // the daemon's CUDA arena
  PidWatch daemon;
  std::unique_ptr<ChannelMapping> channel_mem;
  std::optional<channel::ResidencyView> residency;  // in channel_mem, with it
  // Local hits wake a sleeping daemon only when its prefetches follow the
  // routing (AttachResponse::routing_feeds_prefetch); else nobody waits on
  // them and it takes them when it next looks.
  channel::ChannelClient::Wake local_hits_wake = channel::ChannelClient::Wake::kLazy;
  absl::Mutex mu;
  std::unique_ptr<channel::ChannelClient> channel ABSL_GUARDED_BY(mu);
  std::unique_ptr<channel::RequestMsg> req ABSL_GUARDED_BY(mu);
  std::unique_ptr<channel::ResponseMsg> reply ABSL_GUARDED_BY(mu);
  bool detached ABSL_GUARDED_BY(mu) = false;
  uint64_t request ABSL_GUARDED_BY(mu) = 0;  // the current request (0: default)
  absl::flat_hash_set<uint64_t> live ABSL_GUARDED_BY(mu);  // begun here, not ended

  bool UseShm(Transport t) const {
    if (t == Transport::kGrpc) return false;
    return channel_mem != nullptr && (t == Transport::kShm || options.use_shm);
  }

  void SetDeadline(grpc::ClientContext* ctx) const {
    ctx->set_deadline(absl::ToChronoTime(absl::Now() + options.timeout));
  }

  absl::Status PeerAlive() const {
    if (daemon.Exited()) {
      return absl::UnavailableError(absl::StrCat("moe-cached (pid ", daemon.pid(), ") exited"));
    }
    return absl::OkStatus();
  }

  // Fills the header of the next shm message.
  void StartMessageLocked(channel::MsgType type, uint32_t count)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    req->type = static_cast<uint32_t>(type);
    req->count = count;
    req->flags = 0;
    req->part = 0;
    req->request_id = request;
  }

  // REQUIRES: hints checked (ValidateHints), at most kMaxItems, not empty.
  absl::Status PostHintsLocked(absl::Span<const ExpertHint> hints)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    StartMessageLocked(channel::MsgType::kHints, static_cast<uint32_t>(hints.size()));
    channel::ToWire(hints, req->hints);
    return channel->Post(*req, options.timeout);
  }

  // The attach call; fills `aresp`.
  absl::Status Attach(moe::v1::AttachResponse* aresp) {
    moe::v1::AttachRequest areq;
    areq.set_model(options.model);
    areq.set_worker_id(options.worker_id);
    areq.set_pid(::getpid());
    areq.set_host_execution(options.host_execution);
    areq.set_arena_kind(options.cuda != nullptr ? moe::v1::ARENA_KIND_CUDA_IPC
                                                : moe::v1::ARENA_KIND_HOST_SHM);
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    ctx.set_wait_for_ready(false);
    RETURN_IF_ERROR(rpc::FromGrpcStatus(stub->Attach(&ctx, areq, aresp)));
    session_id = aresp->session_id();
    return absl::OkStatus();
  }

  // Maps the model's arena as Attach described it; `fds` receives the
  // [arena, channel] descriptors when the daemon passes them.
  absl::Status MapArena(const moe::v1::AttachResponse& aresp, std::vector<UniqueFd>* fds) {
    if (aresp.arena_kind() == moe::v1::ARENA_KIND_CUDA_IPC) {
      if (options.cuda == nullptr) {
        return absl::FailedPreconditionError(absl::StrCat(
            "moe-cached keeps model '", options.model, "' in CUDA device memory (device ",
            aresp.cuda_device(), "); this client has no CUDA backend: run the worker with "
            "--backend cuda, or moe-cached with --device cpu"));
      }
      ASSIGN_OR_RETURN(cuda_arena, CudaArenaMapping::Open(options.cuda, aresp.cuda_ipc_handle(),
                                                          aresp.arena_bytes()));
      return absl::OkStatus();
    }
    if (aresp.arena_kind() != moe::v1::ARENA_KIND_HOST_SHM) {
      return absl::UnimplementedError(
          absl::StrCat("unknown arena kind ", static_cast<int>(aresp.arena_kind())));
    }
    if (options.cuda != nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "moe-cached keeps model '", options.model, "' in host memory but this client "
          "computes on a CUDA device: start moe-cached with --device cuda, or the worker with "
          "--backend cpu"));
    }
    if (aresp.fd_socket().empty()) {
      ASSIGN_OR_RETURN(arena,
                       cache::ShmRegion::OpenReadOnlyByName(aresp.shm_name(), aresp.arena_bytes()));
      return absl::OkStatus();
    }
    absl::StatusOr<std::vector<UniqueFd>> got = FetchFds(aresp.fd_socket(), aresp.fd_token());
    if (!got.ok()) {
      return absl::Status(got.status().code(),
                          absl::StrCat("attach: collecting the arena: ", got.status().message()));
    }
    const size_t want = aresp.store_bytes() > 0 ? 3 : 2;
    if (got->size() != want) {
      return absl::InternalError(absl::StrCat("attach: daemon passed ", got->size(),
                                              " descriptors, expected ", want));
    }
    *fds = std::move(*got);
    ASSIGN_OR_RETURN(arena, cache::ShmRegion::OpenReadOnly((*fds)[0].get(), aresp.arena_bytes()));
    if (want == 3) {
      // Every expert: page tables as host execution touches them.
      ASSIGN_OR_RETURN(store, cache::ShmRegion::OpenReadOnly((*fds)[2].get(), aresp.store_bytes(),
                                                             cache::ShmRegion::Pages::kOnTouch));
    }
    return absl::OkStatus();
  }

  // Opens the shared-memory channel and its residency view; without it
  // calls go over gRPC.
  void OpenChannel(const moe::v1::AttachResponse& aresp, const std::vector<UniqueFd>& fds) {
    if (!options.use_shm || (aresp.channel_name().empty() && fds.empty())) return;
    const channel::ResidencyShape shape{static_cast<uint32_t>(aresp.num_layers()),
                                        static_cast<uint32_t>(aresp.num_experts()),
                                        aresp.slot_count()};
    const size_t bytes = channel::ChannelRegionBytes(shape);
    absl::StatusOr<std::unique_ptr<ChannelMapping>> ch =
        fds.empty() ? ChannelMapping::Open(aresp.channel_name(), bytes)
                    : ChannelMapping::FromFd(fds[1].get(), "(memfd)", bytes);
    if (!ch.ok()) {
      MOE_LOG(WARNING) << "cache client: shared-memory channel unavailable, using gRPC: "
                       << ch.status();
      return;
    }
    channel_mem = std::move(*ch);
    residency.emplace(channel_mem->mem(), shape);
    local_hits_wake = aresp.routing_feeds_prefetch() ? channel::ChannelClient::Wake::kEager
                                                     : channel::ChannelClient::Wake::kLazy;
    absl::MutexLock lock(&mu);
    channel = std::make_unique<channel::ChannelClient>(channel_mem->mem());
  }

  // Posts `members` (kMember, as many to a message as fit: one message for
  // a batch of 16 decoding sequences) for the acquire or local hits that
  // follow. REQUIRES: each member in range (ValidateMembers: at most
  // num_experts demands, far fewer than a message holds).
  absl::Status PostMembersLocked(int layer, absl::Span<const MemberDemands> members,
                                 channel::ChannelClient::Wake wake)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    while (!members.empty()) {
      StartMessageLocked(channel::MsgType::kMember, 0);
      req->layer = layer;
      const size_t packed = channel::PackMembers(members, req.get());
      if (packed == 0) return absl::InternalError("a member too large for a message");
      members.remove_prefix(packed);
      RETURN_IF_ERROR(channel->Post(*req, options.timeout, wake));
    }
    return absl::OkStatus();
  }

  // Whether the daemon would take `call` as it stands: in range (the
  // exchange rules, as the daemon checks them) and for live requests (begun
  // through this client, or 0). Anything else goes to the daemon, whose
  // error the caller then gets.
  bool MayServeLocallyLocked(const ExchangeShape& shape, const AcquireCall& call)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (!residency.has_value() || !ValidateDemands(shape, call.layer, call.demands).ok()) {
      return false;
    }
    auto live_request = [&](uint64_t r) { return r == 0 || live.contains(r); };
    if (!live_request(request)) return false;
    if (call.members.empty()) return true;
    if (!ValidateMembers(shape, call.layer, call.demands, call.members).ok()) return false;
    bool lead = false;
    for (const MemberDemands& m : call.members) {
      if (!live_request(m.request)) return false;
      lead |= m.request == request;
    }
    return lead;
  }

  // Every demanded expert resident: each slot pinned through the residency
  // view, and the acquire posted to the daemon as local hits (no reply to
  // wait for). False, nothing pinned, when one is not.
  // REQUIRES: `call` in range (MayServeLocallyLocked).
  bool TryLocalAcquireLocked(const AcquireCall& call, AcquireResult* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (!residency.has_value()) return false;
    std::vector<SlotLease> pinned;
    pinned.reserve(call.demands.size());
    for (const ExpertDemand& d : call.demands) {
      const int32_t slot = residency->TryPin(residency->shape().Key(
          static_cast<uint32_t>(call.layer), static_cast<uint32_t>(d.expert)));
      if (slot < 0) break;
      pinned.push_back({ExpertKey{call.layer, d.expert}, slot, kLocalLeaseGeneration});
    }
    absl::Status posted;
    if (pinned.size() == call.demands.size()) {
      posted = PostMembersLocked(call.layer, call.members, local_hits_wake);
      if (posted.ok()) {
        StartMessageLocked(channel::MsgType::kLocalHits,
                           static_cast<uint32_t>(call.demands.size()));
        req->layer = call.layer;
        req->flags = (call.prefill ? channel::kFlagPrefill : 0) |
                     (call.members.empty() ? 0 : channel::kFlagMembers);
        channel::ToWire(call.demands, req->demands);
        posted = channel->Post(*req, options.timeout, local_hits_wake);
      }
      if (posted.ok()) {
        out->leases = std::move(pinned);
        out->usage.hits = static_cast<int32_t>(call.demands.size());
        return true;
      }
    }
    for (const SlotLease& l : pinned) residency->Unpin(static_cast<uint32_t>(l.slot));
    return false;
  }
};

absl::Status CheckArenaGeometry(const ArenaGeometry& g) {
  auto refuse = [&](absl::string_view why) {
    return absl::FailedPreconditionError(absl::StrCat(
        "moe-cached reported an arena of ", g.arena_bytes, " bytes with ", g.slot_count,
        " slots of ", g.slot_bytes, " bytes and a host copy of ", g.store_bytes, " bytes for ",
        g.num_layers, " x ", g.num_experts, " experts: ", why));
  };
  uint64_t slots_bytes;
  if (g.slot_bytes == 0) return refuse("empty slots");
  if (!CheckedMul(g.slot_bytes, uint64_t{g.slot_count}, &slots_bytes) ||
      slots_bytes > g.arena_bytes) {
    return refuse("the slots do not fit in the arena");
  }
  if (g.num_layers <= 0 || g.layer_block_bytes.size() != static_cast<size_t>(g.num_layers)) {
    return refuse(absl::StrCat("it describes ", g.layer_block_bytes.size(), " layers' blocks"));
  }
  for (uint64_t b : g.layer_block_bytes) {
    if (b == 0 || b > g.slot_bytes) return refuse("a layer's blocks do not fit in a slot");
  }
  if (g.store_bytes == 0) return absl::OkStatus();
  if (g.num_experts <= 0) return refuse("no experts");
  uint64_t store_need = 0;
  for (uint64_t b : g.layer_block_bytes) {
    uint64_t layer;
    if (!CheckedMul(b, static_cast<uint64_t>(g.num_experts), &layer) ||
        layer > g.store_bytes - store_need) {
      return refuse("the host copy does not hold a block per expert");
    }
    store_need += layer;
  }
  return absl::OkStatus();
}

CacheClient::CacheClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

CacheClient::~CacheClient() {
  absl::Status s = Detach();
  if (!s.ok() && !absl::IsFailedPrecondition(s)) {
    MOE_LOG(DEBUG) << "cache client: detach on destruction: " << s;
  }
}

absl::StatusOr<std::unique_ptr<CacheClient>> CacheClient::Connect(
    const CacheClientOptions& options) {
  ASSIGN_OR_RETURN(rpc::ListenAddress address, rpc::ParseListenAddress(options.address));
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                   rpc::MakeChannel(address, options.security));
  impl->stub = moe::v1::ExpertCache::NewStub(std::move(channel));
  impl->req = std::make_unique<channel::RequestMsg>();
  impl->reply = std::make_unique<channel::ResponseMsg>();
  moe::v1::AttachResponse aresp;
  RETURN_IF_ERROR(impl->Attach(&aresp));

  // From here on the destructor detaches.
  std::unique_ptr<CacheClient> client(new CacheClient(std::move(impl)));
  Impl& im = *client->impl_;
  std::vector<UniqueFd> fds;
  RETURN_IF_ERROR(im.MapArena(aresp, &fds));
  ArenaGeometry geometry{aresp.arena_bytes(), aresp.slot_bytes(), aresp.slot_count(),
                        im.store.valid() ? aresp.store_bytes() : 0, aresp.num_layers(),
                        aresp.num_experts()};
  for (const moe::v1::LayerLayout& l : aresp.layer_layout()) {
    geometry.layer_block_bytes.push_back(l.block_bytes());
  }
  RETURN_IF_ERROR(CheckArenaGeometry(geometry));
  client->model_ = aresp.model().empty() ? options.model : aresp.model();
  client->num_layers_ = aresp.num_layers();
  client->num_experts_ = aresp.num_experts();
  client->top_k_ = aresp.top_k();
  client->slot_bytes_ = aresp.slot_bytes();
  client->slot_count_ = aresp.slot_count();
  uint64_t store_offset = 0;
  for (const moe::v1::LayerLayout& l : aresp.layer_layout()) {
    SlotLayout& layout = client->layouts_.emplace_back();
    layout.block_bytes = l.block_bytes();
    layout.store_offset = store_offset;
    store_offset += l.block_bytes() * static_cast<uint64_t>(aresp.num_experts());
    for (const moe::v1::TensorLayout& t : l.tensors()) {
      ASSIGN_OR_RETURN(DType dtype, ParseWeightDType(t.dtype()));
      if (t.offset() > l.block_bytes() || t.nbytes() > l.block_bytes() - t.offset()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "moe-cached's layout puts the ", t.role(), " tensor at [", t.offset(), ", +",
            t.nbytes(), ") outside its ", l.block_bytes(), "-byte block"));
      }
      layout.tensors.push_back(
          {t.role(), dtype, {t.shape().begin(), t.shape().end()}, t.offset(), t.nbytes()});
    }
  }
  absl::StatusOr<PidWatch> watch = PidWatch::Open(aresp.daemon_pid());
  if (watch.ok()) im.daemon = std::move(*watch);
  im.OpenChannel(aresp, fds);
  return client;
}

bool CacheClient::shm_enabled() const { return impl_->channel_mem != nullptr; }

bool CacheClient::host_execution() const { return impl_->store.valid(); }

const uint8_t* CacheClient::HostData(const ExpertKey& key) const {
  MOE_CHECK(impl_->store.valid()) << "no host copy was granted";
  MOE_CHECK(key.layer >= 0 && key.layer < num_layers_ && key.expert >= 0 &&
            key.expert < num_experts_)
      << key.ToString() << " out of range";
  // CheckArenaGeometry saw every layer's blocks inside the host copy.
  const SlotLayout& l = layouts_[static_cast<size_t>(key.layer)];
  return impl_->store.data() + l.store_offset + static_cast<uint64_t>(key.expert) * l.block_bytes;
}

const uint8_t* CacheClient::SlotData(SlotId slot) const {
  MOE_CHECK(slot >= 0 && static_cast<uint32_t>(slot) < slot_count_)
      << "slot " << slot << " out of range";
  const uint8_t* base = impl_->cuda_arena != nullptr
                            ? static_cast<const uint8_t*>(impl_->cuda_arena->device_ptr())
                            : impl_->arena.data();
  return base + uint64_t(slot) * slot_bytes_;
}

absl::Status CacheClient::CheckHints(absl::Span<const ExpertHint> hints) const {
  // Over shm hints are posted without a reply, so they are checked here, by
  // the daemon's own rule, to report errors as gRPC does.
  if (hints.size() > channel::kMaxItems) {
    return absl::InvalidArgumentError("too many hints for one message");
  }
  return ValidateHints(ExchangeShape{num_layers_, num_experts_}, hints);
}

absl::Status CacheClient::Hint(absl::Span<const ExpertHint> hints) {
  if (hints.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(CheckHints(hints));
  Impl& im = *impl_;
  if (!im.UseShm(Transport::kDefault)) {
    return absl::FailedPreconditionError("hints on their own need the shared-memory channel");
  }
  absl::MutexLock lock(&im.mu);
  if (im.detached) return absl::FailedPreconditionError("client detached");
  return im.PostHintsLocked(hints);
}

absl::Status CacheClient::ReportHostRuns(const HostRunReport& report) {
  RETURN_IF_ERROR(ValidateHostRunReport(report));
  Impl& im = *impl_;
  if (!im.UseShm(Transport::kDefault) || !host_execution()) {
    return absl::FailedPreconditionError(
        "host-run reports need the shared-memory channel and host execution");
  }
  absl::MutexLock lock(&im.mu);
  if (im.detached) return absl::FailedPreconditionError("client detached");
  im.StartMessageLocked(channel::MsgType::kHostRuns, 1);
  im.req->host_runs[0] = channel::ToWire(report);
  return im.channel->Post(*im.req, im.options.timeout);
}

absl::StatusOr<AcquireResult> CacheClient::Acquire(const AcquireCall& call,
                                                   Transport transport) {
  Impl& im = *impl_;
  const int layer = call.layer;
  const absl::Span<const ExpertDemand> experts = call.demands;
  const bool prefill = call.prefill;
  const absl::Span<const ExpertHint> hints = call.hints;
  const absl::Span<const MemberDemands> members = call.members;
  AcquireResult out;
  // Over shm hints travel in a message of their own: a continue's would
  // reach the daemon unchecked against it.
  RETURN_IF_ERROR(ValidateParts(ExchangeShape{num_layers_, num_experts_}, call));
  if (members.size() > static_cast<size_t>(kMaxRequestsPerSession)) {
    return absl::InvalidArgumentError("too many members for one acquire");
  }
  if (im.UseShm(transport)) {
    if (experts.size() > channel::kMaxItems) {
      return absl::InvalidArgumentError("too many experts for one message");
    }
    for (const MemberDemands& m : members) {
      if (m.demands.size() > channel::kMaxItems - channel::kMemberWireItems) {
        return absl::InvalidArgumentError("too many experts for one member message");
      }
    }
    RETURN_IF_ERROR(CheckHints(hints));
    absl::MutexLock lock(&im.mu);
    if (im.detached) return absl::FailedPreconditionError("client detached");
    if (!hints.empty()) RETURN_IF_ERROR(im.PostHintsLocked(hints));
    if (!call.continues &&
        im.MayServeLocallyLocked(ExchangeShape{num_layers_, num_experts_}, call) &&
        im.TryLocalAcquireLocked(call, &out)) {
      return out;
    }
    RETURN_IF_ERROR(im.PostMembersLocked(layer, members, channel::ChannelClient::Wake::kEager));
    im.StartMessageLocked(channel::MsgType::kAcquire, static_cast<uint32_t>(experts.size()));
    im.req->layer = layer;
    im.req->flags = (prefill ? channel::kFlagPrefill : 0) |
                    (members.empty() ? 0 : channel::kFlagMembers) |
                    (call.continues ? channel::kFlagContinues : 0);
    im.req->part = static_cast<uint32_t>(std::max(0, call.part));
    channel::ToWire(experts, im.req->demands);
    RETURN_IF_ERROR(im.channel->Call(*im.req, im.reply.get(), im.options.timeout,
                                     [&im] { return im.PeerAlive(); }));
    out = channel::AcquireResultFromWire(*im.reply);
  } else {
    moe::v1::AcquireRequest req;
    req.set_session_id(im.session_id);
    req.set_layer(layer);
    req.set_prefill(prefill);
    ToProtoList(experts, req.mutable_experts());
    ToProtoList(hints, req.mutable_hints());
    ToProtoList(members, req.mutable_members());
    req.set_lease_part(static_cast<uint32_t>(std::max(0, call.part)));
    req.set_continues(call.continues);
    {
      absl::MutexLock lock(&im.mu);
      req.set_request(im.request);
    }
    moe::v1::AcquireResponse resp;
    grpc::ClientContext ctx;
    im.SetDeadline(&ctx);
    RETURN_IF_ERROR(rpc::FromGrpcStatus(im.stub->Acquire(&ctx, req, &resp)));
    out = AcquireResultFromProto(resp, layer);
  }
  if (!out.host.empty() && !impl_->store.valid()) {
    return absl::InternalError("daemon answered 'run on host' but granted no host copy");
  }
  for (const SlotLease& l : out.leases) {
    if (l.slot < 0 || static_cast<uint32_t>(l.slot) >= slot_count_) {
      return absl::InternalError(absl::StrCat("daemon leased slot ", l.slot, " of ", slot_count_));
    }
  }
  return out;
}

void CacheClient::SetCurrentRequest(uint64_t request) {
  absl::MutexLock lock(&impl_->mu);
  impl_->request = request;
}

absl::Status CacheClient::Release(absl::Span<const SlotLease> leases, Transport transport) {
  Impl& im = *impl_;
  // Pins taken through the residency view are dropped here; the daemon's
  // leases go back to it.
  std::vector<SlotLease> daemon_leases;
  for (const SlotLease& l : leases) {
    if (l.generation == kLocalLeaseGeneration && im.residency.has_value() && l.slot >= 0 &&
        static_cast<uint32_t>(l.slot) < slot_count_) {
      im.residency->Unpin(static_cast<uint32_t>(l.slot));
    } else {
      daemon_leases.push_back(l);
    }
  }
  if (daemon_leases.size() != leases.size()) leases = daemon_leases;
  if (leases.empty()) return absl::OkStatus();
  if (im.UseShm(transport) && leases.size() <= channel::kMaxItems) {
    absl::MutexLock lock(&im.mu);
    if (im.detached) return absl::FailedPreconditionError("client detached");
    im.StartMessageLocked(channel::MsgType::kRelease, static_cast<uint32_t>(leases.size()));
    channel::ToWire(leases, im.req->leases);
    return im.channel->Post(*im.req, im.options.timeout);
  }
  moe::v1::ReleaseRequest req;
  req.set_session_id(im.session_id);
  ToProtoList(leases, req.mutable_leases());
  moe::v1::ReleaseResponse resp;
  grpc::ClientContext ctx;
  im.SetDeadline(&ctx);
  return rpc::FromGrpcStatus(im.stub->Release(&ctx, req, &resp));
}

absl::Status CacheClient::BeginRequest(uint64_t request, Transport transport) {
  Impl& im = *impl_;
  absl::Status s;
  if (im.UseShm(transport)) {
    absl::MutexLock lock(&im.mu);
    if (im.detached) return absl::FailedPreconditionError("client detached");
    im.StartMessageLocked(channel::MsgType::kBeginRequest, 0);
    im.req->request_id = request;
    s = im.channel->Call(*im.req, im.reply.get(), im.options.timeout,
                         [&im] { return im.PeerAlive(); });
  } else {
    moe::v1::BeginRequestRequest req;
    req.set_session_id(im.session_id);
    req.set_request(request);
    moe::v1::BeginRequestResponse resp;
    grpc::ClientContext ctx;
    im.SetDeadline(&ctx);
    s = rpc::FromGrpcStatus(im.stub->BeginRequest(&ctx, req, &resp));
  }
  if (s.ok()) {
    absl::MutexLock lock(&im.mu);
    im.request = request;
    im.live.insert(request);
  }
  return s;
}

absl::Status CacheClient::EndRequest(uint64_t request, Transport transport) {
  Impl& im = *impl_;
  {
    absl::MutexLock lock(&im.mu);
    if (im.request == request) im.request = 0;
    im.live.erase(request);
  }
  if (im.UseShm(transport)) {
    absl::MutexLock lock(&im.mu);
    if (im.detached) return absl::FailedPreconditionError("client detached");
    im.StartMessageLocked(channel::MsgType::kEndRequest, 0);
    im.req->request_id = request;
    return im.channel->Call(*im.req, im.reply.get(), im.options.timeout,
                            [&im] { return im.PeerAlive(); });
  }
  moe::v1::EndRequestRequest req;
  req.set_session_id(im.session_id);
  req.set_request(request);
  moe::v1::EndRequestResponse resp;
  grpc::ClientContext ctx;
  im.SetDeadline(&ctx);
  return rpc::FromGrpcStatus(im.stub->EndRequest(&ctx, req, &resp));
}

absl::Status CacheClient::Detach() {
  Impl& im = *impl_;
  {
    absl::MutexLock lock(&im.mu);
    if (im.detached) return absl::FailedPreconditionError("client already detached");
    im.detached = true;
  }
  if (im.daemon.Exited()) return absl::UnavailableError("moe-cached exited");
  moe::v1::DetachRequest req;
  req.set_session_id(im.session_id);
  moe::v1::DetachResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  return rpc::FromGrpcStatus(im.stub->Detach(&ctx, req, &resp));
}

absl::StatusOr<moe::v1::GetStatsResponse> CacheClient::GetStats(const std::string& model) {
  if (shm_enabled()) {
    // A round trip on the channel first: the daemon has then counted the
    // local hits posted before it (it takes the channel's messages in order).
    Impl& im = *impl_;
    absl::MutexLock lock(&im.mu);
    if (!im.detached) {
      im.StartMessageLocked(channel::MsgType::kPing, 0);
      RETURN_IF_ERROR(im.channel->Call(*im.req, im.reply.get(), im.options.timeout,
                                       [&im] { return im.PeerAlive(); }));
    }
  }
  moe::v1::GetStatsRequest req;
  req.set_model(model);
  moe::v1::GetStatsResponse resp;
  grpc::ClientContext ctx;
  impl_->SetDeadline(&ctx);
  RETURN_IF_ERROR(rpc::FromGrpcStatus(impl_->stub->GetStats(&ctx, req, &resp)));
  return resp;
}

}  // namespace moe::client
