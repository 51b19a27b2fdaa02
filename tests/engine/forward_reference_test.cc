// The C++ engine against the independent float64 numpy reference
// (tests/reference/moe_reference.py) on tiny models of every family.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/fp8.h"
#include "common/model_maker.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"
#include "kernels/backend.h"
#include "nlohmann/json.hpp"
#include "services/engine/generator.h"
#include "services/engine/in_memory_provider.h"

namespace moe {
namespace {

struct Case {
  std::string name;
  MakeModelOptions options;
  // How the engine holds the experts (nullopt: as stored, or q8 for F8).
  std::optional<DType> held;
  // q8 experts round the activations of each product to 8 bits per 32: the
  // top-5 order may swap near ties and the logprobs move more (measured
  // bound below), so only the greedy tokens and the chosen token's logprob
  // are compared then.
  double tolerance = 2e-2;
  bool compare_alternatives = true;
};

std::string RunCommand(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  int rc = pclose(p);
  if (rc != 0) ADD_FAILURE() << cmd << " exited with " << rc << "\n" << out;
  return out;
}

// |logprob - reference| bound for F8 experts held as q8, the default
// (measured up to 0.069, olmoe; the q8 format's own rounding of weights and
// activations, not the FP8 loading: held as F32 with F32 dense weights the
// same checkpoints match the reference to 1.1e-6).
constexpr double kQ8Tolerance = 8e-2;

MakeModelOptions Tiny(ModelFamily family, uint64_t seed) {
  MakeModelOptions o = TinyPreset(family);
  o.seed = seed;
  o.kv_heads = o.heads / 2;  // GQA ratio 2
  return o;
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  cases.push_back({"mixtral", Tiny(ModelFamily::kMixtral, 11)});
  Case q2{"qwen2_moe_dense_layer", Tiny(ModelFamily::kQwen2Moe, 12)};
  q2.options.mlp_only_layers = {1};  // a dense layer among MoE layers
  q2.options.norm_topk_prob = false;
  cases.push_back(q2);
  Case q2n{"qwen2_moe_norm_topk", Tiny(ModelFamily::kQwen2Moe, 13)};
  q2n.options.norm_topk_prob = true;
  cases.push_back(q2n);
  Case q3{"qwen3_moe", Tiny(ModelFamily::kQwen3Moe, 14)};
  q3.options.norm_topk_prob = true;
  cases.push_back(q3);
  cases.push_back({"olmoe", Tiny(ModelFamily::kOlmoe, 15)});
  // MLA without q_lora_rank, group_limited_greedy, 2 shared experts,
  // routed_scaling_factor 2, layer 0 dense.
  cases.push_back({"deepseek_v2", Tiny(ModelFamily::kDeepseekV2, 16)});
  // q_lora_rank, greedy with norm_topk_prob (no scaling then), YaRN with a
  // cos/sin factor (mscale != mscale_all_dim) and the softmax correction,
  // moe_layer_freq 2 (MoE layers 2 and 4).
  Case v2y{"deepseek_v2_yarn_qlora", Tiny(ModelFamily::kDeepseekV2, 17)};
  v2y.options.layers = 5;
  v2y.options.moe_layer_freq = 2;
  v2y.options.mla.q_lora_rank = 24;
  v2y.options.topk_method = TopkMethod::kGreedy;
  v2y.options.norm_topk_prob = true;
  v2y.options.yarn = YarnConfig{4.0, 64, 32.0, 1.0, 1.0, 0.8};
  cases.push_back(v2y);
  // Sigmoid scores, noaux_tc with e_score_correction_bias, q_lora_rank.
  cases.push_back({"deepseek_v3", Tiny(ModelFamily::kDeepseekV3, 18)});
  // gpt_oss: sinks, sliding layers (window 8 < the 19 positions), YaRN
  // without truncation, biased router, biased clamped-SwiGLU experts
  // (limit 1.5: the clamp acts), bf16 experts as stored.
  cases.push_back({"gpt_oss", Tiny(ModelFamily::kGptOss, 19)});
  // glm4_moe: q/k/v biases, per-head q/k norm, rope on half of each head
  // (head_dim 32 != hidden/heads), sigmoid + e_score_correction_bias routing
  // over 2 groups keeping 1, a shared expert, layer 0 dense.
  cases.push_back({"glm4_moe", Tiny(ModelFamily::kGlm4Moe, 21)});
  // As GLM-4.5-Air: no q/k norm, one group, rope on a quarter of each head,
  // routed_scaling_factor 1.
  Case air{"glm4_moe_air_like", Tiny(ModelFamily::kGlm4Moe, 22)};
  air.options.use_qk_norm = false;
  air.options.n_group = 1;
  air.options.topk_group = 1;
  air.options.partial_rotary_factor = 0.25;
  air.options.routed_scaling_factor = 1.0;
  cases.push_back(air);
  // MXFP4 experts: the reference dequantizes the blocks exactly; held as F32
  // (exact) they match as tightly as bf16; the default q8 holds the same
  // weights exactly, only its activation rounding moves the logprobs.
  Case mx{"gpt_oss_mxfp4_as_f32", Tiny(ModelFamily::kGptOss, 20)};
  mx.options.mxfp4 = true;
  mx.held = DType::kF32;
  cases.push_back(mx);
  mx.name = "gpt_oss_mxfp4_as_q8";
  mx.held = std::nullopt;
  mx.tolerance = kQ8Tolerance;
  mx.compare_alternatives = false;
  cases.push_back(mx);
  // Held natively (--expert-format mxfp4): half q8's bytes, the same
  // integer products.
  mx.name = "gpt_oss_mxfp4_native";
  mx.held = DType::kMxfp4;
  cases.push_back(mx);
  // FP8 E4M3 checkpoints with block scales (DeepSeek-V3 / Qwen3 FP8
  // layout): the reference dequantizes them exactly; the engine dequantizes
  // the dense weights to bf16 and holds the experts as q8 (the default for
  // F8_E4M3 experts). Blocks of 32 and 48 give several scales per weight,
  // 48 partial ones at the edges.
  const std::pair<const char*, ModelFamily> fp8[] = {
      {"mixtral_fp8", ModelFamily::kMixtral},
      {"qwen2_moe_fp8", ModelFamily::kQwen2Moe},
      {"qwen3_moe_fp8", ModelFamily::kQwen3Moe},
      {"olmoe_fp8", ModelFamily::kOlmoe}};
  uint64_t seed = 16;
  for (const auto& [name, family] : fp8) {
    Case c{absl::StrCat(name, "_as_bf16"), Tiny(family, seed)};
    const int64_t block = seed % 2 == 0 ? 32 : 48;
    c.options.fp8 = Fp8BlockScheme{block, block};
    c.held = DType::kBF16;
    // Every weight rounded to bf16 (dense ones at load, experts here): the
    // top-5 order swaps at near ties, the chosen logprobs stay within 2e-2
    // (measured <= 0.011).
    c.compare_alternatives = false;
    cases.push_back(c);
    // The default: F8 experts held as q8.
    c.name = absl::StrCat(name, "_as_q8");
    c.held = std::nullopt;
    c.tolerance = kQ8Tolerance;
    c.compare_alternatives = false;
    cases.push_back(c);
    ++seed;
  }
  return cases;
}

class ForwardReferenceTest : public ::testing::TestWithParam<Case> {};

TEST_P(ForwardReferenceTest, GreedyTokensAndLogprobsMatchFloat64Reference) {
  const Case& c = GetParam();
  // f32 activations: bf16 weights on AVX512_BF16 would round them (near-tied
  // tokens and routes of these random models flip against the exact
  // reference; the rounding is tested op by op: bf16_dot_test).
  moe::testing::ScopedF32Activations f32_activations;
  std::string dir = absl::StrCat(::testing::TempDir(), "/ref_", c.name);
  ASSERT_TRUE(MakeModel(c.options, dir).ok());
  auto backend = CreateBackend("cpu");
  ASSERT_TRUE(backend.ok());
  auto model = MoeModel::Load(dir, backend->get());
  ASSERT_TRUE(model.ok()) << model.status();
  auto experts = InMemoryExpertProvider::Create(**model, c.held);
  ASSERT_TRUE(experts.ok()) << experts.status();

  const std::vector<int32_t> prompt = {1, 7, 42, 99, 3, 250, 17};
  const int kNew = 12;
  GenerateOptions opts;
  opts.prompt = prompt;
  opts.max_new_tokens = kNew;
  opts.stop_at_eos = false;
  opts.sampling.top_logprobs = 5;
  std::vector<SampledToken> got;
  auto summary = Generate(**model, experts->get(), opts,
                          [&](const SampledToken& t) {
                            got.push_back(t);
                            return true;
                          });
  ASSERT_TRUE(summary.ok()) << summary.status();
  ASSERT_EQ(got.size(), static_cast<size_t>(kNew));

  std::string out = RunCommand(absl::StrCat(
      "/usr/bin/python3 ", MOE_SOURCE_DIR,
      "/tests/reference/moe_reference.py --model ", dir, " --prompt-ids ",
      absl::StrJoin(prompt, ","), " --max-new-tokens ", kNew,
      " --top-logprobs 5"));
  auto ref = nlohmann::json::parse(out, nullptr, false);
  ASSERT_FALSE(ref.is_discarded()) << out;
  double max_diff = 0.0;
  for (int i = 0; i < kNew; ++i) {
    int ref_token = ref["tokens"][i].get<int>();
    ASSERT_EQ(got[i].token, ref_token) << "token " << i;
    max_diff = std::max(
        max_diff, std::abs(got[i].logprob - ref["logprobs"][i].get<double>()));
    for (int j = 0; j < 5 && c.compare_alternatives; ++j) {
      const auto& alt = ref["top_logprobs"][i][j];
      EXPECT_EQ(got[i].top_logprobs[j].first, alt[0].get<int>())
          << "step " << i << " alternative " << j;
      max_diff = std::max(
          max_diff,
          std::abs(got[i].top_logprobs[j].second - alt[1].get<double>()));
    }
  }
  std::printf("[%s] max |logprob - reference| = %.3g\n", c.name.c_str(),
              max_diff);
  EXPECT_LE(max_diff, c.tolerance);
}

INSTANTIATE_TEST_SUITE_P(Families, ForwardReferenceTest,
                         ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return info.param.name; });

// The KV cache path (prefill, then one token at a time) gives the logits of
// a full recompute of the same sequence.
// A gpt-oss MXFP4 checkpoint written without our code
// (tests/common/hf_checkpoint.py): experts held as F32 (the exact MXFP4
// values) against the reference, which dequantizes the blocks itself.
TEST(ForwardReferenceExternalTest, PythonWrittenGptOssMxfp4MatchesTheReference) {
  moe::testing::ScopedF32Activations f32_activations;  // as above
  const std::string dir = absl::StrCat(::testing::TempDir(), "/ref_py_gpt_oss_mxfp4");
  RunCommand(absl::StrCat("/usr/bin/python3 ", MOE_SOURCE_DIR,
                          "/tests/common/hf_checkpoint.py write --family gpt_oss_mxfp4 --out ",
                          dir));
  auto backend = CreateBackend("cpu");
  ASSERT_TRUE(backend.ok());
  auto model = MoeModel::Load(dir, backend->get());
  ASSERT_TRUE(model.ok()) << model.status();
  auto experts = InMemoryExpertProvider::Create(**model, DType::kF32);
  ASSERT_TRUE(experts.ok()) << experts.status();
  const std::vector<int32_t> prompt = {1, 7, 42, 99, 3, 250, 17};  // > window 4
  const int kNew = 8;
  GenerateOptions opts;
  opts.prompt = prompt;
  opts.max_new_tokens = kNew;
  opts.stop_at_eos = false;
  std::vector<SampledToken> got;
  ASSERT_TRUE(Generate(**model, experts->get(), opts, [&](const SampledToken& t) {
                got.push_back(t);
                return true;
              }).ok());
  ASSERT_EQ(got.size(), static_cast<size_t>(kNew));
  auto ref = nlohmann::json::parse(
      RunCommand(absl::StrCat("/usr/bin/python3 ", MOE_SOURCE_DIR,
                              "/tests/reference/moe_reference.py --model ", dir, " --prompt-ids ",
                              absl::StrJoin(prompt, ","), " --max-new-tokens ", kNew)),
      nullptr, false);
  ASSERT_FALSE(ref.is_discarded());
  double max_diff = 0;
  for (int i = 0; i < kNew; ++i) {
    ASSERT_EQ(got[i].token, ref["tokens"][i].get<int>()) << "token " << i;
    max_diff = std::max(max_diff, std::abs(got[i].logprob - ref["logprobs"][i].get<double>()));
  }
  std::printf("[python gpt_oss mxfp4] max |logprob - reference| = %.3g\n", max_diff);
  EXPECT_LE(max_diff, 2e-2);
}

TEST(SessionTest, IncrementalDecodeMatchesFullRecompute) {
  std::string dir = absl::StrCat(::testing::TempDir(), "/kv_mixtral");
  ASSERT_TRUE(MakeModel(Tiny(ModelFamily::kMixtral, 21), dir).ok());
  auto backend = CreateBackend("cpu");
  auto model = MoeModel::Load(dir, backend->get());
  ASSERT_TRUE(model.ok()) << model.status();
  auto experts = InMemoryExpertProvider::Create(**model);
  std::vector<int32_t> seq = {5, 9, 13, 200, 77, 31};
  Session inc(**model, experts->get(), 64);
  ASSERT_TRUE(inc.Forward(absl::MakeSpan(seq).subspan(0, 3), true).ok());
  absl::Span<const float> last;
  for (size_t i = 3; i < seq.size(); ++i) {
    auto l = inc.Forward(absl::MakeSpan(seq).subspan(i, 1), false);
    ASSERT_TRUE(l.ok());
    last = *l;
  }
  std::vector<float> inc_logits(last.begin(), last.end());
  Session full(**model, experts->get(), 64);
  auto all = full.Forward(seq, true);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), inc_logits.size());
  for (size_t i = 0; i < inc_logits.size(); ++i) {
    EXPECT_NEAR((*all)[i], inc_logits[i], 1e-4) << i;
  }
  EXPECT_EQ(inc.position(), 6);
}

