// moectl plan on the published config.json files of every supported family:
// its parameter, expert, dense and KV figures against counts written here
// from each architecture (not from the planner's code), the published
// totals, and `fits` for a 24 GB GPU + 128 GB host and an 8 GB GPU + 32 GB
// host.
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/flags.h"
#include "common/model_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/plan/plan.h"
#include "services/plan/predict.h"
#include "tests/common/test_util.h"

namespace moe {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr double kGiB = 1024.0 * 1024 * 1024;

// ---- Published config.json files (Hugging Face, as released). -----------

constexpr char kMixtral8x7B[] = R"({
  "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0,
  "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
  "max_position_embeddings": 32768, "model_type": "mixtral",
  "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32,
  "num_key_value_heads": 8, "num_local_experts": 8, "output_router_logits": false,
  "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02,
  "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.36.0.dev0", "use_cache": true, "vocab_size": 32000})";

constexpr char kQwen15MoE[] = R"({
  "architectures": ["Qwen2MoeForCausalLM"], "bos_token_id": 151643,
  "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 2048,
  "intermediate_size": 5632, "max_position_embeddings": 8192,
  "max_window_layers": 21, "model_type": "qwen2_moe", "num_attention_heads": 16,
  "num_hidden_layers": 24, "num_key_value_heads": 16, "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "use_cache": true, "use_sliding_window": false,
  "vocab_size": 151936, "decoder_sparse_step": 1, "moe_intermediate_size": 1408,
  "shared_expert_intermediate_size": 5632, "num_experts_per_tok": 4,
  "num_experts": 60, "norm_topk_prob": false, "router_aux_loss_coef": 0.001})";

constexpr char kQwen3_30B[] = R"({
  "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false,
  "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645,
  "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048,
  "intermediate_size": 6144, "max_position_embeddings": 40960,
  "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
  "norm_topk_prob": true, "num_attention_heads": 32, "num_experts": 128,
  "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000.0,
  "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "use_sliding_window": false, "vocab_size": 151936})";

constexpr char kQwen3_235B[] = R"({
  "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false,
  "attention_dropout": 0.0, "bos_token_id": 151643, "decoder_sparse_step": 1,
  "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 12288,
  "max_position_embeddings": 40960, "max_window_layers": 94,
  "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 1536,
  "norm_topk_prob": true, "num_attention_heads": 64, "num_experts": 128,
  "num_experts_per_tok": 8, "num_hidden_layers": 94, "num_key_value_heads": 4,
  "output_router_logits": false, "rms_norm_eps": 1e-06, "rope_scaling": null,
  "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001, "sliding_window": null,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_cache": true,
  "use_sliding_window": false, "vocab_size": 151936})";

constexpr char kOlmoe1B7B[] = R"({
  "architectures": ["OlmoeForCausalLM"], "attention_bias": false,
  "clip_qkv": null, "eos_token_id": 50279, "hidden_act": "silu",
  "hidden_size": 2048, "intermediate_size": 1024, "max_position_embeddings": 4096,
  "model_type": "olmoe", "norm_topk_prob": false, "num_attention_heads": 16,
  "num_experts": 64, "num_experts_per_tok": 8, "num_hidden_layers": 16,
  "num_key_value_heads": 16, "pad_token_id": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": null, "rope_theta": 10000.0, "tie_word_embeddings": false,
  "vocab_size": 50304})";

constexpr char kDeepseekV2Lite[] = R"({
  "architectures": ["DeepseekV2ForCausalLM"], "attention_bias": false,
  "attention_dropout": 0.0, "aux_loss_alpha": 0.001, "bos_token_id": 100000,
  "eos_token_id": 100001, "first_k_dense_replace": 1, "hidden_act": "silu",
  "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 10944,
  "kv_lora_rank": 512, "max_position_embeddings": 163840,
  "model_type": "deepseek_v2", "moe_intermediate_size": 1408,
  "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 64,
  "n_shared_experts": 2, "norm_topk_prob": false, "num_attention_heads": 16,
  "num_experts_per_tok": 6, "num_hidden_layers": 27, "num_key_value_heads": 16,
  "pretraining_tp": 1, "q_lora_rank": null, "qk_nope_head_dim": 128,
  "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40,
    "mscale": 0.707, "mscale_all_dim": 0.707,
    "original_max_position_embeddings": 4096, "type": "yarn"},
  "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax",
  "seq_aux": true, "tie_word_embeddings": false, "topk_group": 1,
  "topk_method": "greedy", "torch_dtype": "bfloat16", "use_cache": true,
  "v_head_dim": 128, "vocab_size": 102400})";

