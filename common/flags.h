// The one command-line flag parser of moe-cached, moe-worker and every moectl
// command. Flags are declared (name, type, default, range, help), then
// parsed; --help text is generated from the declarations.
//
//   FlagSet f("moe-worker", "--model DIR [flags]");
//   f.Group("cache");
//   f.Size("kv-budget", 0, "KV cache the running sequences may hold");
//   f.Int("max-batch", 1, "sequences per step", {.min = 1, .max = 64});
//   f.Choice("device", "auto", {"cpu", "cuda", "auto"}, "compute backend");
//   f.Alias("backend", "device");  // old spelling: works, warns
//   RETURN_IF_ERROR(f.Parse(args));
//   if (f.help()) { std::fputs(f.Usage().c_str(), stdout); ... }
//   int64_t batch = f.GetInt("max-batch");
//
// Syntax: `--name value` and `--name=value`; a value is taken as is, even
// when it starts with '-' or is empty (`--metrics-addr ""`). A Bool flag is
// `--name` alone (true) or `--name=true|false|1|0`; it never takes the next
// argument. `--` ends the flags. `--help` and `-h` set help(). Anything not
// starting with "--" (and "-", and negative numbers) is positional, unless
// NoPositional() was called (then it is an error).
//
// Repeated flags: every flag may be given once; a second occurrence (also
// through an alias) is INVALID_ARGUMENT "--name given more than once",
// except for StringList flags, which collect every value in order.
//
// Errors are INVALID_ARGUMENT and name the flag as the user spelled it:
// unknown flags (with a "did you mean" suggestion when a declared name is
// close), missing values, malformed values and values out of range.
//
// Sizes (Size flags, ParseSize): a number, decimals allowed, and an optional
// suffix, any case: K or KiB = 2^10, M or MiB = 2^20, G or GiB = 2^30,
// T or TiB = 2^40. A suffix letter is always binary: "24G" is 24 x 2^30
// bytes, the same as "24GiB". "GB"/"MB"-style suffixes are refused as
// ambiguous rather than guessed. A bare number is in the flag's `unit`
// (bytes unless declared otherwise, e.g. MiB for --kv-budget-mb). The result
// is rounded to whole bytes and must fit in int64.
//
// Not thread-safe; a FlagSet is built, parsed and read by one thread.
// Getters MOE_CHECK-fail on an undeclared name or a type mismatch: those are
// programming errors, not user errors.
#ifndef MOECACHE_COMMON_FLAGS_H_
#define MOECACHE_COMMON_FLAGS_H_

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace moe::flags {

inline constexpr int64_t kKiB = int64_t{1} << 10;
inline constexpr int64_t kMiB = int64_t{1} << 20;
inline constexpr int64_t kGiB = int64_t{1} << 30;
inline constexpr int64_t kTiB = int64_t{1} << 40;

// Parses a size as described above; `unit` is what a bare number counts.
// INVALID_ARGUMENT (without a flag name) for malformed, negative or
// overflowing text.
absl::StatusOr<int64_t> ParseSize(absl::string_view text, int64_t unit = 1);

// "512MiB" when `bytes` is a whole number of the largest such unit, else
// the number of bytes; for help text and messages.
std::string FormatSize(int64_t bytes);

// Inclusive bounds of the values a user may give. A declared default may lie
// outside them, as an "unset" marker (--cache-experts: 0, else >= 1); Usage()
// then shows no default. (Nor does it for a false Bool.)
struct IntRange {
  int64_t min = std::numeric_limits<int64_t>::min();
  int64_t max = std::numeric_limits<int64_t>::max();
};

// Bounds of a Double; `min_exclusive` makes the lower bound strict (> min).
// Values must be finite whatever the bounds.
struct DoubleRange {
  double min = -std::numeric_limits<double>::infinity();
  double max = std::numeric_limits<double>::infinity();
  bool min_exclusive = false;
};

// A Size's unit for bare numbers and inclusive bounds, in bytes.
struct SizeSpec {
  int64_t unit = 1;
  int64_t min = 0;
  int64_t max = std::numeric_limits<int64_t>::max();
};

// Checks a String value; a non-OK status becomes "--name: <message>".
using Validator = std::function<absl::Status(const std::string& value)>;

enum class FlagType { kString, kStringList, kInt, kDouble, kBool, kSize, kChoice };

class FlagSet {
 public:
  // `program` and `synopsis` feed Usage(): "usage: PROGRAM SYNOPSIS" (e.g.
  // "moe-cached", "moectl simulate"); `program` also prefixes warnings.
  FlagSet(std::string program, std::string synopsis);

  // Declarations. A name (or alias) is declared once (MOE_CHECK). Flags are
  // listed in Usage() in declaration order, under the latest Group() title.
  void Group(std::string title);
  void String(const std::string& name, std::string default_value, std::string help,
              Validator validator = nullptr);
  void StringList(const std::string& name, std::string help);  // repeatable
  void Int(const std::string& name, int64_t default_value, std::string help,
           IntRange range = {});
  void Double(const std::string& name, double default_value, std::string help,
              DoubleRange range = {});
  void Bool(const std::string& name, bool default_value, std::string help);
  void Size(const std::string& name, int64_t default_bytes, std::string help,
            SizeSpec spec = {});
  // Matched in any case; GetString returns the declared spelling.
  void Choice(const std::string& name, std::string default_value,
              std::vector<std::string> choices, std::string help);
  // `old_name` is accepted for `name` (declared before) with a warning,
  // kept in warnings() and printed on stderr ("PROGRAM: warning: ...") when
  // Parse succeeds (a failed parse prints nothing but its error).
  void Alias(const std::string& old_name, const std::string& name);
  // `other_name` is accepted for `name` (declared before) without a warning:
  // a second spelling in current use (--alias for --served-model-name, as
  // llama-server spells it). Usage() shows it as "(also --other_name)".
  void Synonym(const std::string& other_name, const std::string& name);
  // Text printed after the flag list (examples, models behind the knobs).
  void Notes(std::string text);
  // Positional arguments become an error ("unexpected argument 'x'").
  void NoPositional();
  // Parsing stops at the first positional argument: it and everything after
  // it are positional() (global flags before a subcommand).
  void StopAtFirstPositional();

  // Parses once. Returns the first error; the FlagSet is then unspecified.
  absl::Status Parse(const std::vector<std::string>& args);

  bool help() const { return help_; }
  std::string Usage() const;
  const std::string& program() const { return program_; }
  const std::vector<std::string>& positional() const { return positional_; }
  const std::vector<std::string>& warnings() const { return warnings_; }

  // True when the flag was given on the command line.
  bool IsSet(const std::string& name) const;
  // INVALID_ARGUMENT "--name is required" unless IsSet(name).
  absl::Status Require(const std::string& name) const;
  // The spelling the user gave ("--backend" for an alias), else "--name".
  std::string Spelling(const std::string& name) const;

  const std::string& GetString(const std::string& name) const;  // String, Choice
  const std::vector<std::string>& GetList(const std::string& name) const;
  int64_t GetInt(const std::string& name) const;
  double GetDouble(const std::string& name) const;
  bool GetBool(const std::string& name) const;
  int64_t GetSize(const std::string& name) const;

  // Declared names in declaration order and their types (for tests that
  // compare binaries' flags).
  std::vector<std::string> Names() const { return order_; }
  FlagType TypeOf(const std::string& name) const;

 private:
  struct Flag {
    FlagType type;
    std::string help;
    std::string group;
    std::string default_text;
    std::vector<std::string> aliases;
    std::vector<std::string> synonyms;
    bool set = false;
    std::string spelling;  // as given
    std::string s;
    std::vector<std::string> list;
    int64_t i = 0;
    double d = 0;
    bool b = false;
    IntRange int_range;
    DoubleRange double_range;
    SizeSpec size;
    std::vector<std::string> choices;
    Validator validator;
  };
  Flag& Declare(const std::string& name, FlagType type, std::string help,
                std::string default_text);
  absl::Status SetValue(Flag& flag, const std::string& value);
  absl::Status ParseOne(const std::vector<std::string>& args, size_t& i);
  std::string UnknownFlag(const std::string& spelled) const;
  std::string UsageLine(const std::string& name, const Flag& f) const;
  const Flag& Get(const std::string& name, FlagType type) const;

  std::string program_;
  std::string synopsis_;
  std::string group_;
  std::string notes_;
  bool no_positional_ = false;
  bool stop_at_positional_ = false;
  std::map<std::string, Flag> flags_;
  std::map<std::string, std::string> aliases_;  // old name or synonym -> name
  std::set<std::string> synonyms_;               // the aliases that do not warn
  std::vector<std::string> order_;
  std::vector<std::string> positional_;
  std::vector<std::string> warnings_;
  bool help_ = false;
};

// Parses "1,2,3" (empty string: empty list).
absl::StatusOr<std::vector<int64_t>> ParseIntList(absl::string_view text);

}  // namespace moe::flags

#endif  // MOECACHE_COMMON_FLAGS_H_
