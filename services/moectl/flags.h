// A small command-line flag parser for moectl commands.
//
//   FlagSet flags("make-model", "--out DIR [flags]");
//   flags.String("out", "", "output directory");
//   flags.Int("layers", 4, "decoder layers");
//   flags.Bool("verbose", false, "print more");
//   if (absl::Status s = flags.Parse(args); !s.ok()) { ...usage error... }
//   if (flags.help()) { puts(flags.Usage().c_str()); return 0; }
//   int64_t layers = flags.GetInt("layers");
//
// Accepted forms: `--name value`, `--name=value`; booleans also `--name`
// alone (true) and `--name=true|false|1|0`. `--` ends the flags; anything
// not starting with `--` is positional (as is "-" and a negative number).
// `--help` / `-h` set help(). Unknown flags, missing values, repeated flags
// and values of the wrong type are INVALID_ARGUMENT naming the flag.
//
// Getters MOE_CHECK-fail on an undeclared name or a type mismatch: those are
// programming errors, not user errors.
#ifndef MOECACHE_SERVICES_MOECTL_FLAGS_H_
#define MOECACHE_SERVICES_MOECTL_FLAGS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace moe::moectl {

class FlagSet {
 public:
  // `command` and `synopsis` only feed Usage(): "usage: moectl CMD SYNOPSIS".
  FlagSet(std::string command, std::string synopsis);

  void String(const std::string& name, std::string default_value,
              std::string help);
  void Int(const std::string& name, int64_t default_value, std::string help);
  void Double(const std::string& name, double default_value, std::string help);
  void Bool(const std::string& name, bool default_value, std::string help);

  absl::Status Parse(const std::vector<std::string>& args);

  bool help() const { return help_; }
  std::string Usage() const;
  const std::vector<std::string>& positional() const { return positional_; }

  // True when the flag was given on the command line.
  bool IsSet(const std::string& name) const;
  // INVALID_ARGUMENT "--name is required" unless IsSet(name).
  absl::Status Require(const std::string& name) const;

  const std::string& GetString(const std::string& name) const;
  int64_t GetInt(const std::string& name) const;
  double GetDouble(const std::string& name) const;
  bool GetBool(const std::string& name) const;

 private:
  enum class Type { kString, kInt, kDouble, kBool };
  struct Flag {
    Type type;
    std::string help;
    std::string default_text;
    bool set = false;
    std::string s;
    int64_t i = 0;
    double d = 0;
    bool b = false;
  };
  void Declare(const std::string& name, Flag flag);
  absl::Status SetValue(const std::string& name, Flag& flag,
                        const std::string& value);
  const Flag& Get(const std::string& name, Type type) const;

  std::string command_;
  std::string synopsis_;
  std::map<std::string, Flag> flags_;
  std::vector<std::string> order_;  // declaration order, for Usage()
  std::vector<std::string> positional_;
  bool help_ = false;
};

// Parses "1,2,3" (empty string: empty list).
absl::StatusOr<std::vector<int64_t>> ParseIntList(absl::string_view text);

// The generation flags shared by `moectl run` and `moectl generate`:
// --prompt-ids, --max-new-tokens, --temperature, --top-p, --seed,
// --top-logprobs, --ignore-eos and --json.
void DeclareGenerationFlags(FlagSet& f);

}  // namespace moe::moectl

#endif  // MOECACHE_SERVICES_MOECTL_FLAGS_H_
