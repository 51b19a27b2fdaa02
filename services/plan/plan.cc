#include "services/plan/plan.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/flags.h"
#include "common/fp8.h"
#include "common/model_desc.h"
#include "common/quant.h"
#include "common/status_macros.h"
#include "services/plan/predict.h"

namespace moe::plan {
namespace {

DType TorchDType(const std::string& name) {
  if (name == "float32") return DType::kF32;
  if (name == "float16") return DType::kF16;
  return DType::kBF16;
}

// Bytes per element of a non-expert matrix on the device: FP8 is widened to
// BF16 at load (MoeModel::Matrix).
// Bytes per dense weight on the device: FP8 becomes BF16; a GGUF file's
// block formats stay blocks (their bytes per weight).
double DenseElementBytes(DType stored) {
  if (stored == DType::kF8E4M3) return 2;
  return static_cast<double>(QuantBlockBytes(stored)) / static_cast<double>(QuantGroupSize(stored));
}

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// One expert's gate, up and down held as `format`, with F32 biases.
absl::StatusOr<int64_t> HeldExpertBytes(const ModelConfig& c, DType format) {
  const int64_t h = c.hidden_size, inter = c.moe_intermediate_size;
  const int64_t gate = WeightBytes(format, inter, h), down = WeightBytes(format, h, inter);
  if (gate < 0 || down < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--expert-format ", ExpertFormatName(format), ": the experts' rows (", h, " and ", inter,
        " weights) are not whole blocks of ", QuantGroupSize(format)));
  }
  int64_t bytes = 2 * gate + down;
  if (c.has_expert_biases()) bytes += 4 * (2 * inter + h);
  return bytes;
}

absl::Status ValidateOptions(const PlanOptions& o) {
  if (o.gpu_bytes < 0) return absl::InvalidArgumentError("--gpu-mem must be >= 0");
  if (o.host_bytes <= 0) return absl::InvalidArgumentError("--host-mem must be > 0");
  if (o.context <= 0) return absl::InvalidArgumentError("--context must be > 0");
  if (o.max_batch < 1) return absl::InvalidArgumentError("--max-batch must be >= 1");
  for (double v : {o.link_gbps, o.host_gbps, o.device_gbps, o.device_gflops}) {
    if (!(v > 0) || !std::isfinite(v)) {
      return absl::InvalidArgumentError("bandwidths and FLOP rates must be > 0");
    }
  }
  if (!(o.host_gflops >= 0) || !std::isfinite(o.host_gflops)) {
    return absl::InvalidArgumentError("--host-gflops must be >= 0");
  }
  return absl::OkStatus();
}

