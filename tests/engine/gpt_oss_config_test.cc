// gpt_oss: the published config.json (openai/gpt-oss-20b) and the defaults
// of configuration_gpt_oss.py; the tensor names of bf16 and MXFP4
// checkpoints; per-expert views of the fused tensors against the raw bytes
// (deinterleaved gate/up, transposed, MXFP4 dequantized by hand here);
// strict validation of malformed checkpoints; moectl make-model/inspect.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/checkpoint.h"
#include "common/fp8.h"
#include "common/model_config.h"
#include "common/model_desc.h"
#include "common/model_maker.h"
#include "common/model_presets.h"
#include "common/mxfp4.h"
#include "common/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/engine/mla_attention.h"
#include "tests/common/test_util.h"

namespace moe {
namespace {

using ::testing::HasSubstr;

std::string LayerTypes(int n) {
  std::string s = "[";
  for (int i = 0; i < n; ++i) {
    absl::StrAppend(
        &s, i ? ", " : "",
        i % 2 == 0 ? "\"sliding_attention\"" : "\"full_attention\"");
  }
  return s + "]";
}

// openai/gpt-oss-20b's config.json.
std::string Gpt20b() {
  return absl::StrCat(R"({
  "architectures": ["GptOssForCausalLM"], "attention_bias": true,
  "attention_dropout": 0.0, "eos_token_id": 200002, "experts_per_token": 4,
  "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880,
  "initial_context_length": 4096, "initializer_range": 0.02,
  "intermediate_size": 2880, "layer_types": )",
                      LayerTypes(24), R"(,
  "max_position_embeddings": 131072, "model_type": "gpt_oss",
  "num_attention_heads": 64, "num_experts_per_tok": 4, "num_hidden_layers": 24,
  "num_key_value_heads": 8, "num_local_experts": 32,
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

TEST(GptOssConfigTest, Published20bConfig) {
  auto c = ParseModelConfig(Gpt20b());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->family, ModelFamily::kGptOss);
  EXPECT_EQ(c->num_experts, 32);
  EXPECT_EQ(c->top_k, 4);
  EXPECT_EQ(c->moe_intermediate_size, 2880);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->num_moe_layers(), 24);
  EXPECT_TRUE(c->norm_topk_prob);
  EXPECT_TRUE(c->qkv_bias && c->o_bias);
  EXPECT_EQ(c->sliding_window, 128);
  EXPECT_TRUE(c->IsSlidingLayer(0));
  EXPECT_FALSE(c->IsSlidingLayer(1));
  EXPECT_TRUE(c->IsSlidingLayer(22));
  EXPECT_FALSE(c->IsSlidingLayer(23));
  EXPECT_TRUE(c->mxfp4.has_value());
  EXPECT_EQ(c->mxfp4->modules_to_not_convert.size(), 4u);
  EXPECT_DOUBLE_EQ(c->swiglu_limit, 7.0);
  EXPECT_DOUBLE_EQ(c->rope_theta, 150000.0);
  ASSERT_TRUE(c->yarn.has_value());
  EXPECT_DOUBLE_EQ(c->yarn->factor, 32.0);
  EXPECT_FALSE(c->yarn->truncate);
  EXPECT_EQ(c->yarn->original_max_position_embeddings, 4096);
  EXPECT_EQ(c->eos_token_ids, std::vector<int64_t>{200002});
  // Round trip.
  auto back = ParseModelConfig(ModelConfigToJson(*c));
  ASSERT_TRUE(back.ok()) << back.status() << ModelConfigToJson(*c);
  EXPECT_EQ(back->sliding_layers, c->sliding_layers);
  EXPECT_EQ(back->mxfp4.has_value(), true);
  EXPECT_FALSE(back->yarn->truncate);
  EXPECT_EQ(ExpectedTensors(*back).size(), ExpectedTensorCount(*back));
}

TEST(GptOssConfigTest, DefaultsOfConfigurationGptOss) {
  auto c = ParseModelConfig(R"({"model_type": "gpt_oss", "hidden_size": 64,
      "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
      "vocab_size": 512, "intermediate_size": 64, "num_local_experts": 4})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 64);  // not hidden / heads
  EXPECT_EQ(c->top_k, 4);
  EXPECT_EQ(c->sliding_window, 128);
  EXPECT_EQ(c->sliding_layers, (std::vector<bool>{true, false, true}));
  EXPECT_TRUE(c->qkv_bias);
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c->swiglu_alpha, 1.702);
  ASSERT_TRUE(c->yarn.has_value());  // no rope_scaling: GptOssConfig's yarn
  EXPECT_DOUBLE_EQ(c->yarn->factor, 32.0);
  EXPECT_FALSE(c->yarn->truncate);
  EXPECT_FALSE(c->mxfp4.has_value());
}

