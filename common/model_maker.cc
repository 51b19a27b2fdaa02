#include "common/model_maker.h"

#include <cmath>
#include <filesystem>
#include <regex>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/file_util.h"
#include "common/fp8.h"
#include "common/logging.h"
#include "common/model_desc.h"
#include "common/mxfp4.h"
#include "common/safetensors.h"
#include "common/splitmix64.h"
#include "common/status_macros.h"
#include "common/tiny_tokenizer.h"
#include "nlohmann/json.hpp"

namespace moe {
namespace {

// splitmix64: tiny, fast, and identical on every platform (std::normal_
// distribution is not), which keeps generated files reproducible.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() { return SplitMix64(state_); }
  // Uniform in (0, 1].
  double Uniform() {
    return (static_cast<double>(Next() >> 11) + 1.0) * 0x1.0p-53;
  }
  // Standard normal (Box-Muller).
  double Normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double r = std::sqrt(-2.0 * std::log(Uniform()));
    double theta = 2.0 * M_PI * Uniform();
    spare_ = r * std::sin(theta);
    has_spare_ = true;
    return r * std::cos(theta);
  }

 private:
  uint64_t state_;
  bool has_spare_ = false;
  double spare_ = 0;
};

uint64_t TensorSeed(uint64_t seed, const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
  return Rng(seed ^ h).Next();
}

bool IsNorm(TensorRole r) {
  return r == TensorRole::kFinalNorm || r == TensorRole::kInputNorm ||
         r == TensorRole::kPostAttnNorm || r == TensorRole::kQNorm ||
         r == TensorRole::kKNorm || r == TensorRole::kQANorm ||
         r == TensorRole::kKvANorm;
}

bool IsBias(TensorRole r) {
  return r == TensorRole::kQBias || r == TensorRole::kKBias ||
         r == TensorRole::kVBias || r == TensorRole::kOBias ||
         r == TensorRole::kScoreBias || r == TensorRole::kRouterBias ||
         r == TensorRole::kExpertGateBias || r == TensorRole::kExpertDownBias;
}

std::vector<float> TensorValues(const TensorSpec& spec, const ModelConfig& c,
                                uint64_t seed) {
  int64_t n = 1;
  for (int64_t d : spec.shape) n *= d;
  double mean = 0, stddev;
  if (IsNorm(spec.role)) {
    mean = 1.0;
    stddev = 0.05;
  } else if (spec.role == TensorRole::kSinks) {
    stddev = 1.0;  // logits of the size of the attention scores
  } else if (spec.fused && spec.dtype == DType::kU8) {
    // An MXFP4 weight as AddMxfp4 asks: [E, out, in].
    stddev = 1.0 / std::sqrt(static_cast<double>(spec.shape[2]));
  } else if (IsBias(spec.role)) {
    stddev = 0.1;
  } else if (spec.role == TensorRole::kEmbed) {
    // Tied embeddings double as lm_head: keep logits O(1) then.
    stddev = c.tie_word_embeddings
                 ? 1.0 / std::sqrt(static_cast<double>(c.hidden_size))
                 : 1.0;
  } else {
    stddev = 1.0 / std::sqrt(static_cast<double>(spec.shape[1]));  // fan_in
  }
  Rng rng(TensorSeed(seed, spec.name));
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = static_cast<float>(mean + stddev * rng.Normal());
  return v;
}

// The Linear weights FP8 releases store as F8_E4M3 (routers and the
// shared expert's 1-row gate stay in the model's dtype, as published).
bool IsFp8Role(TensorRole r) {
  switch (r) {
    case TensorRole::kQProj:
    case TensorRole::kKProj:
    case TensorRole::kVProj:
    case TensorRole::kOProj:
    case TensorRole::kExpertGate:
    case TensorRole::kExpertUp:
    case TensorRole::kExpertDown:
    case TensorRole::kSharedGate:
    case TensorRole::kSharedUp:
    case TensorRole::kSharedDown:
    case TensorRole::kMlpGate:
    case TensorRole::kMlpUp:
    case TensorRole::kMlpDown:
      return true;
    default:
      return false;
  }
}

