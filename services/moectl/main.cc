// moectl: the command-line client and tool box of moecache.
#include <cstdio>
#include <cstring>

#include "services/moectl/commands.h"

namespace {

using moe::moectl::Command;

const Command kCommands[] = {
    {"info", "show the build and the backends this machine offers",
     &moe::moectl::RunInfo},
};

int Usage(FILE* out) {
  std::fprintf(out, "usage: moectl COMMAND [flags]\n\ncommands:\n");
  for (const Command& c : kCommands) {
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
  for (const Command& c : kCommands) {
    if (std::strcmp(argv[1], c.name) == 0) {
      return c.run(moe::moectl::Args(argv + 2, argv + argc));
    }
  }
  std::fprintf(stderr, "moectl: unknown command '%s'\n", argv[1]);
  return Usage(stderr);
}
