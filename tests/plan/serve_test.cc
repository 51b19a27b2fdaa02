// moectl serve (issue 28): plans, starts moe-worker (and moe-cached when
// planned), answers a chat request over the OpenAI API, stops them on
// SIGTERM within 10 s leaving no process behind; a plan that does not fit starts nothing; a
// child that fails at start stops the other and is moectl's exit status.
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <string>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/test_util.h"
#include "tests/moe_worker/worker_process.h"

namespace moe {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using worker::testing::WorkerProcess;

const std::string kMoectl = std::string(MOE_BINARY_DIR) + "/bin/moectl";
const std::string kModel = std::string(MOE_SOURCE_DIR) + "/deploy/models/kjv-moe";

bool Gone(pid_t pid) { return pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH; }

// The number after `key` in `text` (0 if absent).
int NumberAfter(const std::string& text, const std::string& key) {
  const size_t at = text.find(key);
  return at == std::string::npos ? 0 : std::atoi(text.c_str() + at + key.size());
}

// Without a GPU `moectl serve` starts the worker alone (every expert in
// it: no hand-offs between processes, issue 32); --daemon on starts
// moe-cached too. Either way a chat is answered and SIGTERM stops all.
class ServeTest : public ::testing::TestWithParam<bool> {};

TEST_P(ServeTest, StartsWhatItPlannedAnswersAChatAndStopsOnSigterm) {
  const bool daemon = GetParam();
  moe::testing::TempDir dir;
  WorkerProcess serve;
  ASSERT_TRUE(serve.Spawn({"serve", "--model", kModel, "--gpu-mem", "0", "--host-mem", "8G",
                           "--host-gbps", "10", "--port", "0", "--daemon", daemon ? "on" : "auto",
                           "--bin-dir", std::string(MOE_BINARY_DIR) + "/bin"},
                          dir.Sub("serve.log"), kMoectl));
  ASSERT_TRUE(worker::testing::WaitFor(
      [&] { return serve.Log().find("OpenAI API: http://127.0.0.1:") != std::string::npos ||
                   serve.Exited(); },
      std::chrono::seconds(60)))
      << serve.Log();
  std::string log = serve.Log();
  const int port = NumberAfter(log, "OpenAI API: http://127.0.0.1:");
  ASSERT_GT(port, 0) << log;
  const pid_t cached = NumberAfter(log, "moe-cached pid ");
  const pid_t worker = NumberAfter(log, "moe-worker pid ");
  ASSERT_GT(worker, 0) << log;
  EXPECT_THAT(log, HasSubstr("(model \"kjv-moe\")"));
  if (daemon) {
    ASSERT_GT(cached, 0) << log;
    EXPECT_THAT(log, HasSubstr("--miss-mode"));  // the plan's flags, said
    EXPECT_THAT(log, HasSubstr("Ctrl-C stops both."));
  } else {
    EXPECT_EQ(cached, 0) << log;
    EXPECT_THAT(log, HasSubstr("--cache none"));
    EXPECT_THAT(log, Not(HasSubstr("moe-cached --model")));
    EXPECT_THAT(log, HasSubstr("Ctrl-C stops it."));
  }

  moe::testing::WriteText(dir.Sub("body.json"),
                          R"({"model": "kjv-moe", "messages": [{"role": "user", "content":)"
                          R"( "Who made the heaven and the earth?"}], "max_tokens": 8})");
  int code = 0;
  const std::string out = worker::testing::RunShell(
      "curl -sS --data-binary @" + dir.Sub("body.json") + " -H 'Content-Type: application/json' " +
          "http://127.0.0.1:" + std::to_string(port) + "/v1/chat/completions",
      &code, /*with_stderr=*/false);
  ASSERT_EQ(code, 0) << out;
  nlohmann::json j = nlohmann::json::parse(out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << out;
  EXPECT_TRUE(j["choices"][0]["message"]["content"].is_string()) << out;
  EXPECT_EQ(j["usage"]["completion_tokens"], 8) << out;

  const auto t0 = std::chrono::steady_clock::now();
  serve.Signal(SIGTERM);
  ASSERT_TRUE(worker::testing::WaitFor([&] { return serve.Exited(); }, std::chrono::seconds(15)))
      << serve.Log();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  EXPECT_EQ(serve.Wait(), 0) << serve.Log();
  if (daemon) {
    EXPECT_TRUE(Gone(cached)) << cached;
  }
  EXPECT_TRUE(Gone(worker)) << worker;
  EXPECT_THAT(serve.Log(), HasSubstr("moectl serve: stopped"));
}

INSTANTIATE_TEST_SUITE_P(DaemonOrNot, ServeTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "WithDaemon" : "WorkerAlone";
                         });

TEST(ServeCommandTest, APlanThatDoesNotFitStartsNothing) {
  moe::testing::TempDir dir;
  WorkerProcess serve;
  ASSERT_TRUE(serve.Spawn({"serve", "--model", kModel, "--gpu-mem", "0", "--host-mem", "1M",
                           "--host-gbps", "10", "--port", "0"},
                          dir.Sub("serve.log"), kMoectl));
  EXPECT_EQ(serve.Wait(), 1) << serve.Log();
  EXPECT_THAT(serve.Log(), HasSubstr("does not fit"));
  EXPECT_THAT(serve.Log(), ::testing::Not(HasSubstr(" pid ")));
}

TEST(ServeCommandTest, AChildThatFailsStopsTheOtherAndGivesItsStatus) {
  // The HTTP port is taken: the worker refuses to start (exit 1, the port
  // may free up), and the daemon is stopped.
  const moe::testing::BusyLoopbackPort busy;
  ASSERT_GT(busy.port(), 0);
  moe::testing::TempDir dir;
  WorkerProcess serve;
  ASSERT_TRUE(serve.Spawn({"serve", "--model", kModel, "--gpu-mem", "0", "--host-mem", "8G",
                           "--host-gbps", "10", "--port", std::to_string(busy.port()),
                           "--daemon", "on", "--bin-dir", std::string(MOE_BINARY_DIR) + "/bin"},
                          dir.Sub("serve.log"), kMoectl));
  ASSERT_TRUE(worker::testing::WaitFor([&] { return serve.Exited(); }, std::chrono::seconds(60)))
      << serve.Log();
  const std::string log = serve.Log();
  EXPECT_EQ(serve.Wait(), 1) << log;
  EXPECT_THAT(log, HasSubstr("--http-listen"));
  EXPECT_THAT(log, HasSubstr("moe-worker exited (status 1)"));
  const pid_t cached = NumberAfter(log, "moe-cached pid ");
  ASSERT_GT(cached, 0) << log;
  EXPECT_TRUE(Gone(cached));
}

}  // namespace
}  // namespace moe
