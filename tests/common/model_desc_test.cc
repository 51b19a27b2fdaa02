#include "common/model_desc.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "common/model_maker.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"

namespace moe {
namespace {

using ::moe::testing::TempDir;
using ::testing::HasSubstr;

std::map<std::string, TensorSpec> ByName(const std::vector<TensorSpec>& specs) {
  std::map<std::string, TensorSpec> out;
  for (const auto& s : specs) out.emplace(s.name, s);
  return out;
}

ModelConfig TinyConfig(ModelFamily f) {
  auto c = ConfigFromOptions(TinyPreset(f));
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

using Shape = std::vector<int64_t>;

TEST(ExpectedTensorsTest, MixtralNames) {
  ModelConfig c = TinyConfig(ModelFamily::kMixtral);
  auto specs = ExpectedTensors(c);
  EXPECT_EQ(specs.size(), ExpectedTensorCount(c));
  auto m = ByName(specs);
  ASSERT_EQ(specs.size(), m.size()) << "duplicate names";
  const auto& w1 = m.at("model.layers.2.block_sparse_moe.experts.5.w1.weight");
  EXPECT_EQ(w1.role, TensorRole::kExpertGate);
  EXPECT_EQ(w1.layer, 2);
  EXPECT_EQ(w1.expert, 5);
  EXPECT_EQ(w1.shape, (Shape{128, 64}));
  EXPECT_EQ(m.at("model.layers.2.block_sparse_moe.experts.5.w3.weight").role,
            TensorRole::kExpertUp);
  EXPECT_EQ(m.at("model.layers.2.block_sparse_moe.experts.5.w2.weight").shape,
            (Shape{64, 128}));
  EXPECT_EQ(m.at("model.layers.0.block_sparse_moe.gate.weight").shape,
            (Shape{8, 64}));
  EXPECT_EQ(m.at("model.layers.0.self_attn.k_proj.weight").shape,
            (Shape{32, 64}));
  EXPECT_EQ(m.at("lm_head.weight").shape, (Shape{512, 64}));
  EXPECT_EQ(m.at("model.norm.weight").role, TensorRole::kFinalNorm);
  EXPECT_EQ(m.count("model.layers.0.self_attn.q_proj.bias"), 0u);
  EXPECT_EQ(m.count("model.layers.0.self_attn.q_norm.weight"), 0u);
  // 3 model-level + 4 layers x (6 attention + router + 8 x 3 experts).
  EXPECT_EQ(specs.size(), 3u + 4u * (6 + 1 + 24));
}

TEST(ExpectedTensorsTest, Qwen2MoeSharedExpertAndBias) {
  auto m = ByName(ExpectedTensors(TinyConfig(ModelFamily::kQwen2Moe)));
  EXPECT_EQ(m.at("model.layers.1.mlp.experts.7.gate_proj.weight").shape,
            (Shape{64, 64}));
  EXPECT_EQ(m.at("model.layers.1.mlp.gate.weight").role, TensorRole::kRouter);
  EXPECT_EQ(m.at("model.layers.1.mlp.shared_expert.up_proj.weight").shape,
            (Shape{128, 64}));
  EXPECT_EQ(m.at("model.layers.1.mlp.shared_expert.down_proj.weight").role,
            TensorRole::kSharedDown);
  EXPECT_EQ(m.at("model.layers.1.mlp.shared_expert_gate.weight").shape,
            (Shape{1, 64}));
  EXPECT_EQ(m.at("model.layers.1.self_attn.q_proj.bias").shape, (Shape{64}));
  EXPECT_EQ(m.at("model.layers.1.self_attn.v_proj.bias").shape, (Shape{32}));
  EXPECT_EQ(m.count("model.layers.1.self_attn.o_proj.bias"), 0u);
}

TEST(ExpectedTensorsTest, Qwen3MoePerHeadNormAndDenseLayer) {
  ModelConfig c = TinyConfig(ModelFamily::kQwen3Moe);
  auto specs = ExpectedTensors(c);
  EXPECT_EQ(specs.size(), ExpectedTensorCount(c));
  auto m = ByName(specs);
  EXPECT_EQ(m.at("model.layers.0.self_attn.q_norm.weight").shape, (Shape{32}));
  EXPECT_EQ(m.at("model.layers.0.self_attn.k_norm.weight").shape, (Shape{32}));
  EXPECT_EQ(m.at("model.layers.0.self_attn.q_proj.weight").shape,
            (Shape{128, 64}));
  EXPECT_EQ(m.at("model.layers.0.self_attn.o_proj.weight").shape,
            (Shape{64, 128}));
  // Layer 2 is dense (mlp_only_layers).
  EXPECT_EQ(m.at("model.layers.2.mlp.gate_proj.weight").role,
            TensorRole::kMlpGate);
  EXPECT_EQ(m.at("model.layers.2.mlp.down_proj.weight").shape,
            (Shape{64, 128}));
  EXPECT_EQ(m.count("model.layers.2.mlp.gate.weight"), 0u);
  EXPECT_EQ(m.count("model.layers.3.mlp.experts.0.up_proj.weight"), 1u);
}

TEST(ExpectedTensorsTest, OlmoeWholeProjectionNormAndTiedEmbeddings) {
  ModelConfig c = TinyConfig(ModelFamily::kOlmoe);
  auto m = ByName(ExpectedTensors(c));
  EXPECT_EQ(m.at("model.layers.3.self_attn.q_norm.weight").shape, (Shape{64}));
  EXPECT_EQ(m.at("model.layers.3.self_attn.k_norm.weight").shape, (Shape{32}));
  EXPECT_EQ(m.at("model.layers.3.mlp.experts.0.down_proj.weight").shape,
            (Shape{64, 64}));
  EXPECT_EQ(m.count("lm_head.weight"), 1u);
  c.tie_word_embeddings = true;
  auto tied = ByName(ExpectedTensors(c));
  EXPECT_EQ(tied.count("lm_head.weight"), 0u);
  EXPECT_EQ(ExpectedTensors(c).size(), ExpectedTensorCount(c));
}

// Rewrites `dir`/model.safetensors through `edit`, which may drop or change
// tensors (name, dtype, shape, bytes).
struct Tensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};
template <typename Edit>
void Rewrite(const std::string& dir, Edit edit) {
  std::vector<Tensor> tensors;
  {
    auto file = SafetensorsFile::Open(dir + "/model.safetensors");
    ASSERT_TRUE(file.ok());
    for (const auto& t : (*file)->tensors()) {
      auto d = (*file)->Data(t);
      tensors.push_back({t.name, t.dtype, t.shape, {d.begin(), d.end()}});
    }
  }
  edit(tensors);
  SafetensorsWriter w;
  for (auto& t : tensors)
    ASSERT_TRUE(w.Add(t.name, t.dtype, t.shape, t.bytes).ok()) << t.name;
  ASSERT_TRUE(w.Write(dir + "/model.safetensors").ok());
}

class ModelDescriptionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MakeModelOptions o = TinyPreset(ModelFamily::kQwen2Moe);
    o.seed = 3;
    ASSERT_TRUE(MakeModel(o, dir_.path()).ok());
  }
  std::string Error() {
    auto d = ModelDescription::Open(dir_.path());
    EXPECT_FALSE(d.ok());
    return std::string(d.status().message());
  }
  TempDir dir_;
};

