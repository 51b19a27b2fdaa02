// Command-line flags of moe-worker. `--listen` may be repeated; every other
// flag once. Forms: `--name value` and `--name=value`.
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
};

// INVALID_ARGUMENT naming the flag for unknown or repeated flags, missing
// values and malformed numbers.
absl::StatusOr<WorkerFlags> ParseWorkerFlags(
    const std::vector<std::string>& args);

std::string WorkerUsage();

}  // namespace moe::worker

#endif  // MOECACHE_SERVICES_MOE_WORKER_WORKER_FLAGS_H_
