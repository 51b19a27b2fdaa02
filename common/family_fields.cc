#include "common/family_fields.h"

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace moe::config_internal {
namespace {

// The scored router's defaults: configuration_deepseek_v2.py, _v3.py and
// configuration_glm4_moe.py.
struct ScoredRouterDefaults {
  int64_t n_shared_experts, first_k_dense_replace;
  bool norm_topk_prob;
  double routed_scaling_factor;
  int64_t n_group, topk_group;
};

// The fields of a scored, group-limited router with shared experts
// (DeepSeek's layout, shared by glm4_moe).
void ReadScoredRouterFields(FieldReader& r, const FamilyDefaults& d,
                            const ScoredRouterDefaults& s, ModelConfig* c) {
  c->num_experts = r.Int("n_routed_experts", d.num_experts, "num_experts");
  c->moe_intermediate_size =
      r.Int("moe_intermediate_size", d.moe_intermediate_size);
  c->n_shared_experts = r.IsExplicitNull("n_shared_experts")
                            ? 0
                            : r.Int("n_shared_experts", s.n_shared_experts);
  c->shared_expert_intermediate_size =
      c->moe_intermediate_size * c->n_shared_experts;
  c->first_k_dense_replace =
      r.Int("first_k_dense_replace", s.first_k_dense_replace);
  c->norm_topk_prob = r.Bool("norm_topk_prob", s.norm_topk_prob);
  c->routed_scaling_factor =
      r.Double("routed_scaling_factor", s.routed_scaling_factor);
  c->n_group = r.Int("n_group", s.n_group);
  c->topk_group = r.Int("topk_group", s.topk_group);
}

// deepseek_v2 / deepseek_v3: the fields of configuration_deepseek_v2.py and
// configuration_deepseek_v3.py (transformers), plus those only DeepSeek's own
// modeling_deepseek.py reads (moe_layer_freq, scoring_func, topk_method for
// v3, the yarn mscale fields).
void ReadDeepseekFields(FieldReader& r, const FamilyDefaults& d,
                        ModelConfig* c) {
  const bool v3 = c->family == ModelFamily::kDeepseekV3;
  ReadScoredRouterFields(r, d,
                         v3 ? ScoredRouterDefaults{1, 3, true, 2.5, 8, 4}
                            : ScoredRouterDefaults{2, 0, false, 1.0, 1, 1},
                         c);
  c->moe_layer_freq = r.Int("moe_layer_freq", 1);
  const std::string scoring =
      r.String("scoring_func", v3 ? "sigmoid" : "softmax");
  const std::string method =
      r.String("topk_method", v3 ? "noaux_tc" : "greedy");
  if (scoring == "softmax") {
    c->scoring_func = ScoringFunc::kSoftmax;
  } else if (scoring == "sigmoid") {
    c->scoring_func = ScoringFunc::kSigmoid;
  } else {
    r.Fail(absl::StrCat("scoring_func '", scoring,
                        "' is not supported (softmax, sigmoid)"));
  }
  // "gready" is the spelling of modeling_deepseek.py's default for v2.
  if (method == "greedy" || method == "gready") {
    c->topk_method = TopkMethod::kGreedy;
  } else if (method == "group_limited_greedy") {
    c->topk_method = TopkMethod::kGroupLimitedGreedy;
  } else if (method == "noaux_tc") {
    c->topk_method = TopkMethod::kNoauxTc;
  } else {
    r.Fail(absl::StrCat("topk_method '", method,
                        "' is not supported (greedy, group_limited_greedy, "
                        "noaux_tc)"));
  }
  MlaConfig& m = c->mla;
  m.q_lora_rank =
      r.IsExplicitNull("q_lora_rank") ? 0 : r.Int("q_lora_rank", 1536);
  m.kv_lora_rank = r.Int("kv_lora_rank", 512);
  m.qk_nope_head_dim = r.Int("qk_nope_head_dim", 128);
  m.qk_rope_head_dim = r.Int("qk_rope_head_dim", 64);
  m.v_head_dim = r.Int("v_head_dim", 128);
  c->head_dim = m.qk_head_dim();
  c->qkv_bias = c->o_bias = r.Bool("attention_bias", false);
  if (c->rope_scaling_type == "yarn") {
    const nlohmann::json* s = r.Find("rope_scaling");
    if (s == nullptr) s = r.Find("rope_parameters");
    const char* obj = "rope_scaling";
    YarnConfig y;
    y.factor = r.SubDouble(*s, obj, "factor", 1.0);
    y.original_max_position_embeddings =
        r.SubInt(*s, obj, "original_max_position_embeddings", 4096);
    y.beta_fast = r.SubDouble(*s, obj, "beta_fast", 32);
    y.beta_slow = r.SubDouble(*s, obj, "beta_slow", 1);
    y.mscale = r.SubDouble(*s, obj, "mscale", 1);
    y.mscale_all_dim = r.SubDouble(*s, obj, "mscale_all_dim", 0);
    c->yarn = y;
  }
}

// glm4_moe: configuration_glm4_moe.py. DeepSeek-V3's router (sigmoid,
// e_score_correction_bias, groups) with grouped-query attention: q/k/v
// biases (attention_bias), optional per-head q/k RMSNorm (use_qk_norm) and
// rope over the first head_dim * partial_rotary_factor values.
void ReadGlmFields(FieldReader& r, const FamilyDefaults& d, ModelConfig* c) {
  ReadScoredRouterFields(r, d, {1, 1, true, 1.0, 1, 1}, c);
  c->scoring_func = ScoringFunc::kSigmoid;
  c->topk_method = TopkMethod::kNoauxTc;
  c->qkv_bias = r.Bool("attention_bias", false);
  if (r.Bool("use_qk_norm", false)) c->qk_norm = QkNorm::kPerHead;
  c->partial_rotary_factor = r.Double("partial_rotary_factor", 0.5);
  c->num_nextn_predict_layers = r.Int("num_nextn_predict_layers", 0);
  if (!(c->partial_rotary_factor > 0 && c->partial_rotary_factor <= 1)) {
    r.Fail(absl::StrCat("partial_rotary_factor must be in (0, 1], got ",
                        c->partial_rotary_factor));
  }
}


// gpt_oss: configuration_gpt_oss.py. Defaults as GptOssConfig:
// sliding_window 128, layer_types alternating sliding ("sliding_attention"
// on even layers) and full attention, attention_bias true, swiglu_limit 7.0,
// swiglu_alpha 1.702, rope_theta 150000 and, when config.json has neither
// rope_scaling nor rope_parameters, YaRN {factor 32, beta_fast 32, beta_slow
// 1, original_max_position_embeddings 4096, truncate false}.

// rope_scaling (or rope_parameters) of type yarn; the defaults of
// _compute_yarn_parameters, with GptOssConfig's when the field is absent.
void ReadYarn(FieldReader& r, ModelConfig* c) {
  const json* s = r.Find("rope_scaling");
  if (s == nullptr) s = r.Find("rope_parameters");
  YarnConfig y;
  y.factor = 32.0;
  y.truncate = false;
  if (s == nullptr) {
    c->rope_scaling_type = "yarn";
    c->yarn = y;
    return;
  }
  if (c->rope_scaling_type != "yarn") {
    if (!c->rope_scaling_type.empty()) {
      r.Fail(absl::StrCat("gpt_oss rope type '", c->rope_scaling_type,
                          "' is not supported (yarn or default)"));
    }
    return;  // plain rope
  }
  const char* obj = "rope_scaling";
  y.factor = r.SubDouble(*s, obj, "factor", 1.0);
  y.beta_fast = r.SubDouble(*s, obj, "beta_fast", 32);
  y.beta_slow = r.SubDouble(*s, obj, "beta_slow", 1);
  y.original_max_position_embeddings = r.SubInt(
      *s, obj, "original_max_position_embeddings", c->max_position_embeddings);
  auto t = s->find("truncate");
  y.truncate = true;  // _compute_yarn_parameters' default
  if (t != s->end() && !t->is_null()) {
    if (!t->is_boolean()) {
      r.Fail("rope_scaling.truncate must be true or false");
    } else {
      y.truncate = t->get<bool>();
    }
  }
  if (s->contains("attention_factor") || s->contains("mscale")) {
    r.Fail(
        "rope_scaling.attention_factor / mscale are not supported for "
        "gpt_oss");
  }
  c->yarn = y;
}

void ReadLayerTypes(FieldReader& r, ModelConfig* c) {
  std::vector<bool>& sliding = c->sliding_layers;
  sliding.clear();
  const json* types = r.Find("layer_types");
  if (types == nullptr) {
    for (int64_t i = 0; i < c->num_hidden_layers; ++i) {
      sliding.push_back((i + 1) % 2 != 0);
    }
    return;
  }
  if (!types->is_array()) return r.Fail("layer_types must be a list");
  for (const json& t : *types) {
    if (t == "sliding_attention") {
      sliding.push_back(true);
    } else if (t == "full_attention") {
      sliding.push_back(false);
    } else {
      return r.Fail(absl::StrCat("layer_types entry ", t.dump(),
                                 " is not \"sliding_attention\" or "
                                 "\"full_attention\""));
    }
  }
}

void ReadQuantization(FieldReader& r, ModelConfig* c) {
  const json* q = r.Find("quantization_config");
  if (q == nullptr) return;
  if (!q->is_object()) return r.Fail("quantization_config is not an object");
  auto m = q->find("quant_method");
  if (m == q->end() || !m->is_string() || *m != "mxfp4") {
    return r.Fail(
        absl::StrCat("quantization_config quant_method ",
                     m == q->end() ? std::string("(missing)") : m->dump(),
                     " is not supported for gpt_oss (supported: \"mxfp4\")"));
  }
  Mxfp4Scheme& scheme = c->mxfp4.emplace();
  auto keep = q->find("modules_to_not_convert");
  if (keep != q->end() && keep->is_array()) {
    for (const json& k : *keep) {
      if (k.is_string()) scheme.modules_to_not_convert.push_back(k);
    }
  }
}

void ScoredRouterFieldsToJson(const ModelConfig& c,
                              nlohmann::ordered_json& j) {
  j["n_routed_experts"] = c.num_experts;
  j["n_shared_experts"] =
      c.n_shared_experts > 0 ? json(c.n_shared_experts) : json(nullptr);
  j["moe_intermediate_size"] = c.moe_intermediate_size;
  j["first_k_dense_replace"] = c.first_k_dense_replace;
  j["norm_topk_prob"] = c.norm_topk_prob;
  j["routed_scaling_factor"] = c.routed_scaling_factor;
  j["n_group"] = c.n_group;
  j["topk_group"] = c.topk_group;
}

void GlmFieldsToJson(const ModelConfig& c, nlohmann::ordered_json& j) {
  ScoredRouterFieldsToJson(c, j);
  j["attention_bias"] = c.qkv_bias;
  j["use_qk_norm"] = c.qk_norm == QkNorm::kPerHead;
  j["partial_rotary_factor"] = c.partial_rotary_factor;
  j["num_nextn_predict_layers"] = c.num_nextn_predict_layers;
}

void DeepseekFieldsToJson(const ModelConfig& c, nlohmann::ordered_json& j) {
  static constexpr const char* kMethods[] = {"greedy", "group_limited_greedy",
                                             "noaux_tc"};
  ScoredRouterFieldsToJson(c, j);
  j["moe_layer_freq"] = c.moe_layer_freq;
  j["scoring_func"] =
      c.scoring_func == ScoringFunc::kSigmoid ? "sigmoid" : "softmax";
  j["topk_method"] = kMethods[static_cast<int>(c.topk_method)];
  j["q_lora_rank"] =
      c.mla.q_lora_rank > 0 ? json(c.mla.q_lora_rank) : json(nullptr);
  j["kv_lora_rank"] = c.mla.kv_lora_rank;
  j["qk_nope_head_dim"] = c.mla.qk_nope_head_dim;
  j["qk_rope_head_dim"] = c.mla.qk_rope_head_dim;
  j["v_head_dim"] = c.mla.v_head_dim;
  j["attention_bias"] = c.qkv_bias;
  if (c.family == ModelFamily::kDeepseekV3) j["rope_interleave"] = true;
}


void ReadGptOssFields(FieldReader& r, ModelConfig* c) {
  c->num_experts =
      r.Int("num_local_experts", r.Int("num_experts", 128, "num_experts"),
            "num_experts");
  c->moe_intermediate_size = c->intermediate_size;
  c->norm_topk_prob = true;  // softmax over the top-k logits
  c->head_dim = r.Int("head_dim", 64);
  c->sliding_window =
      r.IsExplicitNull("sliding_window") ? 0 : r.Int("sliding_window", 128);
  c->qkv_bias = c->o_bias = r.Bool("attention_bias", true);
  c->swiglu_limit = r.Double("swiglu_limit", 7.0);
  c->swiglu_alpha = r.Double("swiglu_alpha", 1.702);
  c->initial_context_length = r.Int("initial_context_length", 4096);
  ReadLayerTypes(r, c);
  ReadYarn(r, c);
  ReadQuantization(r, c);
}

absl::Status CheckGptOss(const ModelConfig& c) {
  if (static_cast<int64_t>(c.sliding_layers.size()) != c.num_hidden_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer_types has ", c.sliding_layers.size(),
                     " entries for ", c.num_hidden_layers, " layers"));
  }
  if (!(c.swiglu_limit > 0) || !std::isfinite(c.swiglu_limit) ||
      !std::isfinite(c.swiglu_alpha)) {
    return absl::InvalidArgumentError(
        "swiglu_limit must be positive and finite, swiglu_alpha finite");
  }
  if (c.head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("head_dim must be even for rope, got ", c.head_dim));
  }
  if (!c.qkv_bias) {
    return absl::InvalidArgumentError(
        "gpt_oss without attention_bias is not supported");
  }
  if (c.mxfp4 && (c.hidden_size % 32 != 0 || c.intermediate_size % 32 != 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("MXFP4 experts need hidden_size (", c.hidden_size,
                     ") and intermediate_size (", c.intermediate_size,
                     ") to be multiples of 32"));
  }
  if (c.yarn.has_value()) {
    const YarnConfig& y = *c.yarn;
    if (!(y.factor >= 1.0) || !std::isfinite(y.factor) || !(y.beta_fast > 0) ||
        !(y.beta_slow > 0) || !std::isfinite(y.beta_fast) ||
        y.original_max_position_embeddings < 1) {
      return absl::InvalidArgumentError(
          "rope_scaling: factor must be >= 1, beta_fast and beta_slow "
          "positive, original_max_position_embeddings positive");
    }
  }
  return absl::OkStatus();
}

