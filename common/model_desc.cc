#include "common/model_desc.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "common/file_util.h"
#include "common/fp8.h"
#include "common/quant.h"
#include "common/gguf_model.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace moe {
namespace {

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Collects specs for one model; `H` is hidden_size throughout.
class SpecBuilder {
 public:
  SpecBuilder(const ModelConfig& c, BiasedExperts biased)
      : c_(c), biased_(biased) {}

  std::vector<TensorSpec> Build() {
    const int64_t v = c_.vocab_size, h = c_.hidden_size;
    Add("model.embed_tokens.weight", TensorRole::kEmbed, -1, -1, {v, h});
    Add("model.norm.weight", TensorRole::kFinalNorm, -1, -1, {h});
    if (!c_.tie_word_embeddings)
      Add("lm_head.weight", TensorRole::kLmHead, -1, -1, {v, h});
    for (int i = 0; i < c_.num_hidden_layers; ++i) {
      AddAttention(i);
      if (c_.moe_layer[i]) {
        AddMoe(i);
      } else {
        AddMlp(absl::StrCat(Layer(i), "mlp."), i, TensorRole::kMlpGate,
               c_.intermediate_size);
      }
    }
    return std::move(specs_);
  }

 private:
  static std::string Layer(int i) {
    return absl::StrCat("model.layers.", i, ".");
  }

  void Add(std::string name, TensorRole role, int layer, int expert,
           std::vector<int64_t> shape) {
    specs_.push_back({std::move(name), role, layer, expert, std::move(shape)});
  }
  void AddFused(std::string name, TensorRole role, int layer,
                std::vector<int64_t> shape, DType dtype = DType::kF32) {
    Add(std::move(name), role, layer, -1, std::move(shape));
    specs_.back().fused = true;
    specs_.back().dtype = dtype;
  }

  // A biased router and the fused experts (model_desc.h).
  void AddFusedMoe(int i) {
    const int64_t h = c_.hidden_size, e = c_.num_experts,
                  inter = c_.moe_intermediate_size;
    const std::string m = absl::StrCat(Layer(i), "mlp.");
    Add(m + "router.weight", TensorRole::kRouter, i, -1, {e, h});
    Add(m + "router.bias", TensorRole::kRouterBias, i, -1, {e});
    const std::string x = m + "experts.";
    if (c_.mxfp4) {
      AddFused(x + "gate_up_proj_blocks", TensorRole::kExpertGate, i,
               {e, 2 * inter, h / 32, 16}, DType::kU8);
      AddFused(x + "gate_up_proj_scales", TensorRole::kExpertGate, i,
               {e, 2 * inter, h / 32}, DType::kU8);
      AddFused(x + "down_proj_blocks", TensorRole::kExpertDown, i,
               {e, h, inter / 32, 16}, DType::kU8);
      AddFused(x + "down_proj_scales", TensorRole::kExpertDown, i,
               {e, h, inter / 32}, DType::kU8);
    } else {
      AddFused(x + "gate_up_proj", TensorRole::kExpertGate, i,
               {e, h, 2 * inter});
      AddFused(x + "down_proj", TensorRole::kExpertDown, i, {e, inter, h});
    }
    AddFused(x + "gate_up_proj_bias", TensorRole::kExpertGateBias, i,
             {e, 2 * inter});
    AddFused(x + "down_proj_bias", TensorRole::kExpertDownBias, i, {e, h});
  }

  // A biased router and biased experts, per expert (BiasedExperts).
  void AddPerExpertBiasedMoe(int i) {
    const int64_t h = c_.hidden_size, e = c_.num_experts,
                  inter = c_.moe_intermediate_size;
    const std::string m = absl::StrCat(Layer(i), "mlp.");
    Add(m + "router.weight", TensorRole::kRouter, i, -1, {e, h});
    Add(m + "router.bias", TensorRole::kRouterBias, i, -1, {e});
    for (int j = 0; j < e; ++j) {
      const std::string x = absl::StrCat(m, "experts.", j, ".");
      AddMlp(x, i, TensorRole::kExpertGate, inter, j);
      Add(x + "gate_proj.bias", TensorRole::kExpertGateBias, i, j, {inter});
      Add(x + "up_proj.bias", TensorRole::kExpertUpBias, i, j, {inter});
      Add(x + "down_proj.bias", TensorRole::kExpertDownBias, i, j, {h});
    }
  }