TEST(GptOssConfigTest, BadFieldsAreNamed) {
  const std::string base = R"({"model_type": "gpt_oss", "hidden_size": 64,
      "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
      "vocab_size": 512, "intermediate_size": 64, "num_local_experts": 4, )";
  struct Bad {
    const char* tail;
    const char* message;
  };
  for (
      const Bad& b :
      {Bad{R"("layer_types": ["sliding_attention"]})",
           "layer_types has 1 entries"},
       Bad{R"("layer_types": ["sliding_attention", "chunked"]})",
           "layer_types entry"},
       Bad{R"("quantization_config": {"quant_method": "fp8"}})",
           "quant_method"},
       Bad{R"("rope_scaling": {"rope_type": "yarn", "factor": 0.5}})",
           "factor"},
       Bad{R"("swiglu_limit": -1})", "swiglu_limit"},
       Bad{R"("attention_bias": false})", "attention_bias"},
       Bad{R"("intermediate_size": 48, "quantization_config": {"quant_method": "mxfp4"}})",
           "multiples of 32"}}) {
    auto c = ParseModelConfig(base + b.tail);
    ASSERT_FALSE(c.ok()) << b.tail;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(c.status().message()), HasSubstr(b.message))
        << b.tail;
  }
}

TEST(GptOssConfigTest, YarnTruncateChangesTheRamp) {
  YarnConfig y;
  y.factor = 32;
  y.original_max_position_embeddings = 4096;
  y.truncate = false;
  RopeTable smooth = YarnRopeFor(64, 150000.0, y);
  y.truncate = true;
  RopeTable floored = YarnRopeFor(64, 150000.0, y);
  ASSERT_EQ(smooth.inv_freq.size(), 32u);
  EXPECT_NEAR(smooth.mscale, 0.1 * std::log(32.0) + 1.0, 1e-6);
  double diff = 0;
  for (int i = 0; i < 32; ++i)
    diff = std::max(
        diff, double(std::fabs(smooth.inv_freq[i] - floored.inv_freq[i])));
  EXPECT_GT(diff, 1e-4);
  // The extremes: unscaled at i = 0, divided by the factor at the end.
  EXPECT_FLOAT_EQ(smooth.inv_freq[0], 1.0f);
  EXPECT_NEAR(smooth.inv_freq[31], std::pow(150000.0, -62.0 / 64) / 32, 1e-12);
}

TEST(GptOssConfigTest, TensorNamesOfBf16AndMxfp4Checkpoints) {
  MakeModelOptions o = TinyPreset(ModelFamily::kGptOss);
  auto c = ConfigFromOptions(o);
  ASSERT_TRUE(c.ok()) << c.status();
  auto names = [](const ModelConfig& cfg) {
    std::vector<std::string> out;
    for (const TensorSpec& s : ExpectedTensors(cfg)) {
      if (s.layer == 1) out.push_back(s.name);
    }
    return out;
  };
  std::vector<std::string> bf16 = names(*c);
  EXPECT_THAT(bf16, ::testing::Contains("model.layers.1.self_attn.sinks"));
  EXPECT_THAT(bf16,
              ::testing::Contains("model.layers.1.self_attn.o_proj.bias"));
  EXPECT_THAT(bf16, ::testing::Contains("model.layers.1.mlp.router.bias"));
  EXPECT_THAT(bf16,
              ::testing::Contains("model.layers.1.mlp.experts.gate_up_proj"));
  EXPECT_THAT(bf16,
              ::testing::Contains("model.layers.1.mlp.experts.down_proj_bias"));
  c->mxfp4 = Mxfp4Scheme{};
  std::vector<std::string> mx = names(*c);
  EXPECT_THAT(mx, ::testing::Contains(
                      "model.layers.1.mlp.experts.gate_up_proj_blocks"));
  EXPECT_THAT(
      mx, ::testing::Contains("model.layers.1.mlp.experts.down_proj_scales"));
  EXPECT_THAT(mx, ::testing::Not(::testing::Contains(
                      "model.layers.1.mlp.experts.down_proj")));
  EXPECT_EQ(ExpectedTensors(*c).size(), ExpectedTensorCount(*c));
}

