// moectl make-model: writes a Hugging Face-layout MoE checkpoint with random
// weights (see common/model_maker.h).
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/fp8.h"
#include "common/model_desc.h"
#include "common/model_maker.h"
#include "common/model_maker_gguf.h"
#include "common/model_presets.h"
#include "common/status_macros.h"
#include "services/moectl/commands.h"
#include "services/moectl/flags.h"

namespace moe::moectl {
namespace {

// "model family (config.json model_type): mixtral, ..." from the table.
std::string FamilyFlagHelp() {
  std::string names;
  for (const FamilyTraits& f : AllFamilies()) {
    absl::StrAppend(&names, names.empty() ? "" : ", ", f.model_type);
  }
  return absl::StrCat("model family (config.json model_type): ", names,
                      " (those with routing groups or sinks start from tiny)");
}

void DeclareFlags(FlagSet& f) {
  f.String("arch", "mixtral",
           FamilyFlagHelp());
  f.String("out", "", "output directory (created if missing; required)");
  f.Bool("force", false, "write into a non-empty --out directory");
  f.String("preset", "",
           absl::StrCat("start from a preset: ", PresetNames(),
                        " (the *-2l presets: a published model's shape at 2 "
                        "layers, to size a cache without a download)"));
  f.Int("layers", 0, "decoder layers");
  f.Int("hidden", 0, "hidden size");
  f.Int("heads", 0, "attention heads");
  f.Int("kv-heads", 0, "key/value heads (GQA when fewer than heads)");
  f.Int("head-dim", 0, "head dimension (default hidden/heads)");
  f.Int("experts", 0, "experts per MoE layer");
  f.Int("top-k", 0, "experts per token");
  f.Int("intermediate", 0, "dense MLP width (mixtral/olmoe: expert width)");
  f.Int("moe-intermediate", 0, "expert width");
  f.Int("shared-intermediate", 0, "qwen2_moe shared expert width");
  f.Int("vocab", 0, "vocabulary size (>= 259)");
  f.Int("seed", 0, "random seed");
  f.String("dtype", "bf16", "weight dtype: bf16, f16 or f32");
  f.Int("shards", 1, "number of safetensors files (> 1 writes an index)");
  f.String("expert-format", "bf16",
           "bf16 (weights as --dtype); fp8: F8_E4M3 Linear weights with "
           "block scales, as the DeepSeek-V3 / Qwen3 FP8 releases; mxfp4 "
           "(gpt_oss): experts as MXFP4 _blocks + _scales, as the gpt-oss "
           "releases (q8 and q4 "
           "have no published safetensors layout: moe-cached --expert-format "
           "converts at load)");
  f.String("gguf", "",
           absl::StrCat("write the model as one GGUF v3 file of this type, "
                        "--out/model-<type>.gguf, in llama.cpp's layout, instead of the "
                        "folder (the same seed and weights, through --dtype): ",
                        GgufFileTypeNames(),
                        " (quantized: experts and matrices, norms/biases/routers F32; "
                        "q4_k_m: Q6_K for ffn_down*, attn_v, output; mxfp4: gpt_oss "
                        "experts; docs/operations.md)"));
  f.Int("fp8-block", 128,
        "fp8: weights per scale along each dimension (published: 128)");
  f.Bool("norm-topk-prob", false,
         "renormalise the top-k weights (qwen, olmoe)");
  f.Int("decoder-sparse-step", 1, "qwen: every n-th layer is MoE");
  f.String("mlp-only-layers", "", "qwen: comma-separated dense layers");
  f.Bool("qkv-bias", false, "biases on q/k/v (qwen2_moe default true)");
  f.Double("clip-qkv", 0, "olmoe: clamp q/k/v to [-c, c]");
  f.Bool("tie-word-embeddings", false, "share embedding and lm_head");
  f.Int("q-lora-rank", 0, "deepseek: q_lora_rank (0: plain q_proj)");
  f.Int("kv-lora-rank", 0, "deepseek: kv_lora_rank (latent width)");
  f.Int("qk-nope-head-dim", 0, "deepseek: qk_nope_head_dim");
  f.Int("qk-rope-head-dim", 0, "deepseek: qk_rope_head_dim (even)");
  f.Int("v-head-dim", 0, "deepseek: v_head_dim");
  f.Int("n-shared-experts", 0, "deepseek: shared experts (0: none)");
  f.Int("first-k-dense-replace", 0, "deepseek: leading dense layers");
  f.Int("moe-layer-freq", 1, "deepseek: every n-th layer (from the first) is MoE");
  f.String("topk-method", "",
           "deepseek_v2: greedy or group_limited_greedy (v3: noaux_tc)");
  f.Int("n-group", 1, "deepseek: expert groups");
  f.Int("topk-group", 1, "deepseek: groups kept per token");
  f.Double("routed-scaling-factor", 1.0, "deepseek: routed_scaling_factor");
  f.Double("yarn-factor", 0, "deepseek: rope_scaling yarn factor (0: none)");
  f.Int("yarn-original-max-position", 4096,
        "deepseek: rope_scaling original_max_position_embeddings");
}

// The deepseek_v2/v3 flags.
absl::Status DeepseekFromFlags(const FlagSet& f, MakeModelOptions& o) {
  struct IntFlag {
    const char* name;
    int64_t* field;
  };
  for (const IntFlag& i :
       {IntFlag{"q-lora-rank", &o.mla.q_lora_rank},
        {"kv-lora-rank", &o.mla.kv_lora_rank},
        {"qk-nope-head-dim", &o.mla.qk_nope_head_dim},
        {"qk-rope-head-dim", &o.mla.qk_rope_head_dim},
        {"v-head-dim", &o.mla.v_head_dim},
        {"n-shared-experts", &o.n_shared_experts},
        {"first-k-dense-replace", &o.first_k_dense_replace},
        {"moe-layer-freq", &o.moe_layer_freq},
        {"n-group", &o.n_group},
        {"topk-group", &o.topk_group}}) {
    if (f.IsSet(i.name)) *i.field = f.GetInt(i.name);
  }
  if (f.IsSet("routed-scaling-factor")) {
    o.routed_scaling_factor = f.GetDouble("routed-scaling-factor");
  }
  if (f.IsSet("topk-method")) {
    const std::string& m = f.GetString("topk-method");
    if (m == "greedy") {
      o.topk_method = TopkMethod::kGreedy;
    } else if (m == "group_limited_greedy") {
      o.topk_method = TopkMethod::kGroupLimitedGreedy;
    } else if (m == "noaux_tc") {
      o.topk_method = TopkMethod::kNoauxTc;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "--topk-method must be greedy, group_limited_greedy or noaux_tc, "
          "got '", m, "'"));
    }
  }
  if (f.IsSet("yarn-factor")) {
    if (f.GetDouble("yarn-factor") == 0) {
      o.yarn.reset();
    } else {
      YarnConfig y = o.yarn.value_or(YarnConfig{});
      y.factor = f.GetDouble("yarn-factor");
      o.yarn = y;
    }
  }
  if (f.IsSet("yarn-original-max-position") && o.yarn.has_value()) {
    o.yarn->original_max_position_embeddings =
        f.GetInt("yarn-original-max-position");
  }
  return absl::OkStatus();
}