  // gate/up/down projections under `prefix`; `gate_role` is followed by its
  // up and down roles in the enum.
  void AddMlp(const std::string& prefix, int layer, TensorRole gate_role,
              int64_t inter, int expert = -1, const char* gate = "gate_proj",
              const char* up = "up_proj", const char* down = "down_proj") {
    const int64_t h = c_.hidden_size;
    auto role = [&](int k) {
      return static_cast<TensorRole>(static_cast<int>(gate_role) + k);
    };
    Add(absl::StrCat(prefix, gate, ".weight"), role(0), layer, expert,
        {inter, h});
    Add(absl::StrCat(prefix, up, ".weight"), role(1), layer, expert,
        {inter, h});
    Add(absl::StrCat(prefix, down, ".weight"), role(2), layer, expert,
        {h, inter});
  }

  // Latent attention: no k/v projections; see TensorRole.
  void AddMlaAttention(int i) {
    const MlaConfig& m = c_.mla;
    const int64_t h = c_.hidden_size, heads = c_.num_attention_heads;
    const int64_t q = heads * m.qk_head_dim();
    const std::string a = absl::StrCat(Layer(i), "self_attn.");
    if (m.q_lora_rank > 0) {
      Add(a + "q_a_proj.weight", TensorRole::kQAProj, i, -1,
          {m.q_lora_rank, h});
      Add(a + "q_a_layernorm.weight", TensorRole::kQANorm, i, -1,
          {m.q_lora_rank});
      Add(a + "q_b_proj.weight", TensorRole::kQBProj, i, -1,
          {q, m.q_lora_rank});
    } else {
      Add(a + "q_proj.weight", TensorRole::kQProj, i, -1, {q, h});
    }
    Add(a + "kv_a_proj_with_mqa.weight", TensorRole::kKvAProj, i, -1,
        {m.kv_lora_rank + m.qk_rope_head_dim, h});
    Add(a + "kv_a_layernorm.weight", TensorRole::kKvANorm, i, -1,
        {m.kv_lora_rank});
    Add(a + "kv_b_proj.weight", TensorRole::kKvBProj, i, -1,
        {heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank});
    Add(a + "o_proj.weight", TensorRole::kOProj, i, -1,
        {h, heads * m.v_head_dim});
  }

  void AddAttention(int i) {
    const int64_t h = c_.hidden_size;
    const int64_t q = c_.num_attention_heads * c_.head_dim;
    const int64_t kv = c_.num_key_value_heads * c_.head_dim;
    const std::string a = absl::StrCat(Layer(i), "self_attn.");
    Add(absl::StrCat(Layer(i), "input_layernorm.weight"),
        TensorRole::kInputNorm, i, -1, {h});
    Add(absl::StrCat(Layer(i), "post_attention_layernorm.weight"),
        TensorRole::kPostAttnNorm, i, -1, {h});
    if (c_.is_mla()) return AddMlaAttention(i);
    Add(a + "q_proj.weight", TensorRole::kQProj, i, -1, {q, h});
    Add(a + "k_proj.weight", TensorRole::kKProj, i, -1, {kv, h});
    Add(a + "v_proj.weight", TensorRole::kVProj, i, -1, {kv, h});
    Add(a + "o_proj.weight", TensorRole::kOProj, i, -1, {h, q});
    if (c_.qkv_bias) {
      Add(a + "q_proj.bias", TensorRole::kQBias, i, -1, {q});
      Add(a + "k_proj.bias", TensorRole::kKBias, i, -1, {kv});
      Add(a + "v_proj.bias", TensorRole::kVBias, i, -1, {kv});
    }
    if (c_.o_bias) Add(a + "o_proj.bias", TensorRole::kOBias, i, -1, {h});
    if (c_.has_attention_sinks()) {
      Add(a + "sinks", TensorRole::kSinks, i, -1, {c_.num_attention_heads});
    }
    if (c_.qk_norm == QkNorm::kPerHead) {
      Add(a + "q_norm.weight", TensorRole::kQNorm, i, -1, {c_.head_dim});
      Add(a + "k_norm.weight", TensorRole::kKNorm, i, -1, {c_.head_dim});
    } else if (c_.qk_norm == QkNorm::kFull) {
      Add(a + "q_norm.weight", TensorRole::kQNorm, i, -1, {q});
      Add(a + "k_norm.weight", TensorRole::kKNorm, i, -1, {kv});
    }
  }

