#include "common/flags.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace moe::flags {
namespace {

bool LooksLikeNumber(const std::string& a) {
  return a.size() >= 2 && a[0] == '-' && ((a[1] >= '0' && a[1] <= '9') || a[1] == '.');
}

std::string Num(double v) { return absl::StrCat(v); }

// "a, b or c".
std::string OrList(const std::vector<std::string>& items) {
  std::string out;
  for (size_t k = 0; k < items.size(); ++k) {
    if (k > 0) out += k + 1 == items.size() ? " or " : ", ";
    out += items[k];
  }
  return out;
}

std::string IntWant(const IntRange& r) {
  const bool lo = r.min != std::numeric_limits<int64_t>::min();
  const bool hi = r.max != std::numeric_limits<int64_t>::max();
  if (lo && hi) return absl::StrCat("an integer in [", r.min, ", ", r.max, "]");
  if (lo) return absl::StrCat("an integer >= ", r.min);
  if (hi) return absl::StrCat("an integer <= ", r.max);
  return "an integer";
}

std::string DoubleWant(const DoubleRange& r) {
  const bool lo = std::isfinite(r.min);
  const bool hi = std::isfinite(r.max);
  if (lo && hi) {
    return absl::StrCat("a number in ", r.min_exclusive ? "(" : "[", Num(r.min), ", ",
                        Num(r.max), "]");
  }
  if (lo) return absl::StrCat("a number ", r.min_exclusive ? "> " : ">= ", Num(r.min));
  if (hi) return absl::StrCat("a number <= ", Num(r.max));
  return "a number";
}

std::string SizeWant(const SizeSpec& s) {
  std::string out = "a size (e.g. 512M, 24GiB";
  if (s.unit != 1) absl::StrAppend(&out, "; a bare number counts ", FormatSize(s.unit));
  out += ")";
  if (s.min > 0) absl::StrAppend(&out, " >= ", FormatSize(s.min));
  if (s.max != std::numeric_limits<int64_t>::max()) {
    absl::StrAppend(&out, " <= ", FormatSize(s.max));
  }
  return out;
}

// Levenshtein distance, for "did you mean".
size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace

absl::StatusOr<int64_t> ParseSize(absl::string_view text, int64_t unit) {
  MOE_CHECK(unit > 0);
  const std::string original(text);
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("'", original, "' is not a size: ", why));
  };
  size_t end = 0;
  while (end < text.size() && (absl::ascii_isdigit(text[end]) || text[end] == '.')) ++end;
  const absl::string_view number = text.substr(0, end);
  const std::string suffix = absl::AsciiStrToLower(text.substr(end));
  if (number.empty()) return bad("want a number, e.g. 512M or 24GiB");
  int64_t mult = unit;
  if (!suffix.empty()) {
    static const std::pair<const char*, int64_t> kSuffixes[] = {
        {"k", kKiB}, {"kib", kKiB}, {"m", kMiB}, {"mib", kMiB},
        {"g", kGiB}, {"gib", kGiB}, {"t", kTiB}, {"tib", kTiB}};
    mult = 0;
    for (const auto& [name, value] : kSuffixes) {
      if (suffix == name) mult = value;
    }
    if (mult == 0 && (suffix == "kb" || suffix == "mb" || suffix == "gb" || suffix == "tb")) {
      return bad("KB/MB/GB/TB are ambiguous; write K/M/G/T or KiB/MiB/GiB/TiB (powers of 1024)");
    }
    if (mult == 0) return bad("unknown suffix (K, M, G, T or KiB, MiB, GiB, TiB)");
  }
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  if (number.find('.') == absl::string_view::npos) {
    uint64_t n = 0;
    if (!absl::SimpleAtoi(number, &n)) return bad("too large");
    if (n > static_cast<uint64_t>(kMax / mult)) return bad("too large");
    return static_cast<int64_t>(n) * mult;
  }
  double d = 0;
  if (!absl::SimpleAtod(number, &d) || !std::isfinite(d)) return bad("malformed number");
  const double bytes = std::round(d * static_cast<double>(mult));
  // 2^63 is exactly representable; anything at or above it overflows.
  if (!(bytes < 9223372036854775808.0)) return bad("too large");
  return static_cast<int64_t>(bytes);
}

std::string FormatSize(int64_t bytes) {
  static const std::pair<int64_t, const char*> kUnits[] = {
      {kTiB, "TiB"}, {kGiB, "GiB"}, {kMiB, "MiB"}, {kKiB, "KiB"}};
  for (const auto& [unit, name] : kUnits) {
    if (bytes != 0 && bytes % unit == 0) return absl::StrCat(bytes / unit, name);
  }
  return absl::StrCat(bytes);
}