// The memory side of a plan: slots, miss mode, fits and why not.
Plan PlanMemory(const ModelFigures& m, const PlanOptions& o) {
  Plan p;
  p.model = m;
  p.options = o;
  p.context = m.max_context > 0 ? std::min(o.context, m.max_context) : o.context;
  p.kv_bytes = m.kv_bytes_per_token * p.context * o.max_batch;
  const bool gpu = o.gpu_bytes > 0;
  const int64_t budget = gpu ? o.gpu_bytes : o.host_bytes;
  const int64_t all_experts = m.all_expert_bytes;
  p.device_reserve = budget * kDeviceReservePercent / 100;
  p.device_needed = m.dense_bytes_device + p.kv_bytes + p.device_reserve;
  // moe-cached caches what does not fit where the worker computes; when
  // every expert fits there (always without a GPU: the host is that
  // device), the worker holds them itself and no acquire crosses processes.
  const bool gpu_holds_all = gpu && p.device_needed + all_experts <= o.gpu_bytes;
  p.daemon = o.daemon.value_or(gpu && !gpu_holds_all);
  if (!p.daemon) {
    // The worker alone: every expert in its memory, once (--cache none); a
    // GPU worker converts them on the host first (counted, a bound).
    p.host_bytes = all_experts + (gpu ? 0 : p.device_needed);
    p.cache_slots = m.experts_total;
  } else if (gpu) {
    p.host_bytes = all_experts;
    const int64_t free = std::max<int64_t>(0, o.gpu_bytes - p.device_needed);
    p.cache_slots = std::min(m.experts_total, free / m.expert_bytes);
  } else {
    // The host computes: it holds the store, the dense weights and the KV.
    // When it can hold every expert twice, the arena takes them all (a
    // resident expert runs faster than a host run through the daemon's
    // copy: 0.24-0.26 against 0.28-0.30 ms per kjv-moe token,
    // docs/benchmarks.md); else an arena of one layer at most, and misses
    // run where the experts are.
    p.host_bytes = all_experts + p.device_needed;
    const int64_t free = std::max<int64_t>(0, o.host_bytes - p.host_bytes);
    p.cache_slots = free >= all_experts ? m.experts_total
                                        : std::min(m.experts_per_layer, free / m.expert_bytes);
    p.host_bytes += p.cache_slots * m.expert_bytes;
  }
  p.cache_fraction = static_cast<double>(p.cache_slots) / static_cast<double>(m.experts_total);
  if (o.miss_mode.has_value()) {
    p.miss_mode = *o.miss_mode;
  } else if (p.cache_slots == m.experts_total) {
    p.miss_mode = MissMode::kFetch;
  } else if (!gpu) {
    p.miss_mode = MissMode::kHost;
  } else {
    p.miss_mode = p.cache_slots >= m.experts_per_layer ? MissMode::kAuto : MissMode::kHost;
  }
  if (gpu && !p.daemon && !gpu_holds_all) {
    p.problems.push_back(absl::StrCat(
        "a worker alone (--daemon off) holds every expert on the GPU: ",
        HumanBytes(all_experts), " of experts + dense weights, KV cache and reserve ",
        HumanBytes(p.device_needed), " exceed the GPU's ", HumanBytes(o.gpu_bytes),
        " (with moe-cached it caches what fits)"));
  } else if (gpu && p.device_needed > o.gpu_bytes) {
    p.problems.push_back(absl::StrCat(
        "dense weights ", HumanBytes(m.dense_bytes_device), " + KV cache ",
        HumanBytes(p.kv_bytes), " + reserve ", HumanBytes(p.device_reserve),
        " exceed the GPU's ", HumanBytes(o.gpu_bytes)));
  }
  if (p.host_bytes > o.host_bytes) {
    p.problems.push_back(absl::StrCat(gpu ? "every expert"
                                          : "every expert, the dense weights and the KV cache",
                                      " (", HumanBytes(p.host_bytes),
                                      ") exceed host memory ", HumanBytes(o.host_bytes)));
  }
  if (p.miss_mode == MissMode::kFetch && p.cache_slots < m.experts_per_layer) {
    p.problems.push_back(absl::StrCat("--miss-mode fetch needs one layer's ", m.experts_per_layer,
                                      " slots; ", p.cache_slots, " fit"));
  }
  p.fits = p.problems.empty();
  return p;
}

// What would fit instead, tried one change at a time.
std::vector<std::string> Suggestions(const ModelConfig& c, const StoredFormats& stored,
                                     const Plan& p) {
  std::vector<std::string> out;
  const PlanOptions& o = p.options;
  for (DType f : {DType::kQ8, DType::kQ4}) {
    absl::StatusOr<ModelFigures> m = ComputeFigures(c, stored, f);
    if (!m.ok() || m->expert_bytes >= p.model.expert_bytes) continue;
    PlanOptions alt = o;
    alt.expert_format = f;
    const Plan q = PlanMemory(*m, alt);
    if (q.fits) {
      out.push_back(absl::StrCat("--expert-format ", ExpertFormatName(f), ": ",
                                 HumanBytes(m->expert_bytes), " per expert, ", q.cache_slots,
                                 " slots, host ", HumanBytes(q.host_bytes)));
      break;
    }
  }
  for (int64_t ctx = p.context / 2; ctx >= 256; ctx /= 2) {
    PlanOptions alt = o;
    alt.context = ctx;
    if (PlanMemory(p.model, alt).fits) {
      out.push_back(absl::StrCat("--context ", ctx));
      break;
    }
  }
  if (o.max_batch > 1) {
    PlanOptions alt = o;
    alt.max_batch = 1;
    if (PlanMemory(p.model, alt).fits) out.push_back("--max-batch 1");
  }
  if (p.daemon && p.miss_mode != MissMode::kHost) {
    PlanOptions alt = o;
    alt.miss_mode = MissMode::kHost;
    const Plan q = PlanMemory(p.model, alt);
    if (q.fits) {
      out.push_back(absl::StrCat("--miss-mode host: host-only experts (", q.cache_slots,
                                 " slots; misses run on the CPU from host memory)"));
    }
  }
  if (out.empty()) {
    absl::StatusOr<ModelFigures> q4 = ComputeFigures(c, stored, DType::kQ4);
    const ModelFigures& m = q4.ok() ? *q4 : p.model;
    PlanOptions alt = o;
    alt.context = std::min<int64_t>(p.context, 4096);
    alt.max_batch = 1;
    if (p.daemon) alt.miss_mode = MissMode::kHost;
    const Plan q = PlanMemory(m, alt);
    out.push_back(absl::StrCat("nothing smaller fits: at ", m.held_name,
                               ", context ", alt.context,
                               p.daemon ? ", host-only experts" : "", " it needs ",
                               o.gpu_bytes > 0 ? absl::StrCat(HumanBytes(q.device_needed),
                                                              " of GPU and ")
                                               : "",
                               HumanBytes(q.host_bytes), " of host memory"));
  }
  return out;
}