  // Names from the family's row: model.layers.i.<moe_block>.<router_name>,
  // .experts.j.<expert_names>, .<shared_block>.
  void AddMoe(int i) {
    const int64_t h = c_.hidden_size, e = c_.num_experts,
                  inter = c_.moe_intermediate_size;
    if (c_.has_expert_biases()) {
      return biased_ == BiasedExperts::kFused ? AddFusedMoe(i)
                                              : AddPerExpertBiasedMoe(i);
    }
    const FamilyTraits& f = c_.traits();
    const std::string m = absl::StrCat(Layer(i), f.moe_block, ".");
    const std::string router = absl::StrCat(m, f.router_name, ".");
    Add(router + "weight", TensorRole::kRouter, i, -1, {e, h});
    if (c_.has_score_correction_bias()) {
      Add(router + "e_score_correction_bias", TensorRole::kScoreBias, i, -1,
          {e});
    }
    const std::string names[3] = {std::string(f.expert_names[0]),
                                  std::string(f.expert_names[1]),
                                  std::string(f.expert_names[2])};
    for (int j = 0; j < e; ++j) {
      AddMlp(absl::StrCat(m, "experts.", j, "."), i, TensorRole::kExpertGate,
             inter, j, names[0].c_str(), names[1].c_str(), names[2].c_str());
    }
    if (!c_.has_shared_expert()) return;
    AddMlp(absl::StrCat(m, f.shared_block, "."), i, TensorRole::kSharedGate,
           c_.shared_expert_intermediate_size);
    if (c_.has_shared_expert_gate()) {
      Add(m + "shared_expert_gate.weight", TensorRole::kSharedExpertGate, i, -1,
          {1, h});
    }
  }

  const ModelConfig& c_;
  const BiasedExperts biased_;
  std::vector<TensorSpec> specs_;
};

std::string Describe(const TensorSpec& s) {
  std::string out(TensorRoleName(s.role));
  if (s.layer >= 0) absl::StrAppend(&out, ", layer ", s.layer);
  if (s.expert >= 0) absl::StrAppend(&out, ", expert ", s.expert);
  return out;
}

}  // namespace

absl::string_view TensorRoleName(TensorRole role) {
  static constexpr absl::string_view kNames[] = {"embed",
                                                 "lm_head",
                                                 "final_norm",
                                                 "input_norm",
                                                 "post_attn_norm",
                                                 "q_proj",
                                                 "k_proj",
                                                 "v_proj",
                                                 "o_proj",
                                                 "q_bias",
                                                 "k_bias",
                                                 "v_bias",
                                                 "o_bias",
                                                 "q_norm",
                                                 "k_norm",
                                                 "router",
                                                 "expert_gate",
                                                 "expert_up",
                                                 "expert_down",
                                                 "shared_gate",
                                                 "shared_up",
                                                 "shared_down",
                                                 "shared_expert_gate",
                                                 "mlp_gate",
                                                 "mlp_up",
                                                 "mlp_down",
                                                 "q_a_proj",
                                                 "q_a_layernorm",
                                                 "q_b_proj",
                                                 "kv_a_proj_with_mqa",
                                                 "kv_a_layernorm",
                                                 "kv_b_proj",
                                                 "e_score_correction_bias",
                                                 "sinks",
                                                 "router_bias",
                                                 "expert_gate_bias",
                                                 "expert_up_bias",
                                                 "expert_down_bias"};
  static_assert(std::size(kNames) ==
                static_cast<size_t>(TensorRole::kExpertDownBias) + 1);
  return kNames[static_cast<size_t>(role)];
}