FlagSet::FlagSet(std::string program, std::string synopsis)
    : program_(std::move(program)), synopsis_(std::move(synopsis)) {}

void FlagSet::Group(std::string title) { group_ = std::move(title); }
void FlagSet::Notes(std::string text) { notes_ = std::move(text); }
void FlagSet::NoPositional() { no_positional_ = true; }
void FlagSet::StopAtFirstPositional() { stop_at_positional_ = true; }

FlagSet::Flag& FlagSet::Declare(const std::string& name, FlagType type, std::string help,
                                std::string default_text) {
  MOE_CHECK(flags_.count(name) == 0 && aliases_.count(name) == 0)
      << "flag --" << name << " declared twice";
  order_.push_back(name);
  Flag& f = flags_[name];
  f.type = type;
  f.help = std::move(help);
  f.group = group_;
  f.default_text = std::move(default_text);
  return f;
}

void FlagSet::String(const std::string& name, std::string def, std::string help,
                     Validator validator) {
  Flag& f = Declare(name, FlagType::kString, std::move(help), def);
  f.s = std::move(def);
  f.validator = std::move(validator);
}

void FlagSet::StringList(const std::string& name, std::string help) {
  Declare(name, FlagType::kStringList, std::move(help), "");
}

void FlagSet::Int(const std::string& name, int64_t def, std::string help, IntRange range) {
  const bool in_range = range.min <= def && def <= range.max;
  Flag& f = Declare(name, FlagType::kInt, std::move(help), in_range ? absl::StrCat(def) : "");
  f.i = def;
  f.int_range = range;
}

void FlagSet::Double(const std::string& name, double def, std::string help, DoubleRange range) {
  const bool in_range =
      (range.min_exclusive ? def > range.min : def >= range.min) && def <= range.max;
  Flag& f = Declare(name, FlagType::kDouble, std::move(help), in_range ? Num(def) : "");
  f.d = def;
  f.double_range = range;
}

void FlagSet::Bool(const std::string& name, bool def, std::string help) {
  Flag& f = Declare(name, FlagType::kBool, std::move(help), def ? "true" : "");
  f.b = def;
}

void FlagSet::Size(const std::string& name, int64_t def, std::string help, SizeSpec spec) {
  const bool in_range = spec.min <= def && def <= spec.max;
  Flag& f = Declare(name, FlagType::kSize, std::move(help), in_range ? FormatSize(def) : "");
  f.i = def;
  f.size = spec;
}

void FlagSet::Choice(const std::string& name, std::string def, std::vector<std::string> choices,
                     std::string help) {
  MOE_CHECK(def.empty() || std::find(choices.begin(), choices.end(), def) != choices.end())
      << "--" << name << " default is not a choice";
  Flag& f = Declare(name, FlagType::kChoice, std::move(help), def);
  f.s = std::move(def);
  f.choices = std::move(choices);
}

void FlagSet::Alias(const std::string& old_name, const std::string& name) {
  auto it = flags_.find(name);
  MOE_CHECK(it != flags_.end()) << "alias of undeclared flag --" << name;
  MOE_CHECK(flags_.count(old_name) == 0 && aliases_.count(old_name) == 0)
      << "flag --" << old_name << " declared twice";
  aliases_[old_name] = name;
  it->second.aliases.push_back(old_name);
}

void FlagSet::Synonym(const std::string& other_name, const std::string& name) {
  Alias(other_name, name);
  Flag& flag = flags_.at(name);
  flag.aliases.pop_back();
  flag.synonyms.push_back(other_name);
  synonyms_.insert(other_name);
}

