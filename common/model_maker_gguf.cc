#include "common/model_maker_gguf.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/gguf_model.h"
#include "common/gguf_quantize.h"
#include "common/gguf_writer.h"
#include "common/logging.h"
#include "common/mxfp4.h"
#include "common/status_macros.h"
#include "common/tiny_tokenizer.h"
#include "nlohmann/json.hpp"

namespace moe {
namespace {

using nlohmann::json;

struct FileTypeRow {
  GgufFileType type;
  const char* name;
  GgufType block;  // the ggml type of experts and matrices (q4_k_m: Q4_K)
};

constexpr FileTypeRow kFileTypes[] = {
    {GgufFileType::kF32, "f32", GgufType::kF32},
    {GgufFileType::kF16, "f16", GgufType::kF16},
    {GgufFileType::kBF16, "bf16", GgufType::kBF16},
    {GgufFileType::kQ8_0, "q8_0", GgufType::kQ8_0},
    {GgufFileType::kQ4_0, "q4_0", GgufType::kQ4_0},
    {GgufFileType::kQ4_1, "q4_1", GgufType::kQ4_1},
    {GgufFileType::kQ5_0, "q5_0", GgufType::kQ5_0},
    {GgufFileType::kQ5_1, "q5_1", GgufType::kQ5_1},
    {GgufFileType::kQ4_K, "q4_k", GgufType::kQ4_K},
    {GgufFileType::kQ5_K, "q5_k", GgufType::kQ5_K},
    {GgufFileType::kQ6_K, "q6_k", GgufType::kQ6_K},
    {GgufFileType::kQ4_K_M, "q4_k_m", GgufType::kQ4_K},
    {GgufFileType::kMxfp4, "mxfp4", GgufType::kMXFP4},
};

const FileTypeRow& RowOf(GgufFileType type) {
  for (const FileTypeRow& r : kFileTypes) {
    if (r.type == type) return r;
  }
  MOE_CHECK(false) << static_cast<int>(type);
  return kFileTypes[0];
}

// The tensors q4_k_m stores as Q6_K (by the name after "blk.N.").
constexpr const char* kQ4KMSixBit[] = {"ffn_down_exps.weight", "ffn_down.weight",
                                       "ffn_down_shexp.weight", "attn_v.weight"};

bool Q4KMSixBit(absl::string_view gguf_name) {
  if (gguf_name == "output.weight") return true;
  for (const char* n : kQ4KMSixBit) {
    if (absl::EndsWith(gguf_name, absl::StrCat(".", n))) return true;
  }
  return false;
}

// ------------------------------------------------------------- refusals

absl::Status Refuse(absl::string_view arch, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("--gguf: ", what, " (no form in llama.cpp's ", arch, " files)"));
}

// What the model's config says that llama.cpp's keys for `arch` cannot.
absl::Status CheckExpressible(const MakeModelOptions& o, const ModelConfig& c,
                              absl::string_view arch) {
  if (o.fp8) return Refuse(arch, "FP8 weights are a safetensors layout");
  if (!c.mlp_only_layers.empty() || c.decoder_sparse_step != 1) {
    return Refuse(arch, "dense qwen layers (mlp_only_layers, decoder_sparse_step)");
  }
  if (c.moe_layer_freq != 1) return Refuse(arch, "moe_layer_freq other than 1");
  const ModelFamily f = c.family;
  if ((f == ModelFamily::kQwen2Moe || f == ModelFamily::kOlmoe) && c.norm_topk_prob) {
    return Refuse(arch, "renormalised top-k weights (norm_topk_prob)");
  }
  if (f == ModelFamily::kDeepseekV2 && c.topk_method == TopkMethod::kGreedy && c.n_group > 1) {
    return Refuse(arch, "greedy selection over several expert groups "
                        "(llama.cpp limits groups whenever there are several)");
  }
  if (c.yarn.has_value() && c.is_mla() && c.yarn->mscale != c.yarn->mscale_all_dim) {
    return Refuse(arch, "YaRN with mscale != mscale_all_dim");
  }
  if (c.yarn.has_value() && c.has_expert_biases() && c.yarn->truncate) {
    return Refuse(arch, "YaRN with a truncated correction range");
  }
  return absl::OkStatus();
}

// ------------------------------------------------------------- metadata

absl::Status AddYarnKeys(const ModelConfig& c, const std::string& a, GgufWriter* w) {
  if (!c.yarn.has_value()) return absl::OkStatus();
  const YarnConfig& y = *c.yarn;
  RETURN_IF_ERROR(w->AddString(a + ".rope.scaling.type", "yarn"));
  RETURN_IF_ERROR(w->AddFloat32(a + ".rope.scaling.factor", y.factor));
  RETURN_IF_ERROR(w->AddUint32(a + ".rope.scaling.original_context_length",
                               static_cast<uint64_t>(y.original_max_position_embeddings)));
  if (c.is_mla()) {
    RETURN_IF_ERROR(
        w->AddFloat32(a + ".rope.scaling.yarn_log_multiplier", 0.1 * y.mscale_all_dim));
  }
  if (y.beta_fast != YarnConfig{}.beta_fast) {
    RETURN_IF_ERROR(w->AddFloat32(a + ".rope.scaling.yarn_beta_fast", y.beta_fast));
  }
  if (y.beta_slow != YarnConfig{}.beta_slow) {
    RETURN_IF_ERROR(w->AddFloat32(a + ".rope.scaling.yarn_beta_slow", y.beta_slow));
  }
  return absl::OkStatus();
}

// The router keys of deepseek2 and glm4moe.
absl::Status AddScoredRouterKeys(const ModelConfig& c, const std::string& a, GgufWriter* w) {
  RETURN_IF_ERROR(w->AddUint32(a + ".leading_dense_block_count",
                               static_cast<uint64_t>(c.first_k_dense_replace)));
  RETURN_IF_ERROR(w->AddUint32(a + ".expert_shared_count", static_cast<uint64_t>(c.n_shared_experts)));
  RETURN_IF_ERROR(w->AddFloat32(a + ".expert_weights_scale", c.routed_scaling_factor));
  RETURN_IF_ERROR(w->AddBool(a + ".expert_weights_norm", c.norm_topk_prob));
  RETURN_IF_ERROR(w->AddUint32(a + ".expert_gating_func",
                               c.scoring_func == ScoringFunc::kSigmoid ? 2 : 1));
  RETURN_IF_ERROR(w->AddUint32(a + ".expert_group_count", static_cast<uint64_t>(c.n_group)));
  return w->AddUint32(a + ".expert_group_used_count", static_cast<uint64_t>(c.topk_group));
}

// deepseek2: the MQA view of the latent cache as key/value_length, the
// heads' sizes as key/value_length_mla (llama.cpp's DeepseekV2Model).
absl::Status AddDeepseek2Keys(const ModelConfig& c, const std::string& a, GgufWriter* w) {
  const MlaConfig& m = c.mla;
  RETURN_IF_ERROR(w->AddUint32(a + ".expert_feed_forward_length",
                               static_cast<uint64_t>(c.moe_intermediate_size)));
  RETURN_IF_ERROR(AddScoredRouterKeys(c, a, w));
  if (m.q_lora_rank > 0) {
    RETURN_IF_ERROR(w->AddUint32(a + ".attention.q_lora_rank", static_cast<uint64_t>(m.q_lora_rank)));
  }
  RETURN_IF_ERROR(w->AddUint32(a + ".attention.kv_lora_rank", static_cast<uint64_t>(m.kv_lora_rank)));
  RETURN_IF_ERROR(w->AddUint32(a + ".attention.key_length",
                               static_cast<uint64_t>(m.kv_lora_rank + m.qk_rope_head_dim)));
  RETURN_IF_ERROR(w->AddUint32(a + ".attention.value_length", static_cast<uint64_t>(m.kv_lora_rank)));
  RETURN_IF_ERROR(w->AddUint32(a + ".attention.key_length_mla", static_cast<uint64_t>(m.qk_head_dim())));
  RETURN_IF_ERROR(w->AddUint32(a + ".attention.value_length_mla", static_cast<uint64_t>(m.v_head_dim)));
  RETURN_IF_ERROR(w->AddUint32(a + ".rope.dimension_count", static_cast<uint64_t>(m.qk_rope_head_dim)));
  return AddYarnKeys(c, a, w);
}

// The keys beyond the common ones, per architecture (hf_to_gguf.py's
// add_arch_keys).
absl::Status AddArchKeys(const ModelConfig& c, const std::string& a, GgufWriter* w) {
  const ModelFamily f = c.family;
  const uint64_t head_dim = static_cast<uint64_t>(c.head_dim);
  auto head_lengths = [&]() -> absl::Status {
    RETURN_IF_ERROR(w->AddUint32(a + ".attention.key_length", head_dim));
    return w->AddUint32(a + ".attention.value_length", head_dim);
  };
  if (f == ModelFamily::kMixtral) {
    RETURN_IF_ERROR(w->AddUint32(a + ".rope.dimension_count", head_dim));
    const bool plain = c.num_attention_heads * c.head_dim == c.hidden_size;
    return plain ? absl::OkStatus() : head_lengths();
  }
  if (c.is_mla()) return AddDeepseek2Keys(c, a, w);
  if (f == ModelFamily::kGptOss) {
    RETURN_IF_ERROR(w->AddUint32(a + ".expert_feed_forward_length",
                                 static_cast<uint64_t>(c.intermediate_size)));
    RETURN_IF_ERROR(head_lengths());
    RETURN_IF_ERROR(w->AddUint32(a + ".attention.sliding_window", static_cast<uint64_t>(c.sliding_window)));
    if (c.swiglu_limit != 7.0) RETURN_IF_ERROR(w->AddFloat32(a + ".swiglu_clamp_exp", c.swiglu_limit));
    return AddYarnKeys(c, a, w);
  }
  if (f != ModelFamily::kOlmoe) {
    RETURN_IF_ERROR(w->AddUint32(a + ".expert_feed_forward_length",
                                 static_cast<uint64_t>(c.moe_intermediate_size)));
    RETURN_IF_ERROR(head_lengths());
  }
  if (f == ModelFamily::kQwen2Moe) {
    return w->AddUint32(a + ".expert_shared_feed_forward_length",
                        static_cast<uint64_t>(c.shared_expert_intermediate_size));
  }
  if (f == ModelFamily::kQwen3Moe) return w->AddBool(a + ".expert_weights_norm", c.norm_topk_prob);
  if (f == ModelFamily::kOlmoe && c.clip_qkv.has_value()) {
    return w->AddFloat32(a + ".attention.clamp_kqv", *c.clip_qkv);
  }
  if (f == ModelFamily::kGlm4Moe) {
    RETURN_IF_ERROR(w->AddUint32(a + ".rope.dimension_count", static_cast<uint64_t>(c.rotary_dim)));
    return AddScoredRouterKeys(c, a, w);
  }
  return absl::OkStatus();
}

absl::Status AddModelKeys(const ModelConfig& c, GgufWriter* w) {
  const std::string a(GgufArchitectureOf(c.family));
  RETURN_IF_ERROR(w->AddString("general.architecture", a));
  const int64_t kv_heads = c.is_mla() ? 1 : c.num_key_value_heads;  // llama.cpp's MQA view
  const std::pair<const char*, int64_t> ints[] = {
      {".embedding_length", c.hidden_size},
      {".block_count", c.num_hidden_layers + c.num_nextn_predict_layers},
      {".attention.head_count", c.num_attention_heads},
      {".attention.head_count_kv", kv_heads},
      {".expert_count", c.num_experts},
      {".expert_used_count", c.top_k},
      {".feed_forward_length", c.intermediate_size},
      {".context_length", c.max_position_embeddings},
      {".vocab_size", c.vocab_size},
  };
  for (const auto& [key, v] : ints) RETURN_IF_ERROR(w->AddUint32(a + key, static_cast<uint64_t>(v)));
  RETURN_IF_ERROR(w->AddFloat32(a + ".attention.layer_norm_rms_epsilon", c.rms_norm_eps));
  RETURN_IF_ERROR(w->AddFloat32(a + ".rope.freq_base", c.rope_theta));
  RETURN_IF_ERROR(AddArchKeys(c, a, w));
  if (c.bos_token_id.has_value()) {
    RETURN_IF_ERROR(w->AddUint32("tokenizer.ggml.bos_token_id", static_cast<uint64_t>(*c.bos_token_id)));
  }
  if (!c.eos_token_ids.empty()) {
    RETURN_IF_ERROR(w->AddUint32("tokenizer.ggml.eos_token_id", static_cast<uint64_t>(c.eos_token_ids[0])));
  }
  return absl::OkStatus();
}

// tokenizer.json (a byte-level BPE, common/tiny_tokenizer.h) as llama.cpp's
// "gpt2" vocabulary. Its ByteLevel pre-tokenizer splits with GPT-2's regex:
// llama.cpp's pre-tokenizer "default".
absl::Status AddTokenizerKeys(const std::string& tokenizer_json, GgufWriter* w) {
  const json tok = json::parse(tokenizer_json, nullptr, /*allow_exceptions=*/false);
  if (tok.is_discarded() || !tok.contains("model") || !tok["model"].contains("vocab")) {
    return absl::InternalError("tokenizer.json: not a BPE tokenizer");
  }
  const json& model = tok["model"];
  if (model.value("type", "BPE") != "BPE" || model.value("byte_fallback", false)) {
    return absl::InvalidArgumentError("--gguf: only byte-level BPE tokenizers are converted");
  }
  std::map<int64_t, std::string> by_id;
  std::map<int64_t, int64_t> kinds;  // id -> token type, for added tokens
  for (const auto& [text, id] : model["vocab"].items()) by_id[id.get<int64_t>()] = text;
  for (const json& added : tok.value("added_tokens", json::array())) {
    const int64_t id = added["id"].get<int64_t>();
    by_id[id] = added["content"].get<std::string>();
    kinds[id] = added.value("special", false) ? 3 : 4;
  }
  const int64_t count = by_id.empty() ? 0 : by_id.rbegin()->first + 1;
  std::vector<std::string> tokens(static_cast<size_t>(count));
  std::vector<int64_t> types(static_cast<size_t>(count), 1);
  for (int64_t i = 0; i < count; ++i) {
    auto it = by_id.find(i);
    tokens[i] = it != by_id.end() ? it->second : absl::StrCat("[PAD", i, "]");
    if (kinds.contains(i)) types[i] = kinds[i];
  }
  std::vector<std::string> merges;
  for (const json& m : model.value("merges", json::array())) {
    merges.push_back(m.is_string() ? m.get<std::string>()
                                   : absl::StrCat(m[0].get<std::string>(), " ",
                                                  m[1].get<std::string>()));
  }
  const json post = tok.value("post_processor", json::object());
  const bool add_bos = post.is_object() && post.value("type", "") == "TemplateProcessing" &&
                       post["single"][0].contains("SpecialToken");
  RETURN_IF_ERROR(w->AddString("tokenizer.ggml.model", "gpt2"));
  RETURN_IF_ERROR(w->AddString("tokenizer.ggml.pre", "default"));
  RETURN_IF_ERROR(w->AddStringArray("tokenizer.ggml.tokens", tokens));
  RETURN_IF_ERROR(w->AddIntArray("tokenizer.ggml.token_type", GgufValueType::kInt32, types));
  RETURN_IF_ERROR(w->AddStringArray("tokenizer.ggml.merges", merges));
  return w->AddBool("tokenizer.ggml.add_bos_token", add_bos);
}

// -------------------------------------------------------------- tensors

// Where one of our tensors goes in the file.
struct Target {
  std::string gguf;
  int expert = -1;  // its slot in a stack, -1 when not stacked
  bool rope_permuted = false;
};

// Our names of a layer (-1: model level) -> llama.cpp's, from the name
// table through MapGgufTensorName (so the reader maps them back).
absl::flat_hash_map<std::string, Target> NamesOfLayer(const ModelConfig& c, int layer) {
  absl::flat_hash_map<std::string, Target> out;
  for (const std::string& gguf : GgufTensorNamesOf(c.family, layer)) {
    absl::StatusOr<GgufName> n = MapGgufTensorName(c.family, gguf);
    MOE_CHECK(n.ok()) << n.status();  // the table's own names
    if (n->nextn || !n->fused.empty() || !n->stands_in_for.empty()) continue;
    if (!n->stacked_experts) {
      out[n->ours] = Target{gguf, -1, n->rope_permuted};
      continue;
    }
    for (int e = 0; e < c.num_experts; ++e) out[n->ForExpert(e)] = Target{gguf, e, false};
  }
  return out;
}

// Writes the tensors of ExpectedTensors(c) under llama.cpp's names, in
// ExpectedTensors' order, each layer's expert stacks after its other
// tensors.
class TensorWriter {
 public:
  TensorWriter(const MakeModelOptions& o, const ModelConfig& c, GgufFileType type, GgufWriter* w)
      : o_(o), c_(c), type_(type), w_(w) {}

