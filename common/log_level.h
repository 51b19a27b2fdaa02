// Parsing log levels for --log-level and MOE_LOG_LEVEL (see logging.h).
//
// MOE_LOG_LEVEL from the environment takes debug, info, warning or error in
// any case; an unknown value keeps INFO (the flag parsers, which run later,
// report bad --log-level values). --log-level overrides the variable.
#ifndef MOECACHE_COMMON_LOG_LEVEL_H_
#define MOECACHE_COMMON_LOG_LEVEL_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/logging.h"

namespace moe {

// "debug", "info", "warning" (or "warn"), "error", in any case;
// INVALID_ARGUMENT naming the value otherwise.
absl::StatusOr<LogLevel> ParseLogLevel(const std::string& text);

}  // namespace moe

#endif  // MOECACHE_COMMON_LOG_LEVEL_H_
