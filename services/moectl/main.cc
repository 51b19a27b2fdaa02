// moectl: the command-line client and tool box of moecache.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>

#include "common/log_level.h"
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

int Usage(FILE* out) {
  std::fprintf(out,
               "usage: moectl [--version] [--log-level debug|info|warning|error] COMMAND "
               "[flags]\n\ncommands:\n");
  for (const auto& c : moe::moectl::Commands()) {
    std::fprintf(out, "  %-14s %s\n", c.name, c.summary);
  }
  std::fprintf(out, "\n'moectl COMMAND --help' describes a command's flags.\n");
  return out == stdout ? 0 : 2;
}

}  // namespace

int main(int argc, char** argv) {
  // Global flags come before the command.
  int i = 1;
  for (; i < argc && std::strncmp(argv[i], "--", 2) == 0; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help") return Usage(stdout);
    if (arg == "--version") {
      std::fputs(moe::VersionText("moectl").c_str(), stdout);
      return 0;
    }
    std::string level;
    if (arg.rfind("--log-level=", 0) == 0) {
      level = arg.substr(12);
    } else if (arg == "--log-level" && i + 1 < argc) {
      level = argv[++i];
    } else {
      std::fprintf(stderr, "moectl: unknown flag '%s' (global flags: --version, --log-level L, "
                   "--help)\n", arg.c_str());
      return Usage(stderr);
    }
    absl::StatusOr<moe::LogLevel> parsed = moe::ParseLogLevel(level);
    if (!parsed.ok()) {
      std::fprintf(stderr, "moectl: --log-level: %s\n",
                   std::string(parsed.status().message()).c_str());
      return 2;
    }
    moe::SetMinLogLevel(*parsed);
  }
  if (i >= argc) return Usage(stderr);
  if (!std::strcmp(argv[i], "help")) return Usage(stdout);
  for (const auto& c : moe::moectl::Commands()) {
    if (std::strcmp(argv[i], c.name) == 0) {
      return c.run(moe::moectl::Args(argv + i + 1, argv + argc));
    }
  }
  std::fprintf(stderr, "moectl: unknown command '%s'\n", argv[i]);
  return Usage(stderr);
}
