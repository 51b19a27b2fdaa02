// Daemon::DryRun (daemon.h): Preflight's checks and each model's plan,
// nothing loaded or started.
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/fp8.h"
#include "common/quant.h"
#include "common/status_macros.h"
#include "services/moe_cached/daemon.h"
#include "services/rpc/build_info.h"
#include "services/rpc/startup_log.h"

namespace moe::cached {
namespace {

std::string Gib(uint64_t bytes) {
  return absl::StrFormat("%.2f GiB", static_cast<double>(bytes) / (1ull << 30));
}

}  // namespace

absl::StatusOr<std::string> Daemon::DryRun() const {
  rpc::ServerOptions so;
  ASSIGN_OR_RETURN(rpc::ListenAddress listen, rpc::ParseListenAddress(options_.listen));
  so.listen.push_back(listen);
  so.security = options_.security;
  RETURN_IF_ERROR(rpc::CheckServerOptions(so, {{".fds", SOCK_SEQPACKET}}));
  if (!options_.state_dir.empty() && std::filesystem::exists(options_.state_dir) &&
      ::access(options_.state_dir.c_str(), W_OK | X_OK) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("--state-dir ", options_.state_dir, ": not writable"));
  }
  std::string out = "moe-cached --dry-run: every flag, path and model checks out; no expert read\n";
  std::string models;
  for (const ModelSpec& spec : options_.models) {
    ASSIGN_OR_RETURN(ModelPlan plan, PlanModel(spec));
    const ModelConfig& c = plan.desc.config();
    const uint64_t experts = static_cast<uint64_t>(c.num_moe_layers()) * c.num_experts;
    absl::StrAppend(&out, "model ", spec.name, " (", spec.dir, "): ",
                    rpc::ModelSummary(plan.desc), "\n");
    absl::StrAppend(&out, "  experts held as ", ExpertFormatsName(plan.held), ", ",
                    plan.desc.mixed_expert_dtypes() ? "up to " : "", plan.block_bytes,
                    " bytes each; host store ", Gib(plan.store_bytes), "\n");
    absl::StrAppend(
        &out, "  arena: ", plan.capacity,
        absl::StrFormat(" slots (%.1f%% of %d experts), ",
                        100.0 * plan.capacity / static_cast<double>(experts),
                        static_cast<int>(experts)),
        Gib(plan.capacity * plan.block_bytes), " on ", plan.device.description, "\n");
    absl::StrAppend(&out, "  policy ", options_.policy, ", prefetch ",
                    options_.prefetch ? "on" : "off", ", --miss-mode ",
                    MissModeName(options_.miss_mode), ", --link-gbps ", options_.link_gbps,
                    "\n");
    absl::StrAppend(&models, models.empty() ? "" : ", ", spec.name);
  }
  absl::StrAppend(&out, "start: ", VersionLine("moe-cached"), " serving ", models, " on ",
                  options_.listen, ", metrics ",
                  options_.metrics_addr.empty() ? "off" : options_.metrics_addr, "\n");
  return out;
}

}  // namespace moe::cached