constexpr char kDeepseekV3[] = R"({
  "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": false,
  "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1,
  "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168,
  "intermediate_size": 18432, "kv_lora_rank": 512,
  "max_position_embeddings": 163840, "model_type": "deepseek_v3",
  "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8,
  "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": true,
  "num_attention_heads": 128, "num_experts_per_tok": 8,
  "num_hidden_layers": 61, "num_key_value_heads": 128,
  "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
  "qk_rope_head_dim": 64,
  "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
    "quant_method": "fp8", "weight_block_size": [128, 128]},
  "rms_norm_eps": 1e-06,
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40,
    "mscale": 1.0, "mscale_all_dim": 1.0,
    "original_max_position_embeddings": 4096, "type": "yarn"},
  "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
  "tie_word_embeddings": false, "topk_group": 4, "topk_method": "noaux_tc",
  "torch_dtype": "bfloat16", "v_head_dim": 128, "vocab_size": 129280})";

std::string LayerTypes(int n) {
  std::string s = "[";
  for (int i = 0; i < n; ++i) {
    absl::StrAppend(&s, i ? ", " : "",
                    i % 2 == 0 ? "\"sliding_attention\"" : "\"full_attention\"");
  }
  return s + "]";
}

// openai/gpt-oss-20b and gpt-oss-120b: the same but for depth and experts.
std::string GptOss(int layers, int experts) {
  return absl::StrCat(R"({
  "architectures": ["GptOssForCausalLM"], "attention_bias": true,
  "attention_dropout": 0.0, "eos_token_id": 200002, "experts_per_token": 4,
  "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880,
  "initial_context_length": 4096, "initializer_range": 0.02,
  "intermediate_size": 2880, "layer_types": )",
                      LayerTypes(layers), R"(,
  "max_position_embeddings": 131072, "model_type": "gpt_oss",
  "num_attention_heads": 64, "num_experts_per_tok": 4, "num_hidden_layers": )",
                      layers, R"(,
  "num_key_value_heads": 8, "num_local_experts": )",
                      experts, R"(,
  "output_router_logits": false, "pad_token_id": 199999,
  "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn",
    "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"],
    "quant_method": "mxfp4"},
  "rms_norm_eps": 1e-05,
  "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
    "original_max_position_embeddings": 4096, "rope_type": "yarn",
    "truncate": false},
  "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128,
  "swiglu_limit": 7.0, "tie_word_embeddings": false,
  "transformers_version": "4.55.0.dev0", "use_cache": true,
  "vocab_size": 201088})");
}

constexpr char kGlm45Air[] = R"({
  "architectures": ["Glm4MoeForCausalLM"], "attention_bias": true,
  "attention_dropout": 0.0, "pad_token_id": 151329,
  "eos_token_id": [151329, 151336, 151338], "hidden_act": "silu",
  "head_dim": 128, "hidden_size": 4096, "partial_rotary_factor": 0.5,
  "initializer_range": 0.02, "intermediate_size": 10944,
  "max_position_embeddings": 131072, "model_type": "glm4_moe",
  "moe_intermediate_size": 1408, "norm_topk_prob": true,
  "num_attention_heads": 96, "n_group": 1, "topk_group": 1,
  "n_routed_experts": 128, "n_shared_experts": 1, "routed_scaling_factor": 1.0,
  "num_experts_per_tok": 8, "first_k_dense_replace": 1, "num_hidden_layers": 46,
  "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_scaling": null,
  "rope_theta": 1000000, "num_nextn_predict_layers": 1,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.54.0", "use_cache": true, "use_qk_norm": false,
  "vocab_size": 151552})";

// ---- The architectures, counted by hand. ---------------------------------

