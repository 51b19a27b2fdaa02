// The worker's view of its moe-cached: waiting for it at start, and watching
// it while serving, so that the worker's own health tells the truth.
//
//   ASSIGN_OR_RETURN(provider, WaitForCache("unix:/run/.../c.sock", wait, attach));
//   ASSIGN_OR_RETURN(watch, CacheWatch::Start(address, security,
//       [&](bool up) { server->SetServing(up); }));
//
// Why: every Generate fails UNAVAILABLE while the daemon is down, so a worker
// that says SERVING then lies to load balancers and probes; and under systemd
// the worker may start while the daemon is still loading (ordering races), so
// failing at once would fail the unit.
#ifndef MOECACHE_SERVICES_MOE_WORKER_CACHE_WATCH_H_
#define MOECACHE_SERVICES_MOE_WORKER_CACHE_WATCH_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "services/engine/expert_provider.h"
#include "services/rpc/security.h"

namespace moe::worker {

// Calls `attach` until it succeeds or `wait` has passed, sleeping 100 ms,
// 200 ms, ... up to 1 s between tries (bounded backoff). Only UNAVAILABLE and
// DEADLINE_EXCEEDED (daemon not up yet, or still loading) are retried; any
// other error returns at once. Logs what it waits for, at most every 10 s,
// and says so in systemd's STATUS= (shown by `systemctl status`).
// `wait` zero: one try.
absl::StatusOr<std::unique_ptr<ExpertProvider>> WaitForCache(
    const std::string& address, absl::Duration wait,
    const std::function<absl::StatusOr<std::unique_ptr<ExpertProvider>>()>& attach);

// Watches moe-cached's gRPC health (grpc.health.v1 Watch, which needs no
// token) from a thread of its own. `on_change(serving)` runs on that thread
// whenever the daemon goes from serving to not serving (it answers
// NOT_SERVING, or the connection is lost: within milliseconds of the daemon
// dying) and back. The daemon is assumed serving at Start. Logs each change.
//
// Thread-safe; Stop (or the destructor) returns once the thread is gone, and
// no on_change call runs after it.
class CacheWatch {
 public:
  static absl::StatusOr<std::unique_ptr<CacheWatch>> Start(
      const std::string& address, const rpc::ClientSecurity& security,
      std::function<void(bool serving)> on_change);
  ~CacheWatch();
  void Stop();

 private:
  CacheWatch() = default;
  void Run();
  // One Watch stream, until it ends; returns why it ended.
  std::string WatchOnce();
  void Report(bool serving, const std::string& why);

  std::string address_;
  std::function<void(bool)> on_change_;
  std::unique_ptr<grpc::health::v1::Health::Stub> stub_;
  bool serving_ = true;  // as last reported; watch thread only
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* call_ ABSL_GUARDED_BY(mu_) = nullptr;  // the open Watch
  std::thread thread_;
};

}  // namespace moe::worker

#endif  // MOECACHE_SERVICES_MOE_WORKER_CACHE_WATCH_H_
