// The make-model presets: the published shapes are those of the real
// config.json files (at 2 layers), and each one's config validates.
#include "common/model_presets.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace moe {
namespace {

using ::testing::HasSubstr;

TEST(ModelPresetsTest, MixtralShapeAtTwoLayers) {
  absl::StatusOr<MakeModelOptions> o =
      PresetOptions("mixtral-8x7b-2l", std::nullopt);
  ASSERT_TRUE(o.ok()) << o.status();
  absl::StatusOr<ModelConfig> c = ConfigFromOptions(*o);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->family, ModelFamily::kMixtral);
  EXPECT_EQ(c->num_hidden_layers, 2);
  EXPECT_EQ(c->hidden_size, 4096);
  EXPECT_EQ(c->moe_intermediate_size, 14336);
  EXPECT_EQ(c->num_experts, 8);
  EXPECT_EQ(c->top_k, 2);
  EXPECT_EQ(c->num_key_value_heads, 8);
  EXPECT_EQ(c->vocab_size, 32000);
}

TEST(ModelPresetsTest, EveryPresetValidates) {
  for (const char* name :
       {"tiny", "small", "mixtral-8x7b-2l", "qwen1.5-moe-a2.7b-2l",
        "qwen3-30b-a3b-2l", "olmoe-1b-7b-2l"}) {
    SCOPED_TRACE(name);
    EXPECT_THAT(PresetNames(), HasSubstr(name));
    absl::StatusOr<MakeModelOptions> o = PresetOptions(name, std::nullopt);
    ASSERT_TRUE(o.ok()) << o.status();
    EXPECT_TRUE(ConfigFromOptions(*o).ok());
  }
  absl::StatusOr<MakeModelOptions> q =
      PresetOptions("qwen3-30b-a3b-2l", std::nullopt);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->experts, 128);
  EXPECT_EQ(q->head_dim, 128);
  EXPECT_EQ(q->moe_intermediate, 768);
}

TEST(ModelPresetsTest, FamilyAndNameErrors) {
  EXPECT_EQ(PresetOptions("small", ModelFamily::kOlmoe)->arch,
            ModelFamily::kOlmoe);
  absl::StatusOr<MakeModelOptions> wrong =
      PresetOptions("olmoe-1b-7b-2l", ModelFamily::kMixtral);
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<MakeModelOptions> unknown =
      PresetOptions("large", std::nullopt);
  EXPECT_THAT(unknown.status().message(), HasSubstr("unknown preset 'large'"));
}

}  // namespace
}  // namespace moe