// --dtype and --expert-format (with --fp8-block) into `o`.
absl::Status FormatsFromFlags(const FlagSet& f, MakeModelOptions& o) {
  const std::string& dtype = f.GetString("dtype");
  if (dtype == "bf16") {
    o.dtype = DType::kBF16;
  } else if (dtype == "f16") {
    o.dtype = DType::kF16;
  } else if (dtype == "f32") {
    o.dtype = DType::kF32;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--dtype must be bf16, f16 or f32, got '", dtype, "'"));
  }
  const std::string& format = f.GetString("expert-format");
  if (format == "fp8") {
    o.fp8 = Fp8BlockScheme{f.GetInt("fp8-block"), f.GetInt("fp8-block")};
  } else if (format == "mxfp4") {
    o.mxfp4 = true;
  } else if (format == "q8" || format == "q4") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--expert-format ", format,
        ": there is no published safetensors layout for ", format,
        " checkpoints; write bf16 or fp8 and give moe-cached (or moectl run) "
        "--expert-format ",
        format, " to convert at load"));
  } else if (format == "bf16") {
    // Presets of MXFP4 families write MXFP4 unless bf16 is asked for.
    if (f.IsSet("expert-format")) o.mxfp4 = false;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--expert-format must be bf16, fp8 or mxfp4, got '", format, "'"));
  }
  return absl::OkStatus();
}

