// Daemon: moe-cached's components wired together, with one Start/Stop.
//
//   Start: check every flag, path, port and permission and start /metrics
//          (Preflight: nothing loaded yet, so errors come at once);
//          per --model, open the checkpoint, size the arena (refusing fewer
//          slots than one layer's experts), load the ExpertStore, create and
//          start its CachedModel (loading learned state from --state-dir);
//          then the session manager, the gRPC server (health SERVING) and
//          a housekeeping thread (reaps ended sessions,
//          refreshes metrics every second, persists every persist interval).
//   Stop:  health NOT_SERVING, close every worker channel and drop leases,
//          drain gRPC calls (up to drain_seconds), stop housekeeping,
//          persist and stop each model, close /metrics.
//
// Thread-safety: Start and Stop from one thread; Stop is idempotent.
#ifndef MOECACHE_SERVICES_MOE_CACHED_DAEMON_H_
#define MOECACHE_SERVICES_MOE_CACHED_DAEMON_H_

#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/model_desc.h"
#include "prometheus/registry.h"
#include "services/moe_cached/cuda_arena.h"
#include "services/moe_cached/cached_model.h"
#include "services/moe_cached/fd_broker.h"
#include "services/moe_cached/huge_page_collapser.h"
#include "services/moe_cached/daemon_options.h"
#include "services/moe_cached/service.h"
#include "services/moe_cached/sessions.h"
#include "services/rpc/metrics_server.h"
#include "services/rpc/process_metrics.h"
#include "services/rpc/rpc_util.h"

namespace moe::cached {

class Daemon {
 public:
  explicit Daemon(DaemonOptions options);
  ~Daemon();

  absl::Status Start();
  void Stop();

  // --dry-run: Preflight's checks (less what has an effect: /metrics is not
  // started, --state-dir not created) and each model's plan (checkpoint
  // checked, arena sized, policy made; no expert read), then the start
  // line, as text.
  absl::StatusOr<std::string> DryRun() const;

  // 0 when /metrics is disabled.
  int metrics_port() const;

 private:
  // What loading a model will use, found without reading any expert.
  struct ModelPlan {
    ModelDescription desc;
    DeviceChoice device;
    int capacity = 0;
    uint64_t block_bytes = 0;  // one expert held: a slot (the largest layer's)
    uint64_t store_bytes = 0;  // every expert held (the host copy)
    std::vector<ExpertDTypes> held;  // per MoE layer
    bool interleave_rows = false;     // ExpertStoreOptions::interleave_rows
  };
  // Checks every flag, path, port and permission (and starts /metrics)
  // before anything is loaded: a configuration error costs no load time.
  absl::Status Preflight();
  absl::StatusOr<ModelPlan> PlanModel(const ModelSpec& spec) const;
  absl::Status StartModel(const ModelSpec& spec);
  void Housekeep();

  const DaemonOptions options_;
  std::shared_ptr<prometheus::Registry> registry_;
  // What /metrics serves: registry_ plus moe_build_info and process_*.
  std::shared_ptr<rpc::ProcessMetrics> exposed_;
  // Per model, its part of the start-up line (what it is and how cached).
  std::vector<std::string> model_lines_;
  std::vector<std::unique_ptr<CachedModel>> models_;
  std::unique_ptr<FdBroker> fd_broker_;  // outlives sessions_ (declared first)
  std::unique_ptr<SessionManager> sessions_;
  std::unique_ptr<ExpertCacheService> service_;
  std::unique_ptr<rpc::Server> server_;
  std::unique_ptr<rpc::MetricsServer> metrics_;
  std::thread housekeeper_;
  // Moves the models' shared memory onto huge pages after start, where the
  // kernel gave it small ones; before models_ goes (declared after it).
  std::unique_ptr<HugePageCollapser> collapser_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ = false;
};

}  // namespace moe::cached

#endif  // MOECACHE_SERVICES_MOE_CACHED_DAEMON_H_