void GptOssFieldsToJson(const ModelConfig& c, nlohmann::ordered_json& j) {
  j["num_local_experts"] = c.num_experts;
  j["experts_per_token"] = c.top_k;
  j["sliding_window"] =
      c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
  std::vector<std::string> types;
  for (bool s : c.sliding_layers) {
    types.push_back(s ? "sliding_attention" : "full_attention");
  }
  j["layer_types"] = types;
  j["attention_bias"] = c.qkv_bias;
  j["swiglu_limit"] = c.swiglu_limit;
  j["initial_context_length"] = c.initial_context_length;
  if (c.yarn.has_value()) {
    const YarnConfig& y = *c.yarn;
    j["rope_scaling"] = {{"beta_fast", y.beta_fast},
                         {"beta_slow", y.beta_slow},
                         {"factor", y.factor},
                         {"original_max_position_embeddings",
                          y.original_max_position_embeddings},
                         {"rope_type", "yarn"},
                         {"truncate", y.truncate}};
  } else {
    j["rope_scaling"] = {{"rope_type", "default"}};  // null means YaRN here
  }
  if (c.mxfp4) {
    j["quantization_config"] = {
        {"modules_to_not_convert", c.mxfp4->modules_to_not_convert},
        {"quant_method", "mxfp4"}};
  }
}

}  // namespace