absl::StatusOr<MakeModelOptions> OptionsFromFlags(const FlagSet& f) {
  ASSIGN_OR_RETURN(ModelFamily family, ParseModelFamily(f.GetString("arch")));
  const std::string& preset = f.GetString("preset");
  MakeModelOptions o;
  o.arch = family;
  // Families whose config needs more than sizes start from their tiny
  // preset (router groups, latent attention, sinks, partial rotary).
  const FamilyTraits& traits = TraitsOf(family);
  if (preset.empty() &&
      (traits.router == RouterKind::kScoredGroups ||
       traits.activation == ExpertActivation::kClampedSwiglu)) {
    o = TinyPreset(family);
  }
  if (!preset.empty()) {
    std::optional<ModelFamily> given;
    if (f.IsSet("arch")) given = family;
    ASSIGN_OR_RETURN(o, PresetOptions(preset, given));
  }
  struct IntFlag {
    const char* name;
    int64_t* field;
  };
  for (const IntFlag& i : {IntFlag{"layers", &o.layers},
                           {"hidden", &o.hidden},
                           {"heads", &o.heads},
                           {"kv-heads", &o.kv_heads},
                           {"head-dim", &o.head_dim},
                           {"experts", &o.experts},
                           {"top-k", &o.top_k},
                           {"intermediate", &o.intermediate},
                           {"moe-intermediate", &o.moe_intermediate},
                           {"shared-intermediate", &o.shared_intermediate},
                           {"vocab", &o.vocab},
                           {"decoder-sparse-step", &o.decoder_sparse_step}}) {
    if (f.IsSet(i.name)) *i.field = f.GetInt(i.name);
  }
  if (f.IsSet("seed")) o.seed = static_cast<uint64_t>(f.GetInt("seed"));
  o.shards = static_cast<int>(f.GetInt("shards"));
  RETURN_IF_ERROR(FormatsFromFlags(f, o));
  if (f.IsSet("fp8-block") && !o.fp8) {
    return absl::InvalidArgumentError("--fp8-block applies to --expert-format fp8 only");
  }
  if (f.IsSet("mlp-only-layers")) {
    ASSIGN_OR_RETURN(o.mlp_only_layers,
                     ParseIntList(f.GetString("mlp-only-layers")));
  }
  if (f.IsSet("norm-topk-prob")) o.norm_topk_prob = f.GetBool("norm-topk-prob");
  if (f.IsSet("qkv-bias")) o.qkv_bias = f.GetBool("qkv-bias");
  if (f.IsSet("clip-qkv")) o.clip_qkv = f.GetDouble("clip-qkv");
  if (f.IsSet("tie-word-embeddings"))
    o.tie_word_embeddings = f.GetBool("tie-word-embeddings");
  RETURN_IF_ERROR(DeepseekFromFlags(f, o));
  return o;
}

// --gguf TYPE (nullopt without it), adjusting `o`: presets' MXFP4 experts
// become float experts for the other types unless --expert-format says
// mxfp4 (which MakeGgufModel refuses then); --gguf mxfp4 asks for them.
absl::StatusOr<std::optional<GgufFileType>> GgufFromFlags(const FlagSet& f,
                                                           MakeModelOptions& o) {
  if (!f.IsSet("gguf")) return std::nullopt;
  ASSIGN_OR_RETURN(GgufFileType type, ParseGgufFileType(f.GetString("gguf")));
  if (f.IsSet("shards")) {
    return absl::InvalidArgumentError("--shards applies to the folder; --gguf writes one file");
  }
  if (type == GgufFileType::kMxfp4) {
    o.mxfp4 = true;
  } else if (!f.IsSet("expert-format")) {
    o.mxfp4 = false;
  }
  return type;
}