// One model's shape as its paper and modelling code describe it.
struct Arch {
  const char* name;
  std::string config;
  double published_params;  // the total its authors give
  int64_t layers, hidden, vocab, heads, kv_heads, head_dim;
  int64_t experts, top_k, expert_inter;
  int64_t dense_layers = 0, dense_inter = 0;  // leading dense-MLP layers
  int64_t shared_inter = 0;                   // shared expert width (0: none)
  bool shared_gate = false;                   // qwen2_moe's sigmoid gate [1, hidden]
  bool qkv_bias = false, o_bias = false;
  int qk_norm = 0;  // 0 none, 1 per head [head_dim] x2, 2 whole [q] + [kv]
  // Multi-head latent attention (DeepSeek): ranks and head parts.
  int64_t q_lora = -1, kv_lora = 0, nope = 0, rope = 0, v_dim = 0;
  bool score_bias = false;    // e_score_correction_bias [experts]
  bool gpt_oss = false;       // sinks, router bias, biased experts
  enum Store { kBf16, kFp8, kMxfp4 } store = kBf16;
};

struct Counts {
  double params = 0;         // every weight
  double expert_params = 0;  // one routed expert, with biases
  double matrix_params = 0;  // non-expert 2-D weights
  double vector_params = 0;  // non-expert 1-D weights
  double kv_per_token = 0;   // f32, all layers
};

double AttentionParams(const Arch& a, double* vectors) {
  const double h = a.hidden;
  if (a.kv_lora > 0) {
    const double qk = a.nope + a.rope;
    double q = a.q_lora > 0 ? h * a.q_lora + a.q_lora * a.heads * qk : h * a.heads * qk;
    if (a.q_lora > 0) *vectors += a.q_lora;  // q_a_layernorm
    *vectors += a.kv_lora;                   // kv_a_layernorm
    return q + h * (a.kv_lora + a.rope) + a.kv_lora * a.heads * (a.nope + a.v_dim) +
           a.heads * a.v_dim * h;
  }
  const double q = a.heads * a.head_dim, kv = a.kv_heads * a.head_dim;
  if (a.qkv_bias) *vectors += q + 2 * kv;
  if (a.o_bias) *vectors += h;
  if (a.qk_norm == 1) *vectors += 2 * a.head_dim;
  if (a.qk_norm == 2) *vectors += q + kv;
  if (a.gpt_oss) *vectors += a.heads;  // sinks
  return h * q + 2 * h * kv + q * h;
}

Counts Count(const Arch& a) {
  Counts c;
  const double h = a.hidden;
  const double moe_layers = a.layers - a.dense_layers;
  c.expert_params = 3 * h * a.expert_inter + (a.gpt_oss ? 2 * a.expert_inter + h : 0);
  double vectors = h;                // final norm
  double matrices = 2 * a.vocab * h; // embedding and lm_head (untied in all of these)
  for (int64_t l = 0; l < a.layers; ++l) {
    vectors += 2 * h;  // input and post-attention norms
    matrices += AttentionParams(a, &vectors);
  }
  matrices += a.dense_layers * 3 * h * a.dense_inter;
  matrices += moe_layers * a.experts * h;  // routers
  if (a.gpt_oss) vectors += moe_layers * a.experts;
  if (a.score_bias) vectors += moe_layers * a.experts;
  matrices += moe_layers * 3 * h * a.shared_inter;
  if (a.shared_gate) matrices += moe_layers * h;
  c.matrix_params = matrices;
  c.vector_params = vectors;
  c.params = matrices + vectors + moe_layers * a.experts * c.expert_params;
  const double widths = a.kv_lora > 0 ? a.kv_lora + a.rope : 2.0 * a.kv_heads * a.head_dim;
  c.kv_per_token = 4.0 * a.layers * widths;
  return c;
}

// Bytes of one expert as moe-cached holds it by default: bf16 as stored,
// FP8 and MXFP4 checkpoints as q8 (per 32 weights a 2-byte scale and 32
// bytes), biases as f32.
double HeldExpertBytes(const Arch& a, const Counts& c) {
  const double weights = 3.0 * a.hidden * a.expert_inter;
  const double biases = c.expert_params - weights;
  if (a.store == Arch::kBf16) return 2 * weights + 4 * biases;
  return weights / 32 * 34 + 4 * biases;
}

// On the device: matrices in bf16 (FP8 widened), vectors as stored + f32.
double DenseDeviceBytes(const Counts& c) { return 2 * c.matrix_params + 6 * c.vector_params; }

