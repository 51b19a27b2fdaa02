// moectl subcommands. Each command file registers itself at static
// initialisation with MOECTL_COMMAND-free plain code:
//
//   namespace { const bool kReg = moe::moectl::RegisterCommand(
//       {"inspect", "print a model summary", &RunInspect}); }
//
// so adding a command means adding one .cc file to moectl's source list.
#ifndef MOECACHE_SERVICES_MOECTL_COMMANDS_H_
#define MOECACHE_SERVICES_MOECTL_COMMANDS_H_

#include <string>
#include <vector>

namespace moe::moectl {

using Args = std::vector<std::string>;

struct Command {
  const char* name;
  const char* summary;
  // Takes the arguments after the command name; returns the exit code.
  int (*run)(const Args& args);
};

// Adds a command; returns true so it can initialise a namespace-scope const.
bool RegisterCommand(const Command& command);

// All registered commands, sorted by name.
std::vector<Command> Commands();

}  // namespace moe::moectl

#endif  // MOECACHE_SERVICES_MOECTL_COMMANDS_H_
