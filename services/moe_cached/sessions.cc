#include "services/moe_cached/sessions.h"

#include <sys/random.h>

#include <algorithm>
#include <cstring>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/threads.h"
#include "services/channel/shm_channel.h"

namespace moe::cached {

struct SessionManager::Session {
  uint64_t id = 0;
  CachedModel* model = nullptr;
  std::string worker_id;
  PidWatch pid;
  cache::ShmRegion channel;
  std::thread thread;
  std::atomic<bool> stop{false};
  std::atomic<bool> ended{false};  // leases dropped; only Reap/Stop remain
  std::atomic<int64_t> leases{0};
  bool host_ok = false;  // may get "run on host" answers (has the store)
  absl::Mutex requests_mu;
  absl::flat_hash_set<uint64_t> requests ABSL_GUARDED_BY(requests_mu);  // begun, not ended
  // kMember messages posted for the next batched acquire (touched only by
  // the session's serving thread); `staged_error` is answered on it.
  std::vector<MemberDemands> staged;
  int32_t staged_layer = -1;
  absl::Status staged_error;
};

namespace {

uint64_t RandomId() {
  uint64_t id = 0;
  while (id == 0) {
    MOE_CHECK(::getrandom(&id, sizeof(id), 0) == sizeof(id)) << "getrandom failed";
  }
  return id;
}

void FillError(const absl::Status& s, channel::ResponseMsg* reply) {
  reply->status_code = static_cast<int32_t>(s.code());
  std::string msg(s.message());
  size_t n = std::min(msg.size(), sizeof(reply->error) - 1);
  std::memcpy(reply->error, msg.data(), n);
  reply->error[n] = '\0';
}

// The worker maps what the model's arena is (design: the device is
// negotiated at attach, so a mismatch is a clear start error on both sides,
// not a restart loop).
absl::Status CheckArenaKind(const CachedModel& model, const std::string& worker,
                            moe::v1::ArenaKind wanted) {
  const bool on_cuda = model.cuda_arena() != nullptr;
  if (wanted == moe::v1::ARENA_KIND_UNSPECIFIED ||
      wanted == (on_cuda ? moe::v1::ARENA_KIND_CUDA_IPC : moe::v1::ARENA_KIND_HOST_SHM)) {
    return absl::OkStatus();
  }
  const absl::Status refused = absl::FailedPreconditionError(absl::StrCat(
      "moe-cached keeps model '", model.name(), "' in ",
      on_cuda ? "CUDA device memory" : "host memory", " but worker '", worker,
      "' computes on ", on_cuda ? "the CPU" : "a CUDA device", ": give both the same --device (",
      on_cuda ? "the worker --device cuda or auto, or moe-cached --device cpu"
              : "moe-cached --device cuda or auto, or the worker --device cpu",
      ")"));
  MOE_LOG(WARNING) << "attach refused: " << refused.message();
  return refused;
}

}  // namespace

std::string ClipName(absl::string_view name) {
  constexpr size_t kMax = 64;
  if (name.size() <= kMax) return std::string(name);
  return absl::StrCat(name.substr(0, kMax), "... (", name.size(), " bytes)");
}

SessionManager::SessionManager(std::vector<CachedModel*> models, int max_sessions)
    : max_sessions_(max_sessions) {
  for (CachedModel* m : models) models_[m->name()] = m;
}

SessionManager::~SessionManager() { Stop(); }

absl::StatusOr<AttachResult> SessionManager::Attach(const std::string& model,
                                                    const std::string& worker_id, int pid,
                                                    bool host_execution,
                                                    moe::v1::ArenaKind arena_kind) {
  auto it = models_.find(model);
  if (it == models_.end()) {
    std::vector<std::string> names;
    for (const auto& [name, m] : models_) names.push_back(name);
    std::sort(names.begin(), names.end());
    return absl::NotFoundError(absl::StrCat("no model '", ClipName(model), "' (serving: ",
                                            absl::StrJoin(names, ", "), ")"));
  }
  CachedModel* const cached = it->second;
  RETURN_IF_ERROR(CheckArenaKind(*cached, ClipName(worker_id), arena_kind));
  // Descriptors through the broker when the arena is an unnamed memfd: no
  // name in /dev/shm that another process could open.
  const bool pass_fds = broker_ != nullptr && cached->arena().valid() &&
                        cached->arena().name().empty();
  // "Run on host" answers need the host copy, which only travels as a
  // descriptor, to a worker that asked for it.
  const bool host_ok = pass_fds && host_execution &&
                       cached->options().cache.miss_mode != MissMode::kFetch;
  const int slots = cached->options().cache.capacity;
  if (!host_ok && slots < cached->store().num_experts()) {
    // A cache smaller than a layer (CheckCapacity) serves only workers whose
    // misses run on the host: a fetch could find no slot.
    return absl::FailedPreconditionError(absl::StrCat(
        "model '", ClipName(model), "' has ", slots, " expert slots, fewer than one layer's ",
        cached->store().num_experts(), ", so its misses must run on the worker's host: ",
        !pass_fds ? "attach over moe-cached's Unix socket (the host copy travels as a "
                    "descriptor)"
                  : "this worker did not offer host execution (a CUDA worker does with "
                    "--device-host-experts on)"));
  }
  // Reserve a place first: a refused attach should cost no channel or grant.
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return absl::FailedPreconditionError("daemon is shutting down");
    int live = attaching_;
    for (const auto& [id, s] : sessions_) live += s->ended ? 0 : 1;
    if (live >= max_sessions_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "moe-cached has ", live, " attached workers, its limit (--max-sessions ",
          max_sessions_, "); detach one or raise the limit"));
    }
    ++attaching_;
  }
  absl::Cleanup unreserve = [this] {
    absl::MutexLock lock(&mu_);
    --attaching_;
  };
  auto session = std::make_shared<Session>();
  session->id = RandomId();
  session->model = it->second;
  session->worker_id = ClipName(worker_id);
  absl::StatusOr<PidWatch> watch = PidWatch::Open(pid);
  if (!watch.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("attach: cannot watch worker pid ", pid, ": ", watch.status().message()));
  }
  session->pid = std::move(*watch);
  ResidencyBoard& board = session->model->residency();
  ASSIGN_OR_RETURN(session->channel,
                   cache::ShmRegion::Create(pass_fds ? "" : UnguessableShmName("moecache-chan"),
                                            channel::ChannelRegionBytes(board.shape())));
  channel::InitChannel(session->channel.mutable_data());
  AttachResult result{session->id, session->model, session->channel.name()};
  session->host_ok = host_ok;
  result.host_execution = session->host_ok;
  if (pass_fds) {
    std::vector<int> fds = {it->second->arena().fd(), session->channel.fd()};
    if (session->host_ok) fds.push_back(it->second->store().fd());
    ASSIGN_OR_RETURN(result.fd_token, broker_->Grant(pid, fds, absl::Seconds(30)));
    result.fd_socket = broker_->path();
  }
  {
    absl::MutexLock lock(&mu_);
    --attaching_;  // the reserved place becomes the session's (or is freed)
    std::move(unreserve).Cancel();
    if (stopped_) return absl::FailedPreconditionError("daemon is shutting down");
    // The worker maps the region once Attach returns: its view is current
    // from here until EndSession.
    board.AddView(session->id, session->channel.mutable_data());
    sessions_[session->id] = session;
    session->thread = std::thread([this, session] { Serve(session); });
  }
  MOE_LOG(INFO) << "worker '" << session->worker_id << "' (pid " << pid << ") attached to model "
                << model;
  return result;
}

