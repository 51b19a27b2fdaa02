// moectl inspect DIR: validates a Hugging Face MoE model directory and prints
// its summary; any invalid model is one line on stderr and exit code 1.
#include <cstdio>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "common/fp8.h"
#include "common/model_desc.h"
#include "common/quant.h"
#include "nlohmann/json.hpp"
#include "services/moectl/commands.h"
#include "services/moectl/flags.h"

namespace moe::moectl {
namespace {

std::string Human(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return absl::StrFormat("%.1f %s", v, units[u]);
}

// gate + up + down of one expert held as `format` (moe-cached
// --expert-format); -1 when a row is not whole blocks of it.
int64_t ExpertBytesAs(const ModelDescription& d, DType format) {
  int64_t total = 0;
  for (TensorRole r : {TensorRole::kExpertGate, TensorRole::kExpertUp,
                       TensorRole::kExpertDown}) {
    absl::StatusOr<TensorView> v = d.Expert(0, 0, r);
    if (!v.ok() || v->shape.size() != 2) return -1;
    const int64_t b = WeightBytes(format, v->shape[0], v->shape[1]);
    if (b < 0) return -1;
    total += b;
  }
  const ModelConfig& c = d.config();
  if (c.has_expert_biases()) {  // F32 biases travel in each block
    total += 4 * (2 * c.moe_intermediate_size + c.hidden_size);
  }
  return total;
}

// The held formats without --expert-format, in words: of the experts' views
// (GGUF blocks stay blocks, mixed types included).
std::string HeldByDefault(const ModelDescription& d) {
  const ModelConfig& c = d.config();
  if (c.num_moe_layers() == 0 || c.num_experts == 0) {
    return ExpertFormatName(DefaultHeldFormat(d.expert_dtype()));
  }
  std::vector<ExpertDTypes> held;
  for (int l = 0; l < c.num_moe_layers(); ++l) {
    DType t[3];
    const TensorRole roles[3] = {TensorRole::kExpertGate, TensorRole::kExpertUp,
                                 TensorRole::kExpertDown};
    for (int r = 0; r < 3; ++r) {
      auto v = d.Expert(l, 0, roles[r]);
      t[r] = v.ok() ? DefaultHeldFormat(*v) : DefaultHeldFormat(d.expert_dtype());
    }
    held.push_back({t[0], t[1], t[2]});
  }
  return ExpertFormatsName(held);
}

// "Q4_K" or, for mixed types, "mixed: Q4_K+Q6_K".
std::string StoredExpertTypes(const ModelDescription& d) {
  if (!d.mixed_expert_dtypes()) return std::string(DTypeName(d.expert_dtype()));
  return absl::StrCat("mixed: ", ExpertFormatsName(d.all_expert_dtypes()));
}

// A GGUF file's tensor types, counted: "Q4_K" -> {tensors, routed experts}.
std::map<std::string, std::pair<int, int>> GgufTypeCounts(const ModelDescription& d) {
  std::map<std::string, std::pair<int, int>> out;
  const GgufCheckpoint* g = d.checkpoint().gguf();
  if (g == nullptr) return out;
  for (const GgufTensorInfo& t : g->tensors()) {
    auto& [all, experts] = out[GgufTypeName(static_cast<uint32_t>(t.type))];
    ++all;
    if (absl::StrContains(t.name, "_exps.")) ++experts;
  }
  return out;
}

void PrintGgufTypes(const ModelDescription& d) {
  for (const auto& [type, counts] : GgufTypeCounts(d)) {
    const bool plain = type == "F32" || type == "F16" || type == "BF16";
    std::string what;
    if (counts.second > 0) {
      absl::StrAppend(&what, counts.second, " routed-expert",
                      plain || type == "MXFP4" ? "" : ", kept as blocks",
                      type == "MXFP4" ? ", repacked to our MXFP4 blocks (lossless)" : "");
    }
    if (counts.first > counts.second) {
      absl::StrAppend(&what, what.empty() ? "" : "; ", counts.first - counts.second, " other",
                      plain ? ""
                            : ", as blocks where a CPU MatMul reads them (attention, "
                              "lm head, router), else decoded to F32 at load");
    }
    std::printf("gguf tensors %s: %d (%s)\n", type.c_str(), counts.first, what.c_str());
  }
}

void PrintSinksAndClampedExperts(const ModelConfig& c) {
  int sliding = 0;
  for (bool s : c.sliding_layers) sliding += s ? 1 : 0;
  std::printf(
      "attention: learned sinks, q/k/v/o biases, sliding window %lld on %d of "
      "%lld layers%s\n",
      static_cast<long long>(c.sliding_window), sliding,
      static_cast<long long>(c.num_hidden_layers),
      c.yarn ? absl::StrCat(", yarn factor ", c.yarn->factor, " over ",
                            c.yarn->original_max_position_embeddings,
                            c.yarn->truncate ? " (truncated)" : "")
                   .c_str()
             : "");
  std::printf(
      "experts: biased clamped SwiGLU (limit %g, alpha %g), router with "
      "bias, softmax over the top-k%s\n",
      c.swiglu_limit, c.swiglu_alpha,
      c.mxfp4 ? "; stored as MXFP4 (_blocks + _scales)" : "");
}

const char* TopkMethodName(TopkMethod m) {
  switch (m) {
    case TopkMethod::kGreedy:
      return "greedy";
    case TopkMethod::kGroupLimitedGreedy:
      return "group_limited_greedy";
    case TopkMethod::kNoauxTc:
      return "noaux_tc";
  }
  return "?";
}

// Bytes of latent cache per token per layer (f32 c_kv and k_pe).
int64_t LatentBytesPerToken(const ModelConfig& c) {
  return 4 * (c.mla.kv_lora_rank + c.mla.qk_rope_head_dim);
}

void PrintLatentAttention(const ModelConfig& c) {
  const MlaConfig& m = c.mla;
  std::printf(
      "attention: MLA, q_lora_rank %lld, kv_lora_rank %lld, qk nope/rope "
      "%lld/%lld, v %lld%s\n",
      static_cast<long long>(m.q_lora_rank),
      static_cast<long long>(m.kv_lora_rank),
      static_cast<long long>(m.qk_nope_head_dim),
      static_cast<long long>(m.qk_rope_head_dim),
      static_cast<long long>(m.v_head_dim),
      c.yarn ? absl::StrCat(", yarn factor ", c.yarn->factor).c_str() : "");
  std::printf("latent cache: %lld bytes per token per layer (f32)\n",
              static_cast<long long>(LatentBytesPerToken(c)));
}

void PrintScoredRouter(const ModelConfig& c) {
  std::printf(
      "routing: %s, %s, n_group %lld, topk_group %lld, "
      "routed_scaling_factor %g\n",
      c.scoring_func == ScoringFunc::kSigmoid ? "sigmoid" : "softmax",
      TopkMethodName(c.topk_method), static_cast<long long>(c.n_group),
      static_cast<long long>(c.topk_group), c.routed_scaling_factor);
  std::printf("shared experts: %lld of width %lld; dense layers: %lld\n",
              static_cast<long long>(c.n_shared_experts),
              static_cast<long long>(c.moe_intermediate_size),
              static_cast<long long>(c.num_hidden_layers -
                                     c.num_moe_layers()));
}

void PrintText(const std::string& dir, const ModelDescription& d) {
  const ModelConfig& c = d.config();
  const char* qk = c.qk_norm == QkNorm::kPerHead ? "per-head"
                   : c.qk_norm == QkNorm::kFull  ? "whole projection"
                                                 : "none";
  std::printf("model: %s\n", dir.c_str());
  std::printf("family: %s\n", std::string(ModelFamilyName(c.family)).c_str());
  std::printf("layers: %lld\n", static_cast<long long>(c.num_hidden_layers));
  std::printf("moe layers: %d\n", c.num_moe_layers());
  std::printf("experts: %lld\n", static_cast<long long>(c.num_experts));
  std::printf("top-k: %lld\n", static_cast<long long>(c.top_k));
  std::printf("norm top-k prob: %s\n", c.norm_topk_prob ? "yes" : "no");
  std::printf("hidden: %lld, heads: %lld, kv heads: %lld, head dim: %lld\n",
              static_cast<long long>(c.hidden_size),
              static_cast<long long>(c.num_attention_heads),
              static_cast<long long>(c.num_key_value_heads),
              static_cast<long long>(c.head_dim));
  std::printf(
      "expert width: %lld, vocab: %lld, qk norm: %s, qkv bias: %s, shared "
      "expert: %s\n",
      static_cast<long long>(c.moe_intermediate_size),
      static_cast<long long>(c.vocab_size), qk, c.qkv_bias ? "yes" : "no",
      c.has_shared_expert() ? "yes" : "no");
  if (c.has_partial_rotary()) {
    std::printf("rotary: first %lld of %lld values per head\n",
                static_cast<long long>(c.rotary_dim),
                static_cast<long long>(c.head_dim));
  }
  if (c.is_mla()) PrintLatentAttention(c);
  if (c.has_scored_router()) PrintScoredRouter(c);
  if (c.has_attention_sinks()) PrintSinksAndClampedExperts(c);
  std::printf("expert dtype: %s\n", StoredExpertTypes(d).c_str());
  if (d.mixed_expert_dtypes()) {
    // One line per run of layers of the same types.
    const std::vector<ExpertDTypes>& t = d.all_expert_dtypes();
    for (size_t a = 0; a < t.size();) {
      size_t b = a;
      while (b + 1 < t.size() && t[b + 1] == t[a]) ++b;
      std::printf("  MoE layers %zu-%zu: gate %s, up %s, down %s, %llu bytes per expert\n", a, b,
                  std::string(DTypeName(t[a].gate)).c_str(),
                  std::string(DTypeName(t[a].up)).c_str(),
                  std::string(DTypeName(t[a].down)).c_str(),
                  static_cast<unsigned long long>(d.expert_bytes(static_cast<int>(a))));
      a = b + 1;
    }
  }
  if (c.fp8) {
    std::printf("fp8 block scales: %lld x %lld weights per scale\n",
                static_cast<long long>(c.fp8->block_rows),
                static_cast<long long>(c.fp8->block_cols));
  }
  PrintGgufTypes(d);
  std::printf("experts held as (no --expert-format): %s\n", HeldByDefault(d).c_str());
  std::printf("bytes per expert: %llu (%s)%s\n",
              static_cast<unsigned long long>(d.bytes_per_expert()),
              Human(d.bytes_per_expert()).c_str(),
              d.mixed_expert_dtypes() ? ", the largest layer's" : "");
  for (DType f : {DType::kBF16, DType::kQ8, DType::kQ4, DType::kMxfp4}) {
    // Held as stored, except that MXFP4 blocks are repacked and expert
    // biases widened to F32.
    if (f == d.expert_dtype() && f != DType::kMxfp4 && !d.mixed_expert_dtypes()) continue;
    const int64_t b = ExpertBytesAs(d, f);
    if (b < 0) {
      std::printf("bytes per expert as %s: n/a (rows are not whole blocks)\n",
                  ExpertFormatName(f).c_str());
    } else {
      const double stored = static_cast<double>(d.bytes_per_expert());
      const bool more = static_cast<double>(b) > stored;
      std::printf("bytes per expert as %s: %lld (%s, %.2fx %s)\n",
                  ExpertFormatName(f).c_str(), static_cast<long long>(b),
                  Human(static_cast<uint64_t>(b)).c_str(),
                  b > 0 && stored > 0 ? (more ? double(b) / stored : stored / double(b)) : 0.0,
                  more ? "more" : "fewer");
    }
  }
  std::printf("dense bytes: %llu (%s)\n",
              static_cast<unsigned long long>(d.dense_bytes()),
              Human(d.dense_bytes()).c_str());
  std::printf("total bytes: %llu (%s)\n",
              static_cast<unsigned long long>(d.total_bytes()),
              Human(d.total_bytes()).c_str());
  std::printf("files: %zu\n", d.checkpoint().file_count());
}

void PrintJson(const std::string& dir, const ModelDescription& d) {
  const ModelConfig& c = d.config();
  nlohmann::ordered_json j;
  j["model"] = dir;
  j["family"] = std::string(ModelFamilyName(c.family));
  j["layers"] = c.num_hidden_layers;
  j["moe_layers"] = c.num_moe_layers();
  j["experts"] = c.num_experts;
  j["top_k"] = c.top_k;
  j["hidden_size"] = c.hidden_size;
  j["expert_dtype"] = std::string(DTypeName(d.expert_dtype()));  // the widest when mixed
  j["expert_dtypes_mixed"] = d.mixed_expert_dtypes();
  if (d.mixed_expert_dtypes()) {
    for (const ExpertDTypes& t : d.all_expert_dtypes()) {
      j["expert_dtypes"].push_back({std::string(DTypeName(t.gate)), std::string(DTypeName(t.up)),
                                    std::string(DTypeName(t.down))});
    }
  }
  j["bytes_per_expert"] = d.bytes_per_expert();
  if (c.fp8) j["fp8_block_size"] = {c.fp8->block_rows, c.fp8->block_cols};
  j["expert_held_format"] = HeldByDefault(d);
  for (const auto& [type, counts] : GgufTypeCounts(d)) {
    j["gguf_tensor_types"][type] = {{"tensors", counts.first}, {"experts", counts.second}};
  }
  j["bytes_per_expert_bf16"] = ExpertBytesAs(d, DType::kBF16);
  j["bytes_per_expert_q8"] = ExpertBytesAs(d, DType::kQ8);
  j["bytes_per_expert_q4"] = ExpertBytesAs(d, DType::kQ4);
  j["bytes_per_expert_mxfp4"] = ExpertBytesAs(d, DType::kMxfp4);
  j["dense_bytes"] = d.dense_bytes();
  j["total_bytes"] = d.total_bytes();
  j["files"] = d.checkpoint().file_count();
  if (c.is_mla()) {
    j["kv_lora_rank"] = c.mla.kv_lora_rank;
    j["qk_rope_head_dim"] = c.mla.qk_rope_head_dim;
    j["latent_bytes_per_token_per_layer"] = LatentBytesPerToken(c);
  }
  if (c.has_partial_rotary()) j["rotary_dim"] = c.rotary_dim;
  if (c.has_scored_router()) {
    j["topk_method"] = TopkMethodName(c.topk_method);
    j["n_shared_experts"] = c.n_shared_experts;
  }
  std::printf("%s\n", j.dump().c_str());
}

int RunInspect(const Args& args) {
  FlagSet flags("inspect", "DIR [--json]");
  flags.Bool("json", false, "print one JSON object instead of text");
  absl::Status parsed = flags.Parse(args);
  if (flags.help()) {
    std::fputs(flags.Usage().c_str(), stdout);
    return 0;
  }
  if (parsed.ok() && flags.positional().size() != 1) {
    parsed = absl::InvalidArgumentError("expects exactly one model directory");
  }
  if (!parsed.ok()) {
    std::fprintf(stderr, "moectl inspect: %s\n",
                 std::string(parsed.message()).c_str());
    return 2;
  }
  const std::string& dir = flags.positional()[0];
  auto desc = ModelDescription::Open(dir);
  if (!desc.ok()) {
    std::string msg =
        absl::StrReplaceAll(desc.status().message(), {{"\n", " "}});
    std::fprintf(stderr, "moectl inspect: %s\n", msg.c_str());
    return 1;
  }
  if (flags.GetBool("json")) {
    PrintJson(dir, *desc);
  } else {
    PrintText(dir, *desc);
  }
  return 0;
}

const bool kRegistered = RegisterCommand(
    {"inspect", "validate a model directory and print its summary",
     &RunInspect});

}  // namespace
}  // namespace moe::moectl
