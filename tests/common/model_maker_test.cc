#include "common/model_maker.h"

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "common/model_desc.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/test_util.h"

namespace moe {
namespace {

using ::moe::testing::ReadText;
using ::moe::testing::TempDir;
using ::testing::HasSubstr;

std::vector<float> Floats(const TensorView& v) {
  std::vector<float> out(static_cast<size_t>(v.numel()));
  EXPECT_TRUE(ConvertToFloat(v.data, v.dtype, out.size(), out.data()).ok());
  return out;
}

std::vector<float> RmsNorm(const float* x, int64_t n) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  float scale = static_cast<float>(1.0 / std::sqrt(ss / n + 1e-6));
  std::vector<float> out(x, x + n);
  for (float& v : out) v *= scale;
  return out;
}

// y = W x for W [rows, cols].
std::vector<float> MatVec(const std::vector<float>& w, int64_t rows,
                          const std::vector<float>& x) {
  std::vector<float> y(static_cast<size_t>(rows), 0.0f);
  const int64_t cols = static_cast<int64_t>(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) y[r] += w[r * cols + c] * x[c];
  }
  return y;
}

double Rms(const std::vector<float>& v) {
  double ss = 0;
  for (float x : v) ss += x * x;
  return std::sqrt(ss / v.size());
}

class TinyPresetTest : public ::testing::TestWithParam<ModelFamily> {};

TEST_P(TinyPresetTest, WritesAValidSmallModel) {
  TempDir dir;
  ASSERT_TRUE(MakeModel(TinyPreset(GetParam()), dir.path()).ok());
  auto d = ModelDescription::Open(dir.path());
  ASSERT_TRUE(d.ok()) << d.status();
  const ModelConfig& c = d->config();
  EXPECT_EQ(c.family, GetParam());
  EXPECT_GE(c.num_moe_layers(), 4);
  EXPECT_GE(c.num_experts, 8);
  EXPECT_EQ(c.top_k, 2);
  EXPECT_LT(c.num_key_value_heads, c.num_attention_heads);
  EXPECT_LT(std::filesystem::file_size(dir.Sub("model.safetensors")), 4u << 20);
  EXPECT_GT(d->bytes_per_expert(), 0u);
  // The config names the tokenizer's end-of-text token.
  auto tok = nlohmann::json::parse(ReadText(dir.Sub("tokenizer.json")));
  ASSERT_FALSE(c.eos_token_ids.empty());
  EXPECT_EQ(tok["added_tokens"][0]["content"], "<|endoftext|>");
  EXPECT_EQ(tok["added_tokens"][0]["id"], c.eos_token_ids[0]);
  EXPECT_LT(c.eos_token_ids[0], c.vocab_size);
  auto raw = nlohmann::json::parse(ReadText(dir.Sub("config.json")));
  EXPECT_EQ(raw["model_type"], std::string(ModelFamilyName(GetParam())));
  EXPECT_EQ(raw["architectures"][0],
            std::string(ModelFamilyArchitecture(GetParam())));
  EXPECT_EQ(raw["torch_dtype"], "bfloat16");
  EXPECT_TRUE(std::filesystem::exists(dir.Sub("generation_config.json")));
}

// Routing must spread tokens over all experts, or caching is trivial.
TEST_P(TinyPresetTest, RoutingUsesEveryExpert) {
  TempDir dir;
  ASSERT_TRUE(MakeModel(TinyPreset(GetParam()), dir.path()).ok());
  auto d = ModelDescription::Open(dir.path());
  ASSERT_TRUE(d.ok()) << d.status();
  const ModelConfig& c = d->config();
  const int64_t h = c.hidden_size, e = c.num_experts;
  std::vector<float> embed = Floats(*d->Dense(TensorRole::kEmbed));
  const int kTokens = 256;
  for (int moe = 0; moe < c.num_moe_layers(); ++moe) {
    std::vector<float> router =
        Floats(*d->Dense(TensorRole::kRouter, c.LayerOfMoeLayer(moe)));
    std::vector<int> picks(static_cast<size_t>(e), 0);
    for (int t = 0; t < kTokens; ++t) {
      auto logits = MatVec(router, e, RmsNorm(&embed[t * h], h));
      std::vector<int> order(static_cast<size_t>(e));
      for (int i = 0; i < e; ++i) order[i] = i;
      std::partial_sort(order.begin(), order.begin() + c.top_k, order.end(),
                        [&](int a, int b) { return logits[a] > logits[b]; });
      for (int k = 0; k < c.top_k; ++k) ++picks[order[k]];
    }
    const double fair = static_cast<double>(kTokens) * c.top_k / e;
    for (int x = 0; x < e; ++x) {
      EXPECT_GT(picks[x], fair / 4) << "layer " << moe << " expert " << x;
      EXPECT_LT(picks[x], fair * 3) << "layer " << moe << " expert " << x;
    }
  }
}

