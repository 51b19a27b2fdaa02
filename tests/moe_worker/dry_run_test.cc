// moe-cached --dry-run and moe-worker --dry-run on the trained model of
// deploy/models: exit 0 in under 3 s with the plan and the start line,
// binding nothing; errors exit non-zero and name the problem; a refused
// start reports its error without a shutdown that never began.
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"

namespace moe {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// A refused configuration exits 78 (EX_CONFIG), as moe::rpc::kExitConfig
// says; this test links no gRPC, so the value is spelled here.
constexpr int kExitConfig = 78;

struct ShellRun {
  int code = -1;
  std::string out;  // stdout and stderr
  double seconds = 0;
};

ShellRun Shell(const std::string& command) {
  ShellRun r;
  const auto start = std::chrono::steady_clock::now();
  FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

std::string Bin(const std::string& name) { return absl::StrCat(MOE_BINARY_DIR, "/bin/", name); }
std::string Model() { return absl::StrCat(MOE_SOURCE_DIR, "/deploy/models/kjv-moe"); }

TEST(DryRunTest, DaemonPrintsThePlanAndExits) {
  testing::TempDir dir;
  const std::string sock = dir.Sub("cached.sock");
  ShellRun r = Shell(absl::StrCat(Bin("moe-cached"), " --model ", Model(),
                                  " --cache-experts 32 --listen unix:", sock,
                                  " --metrics-addr 127.0.0.1:0 --dry-run"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_LT(r.seconds, 3.0);
  EXPECT_THAT(r.out, HasSubstr("no expert read"));
  EXPECT_THAT(r.out, HasSubstr("arena: 32 slots (33.3% of 96 experts)"));
  EXPECT_THAT(r.out, HasSubstr("73728 bytes each"));
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("serving kjv-moe on unix:", sock)));
  EXPECT_THAT(r.out, Not(HasSubstr("stopped")));
  EXPECT_FALSE(std::filesystem::exists(sock));  // nothing bound
}

TEST(DryRunTest, DaemonRefusesWhatStartWouldRefuse) {
  ShellRun r = Shell(absl::StrCat(Bin("moe-cached"), " --model ", Model(),
                                  " --cache-experts 3 --dry-run"));
  EXPECT_EQ(r.code, kExitConfig) << r.out;
  EXPECT_THAT(r.out, HasSubstr("fewer than one layer's 16 experts"));
  r = Shell(absl::StrCat(Bin("moe-cached"), " --model /nonexistent/model --dry-run"));
  EXPECT_EQ(r.code, kExitConfig) << r.out;
  EXPECT_THAT(r.out, HasSubstr("/nonexistent/model"));
  r = Shell(absl::StrCat(Bin("moe-cached"), " --model ", Model(), " --policy nope --dry-run"));
  EXPECT_EQ(r.code, kExitConfig) << r.out;
  EXPECT_THAT(r.out, HasSubstr("--policy nope"));
}

TEST(DryRunTest, WorkerPrintsThePlanAndExits) {
  testing::TempDir dir;
  const std::string sock = dir.Sub("worker.sock");
  ShellRun r = Shell(absl::StrCat(Bin("moe-worker"), " --model ", Model(), " --device cpu",
                                  " --cache unix:", dir.Sub("cached.sock"), " --listen unix:",
                                  sock, " --metrics-addr 127.0.0.1:0 --dry-run"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_LT(r.seconds, 3.0);
  EXPECT_THAT(r.out, HasSubstr("nothing loaded"));
  EXPECT_THAT(r.out, HasSubstr("backend:  cpu"));
  EXPECT_THAT(r.out, HasSubstr("KV cache: 3072 B per token"));
  EXPECT_THAT(r.out, HasSubstr("not contacted"));
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("serving model kjv-moe on unix:", sock)));
  EXPECT_FALSE(std::filesystem::exists(sock));
  // --cache none: the experts this process would hold.
  r = Shell(absl::StrCat(Bin("moe-worker"), " --model ", Model(),
                         " --device cpu --metrics-addr '' --dry-run"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("in this process, 6.8 MiB as bf16 (--cache none)"));
  // ... and in its --expert-format (q8: 34 bytes per 32 weights).
  r = Shell(absl::StrCat(Bin("moe-worker"), " --model ", Model(),
                         " --device cpu --metrics-addr '' --expert-format q8 --dry-run"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("in this process, 3.6 MiB as q8 (--cache none)"));
}

TEST(DryRunTest, WorkerErrorsComeAloneAndFirst) {
  ShellRun r = Shell(absl::StrCat(Bin("moe-worker"), " --model /nonexistent/model --dry-run"));
  EXPECT_EQ(r.code, kExitConfig) << r.out;
  EXPECT_THAT(r.out, HasSubstr("--model /nonexistent/model: not a directory"));
  r = Shell(absl::StrCat(Bin("moe-worker"), " --model ", Model(),
                         " --cache tcp://x:1 --dry-run"));
  EXPECT_EQ(r.code, kExitConfig) << r.out;
  EXPECT_THAT(r.out, HasSubstr("bad --cache"));
  // Without --dry-run, a refused start says its error and nothing about
  // draining requests or stopping servers that never started.
  r = Shell(absl::StrCat(Bin("moe-worker"), " --model /nonexistent/model --metrics-addr ''"));
  EXPECT_EQ(r.code, kExitConfig) << r.out;
  EXPECT_THAT(r.out, HasSubstr("not a directory"));
  EXPECT_THAT(r.out, Not(HasSubstr("requests drained")));
  EXPECT_THAT(r.out, Not(HasSubstr("gRPC server stopped")));
}

}  // namespace
}  // namespace moe