TEST(GptOssConfigTest, PublishedShapePresets) {
  for (const auto& [name, experts] :
       std::vector<std::pair<const char*, int>>{{"gpt-oss-20b-2l", 32}, {"gpt-oss-120b-2l", 128}}) {
    auto o = PresetOptions(name, std::nullopt);
    ASSERT_TRUE(o.ok()) << o.status();
    auto c = ConfigFromOptions(*o);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->family, ModelFamily::kGptOss);
    EXPECT_EQ(c->num_experts, experts);
    EXPECT_EQ(c->hidden_size, 2880);
    EXPECT_TRUE(c->mxfp4.has_value());
    EXPECT_EQ(c->sliding_window, 128);
    EXPECT_DOUBLE_EQ(c->yarn->factor, 32.0);
  }
  EXPECT_FALSE(PresetOptions("gpt-oss-20b-2l", ModelFamily::kMixtral).ok());
}

std::vector<float> AsFloats(const TensorView& v) {
  std::vector<float> out(static_cast<size_t>(v.numel()));
  EXPECT_TRUE(v.shape.size() == 1
                  ? ConvertVectorView(v, out.data()).ok()
                  : ConvertWeightView(v, DType::kF32, out.data()).ok());
  return out;
}

TEST(GptOssCheckpointTest, Bf16ExpertViewsDeinterleaveAndTranspose) {
  moe::testing::TempDir dir;
  MakeModelOptions o = TinyPreset(ModelFamily::kGptOss);
  o.experts = 4;
  ASSERT_TRUE(MakeModel(o, dir.path()).ok());
  auto d = ModelDescription::Open(dir.path());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->expert_dtype(), DType::kBF16);
  const int64_t h = 64, inter = 64;
  // gate + up + down bf16, then the three biases bf16.
  EXPECT_EQ(d->bytes_per_expert(), 3u * h * inter * 2 + (2 * inter + h) * 2);
  auto raw = d->checkpoint().Get("model.layers.2.mlp.experts.gate_up_proj");
  auto raw_down = d->checkpoint().Get("model.layers.2.mlp.experts.down_proj");
  auto raw_bias =
      d->checkpoint().Get("model.layers.2.mlp.experts.gate_up_proj_bias");
  ASSERT_TRUE(raw.ok() && raw_down.ok() && raw_bias.ok());
  auto bf = [](const TensorView& v, int64_t i) {
    uint16_t b;
    std::memcpy(&b, v.data + 2 * i, 2);
    return BF16ToFloat(b);
  };
  const int e = 3;
  auto gate = AsFloats(*d->Expert(2, e, TensorRole::kExpertGate));
  auto up = AsFloats(*d->Expert(2, e, TensorRole::kExpertUp));
  auto down = AsFloats(*d->Expert(2, e, TensorRole::kExpertDown));
  auto gb = AsFloats(*d->Expert(2, e, TensorRole::kExpertGateBias));
  auto ub = AsFloats(*d->Expert(2, e, TensorRole::kExpertUpBias));
  for (int64_t r = 0; r < inter; ++r) {
    for (int64_t col = 0; col < h; ++col) {
      // gate_up_proj[e][col][2r] is gate row r, column col.
      ASSERT_EQ(gate[r * h + col], bf(*raw, (e * h + col) * 2 * inter + 2 * r));
      ASSERT_EQ(up[r * h + col],
                bf(*raw, (e * h + col) * 2 * inter + 2 * r + 1));
      ASSERT_EQ(down[col * inter + r],
                bf(*raw_down, (e * inter + r) * h + col));
    }
    ASSERT_EQ(gb[r], bf(*raw_bias, e * 2 * inter + 2 * r));
    ASSERT_EQ(ub[r], bf(*raw_bias, e * 2 * inter + 2 * r + 1));
  }
}