// Adds `spec` with `values` as an F8_E4M3 weight and its F32 block scales.
absl::Status AddFp8(SafetensorsWriter& w, const TensorSpec& spec,
                    const std::vector<float>& values,
                    const Fp8BlockScheme& scheme) {
  const int64_t rows = spec.shape[0], cols = spec.shape[1];
  const int64_t srows = (rows + scheme.block_rows - 1) / scheme.block_rows;
  const int64_t scols = (cols + scheme.block_cols - 1) / scheme.block_cols;
  std::vector<uint8_t> q(values.size());
  std::vector<float> scales(static_cast<size_t>(srows * scols));
  QuantizeFp8Blocks(values.data(), rows, cols, scheme, q.data(), scales.data());
  RETURN_IF_ERROR(w.Add(spec.name, DType::kF8E4M3, spec.shape, q));
  return w.Add(spec.name + kFp8ScaleSuffix, DType::kF32, {srows, scols},
               absl::Span<const uint8_t>(
                   reinterpret_cast<const uint8_t*>(scales.data()),
                   scales.size() * sizeof(float)));
}

// An MXFP4 `_blocks` spec [E, rows, cols / 32, 16]: random rows quantized
// with QuantizeMxfp4Row, written with their `_scales`; the `_scales` spec
// itself is then skipped (its name maps to the same shard).
absl::Status AddMxfp4(SafetensorsWriter& w, const TensorSpec& spec,
                      const ModelConfig& c, uint64_t seed) {
  if (!absl::EndsWith(spec.name, kMxfp4BlocksSuffix)) return absl::OkStatus();
  const int64_t rows = spec.shape[0] * spec.shape[1], cols = spec.shape[2] * 32;
  std::vector<float> values = MakeModelTensorValues(spec, c, seed);
  std::vector<uint8_t> codes(static_cast<size_t>(rows * cols / 2), 0);
  std::vector<uint8_t> scales(static_cast<size_t>(rows * cols / 32));
  for (int64_t r = 0; r < rows; ++r) {
    QuantizeMxfp4Row(values.data() + r * cols, cols, codes.data() + r * cols / 2,
                     scales.data() + r * cols / 32);
  }
  RETURN_IF_ERROR(w.Add(spec.name, DType::kU8, spec.shape, codes));
  const std::string base = spec.name.substr(0, spec.name.size() - 7);
  return w.Add(base + kMxfp4ScalesSuffix, DType::kU8,
               {spec.shape[0], spec.shape[1], spec.shape[2]}, scales);
}

uint64_t SpecBytes(const TensorSpec& s, DType dtype) {
  uint64_t n = DTypeSize(dtype);
  for (int64_t d : s.shape) n *= static_cast<uint64_t>(d);
  return n;
}

// Shard of each spec: contiguous runs of roughly equal bytes, none empty.
std::vector<int> AssignShards(const std::vector<TensorSpec>& specs, DType dtype,
                              int shards) {
  uint64_t total = 0;
  for (const auto& s : specs) total += SpecBytes(s, dtype);
  std::vector<int> out;
  int k = 0, in_k = 0;
  uint64_t cum = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    bool boundary = cum * static_cast<uint64_t>(shards) >=
                    total * static_cast<uint64_t>(k + 1);
    bool must = static_cast<int>(specs.size() - i) == shards - 1 - k;
    if (in_k > 0 && k < shards - 1 && (boundary || must)) {
      ++k;
      in_k = 0;
    }
    out.push_back(k);
    ++in_k;
    cum += SpecBytes(specs[i], dtype);
  }
  return out;
}

std::string ShardName(int k, int n) {
  return absl::StrFormat("model-%05d-of-%05d.safetensors", k + 1, n);
}

absl::Status RemoveStaleCheckpoint(const std::string& dir) {
  static const std::regex kShard(R"(model-\d{5}-of-\d{5}\.safetensors)");
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    std::string name = entry.path().filename().string();
    if (name == kSingleFileName || name == kIndexFileName ||
        std::regex_match(name, kShard)) {
      std::filesystem::remove(entry.path(), ec);
      if (ec)
        return absl::InternalError(
            absl::StrCat(entry.path().string(), ": ", ec.message()));
    }
  }
  if (ec) return absl::InternalError(absl::StrCat(dir, ": ", ec.message()));
  return absl::OkStatus();
}