// Fields whose meaning differs between families.
void ReadFamilyFields(FieldReader& r, const FamilyDefaults& d, ModelConfig* c) {
  switch (c->family) {
    case ModelFamily::kMixtral:
      c->num_experts =
          r.Int("num_local_experts", r.Int("num_experts", d.num_experts),
                "num_experts");
      c->moe_intermediate_size = c->intermediate_size;
      c->norm_topk_prob = true;  // MixtralSparseMoeBlock always renormalises
      c->sliding_window = r.Int("sliding_window", 0);
      break;
    case ModelFamily::kQwen2Moe:
    case ModelFamily::kQwen3Moe: {
      bool qwen2 = c->family == ModelFamily::kQwen2Moe;
      c->num_experts =
          r.Int("num_experts",
                r.Int("num_local_experts", d.num_experts, "num_experts"));
      c->moe_intermediate_size =
          r.Int("moe_intermediate_size", d.moe_intermediate_size);
      c->norm_topk_prob = r.Bool("norm_topk_prob", false);
      c->decoder_sparse_step = r.Int("decoder_sparse_step", 1);
      c->mlp_only_layers = r.IntList("mlp_only_layers");
      if (r.Bool("use_sliding_window", false))
        c->sliding_window = r.Int("sliding_window", 4096);
      if (qwen2) {
        c->shared_expert_intermediate_size =
            r.Int("shared_expert_intermediate_size",
                  d.shared_expert_intermediate_size);
        c->qkv_bias = r.Bool("qkv_bias", true);
      } else {
        c->qkv_bias = c->o_bias = r.Bool("attention_bias", false);
        c->qk_norm = QkNorm::kPerHead;
      }
      break;
    }
    case ModelFamily::kOlmoe:
      c->num_experts =
          r.Int("num_experts",
                r.Int("num_local_experts", d.num_experts, "num_experts"));
      c->moe_intermediate_size = c->intermediate_size;
      c->norm_topk_prob = r.Bool("norm_topk_prob", false);
      c->qkv_bias = c->o_bias = r.Bool("attention_bias", false);
      c->qk_norm = QkNorm::kFull;
      if (r.Has("clip_qkv")) c->clip_qkv = r.Double("clip_qkv", 0);
      break;
    case ModelFamily::kDeepseekV2:
    case ModelFamily::kDeepseekV3:
      ReadDeepseekFields(r, d, c);
      break;
    case ModelFamily::kGptOss:
      ReadGptOssFields(r, c);
      break;
    case ModelFamily::kGlm4Moe:
      ReadGlmFields(r, d, c);
      break;
  }
}