std::vector<Arch> Published() {
  std::vector<Arch> v;
  v.push_back({"Mixtral-8x7B", kMixtral8x7B, 46.7e9, 32, 4096, 32000, 32, 8, 128, 8, 2, 14336});
  Arch q15{"Qwen1.5-MoE-A2.7B", kQwen15MoE, 14.3e9, 24, 2048, 151936, 16, 16, 128, 60, 4, 1408};
  q15.shared_inter = 5632;
  q15.shared_gate = true;
  q15.qkv_bias = true;
  v.push_back(q15);
  Arch q30{"Qwen3-30B-A3B", kQwen3_30B, 30.5e9, 48, 2048, 151936, 32, 4, 128, 128, 8, 768};
  q30.qk_norm = 1;
  v.push_back(q30);
  Arch q235{"Qwen3-235B-A22B", kQwen3_235B, 235e9, 94, 4096, 151936, 64, 4, 128, 128, 8, 1536};
  q235.qk_norm = 1;
  v.push_back(q235);
  Arch olmoe{"OLMoE-1B-7B", kOlmoe1B7B, 6.9e9, 16, 2048, 50304, 16, 16, 128, 64, 8, 1024};
  olmoe.qk_norm = 2;
  v.push_back(olmoe);
  Arch v2{"DeepSeek-V2-Lite", kDeepseekV2Lite, 15.7e9, 27, 2048, 102400, 16, 16, 0, 64, 6, 1408};
  v2.dense_layers = 1;
  v2.dense_inter = 10944;
  v2.shared_inter = 2 * 1408;
  v2.kv_lora = 512;
  v2.nope = 128;
  v2.rope = 64;
  v2.v_dim = 128;
  v.push_back(v2);
  Arch v3{"DeepSeek-V3", kDeepseekV3, 671e9, 61, 7168, 129280, 128, 128, 0, 256, 8, 2048};
  v3.dense_layers = 3;
  v3.dense_inter = 18432;
  v3.shared_inter = 2048;
  v3.q_lora = 1536;
  v3.kv_lora = 512;
  v3.nope = 128;
  v3.rope = 64;
  v3.v_dim = 128;
  v3.score_bias = true;
  v3.store = Arch::kFp8;
  v.push_back(v3);
  for (auto [name, layers, experts, total] :
       {std::tuple{"GPT-OSS-20B", 24, 32, 20.9e9}, std::tuple{"GPT-OSS-120B", 36, 128, 116.8e9}}) {
    Arch g{name, GptOss(layers, experts), total, layers, 2880, 201088, 64, 8, 64, experts, 4,
           2880};
    g.qkv_bias = g.o_bias = true;
    g.gpt_oss = true;
    g.store = Arch::kMxfp4;
    v.push_back(g);
  }
  Arch glm{"GLM-4.5-Air", kGlm45Air, 106e9, 46, 4096, 151552, 96, 8, 128, 128, 8, 1408};
  glm.dense_layers = 1;
  glm.dense_inter = 10944;
  glm.shared_inter = 1408;
  glm.qkv_bias = true;
  glm.score_bias = true;
  v.push_back(glm);
  return v;
}

absl::StatusOr<plan::Plan> PlanFor(const Arch& a, double gpu_gib, double host_gib) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(a.config);
  if (!c.ok()) return c.status();
  plan::PlanOptions o;
  o.model_dir = "/models/x";
  o.gpu_bytes = static_cast<int64_t>(gpu_gib * kGiB);
  o.host_bytes = static_cast<int64_t>(host_gib * kGiB);
  o.context = 4096;
  return plan::MakePlan(*c, plan::StoredFormatsFromConfig(*c), o);
}

void ExpectNear(double got, double want, double rel, const std::string& what) {
  EXPECT_LE(std::fabs(got - want), rel * want) << what << ": got " << got << ", want " << want;
}

// `fits` from the hand counts: the GPU holds dense weights, the KV cache of
// 4096 tokens and a 5% reserve; the host every expert. None of these models
// falls within 2% of either boundary (checked), so the rounding of the
// counts cannot decide it.
bool ExpectedFits(const Arch& a, const Counts& c, double gpu_gib, double host_gib) {
  const double gpu = gpu_gib * kGiB, host = host_gib * kGiB;
  const double device = DenseDeviceBytes(c) + c.kv_per_token * 4096 + 0.05 * gpu;
  const double experts = (a.layers - a.dense_layers) * a.experts * HeldExpertBytes(a, c);
  EXPECT_GT(std::fabs(device - gpu), 0.02 * gpu) << a.name << " is too close to call";
  EXPECT_GT(std::fabs(experts - host), 0.02 * host) << a.name << " is too close to call";
  return device <= gpu && experts <= host;
}