  absl::Status Run() {
    fused_ = ExpectedTensors(c_);
    int layer = -2;
    absl::flat_hash_map<std::string, Target> names;
    for (const TensorSpec& spec : ExpectedTensors(c_, BiasedExperts::kPerExpert)) {
      if (spec.layer != layer) {
        RETURN_IF_ERROR(FlushStacks());
        layer = spec.layer;
        names = NamesOfLayer(c_, layer);
        fused_values_.clear();
      }
      auto it = names.find(spec.name);
      if (it == names.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--gguf: ", spec.name, " has no tensor name in llama.cpp's ",
            GgufArchitectureOf(c_.family), " files"));
      }
      ASSIGN_OR_RETURN(std::vector<float> values, Values(spec));
      const Target& t = it->second;
      if (t.expert < 0) {
        RETURN_IF_ERROR(Emit(t.gguf, KindOf(spec), spec.shape, values, t.rope_permuted));
        continue;
      }
      Stack& s = stacks_[t.gguf];
      if (s.values.empty()) {
        s.shape = spec.shape;
        s.kind = spec.shape.size() == 1 ? GgufTensorKind::kVector : GgufTensorKind::kExperts;
        s.values.resize(values.size() * static_cast<size_t>(c_.num_experts));
      }
      MOE_CHECK(s.shape == spec.shape) << spec.name;
      std::copy(values.begin(), values.end(), s.values.begin() + t.expert * values.size());
    }
    return FlushStacks();
  }

 private:
  struct Stack {
    std::vector<int64_t> shape;  // one expert's
    GgufTensorKind kind;
    std::vector<float> values;   // [experts, shape...]
  };

  static GgufTensorKind KindOf(const TensorSpec& spec) {
    if (spec.shape.size() == 1) return GgufTensorKind::kVector;
    if (spec.role == TensorRole::kRouter || spec.role == TensorRole::kSharedExpertGate) {
      return GgufTensorKind::kRouter;
    }
    return GgufTensorKind::kMatrix;
  }

  // The values as the folder stores them (through options.dtype).
  absl::StatusOr<std::vector<float>> Rounded(const TensorSpec& spec) const {
    std::vector<float> v = MakeModelTensorValues(spec, c_, o_.seed);
    std::vector<uint8_t> stored(v.size() * DTypeSize(o_.dtype));
    RETURN_IF_ERROR(ConvertFromFloat(v.data(), v.size(), o_.dtype, stored.data()));
    RETURN_IF_ERROR(ConvertToFloat(stored.data(), o_.dtype, v.size(), v.data()));
    return v;
  }

  absl::StatusOr<std::vector<float>> Values(const TensorSpec& spec) {
    if (!c_.has_expert_biases() || !IsExpertRole(spec.role)) return Rounded(spec);
    return SplitExpert(spec);
  }

  // gpt_oss: expert spec.expert's part of its layer's fused tensor, as
  // llama.cpp splits them: gate from the even columns of gate_up_proj (the
  // even rows of MXFP4 blocks), up from the odd ones, transposed to [out,
  // in]; MXFP4 weights are the values their codes quantize.
  absl::StatusOr<std::vector<float>> SplitExpert(const TensorSpec& spec) {
    // The fused tensor of each ExpertSlot (gate, up, down, their biases):
    // gate_up_proj (or its MXFP4 blocks), down_proj and their biases.
    constexpr TensorRole kFusedRole[6] = {
        TensorRole::kExpertGate,     TensorRole::kExpertGate,     TensorRole::kExpertDown,
        TensorRole::kExpertGateBias, TensorRole::kExpertGateBias, TensorRole::kExpertDownBias};
    const int slot = ExpertSlot(spec.role);
    const TensorSpec* f = nullptr;
    for (const TensorSpec& s : fused_) {
      if (s.layer == spec.layer && s.role == kFusedRole[slot] &&
          !absl::EndsWith(s.name, kMxfp4ScalesSuffix)) {
        f = &s;
      }
    }
    MOE_CHECK(f != nullptr) << spec.name;
    auto cached = fused_values_.find(f->name);
    if (cached == fused_values_.end()) {
      std::vector<float> v;
      if (f->dtype == DType::kU8) {
        v = MakeModelTensorValues(*f, c_, o_.seed);  // MXFP4: not rounded
      } else {
        ASSIGN_OR_RETURN(v, Rounded(*f));
      }
      cached = fused_values_.emplace(f->name, std::move(v)).first;
    }
    const std::vector<float>& v = cached->second;
    const int64_t e = spec.expert, h = c_.hidden_size, inter = c_.moe_intermediate_size;
    const int parity = slot % 3 == 1 ? 1 : 0;  // up: the odd columns / rows
    const bool mxfp4 = f->dtype == DType::kU8;
    std::vector<float> out(static_cast<size_t>(spec.shape.size() == 1 ? spec.shape[0]
                                                                      : spec.shape[0] * spec.shape[1]));
    if (slot >= 3) {  // biases [E, 2I] or [E, H]
      const int64_t n = static_cast<int64_t>(out.size());
      for (int64_t i = 0; i < n; ++i) {
        out[i] = slot == 5 ? v[e * h + i] : v[e * 2 * inter + 2 * i + parity];
      }
    } else if (slot == 2) {  // down [H, I] from [E, I, H] (MXFP4: [E, H, I])
      for (int64_t r = 0; r < h; ++r) {
        for (int64_t i = 0; i < inter; ++i) {
          out[r * inter + i] = mxfp4 ? v[(e * h + r) * inter + i] : v[(e * inter + i) * h + r];
        }
      }
    } else {  // gate / up [I, H] from [E, H, 2I] (MXFP4: [E, 2I, H])
      for (int64_t i = 0; i < inter; ++i) {
        for (int64_t r = 0; r < h; ++r) {
          out[i * h + r] = mxfp4 ? v[(e * 2 * inter + 2 * i + parity) * h + r]
                                 : v[(e * h + r) * 2 * inter + 2 * i + parity];
        }
      }
    }
    return out;
  }

  absl::Status FlushStacks() {
    for (auto& [name, s] : stacks_) {
      std::vector<int64_t> shape = s.shape;
      shape.insert(shape.begin(), c_.num_experts);
      RETURN_IF_ERROR(Emit(name, s.kind, shape, s.values, false));
    }
    stacks_.clear();
    return absl::OkStatus();
  }

  // Adds tensor `name` of row-major `shape` (rows permuted for llama's rope
  // when `permute`) in the type the file type gives it.
  absl::Status Emit(const std::string& name, GgufTensorKind kind,
                    const std::vector<int64_t>& shape, std::vector<float>& values,
                    bool permute) {
    const int64_t cols = shape.back();
    if (permute) PermuteForLlamaRope(shape[0], cols, values);
    const GgufType type = GgufTensorTypeFor(type_, kind, name, cols);
    const GgufTypeInfo& info = GgufTypeInfoOf(type);
    const int64_t n = static_cast<int64_t>(values.size());
    std::vector<uint8_t> bytes(static_cast<size_t>(n / info.block_elems * info.block_bytes));
    absl::Status s = QuantizeGguf(type, values.data(), n, bytes.data());
    if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat(name, ": ", s.message()));
    return w_->AddTensor(name, type, std::vector<int64_t>(shape.rbegin(), shape.rend()), bytes);
  }

  // llama.cpp's converter's permutation of llama's attn_q / attn_k rows
  // (the inverse of UndoLlamaRopePermutation).
  void PermuteForLlamaRope(int64_t rows, int64_t cols, std::vector<float>& values) const {
    const int64_t d = c_.head_dim, half = d / 2;
    std::vector<float> out(values.size());
    for (int64_t h = 0; h < rows / d; ++h) {
      for (int64_t i = 0; i < half; ++i) {
        for (int64_t j = 0; j < 2; ++j) {
          std::copy_n(values.begin() + (h * d + j * half + i) * cols, cols,
                      out.begin() + (h * d + 2 * i + j) * cols);
        }
      }
    }
    values.swap(out);
  }

  const MakeModelOptions& o_;
  const ModelConfig& c_;
  GgufFileType type_;
  GgufWriter* w_;
  std::vector<TensorSpec> fused_;
  std::map<std::string, std::vector<float>> fused_values_;  // this layer's
  std::map<std::string, Stack> stacks_;                     // this layer's
};

}  // namespace