absl::Status CheckRouterVariant(const ModelConfig& c) {
  const bool v3 = c.family != ModelFamily::kDeepseekV2;
  // The combinations DeepSeek's modeling code implements (glm4_moe routes
  // as deepseek_v3 does).
  if (v3 && (c.scoring_func != ScoringFunc::kSigmoid ||
             c.topk_method != TopkMethod::kNoauxTc)) {
    return absl::InvalidArgumentError(
        "deepseek_v3 routes with scoring_func sigmoid and topk_method "
        "noaux_tc only");
  }
  if (!v3 && (c.scoring_func != ScoringFunc::kSoftmax ||
              c.topk_method == TopkMethod::kNoauxTc)) {
    return absl::InvalidArgumentError(
        "deepseek_v2 routes with scoring_func softmax and topk_method greedy "
        "or group_limited_greedy only");
  }
  return absl::OkStatus();
}

absl::Status CheckFamilyFields(const ModelConfig& c) {
  if (c.family == ModelFamily::kGptOss) return CheckGptOss(c);
  return absl::OkStatus();
}

void FamilyFieldsToJson(const ModelConfig& c, nlohmann::ordered_json& j) {
  switch (c.family) {
    case ModelFamily::kMixtral:
      j["num_local_experts"] = c.num_experts;
      j["sliding_window"] =
          c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
      break;
    case ModelFamily::kQwen2Moe:
    case ModelFamily::kQwen3Moe:
      j["num_experts"] = c.num_experts;
      j["moe_intermediate_size"] = c.moe_intermediate_size;
      if (c.has_shared_expert()) {
        j["shared_expert_intermediate_size"] =
            c.shared_expert_intermediate_size;
        if (!c.qkv_bias)
          j["qkv_bias"] = false;  // transformers' default is true
      } else {
        j["attention_bias"] = c.qkv_bias;
      }
      j["norm_topk_prob"] = c.norm_topk_prob;
      j["decoder_sparse_step"] = c.decoder_sparse_step;
      j["mlp_only_layers"] = c.mlp_only_layers;
      j["use_sliding_window"] = c.sliding_window > 0;
      j["sliding_window"] =
          c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
      break;
    case ModelFamily::kOlmoe:
      j["num_experts"] = c.num_experts;
      j["norm_topk_prob"] = c.norm_topk_prob;
      j["attention_bias"] = c.qkv_bias;
      j["clip_qkv"] = c.clip_qkv ? json(*c.clip_qkv) : json(nullptr);
      break;
    case ModelFamily::kDeepseekV2:
    case ModelFamily::kDeepseekV3:
      DeepseekFieldsToJson(c, j);
      break;
    case ModelFamily::kGptOss:
      GptOssFieldsToJson(c, j);
      break;
    case ModelFamily::kGlm4Moe:
      GlmFieldsToJson(c, j);
      break;
  }
}

}  // namespace moe::config_internal