absl::Status FlagSet::SetValue(Flag& flag, const std::string& value) {
  const std::string& n = flag.spelling;
  auto want = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(n, " expects ", what, ", got '", value, "'"));
  };
  switch (flag.type) {
    case FlagType::kString:
      if (flag.validator) {
        if (absl::Status s = flag.validator(value); !s.ok()) {
          return absl::InvalidArgumentError(absl::StrCat(n, ": ", s.message()));
        }
      }
      flag.s = value;
      return absl::OkStatus();
    case FlagType::kStringList:
      flag.list.push_back(value);
      return absl::OkStatus();
    case FlagType::kInt: {
      const IntRange& r = flag.int_range;
      if (!absl::SimpleAtoi(value, &flag.i) || flag.i < r.min || flag.i > r.max) {
        return want(IntWant(r));
      }
      return absl::OkStatus();
    }
    case FlagType::kDouble: {
      const DoubleRange& r = flag.double_range;
      const double d = flag.d;
      const bool parsed = absl::SimpleAtod(value, &flag.d) && std::isfinite(flag.d);
      const bool low_ok = r.min_exclusive ? flag.d > r.min : flag.d >= r.min;
      if (!parsed || !low_ok || !(flag.d <= r.max)) {
        flag.d = d;
        return want(DoubleWant(r));
      }
      return absl::OkStatus();
    }
    case FlagType::kBool:
      if (value == "true" || value == "1") {
        flag.b = true;
      } else if (value == "false" || value == "0") {
        flag.b = false;
      } else {
        return want("true or false");
      }
      return absl::OkStatus();
    case FlagType::kSize: {
      absl::StatusOr<int64_t> bytes = ParseSize(value, flag.size.unit);
      if (!bytes.ok() || *bytes < flag.size.min || *bytes > flag.size.max) {
        return want(SizeWant(flag.size));
      }
      flag.i = *bytes;
      return absl::OkStatus();
    }
    case FlagType::kChoice:
      for (const std::string& c : flag.choices) {
        if (absl::EqualsIgnoreCase(c, value)) {
          flag.s = c;
          return absl::OkStatus();
        }
      }
      return want(OrList(flag.choices));
  }
  return absl::InternalError("unreachable");
}

std::string FlagSet::UnknownFlag(const std::string& spelled) const {
  const std::string name = spelled.substr(2);
  std::string best;
  size_t best_distance = std::max<size_t>(2, name.size() / 4) + 1;
  auto consider = [&](const std::string& candidate) {
    const size_t d = EditDistance(name, candidate);
    if (d < best_distance) {
      best_distance = d;
      best = candidate;
    }
  };
  for (const std::string& n : order_) consider(n);
  for (const auto& [old_name, n] : aliases_) consider(n);
  std::string out = absl::StrCat("unknown flag ", spelled);
  if (!best.empty()) absl::StrAppend(&out, "; did you mean --", best, "?");
  absl::StrAppend(&out, " (see '", program_, " --help')");
  return out;
}

// Parses args[i] (a flag), advancing i past a separate value.
absl::Status FlagSet::ParseOne(const std::vector<std::string>& args, size_t& i) {
  const std::string& a = args[i];
  if (a.size() < 3 || a[1] != '-') {
    return absl::InvalidArgumentError(absl::StrCat("unknown flag '", a, "'"));
  }
  const size_t eq = a.find('=');
  const std::string spelled = a.substr(0, eq);
  std::string name = spelled.substr(2);
  bool alias = false;
  if (auto al = aliases_.find(name); al != aliases_.end()) {
    name = al->second;
    alias = true;
  }
  auto it = flags_.find(name);
  if (it == flags_.end()) return absl::InvalidArgumentError(UnknownFlag(spelled));
  Flag& flag = it->second;
  if (flag.set && flag.type != FlagType::kStringList) {
    const std::string also =
        flag.spelling == spelled ? "" : absl::StrCat(" (as ", flag.spelling, " and ", spelled, ")");
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, " given more than once", also));
  }
  if (alias && synonyms_.count(spelled.substr(2)) == 0) {
    warnings_.push_back(absl::StrCat(spelled, " is deprecated; use --", name));
  }
  flag.set = true;
  flag.spelling = spelled;
  if (eq != std::string::npos) return SetValue(flag, a.substr(eq + 1));
  if (flag.type == FlagType::kBool) return SetValue(flag, "true");
  if (i + 1 >= args.size()) {
    return absl::InvalidArgumentError(absl::StrCat(spelled, " needs a value"));
  }
  return SetValue(flag, args[++i]);
}

absl::Status FlagSet::Parse(const std::vector<std::string>& args) {
  bool flags_done = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (flags_done || a == "-" || LooksLikeNumber(a) || a.empty() || a[0] != '-') {
      if (no_positional_) {
        return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", a, "'"));
      }
      positional_.push_back(a);
      if (stop_at_positional_) flags_done = true;
      continue;
    }
    if (a == "--") {
      flags_done = true;
      continue;
    }
    if (a == "--help" || a == "-h") {
      help_ = true;
      continue;
    }
    RETURN_IF_ERROR(ParseOne(args, i));
  }
  // Only once the whole line parsed: a usage error stays one line.
  for (const std::string& w : warnings_) {
    std::fprintf(stderr, "%s: warning: %s\n", program_.c_str(), w.c_str());
  }
  return absl::OkStatus();
}