absl::string_view GgufFileTypeName(GgufFileType type) { return RowOf(type).name; }

std::string GgufFileTypeNames() {
  std::vector<std::string> names;
  for (const FileTypeRow& r : kFileTypes) names.push_back(r.name);
  return absl::StrJoin(names, ", ");
}

absl::StatusOr<GgufFileType> ParseGgufFileType(absl::string_view name) {
  std::string lower(name);
  for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  for (const FileTypeRow& r : kFileTypes) {
    if (lower == r.name) return r.type;
  }
  return absl::InvalidArgumentError(absl::StrCat("--gguf must be one of ", GgufFileTypeNames(),
                                                 ", got '", name, "'"));
}

std::string GgufModelFileName(GgufFileType type) {
  return absl::StrCat("model-", GgufFileTypeName(type), ".gguf");
}

absl::string_view GgufArchitectureOf(ModelFamily family) {
  switch (family) {
    case ModelFamily::kMixtral: return "llama";
    case ModelFamily::kQwen2Moe: return "qwen2moe";
    case ModelFamily::kQwen3Moe: return "qwen3moe";
    case ModelFamily::kOlmoe: return "olmoe";
    case ModelFamily::kGlm4Moe: return "glm4moe";
    case ModelFamily::kDeepseekV2:
    case ModelFamily::kDeepseekV3: return "deepseek2";
    case ModelFamily::kGptOss: return "gpt-oss";
  }
  return "";
}