TEST(PlanTest, PublishedConfigsMatchHandCounts) {
  for (const Arch& a : Published()) {
    SCOPED_TRACE(a.name);
    const Counts c = Count(a);
    absl::StatusOr<plan::Plan> p = PlanFor(a, 24, 128);
    ASSERT_TRUE(p.ok()) << p.status();
    const plan::ModelFigures& m = p->model;
    // The published total, within 1%; the hand count exactly (same weights).
    ExpectNear(static_cast<double>(m.params_total), a.published_params, 0.01, "published total");
    EXPECT_EQ(m.params_total, static_cast<int64_t>(c.params));
    EXPECT_EQ(m.experts_total, (a.layers - a.dense_layers) * a.experts);
    EXPECT_EQ(m.expert_params, static_cast<int64_t>(c.expert_params));
    ExpectNear(static_cast<double>(m.expert_bytes), HeldExpertBytes(a, c), 0.02, "expert bytes");
    ExpectNear(static_cast<double>(m.dense_bytes_device), DenseDeviceBytes(c), 0.02, "dense");
    ExpectNear(static_cast<double>(m.kv_bytes_per_token), c.kv_per_token, 0.02, "kv/token");
    EXPECT_GT(p->predicted_decode_tokens_per_s, 0);
    EXPECT_GT(p->predicted_prefill_tokens_per_s, 0);
  }
}

TEST(PlanTest, FitsIsRightForTwoWorkstations) {
  int fits_big = 0, fits_small = 0;
  for (const Arch& a : Published()) {
    SCOPED_TRACE(a.name);
    const Counts c = Count(a);
    for (auto [gpu, host] : {std::pair{24.0, 128.0}, std::pair{8.0, 32.0}}) {
      absl::StatusOr<plan::Plan> p = PlanFor(a, gpu, host);
      ASSERT_TRUE(p.ok()) << p.status();
      const bool want = ExpectedFits(a, c, gpu, host);
      EXPECT_EQ(p->fits, want) << gpu << " GiB GPU + " << host << " GiB host";
      if (!p->fits) {
        EXPECT_FALSE(p->suggestions.empty());
      }
      if (p->fits) (gpu > 10 ? fits_big : fits_small) += 1;
    }
  }
  // Neither answer is the same for all: the test can tell a wrong planner.
  EXPECT_GT(fits_big, fits_small);
  EXPECT_GT(fits_small, 0);
  EXPECT_LT(fits_big, static_cast<int>(Published().size()));
}

TEST(PlanTest, SlotsFillWhatTheGpuHasLeft) {
  const Arch mixtral = Published()[0];
  absl::StatusOr<plan::Plan> p = PlanFor(mixtral, 24, 128);
  ASSERT_TRUE(p.ok()) << p.status();
  const double left = 24 * kGiB - p->device_needed;
  EXPECT_EQ(p->cache_slots, static_cast<int64_t>(left / p->model.expert_bytes));
  EXPECT_LT(p->cache_slots, p->model.experts_total);
  EXPECT_EQ(p->miss_mode, MissMode::kAuto);  // at least a layer, not all
  EXPECT_THAT(plan::ShellLine("moe-cached", p->daemon_flags),
              HasSubstr(absl::StrCat("--cache-experts ", p->cache_slots)));
  EXPECT_THAT(plan::ShellLine("moe-worker", p->worker_flags),
              HasSubstr("--device cuda --cache unix:/tmp/moe-cached.sock"));
  // More GPU: more slots, and a faster decode.
  absl::StatusOr<plan::Plan> big = PlanFor(mixtral, 80, 128);
  ASSERT_TRUE(big.ok());
  EXPECT_GT(big->cache_slots, p->cache_slots);
  EXPECT_GT(big->predicted_decode_tokens_per_s, p->predicted_decode_tokens_per_s);
}

TEST(PlanTest, SuggestsWhatFits) {
  // Qwen3-30B in bf16 (57 GB of experts) on 32 GiB of host: q4 fits.
  absl::StatusOr<plan::Plan> p = PlanFor(Published()[2], 8, 32);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->fits);
  ASSERT_FALSE(p->suggestions.empty());
  EXPECT_THAT(p->suggestions[0], HasSubstr("--expert-format q8"));
}