void AddFlags(Plan& p) {
  const PlanOptions& o = p.options;
  const std::string device = o.gpu_bytes > 0 ? "cuda" : "cpu";
  std::vector<std::string>& w = p.worker_flags;
  w = {"--model", o.model_dir, "--device", device, "--cache",
       p.daemon ? o.daemon_socket : std::string("none")};
  // The held format is whoever holds the experts' flag.
  std::vector<std::string>& holder = p.daemon ? p.daemon_flags : w;
  if (p.daemon) {
    p.daemon_flags = {"--model", o.model_dir, "--device", device, "--cache-experts",
                      absl::StrCat(p.cache_slots)};
  }
  if (o.expert_format.has_value()) {
    holder.insert(holder.end(), {"--expert-format", ExpertFormatName(*o.expert_format)});
  }
  // The KV the plan reserved bounds the worker's (auto) batching too.
  if (o.max_batch > 1) w.insert(w.end(), {"--max-batch", absl::StrCat(o.max_batch)});
  w.insert(w.end(), {"--kv-budget-mb", flags::FormatSize(p.kv_bytes)});
  if (!p.daemon) return;
  std::vector<std::string>& d = p.daemon_flags;
  d.insert(d.end(), {"--miss-mode", MissModeName(p.miss_mode)});
  if (o.gpu_bytes > 0) d.insert(d.end(), {"--link-gbps", absl::StrCat(o.link_gbps)});
  if (p.miss_mode != MissMode::kFetch) {
    d.insert(d.end(), {"--host-gbps", absl::StrCat(o.host_gbps)});
  }
  if (o.daemon_socket != "unix:/tmp/moe-cached.sock") d.insert(d.end(), {"--listen", o.daemon_socket});
  if (o.gpu_bytes > 0 && p.miss_mode != MissMode::kFetch) {
    w.insert(w.end(), {"--device-host-experts", "on"});
  }
}

}  // namespace

StoredFormats StoredFormatsFromConfig(const ModelConfig& c) {
  StoredFormats s;
  s.dense = TorchDType(c.torch_dtype);
  s.experts = s.dense;
  if (c.fp8.has_value()) s.experts = s.dense = DType::kF8E4M3;
  if (c.mxfp4.has_value()) s.experts = DType::kMxfp4;
  return s;
}

StoredFormats StoredFormatsFromWeights(const ModelDescription& d) {
  StoredFormats s = StoredFormatsFromConfig(d.config());
  s.experts = d.expert_dtype();
  if (absl::StatusOr<TensorView> embed = d.Dense(TensorRole::kEmbed, -1); embed.ok()) {
    s.dense = embed->dtype;
  }
  if (d.checkpoint().gguf() != nullptr) {  // GGUF experts are held as they are
    s.held_name = ExpertFormatsName(d.all_expert_dtypes());
    s.held_expert_bytes = static_cast<int64_t>(d.bytes_per_expert());
    s.held_all_expert_bytes = static_cast<int64_t>(d.routed_expert_bytes());
  }
  return s;
}