// Expert FFN outputs on a normalised input stay O(1).
TEST_P(TinyPresetTest, ExpertActivationsAreOrderOne) {
  TempDir dir;
  ASSERT_TRUE(MakeModel(TinyPreset(GetParam()), dir.path()).ok());
  auto d = ModelDescription::Open(dir.path());
  ASSERT_TRUE(d.ok());
  const ModelConfig& c = d->config();
  std::vector<float> embed = Floats(*d->Dense(TensorRole::kEmbed));
  auto x = RmsNorm(&embed[5 * c.hidden_size], c.hidden_size);
  for (int expert : {0, 3, 7}) {
    auto g = MatVec(Floats(*d->Expert(1, expert, TensorRole::kExpertGate)),
                    c.moe_intermediate_size, x);
    auto u = MatVec(Floats(*d->Expert(1, expert, TensorRole::kExpertUp)),
                    c.moe_intermediate_size, x);
    std::vector<float> act(g.size());
    for (size_t i = 0; i < g.size(); ++i)
      act[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
    auto y = MatVec(Floats(*d->Expert(1, expert, TensorRole::kExpertDown)),
                    c.hidden_size, act);
    EXPECT_GT(Rms(y), 0.05) << expert;
    EXPECT_LT(Rms(y), 5.0) << expert;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Families, TinyPresetTest,
    ::testing::Values(ModelFamily::kMixtral, ModelFamily::kQwen2Moe,
                      ModelFamily::kQwen3Moe, ModelFamily::kOlmoe),
    [](const auto& info) { return std::string(ModelFamilyName(info.param)); });

TEST(MakeModelTest, DeterministicPerSeed) {
  TempDir a, b, c;
  MakeModelOptions o = TinyPreset(ModelFamily::kOlmoe);
  o.seed = 11;
  ASSERT_TRUE(MakeModel(o, a.path()).ok());
  ASSERT_TRUE(MakeModel(o, b.path()).ok());
  o.seed = 12;
  ASSERT_TRUE(MakeModel(o, c.path()).ok());
  for (const char* f : {"model.safetensors", "config.json", "tokenizer.json"}) {
    EXPECT_EQ(ReadText(a.Sub(f)), ReadText(b.Sub(f))) << f;
  }
  EXPECT_NE(ReadText(a.Sub("model.safetensors")),
            ReadText(c.Sub("model.safetensors")));
}

TEST(MakeModelTest, ShardsHoldTheSameTensorsAsOneFile) {
  TempDir one, three;
  MakeModelOptions o = TinyPreset(ModelFamily::kQwen3Moe);
  ASSERT_TRUE(MakeModel(o, one.path()).ok());
  o.shards = 3;
  ASSERT_TRUE(MakeModel(o, three.path()).ok());
  EXPECT_FALSE(std::filesystem::exists(three.Sub("model.safetensors")));
  for (const char* f :
       {"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
        "model-00003-of-00003.safetensors"}) {
    EXPECT_TRUE(std::filesystem::exists(three.Sub(f))) << f;
  }
  auto index = nlohmann::json::parse(
      ReadText(three.Sub("model.safetensors.index.json")));
  auto d1 = ModelDescription::Open(one.path());
  auto d3 = ModelDescription::Open(three.path());
  ASSERT_TRUE(d1.ok() && d3.ok()) << d3.status();
  EXPECT_EQ(d3->checkpoint().files().size(), 3u);
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), d1->total_bytes());
  EXPECT_EQ(index["weight_map"].size(), d1->checkpoint().names().size());
  EXPECT_EQ(d1->checkpoint().names(), d3->checkpoint().names());
  for (const auto& name : d1->checkpoint().names()) {
    auto x = *d1->checkpoint().Get(name);
    auto y = *d3->checkpoint().Get(name);
    ASSERT_EQ(x.nbytes, y.nbytes) << name;
    ASSERT_EQ(std::memcmp(x.data, y.data, x.nbytes), 0) << name;
  }
  // Shards are balanced: none holds more than half of the bytes.
  for (const auto& f : d3->checkpoint().files()) {
    EXPECT_LT(f->data_size(), d1->total_bytes() / 2) << f->source();
  }
}

