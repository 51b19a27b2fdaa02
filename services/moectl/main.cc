// moectl: the command-line client and tool box of moecache.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "common/flags.h"
#include "common/logging.h"
#include "common/threads.h"
#include "services/flags/flag_groups.h"
#include "services/moectl/commands.h"
#include "services/rpc/build_info.h"

namespace moe::moectl {
namespace {

std::vector<Command>& Registry() {
  static std::vector<Command>* commands = new std::vector<Command>();
  return *commands;
}

}  // namespace

bool RegisterCommand(const Command& command) {
  Registry().push_back(command);
  return true;
}

std::vector<Command> Commands() {
  std::vector<Command> out = Registry();
  std::sort(out.begin(), out.end(), [](const Command& a, const Command& b) {
    return std::strcmp(a.name, b.name) < 0;
  });
  return out;
}

}  // namespace moe::moectl

namespace {

int Usage(FILE* out, const moe::flags::FlagSet& global) {
  std::fprintf(out, "%s\ncommands:\n", global.Usage().c_str());
  for (const auto& c : moe::moectl::Commands()) {
    std::fprintf(out, "  %-14s %s\n", c.name, c.summary);
  }
  std::fprintf(out, "\n'moectl COMMAND --help' describes a command's flags.\n");
  return out == stdout ? 0 : 2;
}

}  // namespace

int main(int argc, char** argv) {
  moe::SkipLockOrderChecks();  // before any lock: they all pay for the checks
  // Global flags come before the command.
  moe::flags::FlagSet global("moectl", "[--version] [--log-level L] COMMAND [flags]");
  global.Bool("version", false, "print the build and whether CUDA loads");
  moe::flag_groups::DeclareLogLevel(global);
  global.StopAtFirstPositional();
  if (absl::Status s = global.Parse(std::vector<std::string>(argv + 1, argv + argc)); !s.ok()) {
    std::fprintf(stderr, "moectl: %s\n", std::string(s.message()).c_str());
    return Usage(stderr, global);
  }
  if (global.help()) return Usage(stdout, global);
  if (global.GetBool("version")) {
    std::fputs(moe::VersionText("moectl").c_str(), stdout);
    return 0;
  }
  if (std::optional<moe::LogLevel> level = moe::flag_groups::LogLevelFromFlags(global)) {
    moe::SetMinLogLevel(*level);
  }
  const std::vector<std::string>& rest = global.positional();
  if (rest.empty()) return Usage(stderr, global);
  if (rest[0] == "help") return Usage(stdout, global);
  for (const auto& c : moe::moectl::Commands()) {
    if (rest[0] == c.name) {
      return c.run(moe::moectl::Args(rest.begin() + 1, rest.end()));
    }
  }
  std::fprintf(stderr, "moectl: unknown command '%s'\n", rest[0].c_str());
  return Usage(stderr, global);
}