TEST_F(ModelDescriptionTest, ViewsAndByteAccounting) {
  auto d = ModelDescription::Open(dir_.path());
  ASSERT_TRUE(d.ok()) << d.status();
  const ModelConfig& c = d->config();
  EXPECT_EQ(c.family, ModelFamily::kQwen2Moe);
  // Expert views are the checkpoint's bytes for the expected names.
  for (int moe = 0; moe < c.num_moe_layers(); ++moe) {
    int layer = c.LayerOfMoeLayer(moe);
    auto up = d->Expert(moe, 6, TensorRole::kExpertUp);
    ASSERT_TRUE(up.ok());
    auto direct = d->checkpoint().Get("model.layers." + std::to_string(layer) +
                                      ".mlp.experts.6.up_proj.weight");
    ASSERT_TRUE(direct.ok());
    EXPECT_EQ(up->data, direct->data);
    EXPECT_EQ(up->shape, (Shape{64, 64}));
  }
  auto gate = d->Dense(TensorRole::kSharedExpertGate, 2);
  ASSERT_TRUE(gate.ok());
  EXPECT_EQ(gate->shape, (Shape{1, 64}));
  EXPECT_TRUE(d->HasDense(TensorRole::kQBias, 0));
  EXPECT_FALSE(d->HasDense(TensorRole::kQNorm, 0));
  EXPECT_EQ(d->Dense(TensorRole::kQNorm, 0).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(d->Dense(TensorRole::kEmbed).ok());
  EXPECT_TRUE(d->Dense(TensorRole::kLmHead).ok());
  EXPECT_EQ(d->Expert(4, 0, TensorRole::kExpertUp).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(d->Expert(0, 8, TensorRole::kExpertUp).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(d->Expert(0, 0, TensorRole::kRouter).status().code(),
            absl::StatusCode::kInvalidArgument);

  EXPECT_EQ(d->expert_dtype(), DType::kBF16);
  EXPECT_EQ(d->bytes_per_expert(), 3u * 64 * 64 * 2);
  uint64_t all = 0;
  for (const auto& name : d->checkpoint().names())
    all += d->checkpoint().Get(name)->nbytes;
  EXPECT_EQ(d->total_bytes(), all);
  EXPECT_EQ(d->dense_bytes() + 4u * 8u * d->bytes_per_expert(), all);
}

TEST_F(ModelDescriptionTest, TiedEmbeddingServesAsLmHead) {
  TempDir dir;
  MakeModelOptions o = TinyPreset(ModelFamily::kMixtral);
  o.tie_word_embeddings = true;
  ASSERT_TRUE(MakeModel(o, dir.path()).ok());
  auto d = ModelDescription::Open(dir.path());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_FALSE(d->checkpoint().Has("lm_head.weight"));
  EXPECT_EQ(d->Dense(TensorRole::kLmHead)->data,
            d->Dense(TensorRole::kEmbed)->data);
}

TEST_F(ModelDescriptionTest, ExtraTensorsAreIgnored) {
  Rewrite(dir_.path(), [](std::vector<Tensor>& t) {
    t.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq",
                 DType::kF32,
                 {8},
                 std::vector<uint8_t>(32, 0)});
  });
  EXPECT_TRUE(ModelDescription::Open(dir_.path()).ok());
}

TEST_F(ModelDescriptionTest, MissingTensorIsNamed) {
  Rewrite(dir_.path(), [](std::vector<Tensor>& t) {
    t.erase(
        std::remove_if(t.begin(), t.end(),
                       [](const Tensor& x) {
                         return x.name ==
                                "model.layers.3.mlp.experts.2.down_proj.weight";
                       }),
        t.end());
  });
  std::string e = Error();
  EXPECT_THAT(
      e, HasSubstr(
             "lacks tensor 'model.layers.3.mlp.experts.2.down_proj.weight'"));
  EXPECT_THAT(e, HasSubstr("expert_down, layer 3, expert 2"));
}

TEST_F(ModelDescriptionTest, WrongShapeIsNamed) {
  Rewrite(dir_.path(), [](std::vector<Tensor>& t) {
    for (auto& x : t) {
      if (x.name == "model.layers.1.self_attn.k_proj.weight")
        x.shape = {64, 32};
    }
  });
  std::string e = Error();
  EXPECT_THAT(
      e,
      HasSubstr("'model.layers.1.self_attn.k_proj.weight' has shape [64, 32], "
                "expected [32, 64]"));
}

TEST_F(ModelDescriptionTest, IntegerWeightsAreRefused) {
  Rewrite(dir_.path(), [](std::vector<Tensor>& t) {
    for (auto& x : t) {
      if (x.name == "model.norm.weight") x.dtype = DType::kI16;
    }
  });
  EXPECT_THAT(Error(), HasSubstr("'model.norm.weight' has dtype I16"));
}

TEST_F(ModelDescriptionTest, MixedExpertDtypesAreRefused) {
  Rewrite(dir_.path(), [](std::vector<Tensor>& t) {
    for (auto& x : t) {
      if (x.name == "model.layers.2.mlp.experts.1.gate_proj.weight") {
        x.dtype = DType::kF16;  // same size, different dtype
      }
    }
  });
  EXPECT_THAT(Error(), HasSubstr("the experts of a layer must share their dtypes"));
}

// A layer whose down projections are all of another dtype (as llama.cpp's
// Q4_K_M keeps some layers' ffn_down_exps in Q6_K) is described per layer.
TEST_F(ModelDescriptionTest, ExpertDtypesMayDifferPerLayerAndProjection) {
  Rewrite(dir_.path(), [](std::vector<Tensor>& t) {
    for (auto& x : t) {
      if (absl::StartsWith(x.name, "model.layers.2.mlp.experts.") &&
          absl::EndsWith(x.name, "down_proj.weight")) {
        x.dtype = DType::kF16;  // same size, different dtype
      }
    }
  });
  auto d = ModelDescription::Open(dir_.path());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(d->mixed_expert_dtypes());
  const ExpertDTypes bf16 = ExpertDTypes::All(DType::kBF16);
  for (int l = 0; l < d->config().num_moe_layers(); ++l) {
    const ExpertDTypes want = l == 2 ? ExpertDTypes{DType::kBF16, DType::kBF16, DType::kF16} : bf16;
    EXPECT_EQ(d->expert_dtypes(l), want) << l;
    EXPECT_EQ(d->expert_bytes(l), d->bytes_per_expert()) << l;
  }
  auto down = d->Expert(2, 3, TensorRole::kExpertDown);
  ASSERT_TRUE(down.ok());
  EXPECT_EQ(down->dtype, DType::kF16);
}

TEST_F(ModelDescriptionTest, AbsurdConfigFailsFast) {
  moe::testing::WriteText(
      dir_.Sub("config.json"),
      R"({"model_type":"mixtral","num_hidden_layers":60000,)"
      R"("num_local_experts":60000,"num_experts_per_tok":2})");
  EXPECT_THAT(Error(), HasSubstr("checkpoint holds only"));
}

}  // namespace
}  // namespace moe