absl::StatusOr<std::shared_ptr<SessionManager::Session>> SessionManager::Find(uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end() || it->second->ended) {
    return absl::NotFoundError(absl::StrCat("no session ", id, " (detached or ended)"));
  }
  return it->second;
}

void SessionManager::EndSession(Session& s, const std::string& why) {
  if (s.ended.exchange(true)) return;
  s.model->residency().RemoveView(s.id);  // its pins go, as its leases do
  int64_t dropped = s.model->cache().ReleaseOwner(s.id);
  s.leases = 0;
  MOE_LOG(INFO) << "session of worker '" << s.worker_id << "' (pid " << s.pid.pid()
                << ") ended: " << why << "; reclaimed " << dropped << " leases";
}

absl::Status SessionManager::Detach(uint64_t session_id) {
  std::shared_ptr<Session> s;
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_.find(session_id);
    if (it == sessions_.end()) return absl::NotFoundError("no such session");
    s = it->second;
    sessions_.erase(it);
  }
  s->stop = true;
  channel::ChannelServer(s->channel.mutable_data()).Close();
  if (s->thread.joinable() && s->thread.get_id() != std::this_thread::get_id()) s->thread.join();
  EndSession(*s, "detached");
  return absl::OkStatus();
}

namespace {

ExchangeShape ShapeOf(const CachedModel& m) {
  return ExchangeShape{m.store().num_layers(), m.store().num_experts()};
}

}  // namespace

