// Command-line flags of moe-worker, parsed by the common parser
// (common/flags.h: `--name value` and `--name=value`, every flag once;
// `--listen` may be repeated). The flags shared with moe-cached and moectl
// (--model, --device, --listen, --metrics-addr, the security flags,
// --log-level) come from services/flags/flag_groups.h. `--backend` is the
// old spelling of `--device`: it still works, with a warning on stderr.
#ifndef MOECACHE_SERVICES_MOE_WORKER_WORKER_FLAGS_H_
#define MOECACHE_SERVICES_MOE_WORKER_WORKER_FLAGS_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/logging.h"
#include "services/moe_worker/worker.h"

namespace moe::worker {

struct WorkerFlags {
  WorkerOptions options;
  std::optional<LogLevel> log_level;  // --log-level; unset: MOE_LOG_LEVEL or INFO
  bool help = false;
  bool version = false;  // --version
  bool dry_run = false;  // --dry-run: Worker::DryRun, then exit
};

// INVALID_ARGUMENT naming the flag for unknown or repeated flags, missing
// values, malformed or out-of-range values and refused security settings.
absl::StatusOr<WorkerFlags> ParseWorkerFlags(
    const std::vector<std::string>& args);

// The --help text, generated from the declarations.
std::string WorkerUsage();

}  // namespace moe::worker

#endif  // MOECACHE_SERVICES_MOE_WORKER_WORKER_FLAGS_H_