absl::Status WriteWeights(const MakeModelOptions& o, const ModelConfig& c,
                          const std::string& dir) {
  std::vector<TensorSpec> specs = ExpectedTensors(c);
  if (o.shards < 1 || o.shards > static_cast<int>(specs.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shards must be in [1, ", specs.size(), "], got ", o.shards));
  }
  std::vector<int> shard_of = AssignShards(specs, o.dtype, o.shards);
  nlohmann::json weight_map = nlohmann::json::object();
  uint64_t total = 0;
  for (int k = 0; k < o.shards; ++k) {
    SafetensorsWriter w;
    w.SetMetadata("format", "pt");
    for (size_t i = 0; i < specs.size(); ++i) {
      if (shard_of[i] != k) continue;
      if (specs[i].fused && specs[i].dtype == DType::kU8) {
        RETURN_IF_ERROR(AddMxfp4(w, specs[i], c, o.seed));
        weight_map[specs[i].name] = ShardName(k, o.shards);
        if (absl::EndsWith(specs[i].name, kMxfp4ScalesSuffix) && shard_of[i] != shard_of[i - 1]) {
          return absl::InternalError("MXFP4 blocks and scales in different shards");
        }
        continue;
      }
      std::vector<float> values = TensorValues(specs[i], c, o.seed);
      if (o.fp8 && IsFp8Role(specs[i].role)) {
        RETURN_IF_ERROR(AddFp8(w, specs[i], values, *o.fp8));
        weight_map[specs[i].name] = ShardName(k, o.shards);
        weight_map[specs[i].name + kFp8ScaleSuffix] = ShardName(k, o.shards);
        continue;
      }
      std::vector<uint8_t> bytes(values.size() * DTypeSize(o.dtype));
      RETURN_IF_ERROR(ConvertFromFloat(values.data(), values.size(), o.dtype,
                                       bytes.data()));
      RETURN_IF_ERROR(w.Add(specs[i].name, o.dtype, specs[i].shape, bytes));
      weight_map[specs[i].name] = ShardName(k, o.shards);
    }
    total += w.data_bytes();
    std::string name =
        o.shards == 1 ? std::string(kSingleFileName) : ShardName(k, o.shards);
    RETURN_IF_ERROR(w.Write(JoinPath(dir, name)));
  }
  if (o.shards == 1) return absl::OkStatus();
  nlohmann::ordered_json index;
  index["metadata"] = {{"total_size", total}};
  index["weight_map"] =
      weight_map;  // sorted by name, as transformers writes it
  return WriteFileAtomically(JoinPath(dir, kIndexFileName),
                             index.dump(2) + "\n");
}

std::string TokenizerConfigJson(const ModelConfig& c) {
  const std::string& eos = TinySpecialTokens()[0];
  nlohmann::ordered_json j;
  j["add_bos_token"] = false;
  j["add_prefix_space"] = false;
  j["bos_token"] = nullptr;
  j["eos_token"] = eos;
  j["pad_token"] = eos;
  j["unk_token"] = nullptr;
  j["clean_up_tokenization_spaces"] = false;
  j["model_max_length"] = c.max_position_embeddings;
  j["tokenizer_class"] = "PreTrainedTokenizerFast";
  return j.dump(2) + "\n";
}

std::string GenerationConfigJson(const ModelConfig& c) {
  nlohmann::ordered_json j;
  j["bos_token_id"] = c.bos_token_id ? nlohmann::json(*c.bos_token_id)
                                     : nlohmann::json(nullptr);
  j["eos_token_id"] = c.eos_token_ids.front();
  j["do_sample"] = false;
  return j.dump(2) + "\n";
}

const char* TorchDtype(DType d) {
  return d == DType::kBF16  ? "bfloat16"
         : d == DType::kF16 ? "float16"
                            : "float32";
}

// Option combinations that no family config can express.
absl::Status CheckOptions(const MakeModelOptions& o) {
  const bool qwen =
      o.arch == ModelFamily::kQwen2Moe || o.arch == ModelFamily::kQwen3Moe;
  if (!IsFloatDType(o.dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dtype must be F32, F16 or BF16, got ", DTypeName(o.dtype)));
  }
  if (o.mxfp4 && o.arch != ModelFamily::kGptOss) {
    return absl::InvalidArgumentError("MXFP4 experts apply to gpt_oss only");
  }
  if (o.fp8 && o.arch == ModelFamily::kGptOss) {
    return absl::InvalidArgumentError(
        "gpt_oss checkpoints are bf16 or MXFP4, not fp8");
  }
  if (o.fp8 && (o.fp8->block_rows <= 0 || o.fp8->block_cols <= 0)) {
    return absl::InvalidArgumentError("fp8 block sizes must be positive");
  }
  if (!qwen && (o.decoder_sparse_step != 1 || !o.mlp_only_layers.empty())) {
    return absl::InvalidArgumentError(
        absl::StrCat("decoder_sparse_step and mlp_only_layers apply to "
                     "qwen2_moe/qwen3_moe only, not ",
                     ModelFamilyName(o.arch)));
  }
  if (o.clip_qkv && o.arch != ModelFamily::kOlmoe) {
    return absl::InvalidArgumentError("clip_qkv applies to olmoe only");
  }
  if (o.qkv_bias.value_or(false) && o.arch == ModelFamily::kMixtral) {
    return absl::InvalidArgumentError("mixtral has no attention biases");
  }
  const bool deepseek = TraitsOf(o.arch).attention == AttentionKind::kLatent;
  if (deepseek && o.qkv_bias.value_or(false)) {
    return absl::InvalidArgumentError(
        "attention_bias is not supported for deepseek models");
  }
  if (!deepseek && o.heads > 0 && o.head_dim == 0 && o.hidden % o.heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("hidden (", o.hidden, ") is not a multiple of heads (",
                     o.heads, "); pass head_dim"));
  }
  return absl::OkStatus();
}

// The scored router's fields (deepseek_v2/v3, glm4_moe); dense layers use
// `intermediate` (2 * hidden when unset), experts `moe_intermediate` (hidden
// when unset). REQUIRES: TraitsOf(o.arch).router == kScoredGroups.
void ScoredRouterFromOptions(const MakeModelOptions& o, ModelConfig* c) {
  const bool v2 = TraitsOf(o.arch).unscaled_when_normalized;
  c->intermediate_size = o.intermediate > 0 ? o.intermediate : 2 * o.hidden;
  c->moe_intermediate_size =
      o.moe_intermediate > 0 ? o.moe_intermediate : o.hidden;
  c->n_shared_experts = o.n_shared_experts;
  c->shared_expert_intermediate_size =
      c->moe_intermediate_size * o.n_shared_experts;
  c->first_k_dense_replace = o.first_k_dense_replace;
  c->moe_layer_freq = o.moe_layer_freq;
  c->scoring_func = !v2 ? ScoringFunc::kSigmoid : ScoringFunc::kSoftmax;
  c->topk_method = !v2 ? TopkMethod::kNoauxTc : o.topk_method;
  c->n_group = o.n_group;
  c->topk_group = o.topk_group;
  c->routed_scaling_factor = o.routed_scaling_factor;
  c->norm_topk_prob = o.norm_topk_prob.value_or(!v2);
}

// The deepseek_v2/v3 attention: MLA, yarn, no biases.
void DeepseekFromOptions(const MakeModelOptions& o, ModelConfig* c) {
  c->num_key_value_heads = o.heads;
  c->mla = o.mla;
  c->head_dim = c->rotary_dim = o.mla.qk_head_dim();
  c->yarn = o.yarn;
  c->rope_scaling_type = o.yarn.has_value() ? "yarn" : "";
  c->qkv_bias = c->o_bias = false;
}

// The gpt_oss fields (configuration_gpt_oss.py names, model_config.h).
void GptOssFromOptions(const MakeModelOptions& o, ModelConfig* c) {
  c->qkv_bias = c->o_bias = true;
  c->norm_topk_prob = true;
  c->sliding_window = o.sliding_window;
  c->sliding_layers.clear();
  for (int64_t i = 0; i < o.layers; ++i) {
    c->sliding_layers.push_back((i + 1) % 2 != 0);
  }
  c->swiglu_limit = o.swiglu_limit;
  if (o.mxfp4) {
    c->mxfp4 = Mxfp4Scheme{{"model.layers.*.self_attn",
                            "model.layers.*.mlp.router", "model.embed_tokens",
                            "lm_head"}};
  }
  c->yarn = o.yarn;
  c->rope_scaling_type = o.yarn.has_value() ? "yarn" : "";
  c->rope_theta = o.rope_theta.value_or(150000.0);
}

}  // namespace