absl::StatusOr<RequestOwner> SessionManager::OwnerOf(Session& s, uint64_t request) {
  if (request != 0) {
    absl::MutexLock lock(&s.requests_mu);
    if (!s.requests.contains(request)) {
      return absl::FailedPreconditionError(
          absl::StrCat("request ", request, " was not begun (BeginRequest) or has ended"));
    }
  }
  return RequestOwner{s.id, request};
}

absl::Status SessionManager::BeginRequest(uint64_t session_id, uint64_t request) {
  ASSIGN_OR_RETURN(auto s, Find(session_id));
  if (request == 0) {
    return absl::InvalidArgumentError("request id 0 is the session's default; begin another id");
  }
  {
    absl::MutexLock lock(&s->requests_mu);
    if (!s->requests.contains(request) &&
        s->requests.size() >= static_cast<size_t>(kMaxRequestsPerSession)) {
      return absl::ResourceExhaustedError(
          absl::StrCat("worker '", s->worker_id, "' has ", s->requests.size(),
                       " requests begun and not ended (the limit); end one first"));
    }
    s->requests.insert(request);
  }
  s->model->cache().BeginRequest(RequestOwner{s->id, request});
  return absl::OkStatus();
}

absl::Status SessionManager::EndRequest(uint64_t session_id, uint64_t request) {
  ASSIGN_OR_RETURN(auto s, Find(session_id));
  if (request != 0) {
    absl::MutexLock lock(&s->requests_mu);
    if (s->requests.erase(request) == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("request ", request, " was not begun or has ended"));
    }
  }
  s->model->cache().EndRequest(RequestOwner{s->id, request});
  return absl::OkStatus();
}

absl::Status SessionManager::AddHints(uint64_t session_id, uint64_t request,
                                      absl::Span<const ExpertHint> hints) {
  ASSIGN_OR_RETURN(auto s, Find(session_id));
  RETURN_IF_ERROR(ValidateHints(ShapeOf(*s->model), hints));
  ASSIGN_OR_RETURN(RequestOwner owner, OwnerOf(*s, request));
  s->model->cache().AddHints(owner, hints);
  return absl::OkStatus();
}

absl::Status SessionManager::ReportHostRuns(uint64_t session_id, const HostRunReport& report) {
  ASSIGN_OR_RETURN(auto s, Find(session_id));
  RETURN_IF_ERROR(ValidateHostRunReport(report));
  if (!s->host_ok) {
    return absl::FailedPreconditionError("host-run report from a worker without host execution");
  }
  s->model->cache().ReportHostRuns(report);
  s->model->metrics().RecordHostRuns(report);
  return absl::OkStatus();
}

absl::StatusOr<RequestOwner> SessionManager::CheckCall(Session& s, uint64_t request,
                                                       const AcquireCall& call) {
  const CachedModel& m = *s.model;
  RETURN_IF_ERROR(ValidateDemands(ShapeOf(m), call.layer, call.demands));
  RETURN_IF_ERROR(ValidateHints(ShapeOf(m), call.hints));
  RETURN_IF_ERROR(ValidateParts(ShapeOf(m), call));
  ASSIGN_OR_RETURN(RequestOwner owner, OwnerOf(s, request));
  if (!call.members.empty()) {
    RETURN_IF_ERROR(
        ValidateMembers(ShapeOf(m), call.layer, call.demands, call.members));
    bool lead = false;
    for (const MemberDemands& mb : call.members) {
      RETURN_IF_ERROR(OwnerOf(s, mb.request).status());
      lead |= mb.request == request;
    }
    if (!lead) {
      return absl::InvalidArgumentError(
          absl::StrCat("the acquire's request ", request, " is not one of its members"));
    }
  }
  return owner;
}

absl::Status SessionManager::RecordLocalHits(uint64_t session_id, uint64_t request,
                                             const AcquireCall& call) {
  ASSIGN_OR_RETURN(auto s, Find(session_id));
  ASSIGN_OR_RETURN(RequestOwner owner, CheckCall(*s, request, call));
  if (call.continues || call.part != 0) {
    return absl::InvalidArgumentError("local hits answer a whole layer: no part, no continues");
  }
  s->model->cache().RecordLocalHits(owner, call);
  s->model->metrics().RecordAcquire(0, 0);  // no time in the daemon
  return absl::OkStatus();
}

