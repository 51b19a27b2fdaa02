// moe-cached: the expert-cache daemon. Parses flags and wires components;
// everything else lives in moe_cached_lib (see daemon.h).
#include <sys/prctl.h>

#include <cstdio>
#include <string>
#include <vector>

#include "common/logging.h"
#include "common/threads.h"
#include "services/moe_cached/daemon.h"
#include "services/moe_cached/daemon_options.h"
#include "services/rpc/build_info.h"
#include "services/rpc/rpc_util.h"

int main(int argc, char** argv) {
  moe::SkipLockOrderChecks();  // before any lock: they all pay for the checks
  // Before any thread starts, so every thread inherits the blocked mask.
  moe::rpc::TerminationSignals signals;

  std::vector<std::string> args(argv + 1, argv + argc);
  absl::StatusOr<moe::cached::DaemonOptions> options = moe::cached::ParseDaemonFlags(args);
  if (!options.ok()) {
    std::fprintf(stderr, "moe-cached: %s\n%s", std::string(options.status().message()).c_str(),
                 moe::cached::DaemonUsage().c_str());
    return 2;
  }
  if (options->help) {
    std::fputs(moe::cached::DaemonUsage().c_str(), stdout);
    return 0;
  }
  if (options->version) {
    std::fputs(moe::VersionText("moe-cached").c_str(), stdout);
    return 0;
  }
  if (options->log_level.has_value()) moe::SetMinLogLevel(*options->log_level);
  if (options->dry_run) {
    absl::StatusOr<std::string> plan = moe::cached::Daemon(*options).DryRun();
    if (!plan.ok()) {
      std::fprintf(stderr, "moe-cached: %s\n", plan.status().ToString().c_str());
      return moe::rpc::StartFailureExitCode(plan.status());  // as a real start would
    }
    std::fputs(plan->c_str(), stdout);
    return 0;
  }
  MOE_LOG(INFO) << moe::VersionLine("moe-cached") << " starting";

  // Not dumpable: processes of the same user cannot ptrace the daemon or
  // open its descriptors through /proc/PID/fd, so an arena memfd reaches a
  // worker only through the FdBroker grant made for its pid.
  if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) {
    MOE_LOG(WARNING) << "moe-cached: prctl(PR_SET_DUMPABLE, 0) failed; /proc/PID/fd stays open";
  }

  moe::cached::Daemon daemon(*options);
  if (absl::Status s = daemon.Start(); !s.ok()) {
    MOE_LOG(ERROR) << "moe-cached: " << s;
    daemon.Stop();
    return moe::rpc::StartFailureExitCode(s);
  }
  moe::rpc::NotifyReady();
  int sig = signals.Wait();
  MOE_LOG(INFO) << "signal " << sig << ": shutting down";
  moe::rpc::NotifyStopping();
  daemon.Stop();
  return 0;
}
