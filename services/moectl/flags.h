// moectl's commands parse their flags with the common parser
// (common/flags.h: syntax, repeated flags, sizes, --help); this header names
// it for them and holds what only moectl's commands share.
//
//   FlagSet flags("make-model", "--out DIR [flags]");  // "moectl make-model"
//   flags.Int("layers", 4, "decoder layers");
//   if (absl::Status s = flags.Parse(args); !s.ok()) { ...usage error... }
//   if (flags.help()) { puts(flags.Usage().c_str()); return 0; }
#ifndef MOECACHE_SERVICES_MOECTL_FLAGS_H_
#define MOECACHE_SERVICES_MOECTL_FLAGS_H_

#include <string>

#include "common/flags.h"

namespace moe::moectl {

// The common FlagSet for `moectl COMMAND`: Usage() says
// "usage: moectl COMMAND SYNOPSIS".
class FlagSet : public flags::FlagSet {
 public:
  FlagSet(const std::string& command, std::string synopsis);
};

using flags::ParseIntList;

// The generation flags shared by `moectl run` and `moectl generate`:
// --prompt-ids, --max-new-tokens, --top-logprobs and --json (the sampler's
// are sampling_flags.h's).
void DeclareGenerationFlags(FlagSet& f);

}  // namespace moe::moectl

#endif  // MOECACHE_SERVICES_MOECTL_FLAGS_H_