// Writes the folder, or with --gguf the file `path`, and reads it back
// (the same checks `inspect` applies).
absl::StatusOr<ModelDescription> Write(const MakeModelOptions& o,
                                       const std::optional<GgufFileType>& gguf,
                                       const std::string& out, std::string* path) {
  *path = out;
  if (!gguf.has_value()) {
    RETURN_IF_ERROR(MakeModel(o, out));
    return ModelDescription::Open(out);
  }
  *path = JoinPath(out, GgufModelFileName(*gguf));
  RETURN_IF_ERROR(MakeGgufModel(o, *gguf, *path));
  return ModelDescription::Open(*path);
}

// INVALID_ARGUMENT when `out` is a directory with anything in it: writing
// there would mix a new model with what is there (or replace a real one).
absl::Status CheckOutEmpty(const std::string& out) {
  std::error_code ec;
  if (!std::filesystem::is_directory(out, ec)) return absl::OkStatus();
  if (std::filesystem::directory_iterator(out, ec) == std::filesystem::directory_iterator()) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--out ", out, " is not empty; give --force to write the model into it anyway "
      "(its checkpoint files are replaced), or choose an empty directory"));
}

int RunMakeModel(const Args& args) {
  FlagSet flags("make-model",
                "--out DIR [--force] [--arch A] [--preset P] [--gguf TYPE] [size flags]");
  DeclareFlags(flags);
  absl::Status parsed = flags.Parse(args);
  if (flags.help()) {
    std::fputs(flags.Usage().c_str(), stdout);
    return 0;
  }
  if (parsed.ok()) parsed = flags.Require("out");
  if (parsed.ok() && !flags.positional().empty()) {
    parsed = absl::InvalidArgumentError(
        absl::StrCat("unexpected argument '", flags.positional()[0], "'"));
  }
  if (!parsed.ok()) {
    std::fprintf(stderr, "moectl make-model: %s\n",
                 std::string(parsed.message()).c_str());
    return 2;
  }
  auto options = OptionsFromFlags(flags);
  const std::string& out = flags.GetString("out");
  absl::Status s = options.status();
  absl::StatusOr<std::optional<GgufFileType>> gguf = std::nullopt;
  if (s.ok()) gguf = GgufFromFlags(flags, *options);
  if (s.ok()) s = gguf.status();
  if (s.ok() && !flags.GetBool("force")) s = CheckOutEmpty(out);
  std::string path;
  absl::StatusOr<ModelDescription> desc = s.ok() ? Write(*options, *gguf, out, &path) : s;
  if (!desc.ok()) {
    std::fprintf(stderr, "moectl make-model: %s\n",
                 std::string(desc.status().message()).c_str());
    return 1;
  }
  const ModelConfig& c = desc->config();
  std::printf(
      "wrote %s: %s, %lld layers (%d MoE), %lld experts, top-%lld, %s, %llu "
      "bytes in %zu file(s)\n",
      path.c_str(), std::string(ModelFamilyName(c.family)).c_str(),
      static_cast<long long>(c.num_hidden_layers), c.num_moe_layers(),
      static_cast<long long>(c.num_experts), static_cast<long long>(c.top_k),
      std::string(DTypeName(desc->expert_dtype())).c_str(),
      static_cast<unsigned long long>(desc->total_bytes()),
      desc->checkpoint().gguf() != nullptr ? desc->checkpoint().gguf()->file_count()
                                           : desc->checkpoint().files().size());
  return 0;
}

const bool kRegistered = RegisterCommand(
    {"make-model",
     "write a random MoE model: a Hugging Face folder or (--gguf) one GGUF file",
     &RunMakeModel});

}  // namespace
}  // namespace moe::moectl
