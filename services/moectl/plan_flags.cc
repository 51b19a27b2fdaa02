#include "services/moectl/plan_flags.h"

#include <cstdio>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/match.h"
#include "absl/strings/str_replace.h"
#include "common/model_desc.h"
#include "services/flags/flag_groups.h"
#include "services/moectl/engine_calibration.h"
#include "services/plan/machine.h"

namespace moe::moectl {
namespace {

constexpr double kAssumedLinkGbps = 25;

}  // namespace

const char kPlanNotes[] =
    "Sizes take K, M, G, T (powers of 1024: 24G = 24GiB). Omitted, --gpu-mem and\n"
    "--host-mem are read from the machine (the GPU through the CUDA module, the host\n"
    "from /proc/meminfo; --gpu-mem 0 plans for the CPU alone), --host-gbps is\n"
    "measured, and --link-gbps is taken as 25 (PCIe 4.0 x16) and said so.\n"
    "Without a GPU the plan is moe-worker alone, holding every expert (--daemon on\n"
    "plans moe-cached too, with --miss-mode and its arena).\n"
    "The plan mirrors what moe-worker and moe-cached hold; the speeds come from\n"
    "the trace simulator's cost model on a synthetic trace of the model's shape\n"
    "(docs/operations.md, \"Will it fit?\").\n";

void DeclarePlanFlags(FlagSet& f) {
  flag_groups::DeclareModel(f, /*repeatable=*/false);
  flag_groups::DeclareExpertFormat(f);
  f.Group("machine");
  f.Size("gpu-mem", 0, "GPU memory to plan for (0: no GPU; unset: the GPU's total)");
  f.Size("host-mem", 0, "host memory to plan for (unset: MemTotal)");
  f.Double("device-gbps", 900,
           "the computing device's weight-read rate, GB/s: the GPU's memory bandwidth, or "
           "without a GPU the CPU engine's (measured when omitted) (for the speed estimate)",
           {.min = 0, .min_exclusive = true});
  f.Double("device-gflops", 50000, "GPU FLOP rate, GFLOP/s (for the prefill estimate)",
           {.min = 0, .min_exclusive = true});
  f.Double("layer-overhead-us", 0,
           "fixed time per MoE layer per decode step beyond its bytes (op dispatch, the "
           "worker -> daemon round trip); without a GPU measured when omitted, with one 0",
           {.min = 0});
  flag_groups::DeclareLink(f, 0);
  flag_groups::DeclareHostFigures(f, {.gbps = 0, .gflops = 100});
  f.Group("serving");
  f.Int("context", 4096, "tokens per sequence the KV cache holds", {.min = 1, .max = 1 << 24});
  f.Int("max-batch", 1, "sequences at once (moe-worker --max-batch)", {.min = 1, .max = 64});
  f.Choice("daemon", "auto", {"auto", "on", "off"},
           "serve the experts from moe-cached: auto = with a GPU only (without one the "
           "worker holds every expert, --cache none, and makes no hand-off between processes)");
}

// The dtypes of the weights when the directory holds a valid checkpoint;
// the config's word otherwise (said on stderr when weights are there but
// do not open).
plan::StoredFormats StoredFormatsOf(const std::string& dir, const ModelConfig& config,
                                    bool* measured, const char* command) {
  plan::StoredFormats s = plan::StoredFormatsFromConfig(config);
  *measured = false;
  bool any = false;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".safetensors") any = true;
  }
  if (absl::EndsWith(dir, ".gguf")) any = true;  // a GGUF file holds its weights
  if (!any) return s;
  absl::StatusOr<ModelDescription> d = ModelDescription::Open(dir);
  if (!d.ok()) {
    std::fprintf(stderr, "moectl %s: weights not used (config.json alone): %s\n", command,
                 absl::StrReplaceAll(d.status().message(), {{"\n", " "}}).c_str());
    return s;
  }
  *measured = true;
  return plan::StoredFormatsFromWeights(*d);
}