std::string FlagSet::UsageLine(const std::string& name, const Flag& f) const {
  std::string meta;
  switch (f.type) {
    case FlagType::kBool:
      break;
    case FlagType::kSize:
      meta = " SIZE";
      break;
    case FlagType::kChoice:
      meta = absl::StrCat(" ", absl::StrJoin(f.choices, "|"));
      break;
    default:
      meta = " V";
  }
  std::string text = f.help;
  if (f.type == FlagType::kStringList) text += " (repeatable)";
  if (!f.default_text.empty()) absl::StrAppend(&text, " (default ", f.default_text, ")");
  for (const std::string& a : f.aliases) absl::StrAppend(&text, " (old spelling --", a, ")");
  for (const std::string& a : f.synonyms) absl::StrAppend(&text, " (also --", a, ")");
  // "  --name META" in 28 columns (else alone on its line), then the text
  // wrapped at 80 columns, continuation lines indented by 29.
  constexpr size_t kIndent = 29, kWidth = 80;
  std::string out = absl::StrCat("  --", name, meta);
  if (out.size() < kIndent) {
    out.resize(kIndent, ' ');
  } else {
    absl::StrAppend(&out, "\n", std::string(kIndent, ' '));
  }
  size_t column = kIndent;
  bool first = true;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (!first && column + 1 + word.size() > kWidth) {
      absl::StrAppend(&out, "\n", std::string(kIndent, ' '));
      column = kIndent;
      first = true;
    }
    if (!first) {
      out += ' ';
      ++column;
    }
    absl::StrAppend(&out, word);
    column += word.size();
    first = false;
  }
  return out + "\n";
}

std::string FlagSet::Usage() const {
  std::string out = absl::StrCat("usage: ", program_, " ", synopsis_, "\n");
  // Groups in order of first appearance.
  std::vector<std::string> groups;
  for (const std::string& n : order_) {
    const std::string& g = flags_.at(n).group;
    if (std::find(groups.begin(), groups.end(), g) == groups.end()) groups.push_back(g);
  }
  for (const std::string& g : groups) {
    absl::StrAppend(&out, "\n", g.empty() ? "flags" : g, ":\n");
    for (const std::string& n : order_) {
      if (flags_.at(n).group == g) out += UsageLine(n, flags_.at(n));
    }
  }
  if (!notes_.empty()) absl::StrAppend(&out, "\n", notes_);
  return out;
}

bool FlagSet::IsSet(const std::string& name) const {
  auto it = flags_.find(name);
  MOE_CHECK(it != flags_.end()) << "undeclared flag --" << name;
  return it->second.set;
}

absl::Status FlagSet::Require(const std::string& name) const {
  if (IsSet(name)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("--", name, " is required"));
}

std::string FlagSet::Spelling(const std::string& name) const {
  return IsSet(name) ? flags_.at(name).spelling : absl::StrCat("--", name);
}

FlagType FlagSet::TypeOf(const std::string& name) const {
  auto it = flags_.find(name);
  MOE_CHECK(it != flags_.end()) << "undeclared flag --" << name;
  return it->second.type;
}

const FlagSet::Flag& FlagSet::Get(const std::string& name, FlagType type) const {
  auto it = flags_.find(name);
  MOE_CHECK(it != flags_.end()) << "undeclared flag --" << name;
  const FlagType t = it->second.type;
  MOE_CHECK(t == type || (type == FlagType::kString && t == FlagType::kChoice))
      << "flag --" << name << " read with the wrong type";
  return it->second;
}

const std::string& FlagSet::GetString(const std::string& name) const {
  return Get(name, FlagType::kString).s;
}
const std::vector<std::string>& FlagSet::GetList(const std::string& name) const {
  return Get(name, FlagType::kStringList).list;
}
int64_t FlagSet::GetInt(const std::string& name) const { return Get(name, FlagType::kInt).i; }
double FlagSet::GetDouble(const std::string& name) const {
  return Get(name, FlagType::kDouble).d;
}
bool FlagSet::GetBool(const std::string& name) const { return Get(name, FlagType::kBool).b; }
int64_t FlagSet::GetSize(const std::string& name) const {
  return Get(name, FlagType::kSize).i;
}

absl::StatusOr<std::vector<int64_t>> ParseIntList(absl::string_view text) {
  std::vector<int64_t> out;
  if (text.empty()) return out;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int64_t v;
    if (!absl::SimpleAtoi(part, &v)) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", part, "' in '", text, "' is not an integer"));
    }
    out.push_back(v);
  }
  return out;
}

}  // namespace moe::flags
