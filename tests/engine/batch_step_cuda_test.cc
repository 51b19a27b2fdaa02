// The batched step on the CUDA backend: cuBLAS may pick a different
// reduction for a different number of rows, so a sequence's logits batched
// are not promised bit-identical to alone there, only within the stated
// tolerance: |batched - alone| <= 1e-3 * max(1, max |alone|) per logit (the
// order of the backend parity tests' f32 matmul tolerance). Skipped without a
// GPU (MOE_REQUIRE_CUDA=1, set by scripts/gpu-check.sh, makes that a
// failure).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model_maker.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "services/engine/batch_step.h"
#include "services/engine/in_memory_provider.h"
#include "services/engine/session.h"

namespace moe {
namespace {

TEST(BatchStepCudaTest, BatchedWithinToleranceOfAlone) {
  auto backend = CreateBackend("cuda");
  if (!backend.ok()) {
    const char* require = std::getenv("MOE_REQUIRE_CUDA");
    ASSERT_FALSE(require != nullptr && *require == '1') << backend.status();
    GTEST_SKIP() << "no CUDA device: " << backend.status().message();
  }
  MakeModelOptions o = TinyPreset(ModelFamily::kQwen3Moe);
  o.seed = 41;
  o.top_k = 3;
  const std::string dir = absl::StrCat(::testing::TempDir(), "/batch_cuda");
  ASSERT_TRUE(MakeModel(o, dir).ok());
  auto model = MoeModel::Load(dir, backend->get());
  ASSERT_TRUE(model.ok()) << model.status();
  auto experts = InMemoryExpertProvider::Create(**model);
  ASSERT_TRUE(experts.ok()) << experts.status();
  const std::vector<std::vector<int32_t>> prompts = {
      {3, 1, 4, 1, 5}, {9}, {2, 6, 5, 3}};
  const std::vector<int32_t> decode = {7, 8, 9, 10};
  // Alone: prompt, then the decode tokens one at a time.
  std::vector<std::vector<std::vector<float>>> alone(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    Session s(**model, experts->get(), 32);
    auto l = s.Forward(prompts[i], true);
    ASSERT_TRUE(l.ok()) << l.status();
    alone[i].emplace_back(l->begin(), l->end());
    for (int32_t t : decode) {
      l = s.Forward(absl::Span<const int32_t>(&t, 1), false);
      ASSERT_TRUE(l.ok()) << l.status();
      alone[i].emplace_back(l->begin(), l->end());
    }
  }
  // Batched: all prompts in one step, then every decode token together.
  std::vector<std::unique_ptr<Session>> sessions;
  for (size_t i = 0; i < prompts.size(); ++i) {
    sessions.push_back(std::make_unique<Session>(**model, experts->get(), 32));
  }
  BatchStep step(**model, experts->get());
  for (size_t k = 0; k <= decode.size(); ++k) {
    std::vector<BatchStep::Entry> entries;
    for (size_t i = 0; i < prompts.size(); ++i) {
      BatchStep::Entry e;
      e.session = sessions[i].get();
      e.request = i + 1;
      e.prefill = k == 0;
      e.tokens = k == 0 ? absl::Span<const int32_t>(prompts[i])
                        : absl::Span<const int32_t>(&decode[k - 1], 1);
      entries.push_back(e);
    }
    ASSERT_TRUE(step.Run(entries).ok());
    for (size_t i = 0; i < prompts.size(); ++i) {
      absl::Span<const float> got = step.logits(i);
      const std::vector<float>& want = alone[i][k];
      ASSERT_EQ(got.size(), want.size());
      float scale = 1.0f;
      for (float v : want) scale = std::max(scale, std::fabs(v));
      float worst = 0.0f;
      for (size_t j = 0; j < want.size(); ++j)
        worst = std::max(worst, std::fabs(got[j] - want[j]));
      EXPECT_LE(worst, 1e-3f * scale) << "sequence " << i << " step " << k;
    }
  }
}

// A device worker's host answers (--device-host-experts): odd experts come
// as views of host memory (here the same model's CPU copy) computed by a
// CPU backend beside the GPU, their sum added on the device. Logits stay
// within the same tolerance of the all-device run.
TEST(BatchStepCudaTest, HostAnswersBesideTheDeviceWithinTolerance) {
  auto backend = CreateBackend("cuda");
  if (!backend.ok()) {
    const char* require = std::getenv("MOE_REQUIRE_CUDA");
    ASSERT_FALSE(require != nullptr && *require == '1') << backend.status();
    GTEST_SKIP() << "no CUDA device: " << backend.status().message();
  }
  auto cpu = CreateBackend("cpu");
  ASSERT_TRUE(cpu.ok());
  MakeModelOptions o = TinyPreset(ModelFamily::kMixtral);
  o.seed = 43;
  const std::string dir = absl::StrCat(::testing::TempDir(), "/split_cuda");
  ASSERT_TRUE(MakeModel(o, dir).ok());
  auto model = MoeModel::Load(dir, backend->get());
  auto host_model = MoeModel::Load(dir, cpu->get());
  ASSERT_TRUE(model.ok() && host_model.ok());
  auto experts = InMemoryExpertProvider::Create(**model);
  auto host_experts = InMemoryExpertProvider::Create(**host_model);
  ASSERT_TRUE(experts.ok() && host_experts.ok());

  class Split : public ExpertProvider {
   public:
    Split(ExpertProvider* device, ExpertProvider* host, Backend* host_be)
        : device_(device), host_(host), host_be_(host_be) {}
    absl::StatusOr<AcquiredExperts> Acquire(int layer, absl::Span<const ExpertDemand> d,
                                            bool prefill) override {
      absl::StatusOr<AcquiredExperts> a = device_->Acquire(layer, d, prefill);
      absl::StatusOr<AcquiredExperts> h = host_->Acquire(layer, d, prefill);
      if (!a.ok()) return a;
      if (!h.ok()) return h.status();
      for (size_t i = 0; i < a->views.size(); ++i) {
        if (a->views[i].expert % 2 == 0) continue;
        a->views[i] = h->views[i];
        a->views[i].on_host = true;
        ++runs;
      }
      host_->Release(*h);
      a->host_backend = host_be_;
      return a;
    }
    void Release(AcquiredExperts& a) override { device_->Release(a); }
    ExpertProvider* device_;
    ExpertProvider* host_;
    Backend* host_be_;
    int64_t runs = 0;
  } split(experts->get(), host_experts->get(), cpu->get());

  const std::vector<int32_t> prompt = {3, 1, 4, 1, 5, 9, 2, 6};
  const std::vector<int32_t> decode = {7, 8, 9, 10, 11};
  Session want(**model, experts->get(), 32);
  Session got(**model, &split, 32);
  for (size_t k = 0; k <= decode.size(); ++k) {
    const absl::Span<const int32_t> in =
        k == 0 ? absl::Span<const int32_t>(prompt) : absl::Span<const int32_t>(&decode[k - 1], 1);
    auto w = want.Forward(in, k == 0);
    ASSERT_TRUE(w.ok()) << w.status();
    const std::vector<float> ref(w->begin(), w->end());
    auto g = got.Forward(in, k == 0);
    ASSERT_TRUE(g.ok()) << g.status();
    ASSERT_EQ(g->size(), ref.size());
    float scale = 1.0f;
    for (float v : ref) scale = std::max(scale, std::fabs(v));
    float worst = 0.0f;
    for (size_t j = 0; j < ref.size(); ++j) worst = std::max(worst, std::fabs((*g)[j] - ref[j]));
    EXPECT_LE(worst, 1e-3f * scale) << "step " << k;
  }
  EXPECT_GT(split.runs, 0);
}

}  // namespace
}  // namespace moe
