// moectl plan --model DIR: "will it fit, and how fast?" from config.json
// alone (services/plan/plan.h); the weights, when present, give the real
// dtypes.
#include <cstdio>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/model_desc.h"
#include "services/flags/flag_groups.h"
#include "services/moectl/commands.h"
#include "services/moectl/flags.h"
#include "services/moectl/plan_flags.h"
#include "services/plan/machine.h"
#include "services/plan/plan.h"

namespace moe::moectl {
namespace {

int Fail(const std::string& message, int code) {
  std::fprintf(stderr, "moectl plan: %s\n", message.c_str());
  return code;
}

int RunPlan(const Args& args) {
  FlagSet flags("plan", "--model DIR [--gpu-mem SIZE] [--host-mem SIZE] [flags]");
  DeclarePlanFlags(flags);
  flags.String("cache", "unix:/tmp/moe-cached.sock", "moe-cached's socket in the printed flags");
  flags.Group("");
  flags.Bool("json", false, "print one JSON object");
  flags.NoPositional();
  flags.Notes(kPlanNotes);
  int code = 0;
  const std::optional<ModelConfig> config = ParsePlanCommand(flags, args, "plan", &code);
  if (!config.has_value()) return code;
  const std::string dir = flags.GetString("model");
  const bool json = flags.GetBool("json");
  bool from_weights = false;
  const plan::StoredFormats stored = StoredFormatsOf(dir, *config, &from_weights, "plan");
  plan::PlanOptions options = PlanOptionsFromFlags(flags, *config, json, "plan");
  options.daemon_socket = flags.GetString("cache");
  absl::StatusOr<plan::Plan> p = plan::MakePlan(*config, stored, options);
  if (!p.ok()) return Fail(std::string(p.status().message()), 2);
  if (json) {
    nlohmann::ordered_json j = plan::PlanJson(*p);
    j["from_weights"] = from_weights;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::fputs(PlanReport(dir, *config, from_weights, *p).c_str(), stdout);
  }
  return 0;
}

const bool kRegistered = RegisterCommand(
    {"plan", "will a model fit, and how fast: memory plan and start flags from config.json",
     &RunPlan});

}  // namespace
}  // namespace moe::moectl