absl::StatusOr<ModelFigures> ComputeFigures(const ModelConfig& c, const StoredFormats& stored,
                                            std::optional<DType> format) {
  ModelFigures m;
  m.stored = stored;
  m.num_moe_layers = c.num_moe_layers();
  m.experts_per_layer = c.num_experts;
  m.top_k = c.top_k;
  m.experts_total = int64_t{m.num_moe_layers} * c.num_experts;
  const double dense_element = DenseElementBytes(stored.dense);
  // Vectors (norms, biases) are F32 in a GGUF file, and widened to F32 here.
  const double vector_element = IsQuantDType(stored.dense) ? 4 : dense_element;
  double dense_bytes = 0;
  for (const TensorSpec& s : ExpectedTensors(c)) {
    if (IsExpertRole(s.role)) continue;  // RoutedExpertParams
    const int64_t n = Numel(s.shape);
    m.params_dense += n;
    dense_bytes += static_cast<double>(n) *
                   (s.shape.size() >= 2 ? dense_element : vector_element + 4);
  }
  m.dense_bytes_device = static_cast<int64_t>(std::ceil(dense_bytes));
  m.expert_params = RoutedExpertParams(c);
  m.params_total = m.params_dense + m.expert_params * m.experts_total;
  m.params_active = m.params_dense + int64_t{m.num_moe_layers} * m.top_k * m.expert_params;
  m.held_format = format.value_or(DefaultHeldFormat(stored.experts));
  m.held_name = ExpertFormatName(m.held_format);
  if (!format.has_value() && stored.held_expert_bytes > 0) {
    m.held_format = stored.experts;  // a GGUF file's MXFP4 blocks stay MXFP4
    m.held_name = stored.held_name;
    m.expert_bytes = stored.held_expert_bytes;
    m.all_expert_bytes = stored.held_all_expert_bytes;
  } else {
    ASSIGN_OR_RETURN(m.expert_bytes, HeldExpertBytes(c, m.held_format));
    m.all_expert_bytes = m.experts_total * m.expert_bytes;
  }
  const int64_t widths = c.is_mla() ? c.mla.kv_lora_rank + c.mla.qk_rope_head_dim
                                    : 2 * c.num_key_value_heads * c.head_dim;
  m.kv_bytes_per_token = c.num_hidden_layers * 4 * widths;
  // MoeModel::max_context: a session holds at most this many positions.
  m.max_context = c.max_position_embeddings > 0 ? c.max_position_embeddings : int64_t{1} << 20;
  if (c.sliding_window > 0 && !c.has_attention_sinks()) {
    m.max_context = std::min(m.max_context, c.sliding_window);
  }
  return m;
}

absl::StatusOr<Plan> MakePlan(const ModelConfig& config, const StoredFormats& stored,
                              const PlanOptions& options) {
  RETURN_IF_ERROR(ValidateOptions(options));
  ASSIGN_OR_RETURN(ModelFigures m, ComputeFigures(config, stored, options.expert_format));
  Plan p = PlanMemory(m, options);
  if (options.miss_mode.has_value() && !p.daemon) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--miss-mode is moe-cached's, and the plan starts none (",
        options.gpu_bytes > 0 ? "every expert fits the GPU" : "without a GPU",
        ": the worker holds them all): add --daemon on to plan one"));
  }
  if (!p.fits) p.suggestions = Suggestions(config, stored, p);
  ASSIGN_OR_RETURN(Rates r, PredictRates(config, p));
  p.layer_ms = r.layer_ms;
  p.predicted_decode_tokens_per_s = r.decode_tokens_per_s;
  p.predicted_prefill_tokens_per_s = r.prefill_tokens_per_s;
  AddFlags(p);
  return p;
}

double DeviceReadGbps(const PlanOptions& o) {
  if (o.gpu_bytes > 0) return o.device_gbps;
  return o.cpu_engine_gbps > 0 ? o.cpu_engine_gbps : o.host_gbps;
}

std::string HumanBytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (std::fabs(v) >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? absl::StrCat(bytes, " B") : absl::StrFormat("%.1f %s", v, units[u]);
}

std::string ShellLine(const std::string& program, const std::vector<std::string>& args) {
  std::string line = program;
  for (const std::string& a : args) {
    const bool plain = !a.empty() && a.find_first_not_of(
                                         "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                         "0123456789-_./:=,+@") == std::string::npos;
    absl::StrAppend(&line, " ", plain ? a : absl::StrCat("'", a, "'"));
  }
  return line;
}

}  // namespace moe::plan