bool IsExpertRole(TensorRole role) {
  return role == TensorRole::kExpertGate || role == TensorRole::kExpertUp ||
         role == TensorRole::kExpertDown ||
         role == TensorRole::kExpertGateBias ||
         role == TensorRole::kExpertUpBias ||
         role == TensorRole::kExpertDownBias;
}

int ExpertSlot(TensorRole role) {
  switch (role) {
    case TensorRole::kExpertGate:
      return 0;
    case TensorRole::kExpertUp:
      return 1;
    case TensorRole::kExpertDown:
      return 2;
    case TensorRole::kExpertGateBias:
      return 3;
    case TensorRole::kExpertUpBias:
      return 4;
    case TensorRole::kExpertDownBias:
      return 5;
    default:
      MOE_CHECK(false) << "not an expert role: " << TensorRoleName(role);
      return 0;
  }
}

std::vector<TensorSpec> ExpectedTensors(const ModelConfig& config,
                                        BiasedExperts biased) {
  return SpecBuilder(config, biased).Build();
}

uint64_t ExpectedTensorCount(const ModelConfig& c, BiasedExperts biased) {
  uint64_t per_layer = 6;  // two norms, q/k/v/o
  if (c.qkv_bias) per_layer += 3;
  if (c.o_bias) per_layer += 1;
  if (c.qk_norm != QkNorm::kNone) per_layer += 2;
  // MLA: two norms, q (1 or 3), kv_a, kv_a_layernorm, kv_b, o.
  if (c.is_mla()) per_layer = (c.mla.q_lora_rank > 0 ? 9 : 7);
  if (c.has_attention_sinks()) per_layer += 1;
  const uint64_t moe = static_cast<uint64_t>(c.num_moe_layers());
  const uint64_t dense = static_cast<uint64_t>(c.num_hidden_layers) - moe;
  uint64_t per_moe = 1 + 3 * static_cast<uint64_t>(c.num_experts);
  if (c.has_shared_expert()) per_moe += c.has_shared_expert_gate() ? 4 : 3;
  if (c.has_score_correction_bias()) per_moe += 1;
  // Fused experts: router weight + bias, experts (2 or 4) + 2 biases.
  if (c.has_expert_biases()) {
    per_moe = biased == BiasedExperts::kFused
                  ? (c.mxfp4 ? 8 : 6)
                  : 2 + 6 * static_cast<uint64_t>(c.num_experts);
  }
  return (c.tie_word_embeddings ? 2 : 3) +
         per_layer * static_cast<uint64_t>(c.num_hidden_layers) +
         moe * per_moe + dense * 3;
}

int64_t RoutedExpertParams(const ModelConfig& c) {
  int64_t all = 0;
  for (const TensorSpec& s : ExpectedTensors(c)) {
    if (!IsExpertRole(s.role)) continue;
    int64_t n = 1;
    for (int64_t d : s.shape) n *= d;
    if (s.fused && s.dtype == DType::kU8) {
      if (absl::EndsWith(s.name, "_scales")) continue;  // MXFP4 scales are not weights
      n *= 2;                                           // two FP4 weights per byte
    }
    all += n;
  }
  const int64_t experts = int64_t{c.num_moe_layers()} * c.num_experts;
  return experts > 0 ? all / experts : 0;
}