// A CPU plan's decode step costs each MoE layer its fixed overhead
// (layer_overhead_us) and reads its weights at the CPU engine's rate
// (cpu_engine_gbps, else host_gbps).
TEST(PlanTest, CpuEngineFiguresSetTheCpuDecodeSpeed) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(Published()[2].config);  // Qwen3-30B
  ASSERT_TRUE(c.ok()) << c.status();
  plan::PlanOptions o;
  o.gpu_bytes = 0;
  o.host_bytes = static_cast<int64_t>(512 * kGiB);
  o.host_gbps = 20;
  auto rate = [&](double engine_gbps, double overhead_us) {
    plan::PlanOptions q = o;
    q.cpu_engine_gbps = engine_gbps;
    q.layer_overhead_us = overhead_us;
    absl::StatusOr<plan::Plan> p = plan::MakePlan(*c, plan::StoredFormatsFromConfig(*c), q);
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? p->predicted_decode_tokens_per_s : 0.0;
  };
  const double base = rate(0, 0);
  ASSERT_GT(base, 0);
  EXPECT_EQ(rate(20, 0), base);  // 0 means host_gbps
  EXPECT_LT(rate(5, 0), base);
  // 10 ms a layer x 48 MoE layers: 0.48 s more per token.
  const double slow = rate(0, 10000);
  EXPECT_NEAR(1 / slow, 1 / base + 0.48, 0.02 * (1 / base + 0.48));
}

// Without a GPU the plan is moe-worker alone (issue 32: the daemon's arena
// would be host memory too, and its hand-offs cost a scheduler slice each
// on a busy machine): every expert held once by the worker, no moe-cached
// flags; --daemon on plans the old layout, which needs more host memory
// (the store and its arena).
TEST(PlanTest, WithoutAGpuTheWorkerHoldsEveryExpert) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(Published()[0].config);  // Mixtral
  ASSERT_TRUE(c.ok()) << c.status();
  plan::PlanOptions o;
  o.model_dir = "/models/m";
  o.gpu_bytes = 0;
  o.host_bytes = static_cast<int64_t>(512 * kGiB);
  o.max_batch = 4;
  o.expert_format = DType::kQ8;
  const plan::StoredFormats stored = plan::StoredFormatsFromConfig(*c);
  absl::StatusOr<plan::Plan> alone = plan::MakePlan(*c, stored, o);
  ASSERT_TRUE(alone.ok()) << alone.status();
  EXPECT_FALSE(alone->daemon);
  EXPECT_TRUE(alone->fits);
  EXPECT_TRUE(alone->daemon_flags.empty());
  EXPECT_EQ(plan::ShellLine("moe-worker", alone->worker_flags),
            absl::StrCat("moe-worker --model /models/m --device cpu --cache none --expert-format "
                         "q8 --max-batch 4 --kv-budget-mb ",
                         flags::FormatSize(alone->kv_bytes)));
  EXPECT_EQ(alone->cache_slots, alone->model.experts_total);
  EXPECT_EQ(alone->host_bytes, alone->model.all_expert_bytes + alone->device_needed);
  EXPECT_THAT(plan::PlanText(*alone), Not(HasSubstr("moe-cached --model")));
  EXPECT_THAT(plan::PlanText(*alone), Not(HasSubstr("miss mode:")));
  EXPECT_FALSE(plan::PlanJson(*alone)["daemon"].get<bool>());

  o.daemon = true;
  absl::StatusOr<plan::Plan> with = plan::MakePlan(*c, stored, o);
  ASSERT_TRUE(with.ok()) << with.status();
  EXPECT_TRUE(with->daemon);
  EXPECT_THAT(plan::ShellLine("moe-cached", with->daemon_flags),
              HasSubstr("--expert-format q8 --miss-mode fetch"));
  EXPECT_THAT(plan::ShellLine("moe-worker", with->worker_flags),
              HasSubstr("--cache unix:/tmp/moe-cached.sock --max-batch 4"));
  EXPECT_GT(with->host_bytes, alone->host_bytes);  // the arena besides the store
  // A host that holds the experts once but not twice: the worker alone
  // fits with every expert; the daemon only with a layer's arena and
  // misses run on the host.
  o.host_bytes = alone->host_bytes + alone->host_bytes / 50;
  o.daemon.reset();
  alone = plan::MakePlan(*c, stored, o);
  ASSERT_TRUE(alone.ok());
  EXPECT_TRUE(alone->fits);
  o.daemon = true;
  with = plan::MakePlan(*c, stored, o);
  ASSERT_TRUE(with.ok());
  EXPECT_EQ(with->miss_mode, MissMode::kHost);
  EXPECT_LE(with->cache_slots, with->model.experts_per_layer);
}

