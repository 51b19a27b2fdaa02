// GLM-4.5's layout (glm4_moe: sigmoid + bias-corrected group routing with a
// shared expert, grouped attention with q/k/v biases, per-head q/k norm and
// rope on part of each head) served by the real moe-cached + moe-worker: the
// greedy tokens and logprobs of the float64 reference
// (tests/reference/glm4_moe_reference.py) for several capacities, policies
// and miss modes, bit-identical across them (design invariant 4).
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/moe_worker/served_e2e.h"

namespace moe::worker {
namespace {

const std::vector<int32_t> kPrompt = {11, 22, 33, 44, 55, 66, 77};
constexpr int kNew = 12;

class Glm4MoeE2eTest : public ServedE2eTest<bool> {
 protected:
  void SetUp() override {
    MakeModelOptions o = TinyPreset(ModelFamily::kGlm4Moe);
    o.seed = 41;
    o.use_qk_norm = GetParam();
    absl::Status s = MakeModel(o, model_dir());
    ASSERT_TRUE(s.ok()) << s;
  }
};

TEST_P(Glm4MoeE2eTest, ServedTokensMatchTheFloat64ReferenceForEveryCache) {
  // Tiny glm4_moe: 4 layers, layer 0 dense, so 3 MoE layers x 8 experts of
  // gate, up and down [32, 64] bf16 (12288 bytes); the shared experts stay
  // in the worker.
  ExpectEveryCacheGivesTheReference(
      kPrompt, kNew,
      {{8, "lru"}, {13, "moe-infinity"}, {24, "lfu"}, {8, "expertflow"}}, {},
      2e-2, 24, "glm4_moe", [](int experts, const Served& run) {
        const nlohmann::json& stats = run.stats;
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

INSTANTIATE_TEST_SUITE_P(QkNorm, Glm4MoeE2eTest, ::testing::Bool(),
                         [](const auto& info) {
                           return std::string(info.param ? "with_qk_norm"
                                                         : "without_qk_norm");
                         });

}  // namespace
}  // namespace moe::worker