TEST(MakeModelTest, RewritingReplacesStaleShards) {
  TempDir dir;
  MakeModelOptions o = TinyPreset(ModelFamily::kMixtral);
  o.shards = 2;
  ASSERT_TRUE(MakeModel(o, dir.path()).ok());
  o.shards = 1;
  ASSERT_TRUE(MakeModel(o, dir.path()).ok());
  EXPECT_FALSE(
      std::filesystem::exists(dir.Sub("model.safetensors.index.json")));
  EXPECT_FALSE(
      std::filesystem::exists(dir.Sub("model-00001-of-00002.safetensors")));
  EXPECT_TRUE(ModelDescription::Open(dir.path()).ok());
  // And the other way round: the single file must go, or it would win.
  o.shards = 2;
  ASSERT_TRUE(MakeModel(o, dir.path()).ok());
  EXPECT_FALSE(std::filesystem::exists(dir.Sub("model.safetensors")));
  auto d = ModelDescription::Open(dir.path());
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(d->checkpoint().sharded());
}

TEST(MakeModelTest, WeightScales) {
  TempDir dir;
  MakeModelOptions o = TinyPreset(ModelFamily::kMixtral);
  o.dtype = DType::kF32;
  o.hidden = 128;
  o.intermediate = 256;
  ASSERT_TRUE(MakeModel(o, dir.path()).ok());
  auto d = ModelDescription::Open(dir.path());
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->expert_dtype(), DType::kF32);
  auto stats = [](const std::vector<float>& v) {
    double s = 0, ss = 0;
    for (float x : v) {
      s += x;
      ss += x * x;
    }
    double mean = s / v.size();
    return std::make_pair(mean, std::sqrt(ss / v.size() - mean * mean));
  };
  auto [qm, qs] = stats(Floats(*d->Dense(TensorRole::kQProj, 1)));
  EXPECT_NEAR(qm, 0.0, 0.01);
  EXPECT_NEAR(qs, 1.0 / std::sqrt(128.0), 0.01);
  auto [dm, ds] = stats(Floats(*d->Expert(2, 4, TensorRole::kExpertDown)));
  EXPECT_NEAR(ds, 1.0 / std::sqrt(256.0), 0.005);
  auto [nm, ns] = stats(Floats(*d->Dense(TensorRole::kInputNorm, 0)));
  EXPECT_NEAR(nm, 1.0, 0.03);
  EXPECT_GT(ns, 0.01);
  EXPECT_LT(ns, 0.1);
  auto [em, es] = stats(Floats(*d->Dense(TensorRole::kEmbed)));
  EXPECT_NEAR(es, 1.0, 0.05);
}

TEST(MakeModelTest, FamilyKnobsReachTheConfig) {
  MakeModelOptions o = TinyPreset(ModelFamily::kQwen2Moe);
  o.layers = 6;
  o.decoder_sparse_step = 2;
  o.mlp_only_layers = {3};
  o.norm_topk_prob = true;
  o.qkv_bias = false;
  auto c = ConfigFromOptions(o);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_moe_layers(), 2);  // layers 1 and 5
  EXPECT_TRUE(c->norm_topk_prob);
  EXPECT_FALSE(c->qkv_bias);
  TempDir dir;
  ASSERT_TRUE(MakeModel(o, dir.path()).ok());
  auto d = ModelDescription::Open(dir.path());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->config().moe_layer, c->moe_layer);
  EXPECT_FALSE(d->HasDense(TensorRole::kQBias, 0));
  EXPECT_TRUE(d->HasDense(TensorRole::kMlpGate, 3));

  MakeModelOptions olmoe = TinyPreset(ModelFamily::kOlmoe);
  olmoe.clip_qkv = 6.0;
  EXPECT_EQ(ConfigFromOptions(olmoe)->clip_qkv, 6.0);
}

TEST(MakeModelTest, RefusesBadOptions) {
  auto err = [](MakeModelOptions o) {
    auto c = ConfigFromOptions(o);
    EXPECT_FALSE(c.ok());
    return std::string(c.status().message());
  };
  MakeModelOptions base = TinyPreset(ModelFamily::kMixtral);
  MakeModelOptions o = base;
  o.vocab = 100;
  EXPECT_THAT(err(o), HasSubstr("vocab"));
  o = base;
  o.top_k = 9;
  EXPECT_THAT(err(o), HasSubstr("exceeds the number of experts"));
  o = base;
  o.mlp_only_layers = {1};
  EXPECT_THAT(err(o), HasSubstr("qwen2_moe/qwen3_moe only"));
  o = base;
  o.kv_heads = 3;
  EXPECT_THAT(err(o), HasSubstr("not a multiple"));
  o = base;
  o.hidden = 0;
  EXPECT_THAT(err(o), HasSubstr("hidden_size must be positive"));
  o = base;
  o.dtype = DType::kI32;
  EXPECT_THAT(err(o), HasSubstr("dtype"));
  o = base;
  o.shards = 0;
  TempDir dir;
  EXPECT_THAT(std::string(MakeModel(o, dir.path()).message()),
              HasSubstr("shards"));
}

}  // namespace
}  // namespace moe
