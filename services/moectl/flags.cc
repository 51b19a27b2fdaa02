#include "services/moectl/flags.h"

#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace moe::moectl {
namespace {

bool LooksLikeNumber(const std::string& a) {
  return a.size() >= 2 && a[0] == '-' &&
         ((a[1] >= '0' && a[1] <= '9') || a[1] == '.');
}

}  // namespace

FlagSet::FlagSet(std::string command, std::string synopsis)
    : command_(std::move(command)), synopsis_(std::move(synopsis)) {}

void FlagSet::Declare(const std::string& name, Flag flag) {
  MOE_CHECK(flags_.count(name) == 0) << "flag --" << name << " declared twice";
  order_.push_back(name);
  flags_.emplace(name, std::move(flag));
}

void FlagSet::String(const std::string& name, std::string def,
                     std::string help) {
  Flag f{Type::kString, std::move(help),
         def.empty() ? "" : absl::StrCat("\"", def, "\"")};
  f.s = std::move(def);
  Declare(name, std::move(f));
}

void FlagSet::Int(const std::string& name, int64_t def, std::string help) {
  Flag f{Type::kInt, std::move(help), absl::StrCat(def)};
  f.i = def;
  Declare(name, std::move(f));
}

void FlagSet::Double(const std::string& name, double def, std::string help) {
  Flag f{Type::kDouble, std::move(help), absl::StrCat(def)};
  f.d = def;
  Declare(name, std::move(f));
}

void FlagSet::Bool(const std::string& name, bool def, std::string help) {
  Flag f{Type::kBool, std::move(help), def ? "true" : "false"};
  f.b = def;
  Declare(name, std::move(f));
}

absl::Status FlagSet::SetValue(const std::string& name, Flag& flag,
                               const std::string& value) {
  if (flag.set)
    return absl::InvalidArgumentError(absl::StrCat("--", name, " given twice"));
  flag.set = true;
  switch (flag.type) {
    case Type::kString:
      flag.s = value;
      return absl::OkStatus();
    case Type::kInt:
      if (!absl::SimpleAtoi(value, &flag.i)) break;
      return absl::OkStatus();
    case Type::kDouble:
      if (!absl::SimpleAtod(value, &flag.d)) break;
      return absl::OkStatus();
    case Type::kBool:
      if (value == "true" || value == "1") {
        flag.b = true;
      } else if (value == "false" || value == "0") {
        flag.b = false;
      } else {
        break;
      }
      return absl::OkStatus();
  }
  static const char* kWhat[] = {"a string", "an integer", "a number",
                                "true or false"};
  return absl::InvalidArgumentError(
      absl::StrCat("--", name, " expects ", kWhat[static_cast<int>(flag.type)],
                   ", got '", value, "'"));
}

absl::Status FlagSet::Parse(const std::vector<std::string>& args) {
  bool flags_done = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (flags_done || a == "-" || LooksLikeNumber(a) || a.empty() ||
        a[0] != '-') {
      positional_.push_back(a);
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
    if (a.size() < 3 || a[1] != '-') {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag '", a, "'"));
    }
    size_t eq = a.find('=');
    std::string name =
        a.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    auto it = flags_.find(name);
    if (it == flags_.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown flag --", name, " (see 'moectl ", command_, " --help')"));
    }
    Flag& flag = it->second;
    if (eq != std::string::npos) {
      RETURN_IF_ERROR(SetValue(name, flag, a.substr(eq + 1)));
    } else if (flag.type == Type::kBool) {
      RETURN_IF_ERROR(SetValue(name, flag, "true"));
    } else if (i + 1 < args.size()) {
      RETURN_IF_ERROR(SetValue(name, flag, args[++i]));
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, " needs a value"));
    }
  }
  return absl::OkStatus();
}

std::string FlagSet::Usage() const {
  std::string out =
      absl::StrCat("usage: moectl ", command_, " ", synopsis_, "\n");
  if (!order_.empty()) out += "\nflags:\n";
  for (const std::string& name : order_) {
    const Flag& f = flags_.at(name);
    std::string left =
        absl::StrCat("  --", name, f.type == Type::kBool ? "" : " V");
    if (left.size() < 28) left.resize(28, ' ');
    absl::StrAppend(&out, left, " ", f.help,
                    f.default_text.empty()
                        ? ""
                        : absl::StrCat(" (default ", f.default_text, ")"),
                    "\n");
  }
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

const FlagSet::Flag& FlagSet::Get(const std::string& name, Type type) const {
  auto it = flags_.find(name);
  MOE_CHECK(it != flags_.end()) << "undeclared flag --" << name;
  MOE_CHECK(it->second.type == type)
      << "flag --" << name << " read with the wrong type";
  return it->second;
}

const std::string& FlagSet::GetString(const std::string& name) const {
  return Get(name, Type::kString).s;
}
int64_t FlagSet::GetInt(const std::string& name) const {
  return Get(name, Type::kInt).i;
}
double FlagSet::GetDouble(const std::string& name) const {
  return Get(name, Type::kDouble).d;
}
bool FlagSet::GetBool(const std::string& name) const {
  return Get(name, Type::kBool).b;
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

void DeclareGenerationFlags(FlagSet& f) {
  f.String("prompt-ids", "", "prompt as comma-separated token ids");
  f.Int("max-new-tokens", 16, "tokens to generate at most");
  f.Double("temperature", 0.0, "0 = greedy");
  f.Double("top-p", 1.0, "nucleus sampling threshold (1 = off)");
  f.Int("seed", 0, "sampling seed");
  f.Int("top-logprobs", 0, "alternatives per token with their log-probs");
  f.Bool("ignore-eos", false, "do not stop at the model's eos tokens");
  f.Bool("json", false, "one JSON object per token, then a summary object");
}

}  // namespace moe::moectl