absl::StatusOr<ModelDescription> ModelDescription::Open(
    const std::string& dir) {
  if (absl::EndsWith(dir, ".gguf") && IsRegularFile(dir)) {
    // A GGUF checkpoint: the config from its metadata, the tensors by our names.
    ASSIGN_OR_RETURN(std::unique_ptr<GgufCheckpoint> gguf, GgufCheckpoint::Open(dir));
    ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(dir));
    ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt,
                     Checkpoint::FromGguf(std::move(gguf), config, dir));
    return FromParts(std::move(config), std::move(ckpt));
  }
  ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(dir));
  ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, Checkpoint::Open(dir));
  return FromParts(std::move(config), std::move(ckpt));
}

absl::StatusOr<ModelDescription> ModelDescription::FromParts(
    ModelConfig config, std::unique_ptr<Checkpoint> ckpt) {
  ModelDescription desc;
  desc.config_ = std::move(config);
  desc.checkpoint_ = std::move(ckpt);
  // GGUF files split biased experts per projection (Checkpoint::FromGguf).
  const BiasedExperts biased = desc.checkpoint_->gguf() != nullptr
                                   ? BiasedExperts::kPerExpert
                                   : BiasedExperts::kFused;
  const uint64_t expected = ExpectedTensorCount(desc.config_, biased);
  const uint64_t held = desc.checkpoint_->names().size();
  if (expected > held + 1000 && expected > 4 * held) {
    // Do not materialise absurd tensor lists for a config that cannot match.
    return absl::InvalidArgumentError(absl::StrCat(
        desc.checkpoint_->dir(), ": config.json describes ", expected,
        " tensors but the checkpoint holds only ", held));
  }
  desc.specs_ = ExpectedTensors(desc.config_, biased);
  RETURN_IF_ERROR(desc.Index());
  return desc;
}

absl::Status ModelDescription::Index() {
  const std::string& dir = checkpoint_->dir();
  const int64_t num_experts = config_.num_experts;
  experts_.assign(static_cast<size_t>(config_.num_moe_layers() * num_experts),
                  {});
  const TensorSpec* first_missing = nullptr;
  int missing = 0;
  for (const TensorSpec& spec : specs_) {
    auto view = checkpoint_->Get(spec.name);
    if (!view.ok()) {
      if (first_missing == nullptr) first_missing = &spec;
      ++missing;
      continue;
    }
    if (spec.fused) {
      RETURN_IF_ERROR(IndexFusedExperts(spec));
      continue;
    }
    if (view->shape != spec.shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          dir, ": tensor '", spec.name, "' has shape ",
          ShapeString(view->shape), ", expected ", ShapeString(spec.shape),
          " for this config (", Describe(spec), ")"));
    }
    if (absl::Status s =
            ResolveWeightDType(*checkpoint_, spec.name, config_.fp8, &*view);
        !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(dir, ": tensor '", spec.name, "' ", s.message()));
    }
    if (!IsExpertRole(spec.role)) {
      dense_[{spec.role, spec.layer}] = *view;
      dense_bytes_ += view->nbytes + view->scales.nbytes;
      continue;
    }
    int moe = config_.MoeLayerIndex(spec.layer);
    experts_[static_cast<size_t>(moe * num_experts + spec.expert)]
            [ExpertSlot(spec.role)] = *view;
  }
  if (missing > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, ": checkpoint lacks tensor '", first_missing->name,
                     "' (", Describe(*first_missing), ")",
                     missing > 1 ? absl::StrCat(" and ", missing - 1, " more")
                                 : std::string()));
  }
  RETURN_IF_ERROR(IndexExpertTypes());
  if (config_.tie_word_embeddings)
    dense_[{TensorRole::kLmHead, -1}] = dense_[{TensorRole::kEmbed, -1}];
  return absl::OkStatus();
}

bool ModelDescription::HasDense(TensorRole role, int layer) const {
  return dense_.count({role, layer}) > 0;
}

absl::StatusOr<TensorView> ModelDescription::Dense(TensorRole role,
                                                   int layer) const {
  auto it = dense_.find({role, layer});
  if (it == dense_.end()) {
    return absl::NotFoundError(
        absl::StrCat("model has no ", TensorRoleName(role), " tensor",
                     layer >= 0 ? absl::StrCat(" in layer ", layer) : ""));
  }
  return it->second;
}