TEST(GptOssCheckpointTest,
     Mxfp4ExpertViewsDequantizeAsConvertMoePackedTensors) {
  moe::testing::TempDir dir;
  MakeModelOptions o = TinyPreset(ModelFamily::kGptOss);
  o.mxfp4 = true;
  ASSERT_TRUE(MakeModel(o, dir.path()).ok());
  auto d = ModelDescription::Open(dir.path());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->expert_dtype(), DType::kMxfp4);
  EXPECT_EQ(DefaultHeldFormat(d->expert_dtype()), DType::kQ8);
  const int64_t h = 64, inter = 64;
  // Codes (half a byte) + one scale byte per 32, then bf16 biases.
  EXPECT_EQ(d->bytes_per_expert(),
            3u * h * inter / 2 + 3u * h * inter / 32 + (2 * inter + h) * 2);
  auto blocks =
      d->checkpoint().Get("model.layers.1.mlp.experts.gate_up_proj_blocks");
  auto scales =
      d->checkpoint().Get("model.layers.1.mlp.experts.gate_up_proj_scales");
  ASSERT_TRUE(blocks.ok() && scales.ok());
  const float kFp4[16] = {0,     .5,  1,  1.5,  2,  3,  4,  6,
                          -0.0f, -.5, -1, -1.5, -2, -3, -4, -6};
  // Element (row, col) of gate_up before the transpose: rows are 2I.
  auto element = [&](int64_t e, int64_t row, int64_t col) {
    const int64_t g = col / 32, j = col % 32;
    const uint8_t byte =
        blocks->data[((e * 2 * inter + row) * (h / 32) + g) * 16 + j / 2];
    const uint8_t code = j % 2 == 0 ? (byte & 0x0f) : (byte >> 4);
    const int s = scales->data[(e * 2 * inter + row) * (h / 32) + g];
    return std::ldexp(double(kFp4[code]), s - 127);
  };
  for (int e : {0, 5}) {
    auto gate = AsFloats(*d->Expert(1, e, TensorRole::kExpertGate));
    auto up = AsFloats(*d->Expert(1, e, TensorRole::kExpertUp));
    for (int64_t r = 0; r < inter; ++r) {
      for (int64_t col = 0; col < h; ++col) {
        ASSERT_EQ(gate[r * h + col], element(e, 2 * r, col))
            << e << " " << r << " " << col;
        ASSERT_EQ(up[r * h + col], element(e, 2 * r + 1, col));
      }
    }
    // q8, the default held format, holds the same values exactly.
    auto view = d->Expert(1, e, TensorRole::kExpertGate);
    std::vector<uint8_t> q8(
        static_cast<size_t>(WeightBytes(DType::kQ8, inter, h)));
    ASSERT_TRUE(ConvertWeightView(*view, DType::kQ8, q8.data()).ok());
    for (int64_t i = 0; i < inter * h; ++i) {
      ASSERT_EQ(DequantizeElement(q8.data(), DType::kQ8, i), gate[i]) << i;
    }
  }
}

// Rewrites `src`'s checkpoint into `dst` through `edit` (which may change
// or drop tensors) with the same config.json.
using Edit = std::function<bool(const std::string& name, TensorView& v,
                                std::vector<uint8_t>& bytes)>;
void Rewrite(const std::string& src, const std::string& dst, const Edit& edit) {
  auto ckpt = Checkpoint::Open(src);
  ASSERT_TRUE(ckpt.ok());
  SafetensorsWriter w;
  for (const std::string& name : (*ckpt)->names()) {
    TensorView v = *(*ckpt)->Get(name);
    std::vector<uint8_t> bytes(v.data, v.data + v.nbytes);
    if (!edit(name, v, bytes)) continue;
    ASSERT_TRUE(w.Add(name, v.dtype, v.shape, bytes).ok()) << name;
  }
  ASSERT_TRUE(w.Write(dst + "/model.safetensors").ok());
  moe::testing::WriteText(dst + "/config.json",
                          moe::testing::ReadText(src + "/config.json"));
}