std::vector<float> MakeModelTensorValues(const TensorSpec& spec,
                                         const ModelConfig& config,
                                         uint64_t seed) {
  if (!(spec.fused && spec.dtype == DType::kU8)) {
    return TensorValues(spec, config, seed);
  }
  MOE_CHECK(absl::EndsWith(spec.name, kMxfp4BlocksSuffix)) << spec.name;
  TensorSpec logical = spec;  // [E, rows, cols / 32, 16] -> [E, rows, cols]
  logical.shape = {spec.shape[0], spec.shape[1], spec.shape[2] * 32};
  return TensorValues(logical, config, seed);
}

const std::vector<std::string>& TinySpecialTokens() {
  static const auto* tokens = new std::vector<std::string>{
      "<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  return *tokens;
}

MakeModelOptions TinyPreset(ModelFamily family) {
  MakeModelOptions o;
  o.arch = family;
  switch (family) {
    case ModelFamily::kMixtral:
      o.intermediate = 128;
      break;
    case ModelFamily::kQwen2Moe:
      o.intermediate = 128;
      o.moe_intermediate = 64;
      o.shared_intermediate = 128;
      break;
    case ModelFamily::kQwen3Moe:
      o.layers = 5;
      o.mlp_only_layers = {2};
      o.head_dim = 32;
      o.intermediate = 128;
      o.moe_intermediate = 64;
      o.norm_topk_prob = true;
      break;
    case ModelFamily::kOlmoe:
      o.intermediate = 64;
      o.rms_norm_eps = 1e-5;
      break;
    case ModelFamily::kDeepseekV2:
    case ModelFamily::kDeepseekV3: {
      const bool v3 = family == ModelFamily::kDeepseekV3;
      o.kv_heads = o.heads;
      o.intermediate = 128;
      o.moe_intermediate = 32;
      o.mla = {v3 ? 32 : 0, 32, 16, 8, 16};
      o.n_shared_experts = v3 ? 1 : 2;
      o.first_k_dense_replace = 1;
      o.topk_method =
          v3 ? TopkMethod::kNoauxTc : TopkMethod::kGroupLimitedGreedy;
      o.n_group = 4;
      o.topk_group = 2;
      o.routed_scaling_factor = v3 ? 2.5 : 2.0;
      o.norm_topk_prob = v3;
      break;
    }
    case ModelFamily::kGlm4Moe:
      o.head_dim = 32;
      o.intermediate = 128;
      o.moe_intermediate = 32;
      o.n_shared_experts = 1;
      o.first_k_dense_replace = 1;
      o.n_group = 2;
      o.topk_group = 1;
      o.routed_scaling_factor = 2.5;
      o.qkv_bias = true;
      o.use_qk_norm = true;
      o.rms_norm_eps = 1e-5;
      break;
    case ModelFamily::kGptOss: {
      o.head_dim = 16;
      o.intermediate = 64;
      o.rms_norm_eps = 1e-5;
      o.sliding_window = 8;
      o.swiglu_limit = 1.5;
      YarnConfig y;
      y.factor = 4.0;
      y.original_max_position_embeddings = 1024;
      y.truncate = false;
      o.yarn = y;
      o.max_position_embeddings = 4096;  // factor x original, as published
      break;
    }
  }
  return o;
}

absl::StatusOr<ModelConfig> ConfigFromOptions(const MakeModelOptions& o) {
  RETURN_IF_ERROR(CheckOptions(o));
  const bool qwen =
      o.arch == ModelFamily::kQwen2Moe || o.arch == ModelFamily::kQwen3Moe;
  ModelConfig c;
  c.family = o.arch;
  c.architectures = {std::string(ModelFamilyArchitecture(o.arch))};
  c.hidden_size = o.hidden;
  c.num_hidden_layers = o.layers;
  c.num_attention_heads = o.heads;
  c.num_key_value_heads = o.kv_heads;
  c.head_dim = c.rotary_dim =
      o.head_dim > 0 ? o.head_dim : (o.heads > 0 ? o.hidden / o.heads : 0);
  c.vocab_size = o.vocab;
  c.num_experts = o.experts;
  c.top_k = o.top_k;
  const int64_t dense = o.intermediate > 0 ? o.intermediate : 2 * o.hidden;
  if (qwen) {
    c.intermediate_size = dense;
    c.moe_intermediate_size =
        o.moe_intermediate > 0 ? o.moe_intermediate : o.hidden;
    c.decoder_sparse_step = o.decoder_sparse_step;
    c.mlp_only_layers = o.mlp_only_layers;
  } else {
    c.intermediate_size = c.moe_intermediate_size =
        o.moe_intermediate > 0 ? o.moe_intermediate : dense;
  }
  if (o.arch == ModelFamily::kQwen2Moe) {
    c.shared_expert_intermediate_size = o.shared_intermediate > 0
                                            ? o.shared_intermediate
                                            : 2 * c.moe_intermediate_size;
  }
  c.norm_topk_prob =
      o.arch == ModelFamily::kMixtral || o.norm_topk_prob.value_or(false);
  c.qkv_bias = o.qkv_bias.value_or(o.arch == ModelFamily::kQwen2Moe);
  c.o_bias = c.qkv_bias && o.arch != ModelFamily::kQwen2Moe;
  c.qk_norm = o.arch == ModelFamily::kQwen3Moe ? QkNorm::kPerHead
              : o.arch == ModelFamily::kOlmoe  ? QkNorm::kFull
                                               : QkNorm::kNone;
  c.clip_qkv = o.clip_qkv;
  c.rms_norm_eps = o.rms_norm_eps;
  c.rope_theta =
      o.rope_theta.value_or(o.arch == ModelFamily::kMixtral ? 1e6 : 1e4);
  c.max_position_embeddings = o.max_position_embeddings;
  c.tie_word_embeddings = o.tie_word_embeddings;
  c.torch_dtype = TorchDtype(o.dtype);
  if (c.has_scored_router()) ScoredRouterFromOptions(o, &c);
  if (c.is_mla()) DeepseekFromOptions(o, &c);
  if (o.arch == ModelFamily::kGptOss) GptOssFromOptions(o, &c);
  if (o.arch == ModelFamily::kGlm4Moe) {
    c.o_bias = false;
    c.qk_norm = o.use_qk_norm ? QkNorm::kPerHead : QkNorm::kNone;
    c.partial_rotary_factor = o.partial_rotary_factor;
    c.rotary_dim = static_cast<int64_t>(static_cast<double>(c.head_dim) *
                                        o.partial_rotary_factor);
  }
  c.fp8 = o.fp8;
  if (o.vocab < 256 + static_cast<int64_t>(TinySpecialTokens().size()) ||
      o.vocab > (1 << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "vocab must be in [", 256 + TinySpecialTokens().size(), ", ", 1 << 20,
        "] for the byte-level tokenizer, got ", o.vocab));
  }
  ASSIGN_OR_RETURN(
      TinyTokenizer tok,
      MakeTinyTokenizer(static_cast<int32_t>(o.vocab), TinySpecialTokens()));
  c.bos_token_id = tok.special_tokens[0].second;
  c.eos_token_ids = {tok.special_tokens[0].second};
  RETURN_IF_ERROR(ValidateModelConfig(&c));
  return c;
}

