#include "common/logging.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/log_level.h"

namespace moe {
namespace {

// A bad MOE_LOG_LEVEL must not stop a service before it can say so: the
// default stays, and the flag parsers (which run later) report bad values.
LogLevel LevelFromEnv() {
  const char* v = std::getenv("MOE_LOG_LEVEL");
  if (v == nullptr || v[0] == '\0') return LogLevel::kINFO;
  absl::StatusOr<LogLevel> level = ParseLogLevel(v);
  return level.ok() ? *level : LogLevel::kINFO;
}

std::atomic<int>& MinLevel() {
  static std::atomic<int> level{static_cast<int>(LevelFromEnv())};
  return level;
}

char LevelChar(LogLevel level) {
  static const char kChars[] = "DIWEF";
  return kChars[static_cast<int>(level)];
}

}  // namespace

absl::StatusOr<LogLevel> ParseLogLevel(const std::string& text) {
  const std::string t = absl::AsciiStrToLower(text);
  if (t == "debug") return LogLevel::kDEBUG;
  if (t == "info") return LogLevel::kINFO;
  if (t == "warning" || t == "warn") return LogLevel::kWARNING;
  if (t == "error") return LogLevel::kERROR;
  return absl::InvalidArgumentError(
      absl::StrCat("log level '", text, "' is not debug, info, warning or error"));
}

void SetMinLogLevel(LogLevel level) {
  MinLevel().store(static_cast<int>(level));
}

LogLevel MinLogLevel() { return static_cast<LogLevel>(MinLevel().load()); }

LogMessage::LogMessage(const char* file, int line, LogLevel level)
    : level_(level) {
  const char* base = std::strrchr(file, '/');
  base = base ? base + 1 : file;
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  int ms = static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(
          now.time_since_epoch()).count() % 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%H:%M:%S", &tm);
  stream_ << LevelChar(level) << ' ' << buf << '.' << (ms < 100 ? "0" : "")
          << (ms < 10 ? "0" : "") << ms << ' ' << base << ':' << line << "] ";
}

LogMessage::~LogMessage() {
  stream_ << '\n';
  std::string s = stream_.str();
  ssize_t unused = ::write(STDERR_FILENO, s.data(), s.size());
  (void)unused;
  if (level_ == LogLevel::kFATAL) std::abort();
}

}  // namespace moe