TEST(GptOssCheckpointTest, MalformedMxfp4CheckpointsNameTheTensor) {
  moe::testing::TempDir dir;
  MakeModelOptions o = TinyPreset(ModelFamily::kGptOss);
  o.mxfp4 = true;
  const std::string good = dir.Sub("good");
  ASSERT_TRUE(MakeModel(o, good).ok());
  const std::string kBlocks = "model.layers.0.mlp.experts.down_proj_blocks";
  const std::string kScales = "model.layers.0.mlp.experts.down_proj_scales";
  struct Bad {
    const char* name;
    Edit edit;
    std::string message;
  };
  const std::vector<Bad> cases = {
      {"missing_scales",
       [&](const std::string& n, TensorView&, std::vector<uint8_t>&) {
         return n != kScales;
       },
       "lacks tensor '" + kScales + "'"},
      {"blocks_as_bf16",
       [&](const std::string& n, TensorView& v, std::vector<uint8_t>& b) {
         if (n == kBlocks) {
           v.dtype = DType::kBF16;
           v.shape.back() = 8;
         }
         return true;
       },
       "'" + kBlocks + "' has shape"},
      {"blocks_wrong_shape",
       [&](const std::string& n, TensorView& v, std::vector<uint8_t>& b) {
         if (n == kBlocks)
           v.shape = {v.shape[0], v.shape[1] * 2, v.shape[2] / 2, 16};
         return true;
       },
       "'" + kBlocks + "' has shape"},
      {"scales_i8",
       [&](const std::string& n, TensorView& v, std::vector<uint8_t>& b) {
         if (n == kScales) v.dtype = DType::kI8;
         return true;
       },
       "'" + kScales + "' has dtype I8, expected U8"},
      {"scale_nan",
       [&](const std::string& n, TensorView& v, std::vector<uint8_t>& b) {
         if (n == kScales) b[5] = 255;
         return true;
       },
       "NaN code 255"},
  };
  for (const Bad& b : cases) {
    const std::string out = dir.Sub(b.name);
    std::filesystem::create_directories(out);
    Rewrite(good, out, b.edit);
    auto d = ModelDescription::Open(out);
    ASSERT_FALSE(d.ok()) << b.name;
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument) << b.name;
    EXPECT_THAT(std::string(d.status().message()), HasSubstr(b.message))
        << b.name;
  }
}

std::string RunText(const std::string& cmd) {
  FILE* p = ::popen(cmd.c_str(), "r");
  std::string text;
  if (p == nullptr) return text;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) text.append(buf, n);
  EXPECT_EQ(::pclose(p), 0) << cmd;
  return text;
}

TEST(GptOssCheckpointTest, MoectlMakeModelAndInspect) {
  moe::testing::TempDir dir;
  const std::string moectl = std::string(MOE_BINARY_DIR) + "/bin/moectl";
  for (const char* format : {"bf16", "mxfp4"}) {
    const std::string out = dir.Sub(format);
    ASSERT_EQ(
        std::system(absl::StrCat(moectl,
                                 " make-model --arch gpt_oss --expert-format ",
                                 format, " --out ", out, " > /dev/null")
                        .c_str()),
        0);
    auto d = ModelDescription::Open(out);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ(d->config().mxfp4.has_value(), std::string(format) == "mxfp4");
    const std::string text = RunText(absl::StrCat(moectl, " inspect ", out));
    EXPECT_THAT(text, HasSubstr("family: gpt_oss"));
    EXPECT_THAT(text, HasSubstr("sliding window 8 on 2 of 4 layers"));
    EXPECT_THAT(
        text, HasSubstr(std::string(format) == "mxfp4" ? "expert dtype: MXFP4"
                                                       : "expert dtype: BF16"));
    std::printf("[%s] %s\n", format,
                text.substr(text.find("bytes per expert:"),
                            text.find('\n', text.find("bytes per expert:")) -
                                text.find("bytes per expert:"))
                    .c_str());
  }
  // mxfp4 is a gpt_oss layout only.
  EXPECT_NE(std::system(
                absl::StrCat(moectl,
                             " make-model --arch mixtral --expert-format mxfp4",
                             " --out ", dir.Sub("mix"), " 2> /dev/null")
                    .c_str()),
            0);
}

}  // namespace
}  // namespace moe
