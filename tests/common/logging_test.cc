#include "common/log_level.h"
#include "common/logging.h"

#include "absl/status/statusor.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"

namespace moe {
namespace {

absl::StatusOr<int> Half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError("odd");
  return x / 2;
}

absl::StatusOr<int> Quarter(int x) {
  ASSIGN_OR_RETURN(int h, Half(x));
  ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

absl::Status CheckQuarter(int x) {
  RETURN_IF_ERROR(Quarter(x).status());
  return absl::OkStatus();
}

TEST(StatusMacrosTest, PropagateErrorsAndValues) {
  EXPECT_EQ(*Quarter(8), 2);
  EXPECT_EQ(Quarter(6).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(CheckQuarter(4).ok());
  EXPECT_FALSE(CheckQuarter(2).ok());
}

TEST(LoggingDeathTest, CheckFailureAborts) {
  int slot = 7;
  EXPECT_DEATH(MOE_CHECK(slot < 4) << "slot " << slot, "Check failed: slot < 4");
}

TEST(LoggingTest, DisabledLevelDoesNotEvaluate) {
  SetMinLogLevel(LogLevel::kWARNING);
  int evaluated = 0;
  MOE_LOG(INFO) << (++evaluated);
  EXPECT_EQ(evaluated, 0);
  SetMinLogLevel(LogLevel::kINFO);
}

TEST(LoggingTest, LevelsParseInAnyCase) {
  EXPECT_EQ(*ParseLogLevel("debug"), LogLevel::kDEBUG);
  EXPECT_EQ(*ParseLogLevel("INFO"), LogLevel::kINFO);
  EXPECT_EQ(*ParseLogLevel("Warning"), LogLevel::kWARNING);
  EXPECT_EQ(*ParseLogLevel("warn"), LogLevel::kWARNING);
  EXPECT_EQ(*ParseLogLevel("ERROR"), LogLevel::kERROR);
  EXPECT_EQ(ParseLogLevel("verbose").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseLogLevel("").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace moe
