// PlanText and PlanJson (plan.h).
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/quant.h"
#include "services/plan/plan.h"

namespace moe::plan {
namespace {

std::string Count(int64_t n) {
  if (n >= 1000000000) return absl::StrFormat("%.2fB", n / 1e9);
  if (n >= 1000000) return absl::StrFormat("%.2fM", n / 1e6);
  return absl::StrCat(n);
}

std::string Line(const char* label, const std::string& value) {
  return absl::StrFormat("%-28s %s\n", label, value);
}

std::string ModelText(const Plan& p) {
  const ModelFigures& m = p.model;
  std::string s;
  absl::StrAppend(&s, Line("parameters:", absl::StrCat(Count(m.params_total), " total, ",
                                                       Count(m.params_active),
                                                       " active per token")));
  absl::StrAppend(&s, Line("experts:", absl::StrCat(m.experts_total, " (", m.num_moe_layers,
                                                    " MoE layers x ", m.experts_per_layer,
                                                    ", top-", m.top_k, ")")));
  const bool mixed = m.held_name.find('+') != std::string::npos;
  absl::StrAppend(&s, Line("experts stored / held as:",
                           mixed ? absl::StrCat(m.held_name, " / as stored")
                                 : absl::StrCat(DTypeName(m.stored.experts), " / ", m.held_name)));
  absl::StrAppend(&s, Line(mixed ? "bytes per expert (held, largest):" : "bytes per expert (held):",
                           absl::StrCat(m.expert_bytes, " (", HumanBytes(m.expert_bytes), ")")));
  absl::StrAppend(&s, Line("dense weights on device:", HumanBytes(m.dense_bytes_device)));
  absl::StrAppend(&s, Line("KV cache per token:",
                           absl::StrCat(m.kv_bytes_per_token, " B (f32, all layers)")));
  absl::StrAppend(&s, Line("KV cache for context:",
                           absl::StrCat(HumanBytes(p.kv_bytes), " (", p.context,
                                        " tokens x ", p.options.max_batch, " sequences)")));
  return s;
}

std::string MachineText(const Plan& p) {
  const PlanOptions& o = p.options;
  const bool gpu = o.gpu_bytes > 0;
  std::string s;
  absl::StrAppend(&s, Line("budget:", absl::StrCat(gpu ? HumanBytes(o.gpu_bytes) + " GPU"
                                                       : std::string("no GPU"),
                                                   ", ", HumanBytes(o.host_bytes), " host")));
  absl::StrAppend(&s, Line(gpu ? "GPU needs (without cache):" : "dense + KV + reserve:",
                           absl::StrCat(HumanBytes(p.device_needed), " (reserve ",
                                        HumanBytes(p.device_reserve), ")")));
  if (p.daemon) {
    absl::StrAppend(&s, Line("expert cache slots:",
                             absl::StrFormat("%d (%.1f%% of the experts, %s)", p.cache_slots,
                                             100 * p.cache_fraction,
                                             HumanBytes(p.cache_slots * p.model.expert_bytes))));
  } else {
    absl::StrAppend(&s, Line("experts held:",
                             gpu ? "every one by moe-worker on the GPU (--cache none): they all "
                                   "fit, moe-cached would add only hand-offs"
                                 : "every one by moe-worker (--cache none): without a GPU "
                                   "moe-cached adds only hand-offs"));
  }
  absl::StrAppend(&s, Line("host memory needed:", absl::StrCat(HumanBytes(p.host_bytes),
                                                               gpu ? " (every expert)" : "")));
  if (p.daemon) absl::StrAppend(&s, Line("miss mode:", MissModeName(p.miss_mode)));
  absl::StrAppend(&s, Line("figures:", absl::StrFormat(
                                           "link %g GB/s, host %g GB/s %g GFLOP/s, device "
                                           "%g GB/s %g GFLOP/s, %g us per layer",
                                           o.link_gbps, o.host_gbps, o.host_gflops,
                                           DeviceReadGbps(o),
                                           gpu ? o.device_gflops : o.host_gflops,
                                           o.layer_overhead_us)));
  absl::StrAppend(&s, Line("predicted decode:",
                           absl::StrFormat("%.1f tokens/s (%d sequences)",
                                           p.predicted_decode_tokens_per_s, o.max_batch)));
  absl::StrAppend(&s, Line("predicted prefill:",
                           absl::StrFormat("%.0f tokens/s", p.predicted_prefill_tokens_per_s)));
  return s;
}

}  // namespace

std::string PlanText(const Plan& p) {
  std::string s = absl::StrCat(ModelText(p), MachineText(p));
  if (p.fits) {
    absl::StrAppend(&s, "fits: yes\n");
  } else {
    absl::StrAppend(&s, "fits: NO\n");
    for (const std::string& why : p.problems) absl::StrAppend(&s, "  - ", why, "\n");
    absl::StrAppend(&s, "what fits instead:\n");
    for (const std::string& alt : p.suggestions) absl::StrAppend(&s, "  - ", alt, "\n");
  }
  absl::StrAppend(&s, "start:\n");
  if (p.daemon) absl::StrAppend(&s, "  ", ShellLine("moe-cached", p.daemon_flags), "\n");
  absl::StrAppend(&s, "  ", ShellLine("moe-worker", p.worker_flags), "\n");
  return s;
}

nlohmann::ordered_json PlanJson(const Plan& p) {
  const ModelFigures& m = p.model;
  nlohmann::ordered_json j;
  j["model"] = p.options.model_dir;
  j["params_total"] = m.params_total;
  j["params_active"] = m.params_active;
  j["params_dense"] = m.params_dense;
  j["experts_total"] = m.experts_total;
  j["moe_layers"] = m.num_moe_layers;
  j["experts_per_layer"] = m.experts_per_layer;
  j["top_k"] = m.top_k;
  j["expert_params"] = m.expert_params;
  j["expert_stored_dtype"] = std::string(DTypeName(m.stored.experts));
  j["expert_format"] = m.held_name;
  j["expert_bytes"] = m.expert_bytes;
  j["all_expert_bytes"] = m.all_expert_bytes;
  j["dense_bytes_device"] = m.dense_bytes_device;
  j["kv_bytes_per_token"] = m.kv_bytes_per_token;
  j["context"] = p.context;
  j["max_batch"] = p.options.max_batch;
  j["kv_bytes"] = p.kv_bytes;
  j["gpu_bytes"] = p.options.gpu_bytes;
  j["host_mem_bytes"] = p.options.host_bytes;
  j["device_needed_bytes"] = p.device_needed;
  j["cache_slots"] = p.cache_slots;
  j["cache_fraction"] = p.cache_fraction;
  j["host_bytes"] = p.host_bytes;
  j["miss_mode"] = MissModeName(p.miss_mode);
  j["fits"] = p.fits;
  j["problems"] = p.problems;
  j["suggestions"] = p.suggestions;
  j["link_gbps"] = p.options.link_gbps;
  j["host_gbps"] = p.options.host_gbps;
  j["device_gbps"] = DeviceReadGbps(p.options);
  j["layer_overhead_us"] = p.options.layer_overhead_us;
  j["layer_ms"] = p.layer_ms;
  j["predicted_decode_tokens_per_s"] = p.predicted_decode_tokens_per_s;
  j["predicted_prefill_tokens_per_s"] = p.predicted_prefill_tokens_per_s;
  j["daemon"] = p.daemon;
  j["daemon_flags"] = p.daemon_flags;
  j["worker_flags"] = p.worker_flags;
  return j;
}

}  // namespace moe::plan