absl::StatusOr<AcquireResult> SessionManager::Acquire(uint64_t session_id,
                                                      uint64_t request,
                                                      AcquireCall call) {
  ASSIGN_OR_RETURN(auto s, Find(session_id));
  CachedModel& m = *s->model;
  ASSIGN_OR_RETURN(RequestOwner owner, CheckCall(*s, request, call));
  call.host_ok = s->host_ok;
  const absl::Time start = absl::Now();
  ASSIGN_OR_RETURN(AcquireResult r, m.cache().Acquire(owner, call));
  s->leases += static_cast<int64_t>(r.leases.size());
  m.metrics().RecordAcquire(absl::ToDoubleSeconds(absl::Now() - start), r.usage.stall_seconds());
  return r;
}

absl::Status SessionManager::Release(uint64_t session_id, absl::Span<const SlotLease> leases) {
  ASSIGN_OR_RETURN(auto s, Find(session_id));
  if (leases.size() > static_cast<size_t>(kMaxWireItems)) {
    return absl::InvalidArgumentError("too many leases in one release");
  }
  absl::Status first;
  for (const SlotLease& l : leases) {
    absl::Status r = s->model->cache().Release(s->id, {l});
    if (r.ok()) {
      --s->leases;
    } else if (first.ok()) {
      first = r;
    }
  }
  return first;
}

void SessionManager::Serve(std::shared_ptr<Session> session) {
  NameThisThread("moe-session");
  Session& s = *session;
  channel::ChannelServer server(s.channel.mutable_data());
  auto request = std::make_unique<channel::RequestMsg>();
  while (!s.stop) {
    absl::StatusOr<bool> got = server.Receive(request.get(), kPeerPollInterval);
    if (!got.ok() && absl::IsDataLoss(got.status())) {
      server.Close();
      EndSession(s, absl::StrCat("channel broken: ", got.status().message()));
      return;
    }
    if (!got.ok()) {  // a malformed message: its header is valid enough to answer
      auto reply = std::make_unique<channel::ResponseMsg>();
      std::memset(reply.get(), 0, offsetof(channel::ResponseMsg, leases));
      reply->seq = request->seq;
      FillError(got.status(), reply.get());
      (void)server.Reply(*reply);
      continue;
    }
    if (!*got) {
      if (s.pid.Exited()) {
        server.Close();
        EndSession(s, "worker exited");
        return;
      }
      continue;
    }
    HandleMessage(s, server, *request);
  }
}

void SessionManager::HandleMessage(Session& s, channel::ChannelServer& server,
                                   const channel::RequestMsg& req) {
  thread_local std::unique_ptr<channel::ResponseMsg> reply_buf(new channel::ResponseMsg());
  channel::ResponseMsg& reply = *reply_buf;
  std::memset(&reply, 0, offsetof(channel::ResponseMsg, leases));
  reply.seq = req.seq;
  absl::Status status;
  switch (static_cast<channel::MsgType>(req.type)) {
    case channel::MsgType::kAcquire:
      status = ShmAcquire(s, req, &reply);
      break;
    case channel::MsgType::kLocalHits: {
      absl::Status r = ShmAcquire(s, req, nullptr);
      if (!r.ok()) MOE_LOG(WARNING) << "worker '" << s.worker_id << "': local hits: " << r;
      return;  // no reply
    }
    case channel::MsgType::kMember:
      StageMember(s, req);
      return;  // no reply
    case channel::MsgType::kRelease: {
      SlotLease leases[channel::kMaxItems];
      channel::FromWire(req.leases, req.count, leases);
      absl::Status r = Release(s.id, absl::MakeConstSpan(leases, req.count));
      if (!r.ok()) MOE_LOG(WARNING) << "worker '" << s.worker_id << "': release: " << r;
      return;  // no reply
    }
    case channel::MsgType::kHostRuns: {
      absl::Status r = req.count == 1 ? ReportHostRuns(s.id, channel::FromWire(req.host_runs[0]))
                                      : absl::InvalidArgumentError("one report per message");
      if (!r.ok()) MOE_LOG(WARNING) << "worker '" << s.worker_id << "': host-run report: " << r;
      return;  // no reply
    }
    case channel::MsgType::kHints: {
      ExpertHint hints[channel::kMaxItems];
      channel::FromWire(req.hints, req.count, hints);
      absl::Status r = AddHints(s.id, req.request_id, absl::MakeConstSpan(hints, req.count));
      if (!r.ok()) MOE_LOG(WARNING) << "worker '" << s.worker_id << "': hints: " << r;
      return;  // no reply
    }
    case channel::MsgType::kBeginRequest:
      status = BeginRequest(s.id, req.request_id);
      break;
    case channel::MsgType::kEndRequest:
      status = EndRequest(s.id, req.request_id);
      break;
    case channel::MsgType::kPing:
      break;
  }
  if (!status.ok()) FillError(status, &reply);
  absl::Status sent = server.Reply(reply);
  if (!sent.ok()) MOE_LOG(WARNING) << "worker '" << s.worker_id << "': " << sent;
}