// Budgets and figures: given, else measured (said on stderr unless --json).
plan::PlanOptions PlanOptionsFromFlags(const FlagSet& f, const ModelConfig& config, bool quiet,
                                       const char* command) {
  plan::PlanOptions o;
  o.model_dir = f.GetString("model");
  o.context = f.GetInt("context");
  o.max_batch = static_cast<int>(f.GetInt("max-batch"));
  o.expert_format = flag_groups::ExpertFormatFromFlags(f);
  if (f.IsSet("miss-mode")) o.miss_mode = flag_groups::MissModeFromFlags(f);
  if (f.GetString("daemon") != "auto") o.daemon = f.GetString("daemon") == "on";
  o.device_gbps = f.GetDouble("device-gbps");
  o.device_gflops = f.GetDouble("device-gflops");
  o.host_gflops = f.GetDouble("host-gflops");
  auto note = [&](const std::string& s) {
    if (!quiet) std::fprintf(stderr, "moectl %s: %s\n", command, s.c_str());
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
  o.layer_overhead_us = f.GetDouble("layer-overhead-us");
  if (o.gpu_bytes == 0) {
    if (f.IsSet("device-gbps")) o.cpu_engine_gbps = o.device_gbps;
    if (!f.IsSet("device-gbps") || !f.IsSet("layer-overhead-us")) {
      // A CPU worker's own speed: measured on made models of the family.
      const bool daemon = o.daemon.value_or(false);
      absl::StatusOr<EngineFigures> e = MeasureCpuEngine(config.family, daemon);
      if (!e.ok()) {
        note(absl::StrCat("the CPU engine was not measured (", e.status().message(),
                          "): the speed estimate reads weights at --host-gbps"));
      } else {
        if (!f.IsSet("device-gbps")) {
          o.cpu_engine_gbps = e->gbps;
          note(absl::StrFormat("--device-gbps %.3g (the CPU engine's weight reads, measured)",
                               e->gbps));
        }
        if (!f.IsSet("layer-overhead-us")) {
          o.layer_overhead_us = e->layer_us + e->handoff_us;
          note(daemon ? absl::StrFormat("--layer-overhead-us %.3g (measured: %.3g us of op "
                                        "dispatch + a %.3g us round trip to the daemon)",
                                        o.layer_overhead_us, e->layer_us, e->handoff_us)
                      : absl::StrFormat("--layer-overhead-us %.3g (op dispatch, measured)",
                                        o.layer_overhead_us));
        }
      }
    }
  }
  o.link_gbps = f.GetDouble("link-gbps");
  if (o.link_gbps <= 0) {
    o.link_gbps = kAssumedLinkGbps;
    if (o.gpu_bytes > 0) note(absl::StrCat("--link-gbps ", o.link_gbps, " (assumed)"));
  }
  return o;
}

std::optional<ModelConfig> ParsePlanCommand(FlagSet& f, const std::vector<std::string>& args,
                                            const char* command, int* exit_code) {
  absl::Status parsed = f.Parse(args);
  if (f.help()) {
    std::fputs(f.Usage().c_str(), stdout);
    *exit_code = 0;
    return std::nullopt;
  }
  if (parsed.ok()) parsed = f.Require("model");
  if (!parsed.ok()) {
    std::fprintf(stderr, "moectl %s: %s\n", command, std::string(parsed.message()).c_str());
    *exit_code = 2;
    return std::nullopt;
  }
  absl::StatusOr<ModelConfig> config = LoadModelConfig(f.GetString("model"));
  if (!config.ok()) {
    std::fprintf(stderr, "moectl %s: %s\n", command,
                 std::string(config.status().message()).c_str());
    *exit_code = 1;
    return std::nullopt;
  }
  return *std::move(config);
}

std::string PlanReport(const std::string& dir, const ModelConfig& config, bool from_weights,
                       const plan::Plan& plan) {
  return absl::StrCat("model: ", dir, " (", ModelFamilyName(config.family), ", ",
                      from_weights ? "sizes from the weights" : "config.json alone", ")\n",
                      plan::PlanText(plan));
}

}  // namespace moe::moectl