absl::Status MakeModel(const MakeModelOptions& options,
                       const std::string& out_dir) {
  ASSIGN_OR_RETURN(ModelConfig config, ConfigFromOptions(options));
  ASSIGN_OR_RETURN(TinyTokenizer tok,
                   MakeTinyTokenizer(static_cast<int32_t>(options.vocab),
                                     TinySpecialTokens()));
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec)
    return absl::InternalError(
        absl::StrCat(out_dir, ": cannot create: ", ec.message()));
  RETURN_IF_ERROR(RemoveStaleCheckpoint(out_dir));
  RETURN_IF_ERROR(WriteWeights(options, config, out_dir));
  RETURN_IF_ERROR(
      WriteFileAtomically(JoinPath(out_dir, "tokenizer.json"), tok.json));
  RETURN_IF_ERROR(WriteFileAtomically(
      JoinPath(out_dir, "tokenizer_config.json"), TokenizerConfigJson(config)));
  RETURN_IF_ERROR(
      WriteFileAtomically(JoinPath(out_dir, "generation_config.json"),
                          GenerationConfigJson(config)));
  // config.json last: a directory with a config has complete weights.
  return WriteFileAtomically(JoinPath(out_dir, "config.json"),
                             ModelConfigToJson(config));
}

}  // namespace moe