absl::Status SessionManager::ShmAcquire(Session& s,
                                        const channel::RequestMsg& req,
                                        channel::ResponseMsg* reply) {
  ExpertDemand demands[channel::kMaxItems];
  channel::FromWire(req.demands, req.count, demands);
  // Members posted for this acquire, taken whatever the outcome.
  std::vector<MemberDemands> members = std::move(s.staged);
  absl::Status staged = std::move(s.staged_error);
  const int32_t staged_layer = s.staged_layer;
  s.staged.clear();
  s.staged_error = absl::OkStatus();
  s.staged_layer = -1;
  RETURN_IF_ERROR(staged);
  const bool batched = (req.flags & channel::kFlagMembers) != 0;
  if (batched && members.empty()) {
    return absl::InvalidArgumentError("a batched acquire without its members");
  }
  if (!batched && !members.empty()) {
    return absl::InvalidArgumentError(
        "members posted without a batched acquire");
  }
  if (batched && staged_layer != req.layer) {
    return absl::InvalidArgumentError(
        absl::StrCat("members posted for layer ", staged_layer,
                     ", acquire of layer ", req.layer));
  }
  const AcquireCall call{.layer = req.layer,
                         .demands = absl::MakeConstSpan(demands, req.count),
                         .prefill = (req.flags & channel::kFlagPrefill) != 0,
                         .members = members,
                         .part = WirePart(req.part),
                         .continues = (req.flags & channel::kFlagContinues) != 0};
  if (reply == nullptr) return RecordLocalHits(s.id, req.request_id, call);
  ASSIGN_OR_RETURN(AcquireResult r, Acquire(s.id, req.request_id, call));
  channel::ToWire(r, reply);
  return absl::OkStatus();
}

void SessionManager::StageMember(Session& s, const channel::RequestMsg& req) {
  // Kept for the acquire that follows; an error waits for it too.
  if (!s.staged_error.ok()) return;
  auto fail = [&s](absl::Status error) {
    s.staged_error = std::move(error);
    s.staged.clear();
  };
  if (!s.staged.empty() && s.staged_layer != req.layer) {
    return fail(absl::InvalidArgumentError(absl::StrCat(
        "members posted for layers ", s.staged_layer, " and ", req.layer)));
  }
  // A message holds at most kMaxItems / kMemberWireItems members, so the
  // staged ones stay bounded before the count is checked.
  if (absl::Status unpacked = channel::UnpackMembers(req, &s.staged); !unpacked.ok()) {
    return fail(std::move(unpacked));
  }
  if (s.staged.size() > static_cast<size_t>(kMaxRequestsPerSession)) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat("more than ", kMaxRequestsPerSession, " members posted for one acquire")));
  }
  s.staged_layer = req.layer;
}

void SessionManager::Reap() {
  std::vector<std::shared_ptr<Session>> done;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = sessions_.begin(); it != sessions_.end();) {
      if (it->second->ended) {
        done.push_back(it->second);
        sessions_.erase(it++);
      } else {
        ++it;
      }
    }
  }
  for (auto& s : done) {
    if (s->thread.joinable()) s->thread.join();
  }
}

SessionCounts SessionManager::Counts(const CachedModel* model) {
  SessionCounts c;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, s] : sessions_) {
    if (s->model != model || s->ended) continue;
    ++c.sessions;
    c.leases_held += static_cast<uint64_t>(std::max<int64_t>(0, s->leases.load()));
  }
  return c;
}

void SessionManager::Stop() {
  absl::flat_hash_map<uint64_t, std::shared_ptr<Session>> all;
  {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
    all.swap(sessions_);
  }
  for (auto& [id, s] : all) {
    s->stop = true;
    channel::ChannelServer(s->channel.mutable_data()).Close();
  }
  for (auto& [id, s] : all) {
    if (s->thread.joinable()) s->thread.join();
    EndSession(*s, "daemon stopping");
  }
}

}  // namespace moe::cached