// With a GPU, moe-cached caches what the GPU cannot hold; when every expert
// fits beside the rest (OLMoE in bf16 on 24 GiB), the worker holds them on
// the GPU itself. --daemon off where they do not fit is a plan that does
// not fit, saying why; --miss-mode without a daemon is refused.
TEST(PlanTest, AGpuThatHoldsEveryExpertNeedsNoDaemon) {
  const Arch olmoe = Published()[4];
  ASSERT_EQ(std::string(olmoe.name), "OLMoE-1B-7B");
  absl::StatusOr<plan::Plan> p = PlanFor(olmoe, 24, 128);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->fits);
  EXPECT_FALSE(p->daemon);
  EXPECT_LE(p->device_needed + p->model.all_expert_bytes, static_cast<int64_t>(24 * kGiB));
  EXPECT_TRUE(p->daemon_flags.empty());
  EXPECT_THAT(plan::ShellLine("moe-worker", p->worker_flags),
              HasSubstr("--device cuda --cache none"));
  EXPECT_THAT(plan::PlanText(*p), HasSubstr("every one by moe-worker on the GPU"));
  // 8 GiB cannot hold its 13 GB of experts: moe-cached caches them.
  p = PlanFor(olmoe, 8, 128);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->daemon);
  EXPECT_LT(p->cache_slots, p->model.experts_total);

  absl::StatusOr<ModelConfig> c = ParseModelConfig(olmoe.config);
  ASSERT_TRUE(c.ok()) << c.status();
  const plan::StoredFormats stored = plan::StoredFormatsFromConfig(*c);
  plan::PlanOptions o;
  o.host_bytes = static_cast<int64_t>(128 * kGiB);
  o.gpu_bytes = static_cast<int64_t>(8 * kGiB);
  o.daemon = false;
  p = plan::MakePlan(*c, stored, o);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->fits);
  ASSERT_FALSE(p->problems.empty());
  EXPECT_THAT(p->problems[0], HasSubstr("a worker alone (--daemon off)"));
  o.daemon.reset();
  o.gpu_bytes = static_cast<int64_t>(24 * kGiB);
  o.miss_mode = MissMode::kAuto;  // moe-cached's, and none is planned
  absl::Status s = plan::MakePlan(*c, stored, o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("every expert fits the GPU"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("--daemon on"));
  o.daemon = true;
  p = plan::MakePlan(*c, stored, o);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->daemon);
  EXPECT_EQ(p->cache_slots, p->model.experts_total);
}

// A tied embedding is also the output head: every step reads all of it.
TEST(PlanTest, TiedEmbeddingIsReadEveryStep) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(Published()[0].config);  // Mixtral: untied
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_FALSE(c->tie_word_embeddings);
  absl::StatusOr<plan::ModelFigures> m =
      plan::ComputeFigures(*c, plan::StoredFormatsFromConfig(*c), std::nullopt);
  ASSERT_TRUE(m.ok());
  const double embed = 2.0 * c->vocab_size * c->hidden_size;  // bf16
  const double routed = 2.0 * m->expert_bytes;                 // top-2
  EXPECT_NEAR(plan::DecodeBytesPerLayer(*c, *m, 1) * m->num_moe_layers,
              m->dense_bytes_device - embed + m->num_moe_layers * routed, 1.0);
  ModelConfig tied = *c;
  tied.tie_word_embeddings = true;
  absl::StatusOr<plan::ModelFigures> t =
      plan::ComputeFigures(tied, plan::StoredFormatsFromConfig(tied), std::nullopt);
  ASSERT_TRUE(t.ok());
  EXPECT_NEAR(plan::DecodeBytesPerLayer(tied, *t, 1) * t->num_moe_layers,
              t->dense_bytes_device + t->num_moe_layers * routed, 1.0);
  // Eight sequences choose at most every expert of a layer.
  EXPECT_NEAR(plan::DecodeBytesPerLayer(*c, *m, 8) - plan::DecodeBytesPerLayer(*c, *m, 1),
              6.0 * m->expert_bytes, 1.0);
}

// ---- The command itself. --------------------------------------------------

struct CommandRun {
  int code = -1;
  std::string out;
};

