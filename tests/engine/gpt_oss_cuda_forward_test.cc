// Tiny gpt_oss models (bf16 and MXFP4 experts) generated on the CUDA backend
// (SinkAttention with the sliding window, BiasedExpertFfn, the biased
// router, interleaved YaRN rope) give the CPU backend's greedy tokens, with
// logprobs within 2e-2.
// Skips, with the reason, when there is no usable device.
#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model_maker.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "services/engine/generator.h"
#include "services/engine/in_memory_provider.h"

namespace moe {
namespace {

struct GreedyRun {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
};

GreedyRun Greedy(const std::string& dir, Backend* backend,
                 std::optional<DType> held = std::nullopt) {
  GreedyRun out;
  auto model = MoeModel::Load(dir, backend);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return out;
  auto experts = InMemoryExpertProvider::Create(**model, held);
  EXPECT_TRUE(experts.ok()) << experts.status();
  if (!experts.ok()) return out;
  GenerateOptions o;
  o.prompt = {1, 7, 42, 99, 3, 250, 17};
  o.max_new_tokens = 12;
  o.stop_at_eos = false;
  auto s = Generate(**model, experts->get(), o, [&](const SampledToken& t) {
    out.tokens.push_back(t.token);
    out.logprobs.push_back(t.logprob);
    return true;
  });
  EXPECT_TRUE(s.ok()) << s.status();
  return out;
}

TEST(GptOssCudaForwardTest, CudaGivesTheCpuTokens) {
  auto cuda = CreateBackend("cuda");
  if (!cuda.ok()) {
    const char* require = std::getenv("MOE_REQUIRE_CUDA");
    ASSERT_FALSE(require != nullptr && *require == '1') << cuda.status();
    GTEST_SKIP() << "no CUDA device: " << cuda.status().message();
  }
  auto cpu = CreateBackend("cpu");
  ASSERT_TRUE(cpu.ok());
  for (bool mxfp4 : {false, true}) {
    SCOPED_TRACE(mxfp4 ? "mxfp4" : "bf16");
    MakeModelOptions o = TinyPreset(ModelFamily::kGptOss);
    o.seed = 43;
    o.mxfp4 = mxfp4;
    const std::string dir = absl::StrCat(::testing::TempDir(), "/cuda_gpt_oss_",
                                         mxfp4 ? "mxfp4" : "bf16");
    ASSERT_TRUE(MakeModel(o, dir).ok());
    // MXFP4: held as q8 (the default) and natively as mxfp4.
    for (std::optional<DType> held :
         {std::optional<DType>(), mxfp4 ? std::optional<DType>(DType::kMxfp4)
                                        : std::optional<DType>()}) {
      const GreedyRun want = Greedy(dir, cpu->get(), held);
      const GreedyRun got = Greedy(dir, cuda->get(), held);
      EXPECT_EQ(got.tokens, want.tokens);
      ASSERT_EQ(got.logprobs.size(), want.logprobs.size());
      for (size_t i = 0; i < got.logprobs.size(); ++i) {
        EXPECT_NEAR(got.logprobs[i], want.logprobs[i], 2e-2) << i;
      }
    }
  }
}

}  // namespace
}  // namespace moe
