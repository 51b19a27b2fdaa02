// gpt_oss tiny models (sinks, sliding and full layers, YaRN, biased router,
// biased clamped-SwiGLU experts whose biases travel in the daemon's slots),
// bf16 and MXFP4 checkpoints, served by the real moe-cached + moe-worker:
// the greedy tokens and logprobs of the float64 reference
// (tests/reference/moe_reference.py) for several capacities and policies,
// bit-identical across them (design invariant 4). The prompt and the
// generated tokens run past the sliding window (8).
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/moe_worker/served_e2e.h"

namespace moe::worker {
namespace {

const std::vector<int32_t> kPrompt = {11, 22, 33, 44, 55, 66, 77, 88, 99, 5};
constexpr int kNew = 10;

// "bf16"; "mxfp4": MXFP4 experts held as q8 by the daemon (exactly, the
// default); "mxfp4_native": held as MXFP4 (--expert-format mxfp4).
class GptOssE2eTest : public ServedE2eTest<std::string> {
 protected:
  void SetUp() override {
    MakeModelOptions o = TinyPreset(ModelFamily::kGptOss);
    o.seed = 33;
    o.mxfp4 = GetParam() != "bf16";
    absl::Status s = MakeModel(o, model_dir());
    ASSERT_TRUE(s.ok()) << s;
  }
};

TEST_P(GptOssE2eTest, ServedTokensMatchTheFloat64ReferenceForEveryCache) {
  // q8 rounds the activations of each product (forward_reference_test's
  // kQ8Tolerance); bf16 experts are exact.
  const double tolerance = GetParam() != "bf16" ? 8e-2 : 2e-2;
  std::vector<std::string> daemon_args;
  if (GetParam() == "mxfp4_native") daemon_args = {"--expert-format", "mxfp4"};
  // 4 MoE layers x 8 experts.
  ExpectEveryCacheGivesTheReference(
      kPrompt, kNew,
      {{8, "lru"}, {13, "moe-infinity"}, {32, "lfu"}, {8, "expertflow"}},
      daemon_args, tolerance, 32, "gpt_oss " + GetParam(), nullptr);
}

INSTANTIATE_TEST_SUITE_P(Formats, GptOssE2eTest,
                         ::testing::Values("bf16", "mxfp4", "mxfp4_native"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace moe::worker