CommandRun Moectl(const std::string& args) {
  CommandRun r;
  FILE* p = ::popen(absl::StrCat(MOE_BINARY_DIR, "/bin/moectl plan ", args, " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

TEST(PlanCommandTest, JsonFromConfigAlone) {
  testing::TempDir dir;
  const std::vector<Arch> archs = Published();
  for (const Arch& a : {archs[0], archs[6], archs[8]}) {  // Mixtral, DeepSeek-V3, GPT-OSS-120B
    SCOPED_TRACE(a.name);
    testing::WriteText(dir.Sub("config.json"), a.config);
    for (auto [gpu, host] : {std::pair{"24G", "128GiB"}, std::pair{"8GiB", "32G"}}) {
      CommandRun r = Moectl(absl::StrCat("--model ", dir.path(), " --gpu-mem ", gpu, " --host-mem ",
                                  host, " --link-gbps 25 --host-gbps 20 --json"));
      ASSERT_EQ(r.code, 0) << r.out;
      const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
      ASSERT_FALSE(j.is_discarded()) << r.out;
      for (const char* key :
           {"params_total", "experts_total", "expert_bytes", "dense_bytes_device",
            "kv_bytes_per_token", "cache_slots", "host_bytes", "fits",
            "predicted_decode_tokens_per_s", "daemon_flags", "worker_flags"}) {
        EXPECT_TRUE(j.contains(key)) << key;
      }
      const Counts c = Count(a);
      EXPECT_EQ(j["params_total"].get<int64_t>(), static_cast<int64_t>(c.params));
      const double g = std::string(gpu) == "24G" ? 24 : 8, h = std::string(host) == "32G" ? 32 : 128;
      EXPECT_EQ(j["fits"].get<bool>(), ExpectedFits(a, c, g, h));
      EXPECT_FALSE(j["from_weights"].get<bool>());
    }
  }
}

// Without a GPU the CPU engine is measured (made models of the family, a
// channel round trip) unless both figures are given; either way the plan
// says what it used.
TEST(PlanCommandTest, CpuPlanMeasuresTheEngineUnlessTold) {
  testing::TempDir dir;
  testing::WriteText(dir.Sub("config.json"), Published()[0].config);
  CommandRun r = Moectl(absl::StrCat("--model ", dir.path(),
                                     " --gpu-mem 0 --host-mem 512G --host-gbps 20"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("(the CPU engine's weight reads, measured)"));
  EXPECT_THAT(r.out, HasSubstr("(op dispatch, measured)"));  // no daemon: no round trip
  EXPECT_THAT(r.out, HasSubstr("start:\n  moe-worker --model"));
  r = Moectl(absl::StrCat("--model ", dir.path(),
                          " --gpu-mem 0 --host-mem 512G --host-gbps 20 --daemon on"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("us round trip to the daemon)"));
  EXPECT_THAT(r.out, HasSubstr("start:\n  moe-cached --model"));
  r = Moectl(absl::StrCat("--model ", dir.path(),
                          " --gpu-mem 0 --host-mem 512G --host-gbps 20 --miss-mode host"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_THAT(r.out, HasSubstr("add --daemon on"));
  r = Moectl(absl::StrCat("--model ", dir.path(),
                          " --gpu-mem 0 --host-mem 512G --host-gbps 20 --device-gbps 7.5 "
                          "--layer-overhead-us 40 --json"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, Not(HasSubstr("measured")));
  const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["device_gbps"].get<double>(), 7.5);
  EXPECT_EQ(j["layer_overhead_us"].get<double>(), 40);
}

TEST(PlanCommandTest, TextSaysWhatFitsAndHowToStart) {
  testing::TempDir dir;
  testing::WriteText(dir.Sub("config.json"), kQwen3_30B);
  CommandRun r = Moectl(absl::StrCat("--model ", dir.path(),
                              " --gpu-mem 8G --host-mem 32G --link-gbps 25 --host-gbps 20"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("fits: NO"));
  EXPECT_THAT(r.out, HasSubstr("what fits instead:"));
  EXPECT_THAT(r.out, HasSubstr("moe-cached --model"));
  EXPECT_THAT(r.out, HasSubstr("moe-worker --model"));
  EXPECT_THAT(r.out, HasSubstr("predicted decode:"));
  r = Moectl(absl::StrCat("--model ", dir.path(), " --gpu-mem 24GB"));
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.out, HasSubstr("--gpu-mem expects a size"));
  r = Moectl("--gpu-mem 24G");
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.out, HasSubstr("--model is required"));
}

}  // namespace
}  // namespace moe
