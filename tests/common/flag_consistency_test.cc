// A flag taken by several binaries has the same name, form and meaning in
// each: read from what the binaries print for --help (generated from their
// declarations, common/flags.h), and checked on a few behaviours that
// used to differ (repeated flags, --backend, --host-gflops 0).
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace moe {
namespace {

using ::testing::HasSubstr;

struct ShellRun {
  int code = -1;
  std::string out;  // stdout and stderr
};

ShellRun Shell(const std::string& command) {
  ShellRun r;
  FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string Bin(const std::string& name) { return absl::StrCat(MOE_BINARY_DIR, "/bin/", name); }

// One flag as --help shows it.
struct HelpFlag {
  std::string meta;  // "V", "SIZE", "cpu|cuda|auto" or "" (a switch)
  std::string text;  // help text without its default, alias and repeat notes
};

// Drops every "(PREFIX...)" note from `text`.
std::string DropNote(std::string text, const std::string& prefix) {
  for (size_t at; (at = text.find(prefix)) != std::string::npos;) {
    const size_t end = text.find(')', at);
    if (end == std::string::npos) break;
    const size_t from = at > 0 && text[at - 1] == ' ' ? at - 1 : at;
    text.erase(from, end + 1 - from);
  }
  return text;
}

// Parses a generated --help: "  --name META   text" lines, the text
// continued on lines indented by 29 spaces.
std::map<std::string, HelpFlag> ParseHelp(const std::string& help) {
  std::map<std::string, HelpFlag> flags;
  HelpFlag* current = nullptr;
  for (absl::string_view line : absl::StrSplit(help, '\n')) {
    if (absl::StartsWith(line, "  --")) {
      const absl::string_view left = line.substr(2, std::min<size_t>(line.size(), 29) - 2);
      std::vector<std::string> words = absl::StrSplit(left, ' ', absl::SkipEmpty());
      current = &flags[words[0].substr(2)];
      current->meta = words.size() > 1 ? words[1] : "";
      if (line.size() > 29) current->text = std::string(line.substr(29));
    } else if (current != nullptr && absl::StartsWith(line, std::string(29, ' '))) {
      absl::StrAppend(&current->text, current->text.empty() ? "" : " ", line.substr(29));
    } else {
      current = nullptr;
    }
  }
  for (auto& [name, f] : flags) {
    for (const char* note : {"(default ", "(unset: ", "(repeatable", "(old spelling "}) {
      f.text = DropNote(f.text, note);
    }
  }
  return flags;
}

class FlagConsistencyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::map<std::string, std::string> commands = {
        {"moe-cached", Bin("moe-cached") + " --help"},
        {"moe-worker", Bin("moe-worker") + " --help"},
        {"moectl", Bin("moectl") + " --help"},
        {"moectl run", Bin("moectl") + " run --help"},
        {"moectl perplexity", Bin("moectl") + " perplexity --help"},
        {"moectl simulate", Bin("moectl") + " simulate --help"},
    };
    for (const auto& [binary, command] : commands) {
      ShellRun r = Shell(command);
      ASSERT_EQ(r.code, 0) << command << "\n" << r.out;
      help_[binary] = ParseHelp(r.out);
      ASSERT_FALSE(help_[binary].empty()) << command << "\n" << r.out;
    }
  }

  // binary -> flag name -> its help entry.
  std::map<std::string, std::map<std::string, HelpFlag>> help_;
};

TEST_F(FlagConsistencyTest, SharedFlagsHaveOneFormAndOneMeaning) {
  std::map<std::string, std::vector<std::string>> takers;  // flag -> binaries
  for (const auto& [binary, flags] : help_) {
    for (const auto& [name, f] : flags) takers[name].push_back(binary);
  }
  int shared = 0;
  for (const auto& [name, binaries] : takers) {
    // Flags of several programs (moe-cached, moe-worker, moectl); one
    // moectl command's own flags (--json, --text) may differ from another's.
    std::set<std::string> programs;
    for (const std::string& b : binaries) programs.insert(b.substr(0, b.find(' ')));
    if (programs.size() < 2) continue;
    ++shared;
    const HelpFlag& first = help_[binaries[0]][name];
    for (size_t k = 1; k < binaries.size(); ++k) {
      const HelpFlag& other = help_[binaries[k]][name];
      SCOPED_TRACE(absl::StrCat("--", name, ": ", binaries[0], " vs ", binaries[k]));
      EXPECT_EQ(other.meta, first.meta);
      // moe-cached's --model is repeatable and may name the model
      // (NAME=DIR); it is still a checkpoint directory.
      if (name == "model") {
        EXPECT_THAT(other.text, HasSubstr("Hugging Face checkpoint directory"));
        EXPECT_THAT(first.text, HasSubstr("Hugging Face checkpoint directory"));
      } else {
        EXPECT_EQ(other.text, first.text);
      }
    }
  }
  EXPECT_GE(shared, 8);
  // One name for cpu|cuda|auto wherever experts are placed or run.
  for (const char* binary : {"moe-cached", "moe-worker", "moectl run", "moectl perplexity"}) {
    SCOPED_TRACE(binary);
    ASSERT_EQ(help_[binary].count("device"), 1u);
    EXPECT_EQ(help_[binary]["device"].meta, "cpu|cuda|auto");
    EXPECT_EQ(help_[binary].count("backend"), 0u);  // only an old spelling
  }
  for (const char* name :
       {"host-gflops", "host-gbps", "miss-mode", "link-gbps", "policy", "prefetch"}) {
    EXPECT_EQ(takers[name].size(), 2u) << name;  // moe-cached and moectl simulate
  }
  for (const char* name : {"log-level", "listen", "metrics-addr", "auth-token-file",
                           "expert-format", "record-trace"}) {
    EXPECT_GE(takers[name].size(), 2u) << name;
  }
  EXPECT_THAT(help_["moe-cached"]["host-gflops"].text, HasSubstr("0: bandwidth only"));
}

TEST_F(FlagConsistencyTest, RepeatedFlagsAreRefusedEverywhere) {
  const std::string twice = " --log-level info --log-level=debug";
  for (const std::string& command :
       {Bin("moe-cached") + " --model /m" + twice, Bin("moe-worker") + " --model /m" + twice,
        Bin("moectl") + twice + " info",
        Bin("moectl") + " simulate --trace t --policy lru --capacity 8 --capacity 9"}) {
    SCOPED_TRACE(command);
    ShellRun r = Shell(command);
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_THAT(r.out, HasSubstr("given more than once"));
  }
}

TEST_F(FlagConsistencyTest, OldSpellingWarnsAndSizesTakeSuffixes) {
  ShellRun r = Shell(Bin("moe-worker") + " --backend cpu --version");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("moe-worker: warning: --backend is deprecated; use --device"));
  r = Shell(Bin("moe-worker") + " --device=tpu");
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.out, HasSubstr("--device expects cpu, cuda or auto, got 'tpu'"));
  r = Shell(Bin("moe-cached") + " --model /m --cache-bytes 24GB");
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.out, HasSubstr("--cache-bytes expects a size"));
  r = Shell(Bin("moe-worker") + " --kv-budget-mb 2x");
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.out, HasSubstr("--kv-budget-mb expects a size"));
}

}  // namespace
}  // namespace moe
