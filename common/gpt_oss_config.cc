#include "common/gpt_oss_config.h"

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace moe::config_internal {
namespace {

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
  GptOssFields& g = c->gpt_oss;
  g.sliding_layers.clear();
  const json* types = r.Find("layer_types");
  if (types == nullptr) {
    for (int64_t i = 0; i < c->num_hidden_layers; ++i) {
      g.sliding_layers.push_back((i + 1) % 2 != 0);
    }
    return;
  }
  if (!types->is_array()) return r.Fail("layer_types must be a list");
  for (const json& t : *types) {
    if (t == "sliding_attention") {
      g.sliding_layers.push_back(true);
    } else if (t == "full_attention") {
      g.sliding_layers.push_back(false);
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
  c->gpt_oss.mxfp4 = true;
  auto keep = q->find("modules_to_not_convert");
  if (keep != q->end() && keep->is_array()) {
    for (const json& k : *keep) {
      if (k.is_string()) c->gpt_oss.modules_to_not_convert.push_back(k);
    }
  }
}

}  // namespace

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
  GptOssFields& g = c->gpt_oss;
  g.swiglu_limit = r.Double("swiglu_limit", 7.0);
  g.swiglu_alpha = r.Double("swiglu_alpha", 1.702);
  g.initial_context_length = r.Int("initial_context_length", 4096);
  ReadLayerTypes(r, c);
  ReadYarn(r, c);
  ReadQuantization(r, c);
}

absl::Status CheckGptOss(const ModelConfig& c) {
  const GptOssFields& g = c.gpt_oss;
  if (static_cast<int64_t>(g.sliding_layers.size()) != c.num_hidden_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer_types has ", g.sliding_layers.size(),
                     " entries for ", c.num_hidden_layers, " layers"));
  }
  if (!(g.swiglu_limit > 0) || !std::isfinite(g.swiglu_limit) ||
      !std::isfinite(g.swiglu_alpha)) {
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
  if (g.mxfp4 && (c.hidden_size % 32 != 0 || c.intermediate_size % 32 != 0)) {
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
  const GptOssFields& g = c.gpt_oss;
  j["num_local_experts"] = c.num_experts;
  j["experts_per_token"] = c.top_k;
  j["sliding_window"] =
      c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
  std::vector<std::string> types;
  for (bool s : g.sliding_layers) {
    types.push_back(s ? "sliding_attention" : "full_attention");
  }
  j["layer_types"] = types;
  j["attention_bias"] = c.qkv_bias;
  j["swiglu_limit"] = g.swiglu_limit;
  j["initial_context_length"] = g.initial_context_length;
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
  if (g.mxfp4) {
    j["quantization_config"] = {
        {"modules_to_not_convert", g.modules_to_not_convert},
        {"quant_method", "mxfp4"}};
  }
}

}  // namespace moe::config_internal
