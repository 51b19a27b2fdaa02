#include "services/moe_cached/daemon.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/model_desc.h"
#include "common/quant.h"
#include "common/status_macros.h"
#include "common/threads.h"
#include "kernels/cpu_gguf_quant.h"
#include "services/cache/policy.h"
#include "services/cache/shm_region.h"
#include "services/rpc/build_info.h"
#include "services/rpc/startup_log.h"

namespace moe::cached {

Daemon::Daemon(DaemonOptions options)
    : options_(std::move(options)),
      registry_(std::make_shared<prometheus::Registry>()),
      exposed_(std::make_shared<rpc::ProcessMetrics>(registry_, "moe-cached")) {}

Daemon::~Daemon() { Stop(); }

absl::StatusOr<Daemon::ModelPlan> Daemon::PlanModel(const ModelSpec& spec) const {
  absl::StatusOr<ModelDescription> desc = ModelDescription::Open(spec.dir);
  if (!desc.ok()) {
    return absl::Status(desc.status().code(), absl::StrCat("--model ", spec.name, "=", spec.dir,
                                                           ": ", desc.status().message()));
  }
  ModelPlan plan{std::move(*desc)};
  const ModelConfig& config = plan.desc.config();
  // Per model: the free device memory shrinks with every arena.
  ASSIGN_OR_RETURN(plan.device, ResolveDevice(options_.device));
  // Experts in host memory only ever meet the CPU kernels (the worker's
  // host execution reads this store): Q4_K and q4 in the CPU's interleaved
  // layouts where this CPU prefers them. A CUDA arena keeps the row-major ones.
  plan.interleave_rows = !plan.device.is_cuda() && CpuPrefersRows16(DetectSimdLevel());
  ASSIGN_OR_RETURN(std::vector<ExpertLayerLayout> layers,
                   ExpertStore::PlanLayers(plan.desc, options_.expert_format,
                                           plan.interleave_rows));
  for (const ExpertLayerLayout& layer : layers) {
    plan.block_bytes = std::max(plan.block_bytes, layer.block_bytes);
    plan.store_bytes = layer.offset + layer.block_bytes * static_cast<uint64_t>(config.num_experts);
    plan.held.push_back({layer.tensors[0].dtype, layer.tensors[1].dtype, layer.tensors[2].dtype});
  }
  const uint64_t block_bytes = plan.block_bytes;
  ASSIGN_OR_RETURN(plan.capacity,
                   ComputeCapacity(options_.capacity, spec.name, config.num_moe_layers(),
                                   static_cast<int>(config.num_experts), block_bytes,
                                   plan.device.is_cuda() ? plan.device.free_bytes : 0,
                                   options_.miss_mode));
  cache::PolicyConfig pc;
  pc.num_layers = config.num_moe_layers();
  pc.num_experts = static_cast<int>(config.num_experts);
  pc.capacity = plan.capacity;
  if (absl::Status s = cache::MakePolicy(options_.policy, pc).status(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--policy ", options_.policy, ": ", s.message()));
  }
  return plan;
}

absl::Status Daemon::StartModel(const ModelSpec& spec) {
  // Planned again: on CUDA the free device memory shrank with every arena.
  ASSIGN_OR_RETURN(ModelPlan plan, PlanModel(spec));
  const DeviceChoice& device = plan.device;
  const int capacity = plan.capacity;
  MOE_LOG(INFO) << "model " << spec.name << ": arena on " << device.description;
  ExpertStoreOptions store_options =
      device.is_cuda() ? PinnedStoreOptions(device.memory) : ExpertStoreOptions{};
  store_options.format = options_.expert_format;
  store_options.interleave_rows = plan.interleave_rows;
  ASSIGN_OR_RETURN(std::unique_ptr<ExpertStore> store,
                   ExpertStore::Load(spec.name, plan.desc, store_options));
  CachedModelOptions mo;
  mo.name = spec.name;
  // The model's cache, configured once here (cache_config.h).
  cache::CacheConfig& cc = mo.cache;
  cc.capacity = capacity;
  cc.policy = options_.policy;
  cc.prefetch = options_.prefetch;
  cc.link_bytes_per_sec = options_.link_gbps * 1e9;
  cc.miss_mode = options_.miss_mode;
  cc.host.flops_per_sec = options_.host_gflops * 1e9;
  cc.host.read_bytes_per_sec = options_.host_gbps * 1e9;
  if (cc.miss_mode != MissMode::kFetch && cc.host.read_bytes_per_sec <= 0) {
    cc.host.read_bytes_per_sec = store->MeasureReadBytesPerSec();
  }
  if (cc.miss_mode != MissMode::kFetch) {
    MOE_LOG(INFO) << "model " << spec.name << ": misses served by --miss-mode "
                  << MissModeName(cc.miss_mode) << "; host reads "
                  << cc.host.read_bytes_per_sec / 1e9
                  << " GB/s, runs experts at " << options_.host_gflops
                  << " GFLOP/s"
                  << (cc.miss_mode == MissMode::kAuto && options_.link_gbps <= 0
                          ? "; no --link-gbps: auto cannot weigh copies and "
                            "fetches every miss"
                          : "");
  }
  // Listening on a Unix socket, the arena is an unnamed memfd and workers
  // collect it from the FdBroker beside the socket.
  absl::StatusOr<rpc::ListenAddress> listen = rpc::ParseListenAddress(options_.listen);
  mo.anonymous_arena = listen.ok() && listen->is_unix;
  mo.cuda = device.memory;
  if (!options_.state_dir.empty()) {
    mo.state_path = absl::StrCat(options_.state_dir, "/", spec.name, ".eamc");
  }
  // What the store holds (the --expert-format), not what the checkpoint stores.
  const rpc::HeldExperts held{ExpertFormatsName(store->formats()), store->slot_bytes(),
                              store->total_bytes()};
  ASSIGN_OR_RETURN(std::unique_ptr<CachedModel> model,
                   CachedModel::Create(std::move(store), mo, *registry_));
  RETURN_IF_ERROR(model->Start());
  const uint64_t all = rpc::AllExpertBytes(plan.desc, &held);
  const uint64_t cached = held.block_bytes * static_cast<uint64_t>(capacity);
  model_lines_.push_back(absl::StrFormat(
      "model %s (%s, %s on the host), cache %d slots = %s (%.0f%% of the experts) on %s, "
      "policy %s, prefetch %s, link %s, misses %s",
      spec.name, rpc::ModelSummary(plan.desc, &held), rpc::HumanBytes(all), capacity,
      rpc::HumanBytes(cached), all > 0 ? 100.0 * cached / all : 0.0,
      device.is_cuda() ? "cuda" : "cpu", options_.policy, options_.prefetch ? "on" : "off",
      options_.link_gbps > 0 ? absl::StrCat(options_.link_gbps, " GB/s") : "unpaced",
      MissModeName(options_.miss_mode)));
  models_.push_back(std::move(model));
  return absl::OkStatus();
}

namespace {

// A daemon killed with SIGKILL leaves its named arena and channel objects in
// /dev/shm. Names carry the creator's pid: remove those whose creator is gone.
void RemoveStaleShmObjects() {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string name = entry.path().filename().string();
    int pid = 0;
    for (const char* prefix : {"moecache-arena-", "moecache-chan-"}) {
      if (!absl::StartsWith(name, prefix)) continue;
      std::string rest = name.substr(std::strlen(prefix));
      if (!absl::SimpleAtoi(rest.substr(0, rest.find('-')), &pid)) pid = 0;
    }
    if (pid <= 0) continue;
    if (::kill(pid, 0) == 0 || errno != ESRCH) continue;  // alive (or not ours to judge)
    if (::shm_unlink(("/" + name).c_str()) == 0) {
      MOE_LOG(INFO) << "removed stale shared memory /" << name << " of dead pid " << pid;
    }
  }
}

}  // namespace

absl::Status Daemon::Preflight() {
  rpc::ServerOptions so;
  ASSIGN_OR_RETURN(rpc::ListenAddress listen, rpc::ParseListenAddress(options_.listen));
  so.listen.push_back(listen);
  so.security = options_.security;
  // The fd broker's socket sits beside a Unix --listen socket.
  RETURN_IF_ERROR(rpc::CheckServerOptions(so, {{".fds", SOCK_SEQPACKET}}));
  if (!options_.state_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(options_.state_dir, ec);
    if (!ec && ::access(options_.state_dir.c_str(), W_OK | X_OK) != 0) {
      ec = std::error_code(errno, std::generic_category());
    }
    if (ec) {
      return absl::FailedPreconditionError(
          absl::StrCat("--state-dir ", options_.state_dir, ": ", ec.message()));
    }
  }
  for (const ModelSpec& spec : options_.models) RETURN_IF_ERROR(PlanModel(spec).status());
  // /metrics first: a port in use is reported before minutes of loading, and
  // the model series appear as each model registers them.
  if (!options_.metrics_addr.empty()) {
    ASSIGN_OR_RETURN(metrics_, rpc::MetricsServer::Start(options_.metrics_addr, exposed_));
    MOE_LOG(INFO) << "metrics on port " << metrics_->port();
  }
  return absl::OkStatus();
}

absl::Status Daemon::Start() {
  // Every flag, path, port and permission before any expert is read.
  RETURN_IF_ERROR(Preflight());
  RemoveStaleShmObjects();
  for (const ModelSpec& spec : options_.models) RETURN_IF_ERROR(StartModel(spec));
  std::vector<CachedModel*> models;
  for (auto& m : models_) models.push_back(m.get());
  sessions_ = std::make_unique<SessionManager>(models, options_.max_sessions);
  ASSIGN_OR_RETURN(rpc::ListenAddress listen, rpc::ParseListenAddress(options_.listen));
  if (listen.is_unix) {
    // Arenas and channels are memfds handed out by pid (SO_PEERCRED). The
    // socket gets the gRPC socket's mode and group.
    gid_t group = static_cast<gid_t>(-1);
    if (!options_.security.socket_group.empty()) {
      ASSIGN_OR_RETURN(group, rpc::LookupGroup(options_.security.socket_group));
    }
    absl::StatusOr<std::unique_ptr<FdBroker>> broker = FdBroker::Start(
        listen.unix_path + ".fds", options_.security.socket_group.empty() ? 0600 : 0660, group);
    if (!broker.ok()) {
      return absl::Status(broker.status().code(), absl::StrCat("--listen ", options_.listen,
                                                               ": ", broker.status().message()));
    }
    fd_broker_ = std::move(*broker);
    sessions_->set_fd_broker(fd_broker_.get());
  }
  service_ = std::make_unique<ExpertCacheService>(sessions_.get(), models);

  rpc::ServerOptions so;
  ASSIGN_OR_RETURN(rpc::ListenAddress address, rpc::ParseListenAddress(options_.listen));
  so.listen.push_back(address);
  so.services.push_back(service_.get());
  so.service_names.push_back(v1::ExpertCache::service_full_name());
  so.security = options_.security;
  ASSIGN_OR_RETURN(server_, rpc::Server::Start(so));
  if (server_->bound_port() != 0) MOE_LOG(INFO) << "gRPC on port " << server_->bound_port();
  housekeeper_ = std::thread([this] { Housekeep(); });
  if (HugePageCollapser::Needed(cache::ShmemHugePageMode())) {  // see its header
    std::vector<HugePageCollapser::Range> ranges;
    for (const auto& m : models_) {  // the arenas first: read on every token
      if (m->arena().valid()) {
        ranges.push_back({absl::StrCat("model ", m->name(), ": arena"), m->arena().data(),
                          m->arena().size()});
      }
    }
    for (const auto& m : models_) {
      if (m->store().pinned()) continue;  // page-locked for a GPU: cannot move
      ranges.push_back({absl::StrCat("model ", m->name(), ": host copy"), m->store().data(),
                        m->store().total_bytes()});
    }
    collapser_ = std::make_unique<HugePageCollapser>(std::move(ranges));
  }
  server_->SetServing(true);
  MOE_LOG(INFO) << VersionLine("moe-cached") << " serving on "
                << rpc::ShownAddress(options_.listen, server_->bound_port()) << ", metrics "
                << (metrics_ != nullptr ? rpc::ShownAddress(options_.metrics_addr, metrics_port())
                                        : "off")
                << ": " << absl::StrJoin(model_lines_, "; ");
  return absl::OkStatus();
}

void Daemon::Housekeep() {
  NameThisThread("moe-housekeep");
  absl::Time next_persist = absl::Now() + absl::Seconds(options_.persist_interval_seconds);
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    // Wake at least as often as persisting is due (--persist-seconds may be < 1).
    mu_.AwaitWithTimeout(absl::Condition(&stopping_),
                         absl::Seconds(std::min(1.0, options_.persist_interval_seconds)));
    if (stopping_) break;
    mu_.Unlock();
    sessions_->Reap();
    for (auto& m : models_) m->SyncMetrics();
    if (absl::Now() >= next_persist) {
      for (auto& m : models_) {
        absl::Status s = m->Persist();
        if (!s.ok()) MOE_LOG(ERROR) << "model " << m->name() << ": persist: " << s;
      }
      next_persist = absl::Now() + absl::Seconds(options_.persist_interval_seconds);
    }
    mu_.Lock();
  }
}

void Daemon::Stop() {
  if (stopped_) return;
  stopped_ = true;
  if (server_ != nullptr) server_->SetServing(false);
  if (sessions_ != nullptr) sessions_->Stop();
  if (server_ != nullptr) server_->Shutdown(absl::Seconds(options_.drain_seconds));
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (housekeeper_.joinable()) housekeeper_.join();
  collapser_.reset();  // at its next chunk, before the memory goes
  for (auto it = models_.rbegin(); it != models_.rend(); ++it) (*it)->Stop();  // persists
  // Said only when something had started (not after a dry run, nor a
  // start refused before any model loaded).
  const bool started = metrics_ != nullptr || !models_.empty() || server_ != nullptr;
  metrics_.reset();
  if (started) MOE_LOG(INFO) << "moe-cached stopped";
}

int Daemon::metrics_port() const { return metrics_ != nullptr ? metrics_->port() : 0; }

}  // namespace moe::cached
