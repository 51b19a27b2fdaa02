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
#include "services/plan/machine.h"
#include "services/plan/plan.h"

namespace moe::moectl {
namespace {

constexpr char kNotes[] =
    "Sizes take K, M, G, T (powers of 1024: 24G = 24GiB). Omitted, --gpu-mem and\n"
    "--host-mem are read from the machine (the GPU through the CUDA module, the host\n"
    "from /proc/meminfo; --gpu-mem 0 plans for the CPU alone), --host-gbps is\n"
    "measured, and --link-gbps is taken as 25 (PCIe 4.0 x16) and said so.\n"
    "The plan mirrors what moe-worker and moe-cached hold; the speeds come from\n"
    "the trace simulator's cost model on a synthetic trace of the model's shape\n"
    "(docs/operations.md, \"Will it fit?\").\n";

constexpr double kAssumedLinkGbps = 25;

void DeclareFlags(FlagSet& f) {
  flag_groups::DeclareModel(f, /*repeatable=*/false);
  flag_groups::DeclareExpertFormat(f);
  f.Group("machine");
  f.Size("gpu-mem", 0, "GPU memory to plan for (0: no GPU; unset: the GPU's total)");
  f.Size("host-mem", 0, "host memory to plan for (unset: MemTotal)");
  f.Double("device-gbps", 900, "GPU memory bandwidth, GB/s (for the speed estimate)",
           {.min = 0, .min_exclusive = true});
  f.Double("device-gflops", 50000, "GPU FLOP rate, GFLOP/s (for the prefill estimate)",
           {.min = 0, .min_exclusive = true});
  flag_groups::DeclareLink(f, 0);
  flag_groups::DeclareHostFigures(f, {.gbps = 0, .gflops = 100});
  f.Group("serving");
  f.Int("context", 4096, "tokens per sequence the KV cache holds", {.min = 1, .max = 1 << 24});
  f.Int("max-batch", 1, "sequences at once (moe-worker --max-batch)", {.min = 1, .max = 64});
  f.String("cache", "unix:/tmp/moe-cached.sock", "moe-cached's socket in the printed flags");
  f.Group("");
  f.Bool("json", false, "print one JSON object");
  f.NoPositional();
  f.Notes(kNotes);
}

// The dtypes of the weights when the directory holds a valid checkpoint;
// the config's word otherwise (said on stderr when weights are there but
// do not open).
plan::StoredFormats Stored(const std::string& dir, const ModelConfig& config, bool* measured) {
  plan::StoredFormats s = plan::StoredFormatsFromConfig(config);
  *measured = false;
  bool any = false;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".safetensors") any = true;
  }
  if (!any) return s;
  absl::StatusOr<ModelDescription> d = ModelDescription::Open(dir);
  if (!d.ok()) {
    std::fprintf(stderr, "moectl plan: weights not used (config.json alone): %s\n",
                 absl::StrReplaceAll(d.status().message(), {{"\n", " "}}).c_str());
    return s;
  }
  s.experts = d->expert_dtype();
  absl::StatusOr<TensorView> embed = d->Dense(TensorRole::kEmbed, -1);
  if (embed.ok()) s.dense = embed->dtype;
  *measured = true;
  return s;
}

// Budgets and figures: given, else measured (said on stderr unless --json).
plan::PlanOptions Options(const FlagSet& f, bool quiet) {
  plan::PlanOptions o;
  o.model_dir = f.GetString("model");
  o.context = f.GetInt("context");
  o.max_batch = static_cast<int>(f.GetInt("max-batch"));
  o.expert_format = flag_groups::ExpertFormatFromFlags(f);
  if (f.IsSet("miss-mode")) o.miss_mode = flag_groups::MissModeFromFlags(f);
  o.daemon_socket = f.GetString("cache");
  o.device_gbps = f.GetDouble("device-gbps");
  o.device_gflops = f.GetDouble("device-gflops");
  o.host_gflops = f.GetDouble("host-gflops");
  auto note = [&](const std::string& s) {
    if (!quiet) std::fprintf(stderr, "moectl plan: %s\n", s.c_str());
  };
  if (f.IsSet("gpu-mem")) {
    o.gpu_bytes = f.GetSize("gpu-mem");
  } else {
    const plan::GpuInfo gpu = plan::ProbeGpu();
    o.gpu_bytes = gpu.total_bytes;
    note(absl::StrCat("--gpu-mem ", flags::FormatSize(gpu.total_bytes), ": ", gpu.description));
  }
  o.host_bytes = f.IsSet("host-mem") ? f.GetSize("host-mem") : plan::HostMemoryBytes();
  if (!f.IsSet("host-mem")) note(absl::StrCat("--host-mem ", plan::HumanBytes(o.host_bytes)));
  o.host_gbps = f.GetDouble("host-gbps");
  if (o.host_gbps <= 0) {
    o.host_gbps = plan::MeasureHostReadGbps();
    note(absl::StrCat("--host-gbps ", o.host_gbps, " (measured)"));
  }
  o.link_gbps = f.GetDouble("link-gbps");
  if (o.link_gbps <= 0) {
    o.link_gbps = kAssumedLinkGbps;
    if (o.gpu_bytes > 0) note(absl::StrCat("--link-gbps ", o.link_gbps, " (assumed)"));
  }
  return o;
}

int Fail(const std::string& message, int code) {
  std::fprintf(stderr, "moectl plan: %s\n", message.c_str());
  return code;
}

int RunPlan(const Args& args) {
  FlagSet flags("plan", "--model DIR [--gpu-mem SIZE] [--host-mem SIZE] [flags]");
  DeclareFlags(flags);
  absl::Status parsed = flags.Parse(args);
  if (flags.help()) {
    std::fputs(flags.Usage().c_str(), stdout);
    return 0;
  }
  if (parsed.ok()) parsed = flags.Require("model");
  if (!parsed.ok()) return Fail(std::string(parsed.message()), 2);
  const std::string dir = flags.GetString("model");
  absl::StatusOr<ModelConfig> config = LoadModelConfig(dir);
  if (!config.ok()) return Fail(std::string(config.status().message()), 1);
  const bool json = flags.GetBool("json");
  bool from_weights = false;
  const plan::StoredFormats stored = Stored(dir, *config, &from_weights);
  absl::StatusOr<plan::Plan> p = plan::MakePlan(*config, stored, Options(flags, json));
  if (!p.ok()) return Fail(std::string(p.status().message()), 2);
  if (json) {
    nlohmann::ordered_json j = plan::PlanJson(*p);
    j["from_weights"] = from_weights;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("model: %s (%s, %s)\n", dir.c_str(),
                std::string(ModelFamilyName(config->family)).c_str(),
                from_weights ? "sizes from the weights" : "config.json alone");
    std::fputs(plan::PlanText(*p).c_str(), stdout);
  }
  return 0;
}

const bool kRegistered = RegisterCommand(
    {"plan", "will a model fit, and how fast: memory plan and start flags from config.json",
     &RunPlan});

}  // namespace
}  // namespace moe::moectl