// KV blocks: a session whose caches grow in blocks of 3 positions gives
// the logits of one that allocates its whole context at once, bit for bit,
// every family (standard, MLA latent, GPT-OSS sinks and windows), while
// holding only the blocks its positions need; KvBytesAfter predicts what
// the next Forward allocates.
TEST(SessionTest, KvBlocksGrowWithTheSequenceAndKeepTheTokens) {
  for (ModelFamily family : {ModelFamily::kMixtral, ModelFamily::kQwen2Moe,
                             ModelFamily::kDeepseekV3, ModelFamily::kGptOss}) {
    SCOPED_TRACE(ModelFamilyName(family));
    std::string dir =
        absl::StrCat(::testing::TempDir(), "/kv_blocks_", ModelFamilyName(family));
    MakeModelOptions o = TinyPreset(family);
    o.seed = 31;
    ASSERT_TRUE(MakeModel(o, dir).ok());
    auto backend = CreateBackend("cpu");
    auto model = MoeModel::Load(dir, backend->get());
    ASSERT_TRUE(model.ok()) << model.status();
    auto experts = InMemoryExpertProvider::Create(**model);
    const int64_t kSeq = 14;
    Session whole(**model, experts->get(), kSeq);
    Session blocks(**model, experts->get(), kSeq);
    EXPECT_EQ(blocks.set_kv_block_tokens(-1).code(), absl::StatusCode::kInvalidArgument);
    ASSERT_TRUE(blocks.set_kv_block_tokens(3).ok());
    const std::vector<int32_t> seq = {5, 9, 13, 200, 77, 31, 8, 2, 40, 41, 42, 43, 44, 45};
    size_t pos = 0;
    for (size_t step : {4, 1, 1, 3, 1, 1, 1, 2}) {
      const auto tokens = absl::MakeConstSpan(seq).subspan(pos, step);
      const int64_t predicted = blocks.KvBytesAfter(static_cast<int64_t>(step));
      auto a = whole.Forward(tokens, step > 1);
      ASSERT_TRUE(a.ok()) << a.status();
      std::vector<float> want(a->begin(), a->end());
      auto b = blocks.Forward(tokens, step > 1);
      ASSERT_TRUE(b.ok()) << b.status();
      pos += step;
      ASSERT_EQ(b->size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ((*b)[i], want[i]) << pos << "/" << i;
      const int64_t held = std::min<int64_t>(kSeq, (static_cast<int64_t>(pos) + 2) / 3 * 3);
      EXPECT_EQ(blocks.kv_cache_allocated_bytes(), Session::KvCacheBytes(**model, held)) << pos;
      EXPECT_EQ(blocks.kv_cache_allocated_bytes(), predicted) << pos;
      EXPECT_EQ(whole.kv_cache_allocated_bytes(), Session::KvCacheBytes(**model, kSeq));
    }
    EXPECT_EQ(pos, seq.size());
    EXPECT_EQ(blocks.set_kv_block_tokens(4).code(), absl::StatusCode::kFailedPrecondition);
  }
}

// MLA keeps a latent cache: kv_lora_rank + qk_rope_head_dim f32 values per
// token per layer (not 2 * heads * head_dim), measured from what the session
// allocates; prefill-then-decode over it gives the logits of a full
// recompute.
TEST(SessionTest, MlaKeepsALatentCacheOfRankPlusRopeValuesPerToken) {
  for (ModelFamily family :
       {ModelFamily::kDeepseekV2, ModelFamily::kDeepseekV3}) {
    SCOPED_TRACE(ModelFamilyName(family));
    std::string dir = absl::StrCat(::testing::TempDir(), "/latent_",
                                   ModelFamilyName(family));
    MakeModelOptions o = TinyPreset(family);
    o.seed = 26;
    ASSERT_TRUE(MakeModel(o, dir).ok());
    auto backend = CreateBackend("cpu");
    auto model = MoeModel::Load(dir, backend->get());
    ASSERT_TRUE(model.ok()) << model.status();
    auto experts = InMemoryExpertProvider::Create(**model);
    const ModelConfig& c = (*model)->config();
    const int64_t kSeq = 64;
    Session inc(**model, experts->get(), kSeq);
    EXPECT_EQ(inc.kv_cache_allocated_bytes(), 0);
    std::vector<int32_t> seq = {5, 9, 13, 200, 77, 31, 8};
    ASSERT_TRUE(inc.Forward(absl::MakeSpan(seq).subspan(0, 4), true).ok());
    const int64_t per_token_layer =
        inc.kv_cache_allocated_bytes() / (kSeq * c.num_hidden_layers);
    std::printf("[%s] latent cache: %lld bytes per token per layer "
                "(kv_lora_rank %lld + qk_rope_head_dim %lld, f32); full "
                "keys and values would be %lld\n",
                std::string(ModelFamilyName(family)).c_str(),
                static_cast<long long>(per_token_layer),
                static_cast<long long>(c.mla.kv_lora_rank),
                static_cast<long long>(c.mla.qk_rope_head_dim),
                static_cast<long long>(4 * c.num_attention_heads *
                                       (c.mla.qk_head_dim() +
                                        c.mla.v_head_dim)));
    EXPECT_EQ(per_token_layer,
              static_cast<int64_t>(sizeof(float)) *
                  (c.mla.kv_lora_rank + c.mla.qk_rope_head_dim));
    EXPECT_EQ(inc.kv_cache_allocated_bytes(),
              Session::KvCacheBytes(**model, kSeq));
    EXPECT_EQ(kSeq * c.num_hidden_layers * per_token_layer,
              inc.kv_cache_allocated_bytes());
    absl::Span<const float> last;
    for (size_t i = 4; i < seq.size(); ++i) {
      auto l = inc.Forward(absl::MakeSpan(seq).subspan(i, 1), false);
      ASSERT_TRUE(l.ok());
      last = *l;
    }
    std::vector<float> inc_logits(last.begin(), last.end());
    Session full(**model, experts->get(), kSeq);
    auto all = full.Forward(seq, true);
    ASSERT_TRUE(all.ok());
    for (size_t i = 0; i < inc_logits.size(); ++i) {
      EXPECT_NEAR((*all)[i], inc_logits[i], 1e-4) << i;
    }
  }
}

TEST(SessionTest, RejectsBadTokensAndOverflow) {
  std::string dir = absl::StrCat(::testing::TempDir(), "/bad_mixtral");
  ASSERT_TRUE(MakeModel(Tiny(ModelFamily::kMixtral, 22), dir).ok());
  auto backend = CreateBackend("cpu");
  auto model = MoeModel::Load(dir, backend->get());
  ASSERT_TRUE(model.ok());
  auto experts = InMemoryExpertProvider::Create(**model);
  Session s(**model, experts->get(), 4);
  std::vector<int32_t> bad = {1, -3};
  EXPECT_EQ(s.Forward(bad, true).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<int32_t> huge = {1, 1 << 30};
  EXPECT_EQ(s.Forward(huge, true).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<int32_t> five = {1, 2, 3, 4, 5};
  EXPECT_EQ(s.Forward(five, true).status().code(),
            absl::StatusCode::kOutOfRange);
  GenerateOptions o;
  o.prompt = {};
  EXPECT_EQ(ValidateGenerateOptions(**model, o).code(),
            absl::StatusCode::kInvalidArgument);
  o.prompt = {1};
  o.max_new_tokens = 0;
  EXPECT_FALSE(ValidateGenerateOptions(**model, o).ok());
  o.max_new_tokens = 1 << 30;
  EXPECT_FALSE(ValidateGenerateOptions(**model, o).ok());
}

}  // namespace
}  // namespace moe

namespace moe {
namespace {

// Records the hints a session sends (pre-gating) and otherwise serves from
// memory.
class HintRecorder : public ExpertProvider {
 public:
  explicit HintRecorder(ExpertProvider* inner) : inner_(inner) {}
  absl::StatusOr<AcquiredExperts> Acquire(int moe_layer,
                                      absl::Span<const ExpertDemand> demands,
                                      bool prefill) override {
    routed.emplace_back(moe_layer, std::vector<ExpertDemand>(demands.begin(),
                                                             demands.end()));
    return inner_->Acquire(moe_layer, demands, prefill);
  }
  void Release(AcquiredExperts& lease) override { inner_->Release(lease); }
  void Hint(absl::Span<const ExpertHint> h) override {
    hints.emplace_back(h.begin(), h.end());
    hint_iteration.push_back(iteration != nullptr ? *iteration : -1);
  }
  ExpertProvider* inner_;
  std::vector<std::pair<int, std::vector<ExpertDemand>>> routed;
  std::vector<std::vector<ExpertHint>> hints;
  const int* iteration = nullptr;  // when set, tags each Hint call
  std::vector<int> hint_iteration;
};

// Pre-gating: during decode, after every layer followed by a MoE layer the
// session hints top_k experts for that next layer, and does not change the
// tokens. Its recall against the real routing is printed (and must beat
// chance).
TEST(SessionTest, PregateHintsPredictTheNextLayerWithoutChangingTokens) {
  std::string dir = absl::StrCat(::testing::TempDir(), "/pregate_mixtral");
  ASSERT_TRUE(MakeModel(Tiny(ModelFamily::kMixtral, 23), dir).ok());
  auto backend = CreateBackend("cpu");
  auto model = MoeModel::Load(dir, backend->get());
  ASSERT_TRUE(model.ok()) << model.status();
  auto experts = InMemoryExpertProvider::Create(**model);
  const ModelConfig& c = (*model)->config();
  GenerateOptions opts;
  opts.prompt = {3, 14, 15, 92, 65};
  opts.max_new_tokens = 24;
  opts.stop_at_eos = false;
  auto run = [&](bool pregate, HintRecorder* rec) {
    opts.pregate_hints = pregate;
    std::vector<int32_t> tokens;
    auto s = Generate(**model, rec, opts, [&](const SampledToken& t) {
      tokens.push_back(t.token);
      return true;
    });
    EXPECT_TRUE(s.ok()) << s.status();
    return tokens;
  };
  HintRecorder plain(experts->get());
  HintRecorder hinted(experts->get());
  EXPECT_EQ(run(false, &plain), run(true, &hinted));
  EXPECT_TRUE(plain.hints.empty());
  // Decode iterations after the first token: (layers - 1) hint batches each.
  const int decode_iters = opts.max_new_tokens - 1;
  ASSERT_EQ(hinted.hints.size(),
            static_cast<size_t>(decode_iters * (c.num_hidden_layers - 1)));
  // Recall: hinted experts that the next acquire of that layer used.
  int hit = 0, total = 0;
  size_t h = 0;
  for (size_t i = 0; i < hinted.routed.size() && h < hinted.hints.size(); ++i) {
    const auto& [layer, demands] = hinted.routed[i];
    if (i < static_cast<size_t>(c.num_moe_layers()) || layer == 0) continue;
    const auto& batch = hinted.hints[h++];
    ASSERT_EQ(batch.size(), static_cast<size_t>(c.top_k));
    for (const ExpertHint& x : batch) {
      EXPECT_EQ(x.layer, layer);
      ++total;
      for (const ExpertDemand& d : demands) hit += d.expert == x.expert;
    }
  }
  ASSERT_GT(total, 0);
  double recall = static_cast<double>(hit) / total;
  std::printf("pre-gating recall on tiny mixtral: %.3f (chance %.3f)\n",
              recall, static_cast<double>(c.top_k) / c.num_experts);
  EXPECT_GT(recall, static_cast<double>(c.top_k) / c.num_experts);
}

// One greedy generation with pre-gating at `distance` (0: off): tokens,
// logprobs and, per [iteration][moe layer], the provider's hints and routing.
struct PregateRun {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::map<std::pair<int, int>, std::vector<int32_t>> hinted;  // sorted ids
  std::map<std::pair<int, int>, std::vector<int32_t>> routed;  // last token
  size_t hint_calls = 0;
};

PregateRun RunPregate(const MoeModel& model, ExpertProvider* experts,
                      GenerateOptions opts, int distance) {
  PregateRun out;
  opts.pregate_hints = distance > 0;
  opts.pregate_distance = std::max(distance, 1);
  HintRecorder rec(experts);
  int iteration = -1;  // 0 = prefill, then one per decode token
  rec.iteration = &iteration;
  const int k = static_cast<int>(model.config().top_k);
  RoutingObserver observer([&](int layer, int64_t tokens,
                               absl::Span<const int32_t> ids,
                               absl::Span<const float>) {
    if (layer == 0) ++iteration;
    out.routed[{iteration, layer}].assign(ids.end() - k, ids.end());
  });
  auto s = Generate(model, &rec, opts,
                    [&](const SampledToken& t) {
                      out.tokens.push_back(t.token);
                      out.logprobs.push_back(t.logprob);
                      return true;
                    },
                    observer);
  EXPECT_TRUE(s.ok()) << s.status();
  out.hint_calls = rec.hints.size();
  for (size_t i = 0; i < rec.hints.size(); ++i) {
    for (const ExpertHint& h : rec.hints[i]) {
      auto& ids = out.hinted[{rec.hint_iteration[i], h.layer}];
      ids.push_back(h.expert);
      std::sort(ids.begin(), ids.end());
    }
  }
  return out;
}

// Of the experts each hinted (iteration, layer) routed, the share hinted.
double Recall(const PregateRun& r) {
  int hit = 0, total = 0;
  for (const auto& [key, ids] : r.hinted) {
    const std::vector<int32_t>& routed = r.routed.at(key);
    total += static_cast<int>(routed.size());
    for (int32_t e : routed) {
      hit += std::count(ids.begin(), ids.end(), e) > 0;
    }
  }
  return total == 0 ? 0.0 : static_cast<double>(hit) / total;
}

// Distance 2: after layer l the session hints layer l+2 with the top-k of
// layer l+2's router applied to layer l's output, as the float64 reference
// computes it independently (tests/engine/pregate_reference.py); the tokens
// and logprobs are bit-identical to pre-gating off and at distance 1.
TEST(SessionTest, PregateDistanceTwoHintsTwoLayersAheadLikeTheReference) {
  std::string dir = absl::StrCat(::testing::TempDir(), "/pregate2_mixtral");
  ASSERT_TRUE(MakeModel(Tiny(ModelFamily::kMixtral, 24), dir).ok());
  auto backend = CreateBackend("cpu");
  auto model = MoeModel::Load(dir, backend->get());
  ASSERT_TRUE(model.ok()) << model.status();
  auto experts = InMemoryExpertProvider::Create(**model);
  ASSERT_TRUE(experts.ok()) << experts.status();
  const ModelConfig& c = (*model)->config();
  GenerateOptions opts;
  opts.prompt = {3, 14, 15, 92, 65};
  opts.max_new_tokens = 16;
  opts.stop_at_eos = false;
  const PregateRun off = RunPregate(**model, experts->get(), opts, 0);
  const PregateRun d1 = RunPregate(**model, experts->get(), opts, 1);
  const PregateRun d2 = RunPregate(**model, experts->get(), opts, 2);
  EXPECT_EQ(off.hint_calls, 0u);
  EXPECT_EQ(d2.tokens, off.tokens);
  EXPECT_EQ(d2.logprobs, off.logprobs);  // bit-identical
  EXPECT_EQ(d1.tokens, off.tokens);
  EXPECT_EQ(d1.logprobs, off.logprobs);
  // All MoE layers: each decode iteration hints layers 2.. once each.
  const int decode_iters = opts.max_new_tokens - 1;
  EXPECT_EQ(d2.hint_calls,
            static_cast<size_t>(decode_iters * (c.num_hidden_layers - 2)));

  std::string out = RunCommand(absl::StrCat(
      "/usr/bin/python3 ", MOE_SOURCE_DIR,
      "/tests/engine/pregate_reference.py --model ", dir, " --prompt-ids ",
      absl::StrJoin(opts.prompt, ","), " --max-new-tokens ",
      opts.max_new_tokens, " --distance 2"));
  auto ref = nlohmann::json::parse(out, nullptr, false);
  ASSERT_FALSE(ref.is_discarded()) << out;
  EXPECT_EQ(ref["tokens"].get<std::vector<int32_t>>(), off.tokens);
  ASSERT_EQ(ref["hints"].size(), d2.hinted.size());
  int compared = 0;
  for (const auto& h : ref["hints"]) {
    const std::pair<int, int> key{h["iteration"].get<int>(),
                                  h["moe_layer"].get<int>()};
    ASSERT_EQ(d2.hinted.count(key), 1u)
        << "no hint for iteration " << key.first << " layer " << key.second;
    if (h["margin"].get<double>() < 1e-3) continue;  // a float32 near tie
    std::vector<int32_t> want = h["experts"].get<std::vector<int32_t>>();
    std::sort(want.begin(), want.end());
    EXPECT_EQ(d2.hinted.at(key), want)
        << "iteration " << key.first << " layer " << key.second;
    ++compared;
  }
  EXPECT_GE(compared, static_cast<int>(ref["hints"].size()) * 3 / 4);
  const double chance = static_cast<double>(c.top_k) / c.num_experts;
  std::printf("pre-gating recall on tiny mixtral: distance 1 %.3f, distance "
              "2 %.3f (chance %.3f)\n",
              Recall(d1), Recall(d2), chance);
  EXPECT_GT(Recall(d2), chance);
}

TEST(SessionTest, PregateDistanceOutsideItsRangeIsRejected) {
  std::string dir = absl::StrCat(::testing::TempDir(), "/pregate_bad_mixtral");
  ASSERT_TRUE(MakeModel(Tiny(ModelFamily::kMixtral, 25), dir).ok());
  auto backend = CreateBackend("cpu");
  auto model = MoeModel::Load(dir, backend->get());
  ASSERT_TRUE(model.ok()) << model.status();
  auto experts = InMemoryExpertProvider::Create(**model);
  Session s(**model, experts->get(), 8);
  EXPECT_EQ(s.set_pregate_distance(0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.set_pregate_distance(kMaxPregateDistance + 1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.pregate_distance(), 1);
  EXPECT_TRUE(s.set_pregate_distance(kMaxPregateDistance).ok());
  EXPECT_EQ(s.pregate_distance(), kMaxPregateDistance);
  GenerateOptions o;
  o.prompt = {1, 2};
  o.max_new_tokens = 2;
  o.pregate_hints = true;
  o.pregate_distance = -1;
  auto r = Generate(**model, experts->get(), o,
                    [](const SampledToken&) { return true; });
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace moe
