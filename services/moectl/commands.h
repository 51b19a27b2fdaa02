// moectl subcommands. Each takes the arguments after the subcommand name and
// returns the process exit code.
#ifndef MOECACHE_SERVICES_MOECTL_COMMANDS_H_
#define MOECACHE_SERVICES_MOECTL_COMMANDS_H_

#include <string>
#include <vector>

namespace moe::moectl {

using Args = std::vector<std::string>;

struct Command {
  const char* name;
  const char* summary;
  int (*run)(const Args& args);
};

int RunInfo(const Args& args);

}  // namespace moe::moectl

#endif  // MOECACHE_SERVICES_MOECTL_COMMANDS_H_
