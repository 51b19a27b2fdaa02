// moe-worker: serves moe.v1.Inference for one model. Parses flags, starts
// the Worker, waits for SIGTERM/SIGINT, stops it.
#include <cstdio>
#include <string>
#include <vector>

#include "common/logging.h"
#include "common/threads.h"
#include "services/moe_worker/worker.h"
#include "services/moe_worker/worker_flags.h"
#include "services/rpc/build_info.h"
#include "services/rpc/rpc_util.h"

int main(int argc, char** argv) {
  moe::SkipLockOrderChecks();  // before any lock: they all pay for the checks
  // Before any thread starts, so that every thread inherits the mask.
  moe::rpc::TerminationSignals signals;
  std::vector<std::string> args(argv + 1, argv + argc);
  auto flags = moe::worker::ParseWorkerFlags(args);
  if (!flags.ok()) {
    std::fprintf(stderr, "moe-worker: %s\n%s",
                 std::string(flags.status().message()).c_str(),
                 moe::worker::WorkerUsage().c_str());
    return 2;
  }
  if (flags->help) {
    std::printf("%s", moe::worker::WorkerUsage().c_str());
    return 0;
  }
  if (flags->version) {
    std::fputs(moe::VersionText("moe-worker").c_str(), stdout);
    return 0;
  }
  if (flags->log_level.has_value()) moe::SetMinLogLevel(*flags->log_level);
  if (flags->dry_run) {
    absl::StatusOr<std::string> plan = moe::worker::Worker::DryRun(flags->options);
    if (!plan.ok()) {
      std::fprintf(stderr, "moe-worker: %s\n", plan.status().ToString().c_str());
      return moe::rpc::StartFailureExitCode(plan.status());  // as a real start would
    }
    std::fputs(plan->c_str(), stdout);
    return 0;
  }
  MOE_LOG(INFO) << moe::VersionLine("moe-worker") << " starting";
  auto worker = moe::worker::Worker::Start(flags->options);
  if (!worker.ok()) {
    std::fprintf(stderr, "moe-worker: %s\n",
                 worker.status().ToString().c_str());
    return moe::rpc::StartFailureExitCode(worker.status());
  }
  MOE_LOG(INFO) << (*worker)->StartupLine();
  moe::rpc::NotifyReady();
  const int sig = signals.Wait();
  MOE_LOG(INFO) << "signal " << sig << ": shutting down";
  moe::rpc::NotifyStopping();
  (*worker)->Stop();
  worker->reset();
  MOE_LOG(INFO) << "moe-worker stopped";
  return 0;
}