GgufType GgufTensorTypeFor(GgufFileType file, GgufTensorKind kind,
                           absl::string_view gguf_name, int64_t row_length) {
  if (kind == GgufTensorKind::kVector || kind == GgufTensorKind::kRouter) return GgufType::kF32;
  if (file == GgufFileType::kMxfp4 && kind != GgufTensorKind::kExperts) return GgufType::kF32;
  GgufType wanted = RowOf(file).block;
  if (file == GgufFileType::kQ4_K_M && Q4KMSixBit(gguf_name)) wanted = GgufType::kQ6_K;
  return GgufTypeForRow(wanted, row_length);
}

absl::Status MakeGgufModel(const MakeModelOptions& options, GgufFileType type,
                           const std::string& path) {
  MakeModelOptions o = options;
  if (type == GgufFileType::kMxfp4) {
    if (o.arch != ModelFamily::kGptOss) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--gguf mxfp4 applies to gpt_oss's experts only (their checkpoints' format), not ",
          ModelFamilyName(o.arch), "; use one of q8_0 .. q6_k, q4_k_m"));
    }
    o.mxfp4 = true;
  } else if (o.mxfp4) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--gguf ", GgufFileTypeName(type),
        " quantizes float experts; MXFP4 experts are written by --gguf mxfp4"));
  }
  ASSIGN_OR_RETURN(ModelConfig c, ConfigFromOptions(o));
  RETURN_IF_ERROR(CheckExpressible(o, c, GgufArchitectureOf(c.family)));
  ASSIGN_OR_RETURN(TinyTokenizer tok,
                   MakeTinyTokenizer(static_cast<int32_t>(o.vocab), TinySpecialTokens()));
  GgufWriter w;
  RETURN_IF_ERROR(AddModelKeys(c, &w));
  RETURN_IF_ERROR(AddTokenizerKeys(tok.json, &w));
  RETURN_IF_ERROR(TensorWriter(o, c, type, &w).Run());
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!dir.empty()) std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat(dir.string(), ": cannot create: ", ec.message()));
  return w.Write(path);
}

}  // namespace moe
