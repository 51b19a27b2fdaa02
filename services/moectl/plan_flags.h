// The flags of `moectl plan`, shared with `moectl serve` (which plans, then
// starts what it planned): the model, the machine's budgets and figures,
// and the serving shape.
//
//   DeclarePlanFlags(flags);          // then the command's own flags
//   ...flags.Parse(args)...
//   plan::PlanOptions o = PlanOptionsFromFlags(flags, quiet, "plan");
#ifndef MOECACHE_SERVICES_MOECTL_PLAN_FLAGS_H_
#define MOECACHE_SERVICES_MOECTL_PLAN_FLAGS_H_

#include <optional>
#include <string>
#include <vector>

#include "common/model_config.h"
#include "services/moectl/flags.h"
#include "services/plan/plan.h"

namespace moe::moectl {

// What the plan flags' help notes say.
extern const char kPlanNotes[];

// --model, --expert-format, --miss-mode, the machine group (--gpu-mem,
// --host-mem, --device-gbps, --device-gflops, --link-gbps, --host-gbps,
// --host-gflops) and the serving group (--context, --max-batch, --daemon).
void DeclarePlanFlags(FlagSet& f);

// Budgets and figures: given, else measured or assumed (said on stderr as
// "moectl COMMAND: ..." unless `quiet`). Without a GPU the CPU engine's
// figures for `config`'s family are measured (engine_calibration.h, about a
// second) unless --device-gbps and --layer-overhead-us are both given.
plan::PlanOptions PlanOptionsFromFlags(const FlagSet& f, const ModelConfig& config, bool quiet,
                                       const char* command);

// Parses `args` into `f` (DeclarePlanFlags and the command's own flags),
// prints the usage for --help, requires --model and reads its config.json.
// Returns the config, or nullopt with *exit_code set: 0 after --help, 2 for a
// usage error, 1 for a config.json that does not load (said on stderr as
// "moectl COMMAND: ...").
std::optional<ModelConfig> ParsePlanCommand(FlagSet& f, const std::vector<std::string>& args,
                                            const char* command, int* exit_code);

// The plan's first line: "model: DIR (family, sizes from the weights)" or
// "(..., config.json alone)", then the plan as a person reads it.
std::string PlanReport(const std::string& dir, const ModelConfig& config, bool from_weights,
                       const plan::Plan& plan);

// The dtypes of the weights when `dir` holds a valid checkpoint (*measured
// true); the config's word otherwise (said on stderr when weights are
// there but do not open).
plan::StoredFormats StoredFormatsOf(const std::string& dir, const ModelConfig& config,
                                    bool* measured, const char* command);

}  // namespace moe::moectl

#endif  // MOECACHE_SERVICES_MOECTL_PLAN_FLAGS_H_
