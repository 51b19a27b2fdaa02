// DeepSeek-V2 and -V3 tiny models (MLA with a latent cache, grouped and
// bias-corrected routing, shared experts, a dense first layer) served by the
// real moe-cached + moe-worker: the greedy tokens and logprobs of the float64
// reference (tests/reference/moe_reference.py) for several capacities and
// policies, bit-identical across them (design invariant 4), and a cache that
// counts MoE layers only.
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/moe_worker/served_e2e.h"

namespace moe::worker {
namespace {

const std::vector<int32_t> kPrompt = {11, 22, 33, 44, 55, 66, 77};
constexpr int kNew = 12;

class DeepseekE2eTest : public ServedE2eTest<ModelFamily> {
 protected:
  void SetUp() override {
    MakeModelOptions o = TinyPreset(GetParam());
    o.seed = 31;
    absl::Status s = MakeModel(o, model_dir());
    ASSERT_TRUE(s.ok()) << s;
  }
};

TEST_P(DeepseekE2eTest, ServedTokensMatchTheFloat64ReferenceForEveryCache) {
  // Tiny deepseek: 4 layers, layer 0 dense, so 3 MoE layers x 8 experts.
  ExpectEveryCacheGivesTheReference(
      kPrompt, kNew,
      {{8, "lru"}, {13, "moe-infinity"}, {24, "lfu"}, {8, "expertflow"}}, {},
      2e-2, 24, std::string(ModelFamilyName(GetParam())),
      [](int experts, const Served& run) {
        const nlohmann::json& stats = run.stats;
        // The cache holds MoE layers only: 3 x 8 experts of gate, up and down
        // [32, 64] bf16 each (12288 bytes); the dense layer 0 and the shared
        // experts stay in the worker.
        if (experts == 24) {
          EXPECT_LE(stats["misses"].get<int64_t>(), 24) << stats.dump();
        }
        if (stats["host_runs"].get<int64_t>() == 0) {
          EXPECT_EQ(stats["bytes_copied"].get<int64_t>(),
                    stats["misses"].get<int64_t>() * 3 * 32 * 64 * 2)
              << stats.dump();
        }
      });
}

INSTANTIATE_TEST_SUITE_P(Families, DeepseekE2eTest,
                         ::testing::Values(ModelFamily::kDeepseekV2,
                                           ModelFamily::kDeepseekV3),
                         [](const auto& info) {
                           return std::string(ModelFamilyName(info.param));
                         });

}  // namespace
}  // namespace moe::worker
