// Minimal leveled logging to stderr. Thread-safe: each message is formatted
// privately and written with one write(2).
//
//   MOE_LOG(INFO) << "loaded " << n << " experts";
//   MOE_CHECK(slot < slot_count_) << "slot out of range";  // dies if false
#ifndef MOECACHE_COMMON_LOGGING_H_
#define MOECACHE_COMMON_LOGGING_H_

#include <sstream>

namespace moe {

enum class LogLevel { kDEBUG = 0, kINFO = 1, kWARNING = 2, kERROR = 3, kFATAL = 4 };

// Messages below `level` are dropped. Default: INFO, or MOE_LOG_LEVEL from the
// environment (DEBUG, INFO, WARNING, ERROR).
void SetMinLogLevel(LogLevel level);
LogLevel MinLogLevel();

class LogMessage {
 public:
  LogMessage(const char* file, int line, LogLevel level);
  ~LogMessage();  // writes the line; aborts for FATAL
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

// Swallows a stream expression when the level is disabled.
struct LogVoidify {
  void operator&(std::ostream&) {}
};

}  // namespace moe

#define MOE_LOG(level)                                                  \
  (::moe::LogLevel::k##level < ::moe::MinLogLevel())                    \
      ? (void)0                                                         \
      : ::moe::LogVoidify() &                                           \
            ::moe::LogMessage(__FILE__, __LINE__, ::moe::LogLevel::k##level) \
                .stream()

// Broken internal invariant: log and abort. Not for bad input from outside.
#define MOE_CHECK(cond)                                                   \
  (cond) ? (void)0                                                        \
         : ::moe::LogVoidify() &                                          \
               ::moe::LogMessage(__FILE__, __LINE__, ::moe::LogLevel::kFATAL) \
                       .stream()                                          \
                   << "Check failed: " #cond " "

#endif  // MOECACHE_COMMON_LOGGING_H_