absl::StatusOr<TensorView> ModelDescription::Expert(int moe_layer, int expert,
                                                    TensorRole role) const {
  if (!IsExpertRole(role)) {
    return absl::InvalidArgumentError(
        absl::StrCat(TensorRoleName(role), " is not an expert role"));
  }
  if (moe_layer < 0 || moe_layer >= config_.num_moe_layers() || expert < 0 ||
      expert >= config_.num_experts) {
    return absl::InvalidArgumentError(
        absl::StrCat("expert (", moe_layer, ", ", expert,
                     ") out of range: ", config_.num_moe_layers(),
                     " MoE layers x ", config_.num_experts, " experts"));
  }
  if (ExpertSlot(role) >= 3 && !config_.has_expert_biases()) {
    return absl::InvalidArgumentError(absl::StrCat(
        ModelFamilyName(config_.family), " experts have no ",
        TensorRoleName(role)));
  }
  return experts_[static_cast<size_t>(moe_layer * config_.num_experts + expert)]
                 [ExpertSlot(role)];
}

absl::Status ModelDescription::IndexExpertTypes() {
  const int layers = config_.num_moe_layers();
  const int64_t n = config_.num_experts;
  layer_dtypes_.assign(static_cast<size_t>(layers), {});
  layer_bytes_.assign(static_cast<size_t>(layers), 0);
  static constexpr const char* kRoles[3] = {"gate", "up", "down"};
  for (int l = 0; l < layers && n > 0; ++l) {
    const std::array<TensorView, 6>& first = experts_[static_cast<size_t>(l * n)];
    layer_dtypes_[l] = {first[0].dtype, first[1].dtype, first[2].dtype};
    for (const TensorView& v : first) layer_bytes_[l] += v.nbytes + v.scales.nbytes;
    for (int64_t e = 1; e < n; ++e) {
      const std::array<TensorView, 6>& x = experts_[static_cast<size_t>(l * n + e)];
      for (int r = 0; r < 3; ++r) {
        if (x[r].dtype != first[r].dtype) {
          return absl::InvalidArgumentError(absl::StrCat(
              checkpoint_->dir(), ": expert ", e, " of MoE layer ", l, " has a ", kRoles[r],
              " of dtype ", DTypeName(x[r].dtype), " but expert 0's is ",
              DTypeName(first[r].dtype), "; the experts of a layer must share their dtypes"));
        }
      }
    }
  }
  if (layers > 0 && n > 0) {
    // Biased experts run in one dtype (Backend::BiasedExpertFfn).
    for (int l = 0; l < layers && config_.has_expert_biases(); ++l) {
      const ExpertDTypes& d = layer_dtypes_[l];
      if (!d.uniform()) {
        return absl::InvalidArgumentError(absl::StrCat(
            checkpoint_->dir(), ": the biased experts of MoE layer ", l,
            " have gate, up and down weights of dtypes ", DTypeName(d.gate), ", ",
            DTypeName(d.up), " and ", DTypeName(d.down), "; they must share one"));
      }
    }
    expert_dtype_ = WidestDType(layer_dtypes_);
    mixed_ = false;
    for (const ExpertDTypes& d : layer_dtypes_) {
      mixed_ |= !d.uniform() || d != layer_dtypes_[0];
    }
    bytes_per_expert_ = *std::max_element(layer_bytes_.begin(), layer_bytes_.end());
  }
  return absl::OkStatus();
}

uint64_t ModelDescription::routed_expert_bytes() const {
  uint64_t experts = 0;
  for (uint64_t b : layer_bytes_) experts += b * static_cast<uint64_t>(config_.num_experts);
  return experts;
}

uint64_t ModelDescription::total_bytes() const { return dense_bytes_ + routed_expert_bytes(); }

}  // namespace moe
