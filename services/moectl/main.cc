// moectl: the command-line client and tool box of moecache.
#include <algorithm>
#include <cstdio>
#include <cstring>

#include "services/moectl/commands.h"

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
  std::fprintf(out, "usage: moectl COMMAND [flags]\n\ncommands:\n");
  for (const auto& c : moe::moectl::Commands()) {
    std::fprintf(out, "  %-14s %s\n", c.name, c.summary);
  }
  std::fprintf(out, "\n'moectl COMMAND --help' describes a command's flags.\n");
  return out == stdout ? 0 : 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return Usage(stderr);
  if (!std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "help")) {
    return Usage(stdout);
  }
  for (const auto& c : moe::moectl::Commands()) {
    if (std::strcmp(argv[1], c.name) == 0) {
      return c.run(moe::moectl::Args(argv + 2, argv + argc));
    }
  }
  std::fprintf(stderr, "moectl: unknown command '%s'\n", argv[1]);
  return Usage(stderr);
}
