#include "common/model_family.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"

namespace moe {
namespace {

constexpr absl::string_view kProj[3] = {"gate_proj", "up_proj", "down_proj"};

std::vector<FamilyTraits> MakeTable() {
  using A = AttentionKind;
  using R = RouterKind;
  using S = SharedExpertKind;
  using X = ExpertActivation;
  std::vector<FamilyTraits> t = {
      // configuration_mixtral.py
      {ModelFamily::kMixtral,
       "mixtral",
       "MixtralForCausalLM",
       {32000,
        4096,
        14336,
        32,
        32,
        8,
        4096 * 32,
        1e-5,
        1e6,
        8,
        2,
        0,
        0,
        1,
        {},
        {2}},
       A::kGrouped,
       R::kSoftmaxTopK,
       S::kNone,
       X::kSwiglu,
       "block_sparse_moe",
       "gate",
       {"w1", "w3", "w2"},
       "",
       /*unscaled_when_normalized=*/false,
       /*experts_use_intermediate_size=*/true},
      // configuration_qwen2_moe.py
      {ModelFamily::kQwen2Moe,
       "qwen2_moe",
       "Qwen2MoeForCausalLM",
       {151936,
        2048,
        5632,
        24,
        16,
        16,
        32768,
        1e-6,
        1e4,
        60,
        4,
        1408,
        5632,
        {},
        {},
        {}},
       A::kGrouped,
       R::kSoftmaxTopK,
       S::kSigmoidGated,
       X::kSwiglu,
       "mlp",
       "gate",
       {kProj[0], kProj[1], kProj[2]},
       "shared_expert"},
      // configuration_qwen3_moe.py
      {ModelFamily::kQwen3Moe,
       "qwen3_moe",
       "Qwen3MoeForCausalLM",
       {151936,
        2048,
        6144,
        24,
        32,
        4,
        32768,
        1e-6,
        1e4,
        128,
        8,
        768,
        0,
        {},
        {},
        {}},
       A::kGrouped,
       R::kSoftmaxTopK,
       S::kNone,
       X::kSwiglu,
       "mlp",
       "gate",
       {kProj[0], kProj[1], kProj[2]},
       ""},
      // configuration_olmoe.py
      {ModelFamily::kOlmoe,
       "olmoe",
       "OlmoeForCausalLM",
       {50304,
        2048,
        2048,
        16,
        16,
        0,
        4096,
        1e-5,
        1e4,
        64,
        8,
        0,
        0,
        {},
        1,
        {50279}},
       A::kGrouped,
       R::kSoftmaxTopK,
       S::kNone,
       X::kSwiglu,
       "mlp",
       "gate",
       {kProj[0], kProj[1], kProj[2]},
       "",
       /*unscaled_when_normalized=*/false,
       /*experts_use_intermediate_size=*/true},
      // configuration_deepseek_v2.py; num_experts_per_tok is null (a dense
      // model) by default, which ValidateModelConfig refuses.
      {ModelFamily::kDeepseekV2,
       "deepseek_v2",
       "DeepseekV2ForCausalLM",
       {32000,
        4096,
        11008,
        32,
        32,
        0,
        2048,
        1e-6,
        1e4,
        64,
        0,
        1407,
        0,
        1,
        {},
        {2}},
       A::kLatent,
       R::kScoredGroups,
       S::kUngated,
       X::kSwiglu,
       "mlp",
       "gate",
       {kProj[0], kProj[1], kProj[2]},
       "shared_experts",
       /*unscaled_when_normalized=*/true},
      // configuration_deepseek_v3.py
      {ModelFamily::kDeepseekV3,
       "deepseek_v3",
       "DeepseekV3ForCausalLM",
       {129280,
        7168,
        18432,
        61,
        128,
        0,
        4096,
        1e-6,
        1e4,
        256,
        8,
        2048,
        0,
        0,
        {},
        {1}},
       A::kLatent,
       R::kScoredGroups,
       S::kUngated,
       X::kSwiglu,
       "mlp",
       "gate",
       {kProj[0], kProj[1], kProj[2]},
       "shared_experts"},
      // configuration_gpt_oss.py (bos/eos/pad default to None); experts are
      // fused per layer (model_desc.h).
      {ModelFamily::kGptOss,
       "gpt_oss",
       "GptOssForCausalLM",
       {201088,
        2880,
        2880,
        36,
        64,
        8,
        131072,
        1e-5,
        150000.0,
        128,
        4,
        0,
        0,
        {},
        {},
        {}},
       A::kGrouped,
       R::kSoftmaxTopK,
       S::kNone,
       X::kClampedSwiglu,
       "mlp",
       "router",
       {"", "", ""},
       "",
       /*unscaled_when_normalized=*/false,
       /*experts_use_intermediate_size=*/true},
      // configuration_glm4_moe.py (bos/eos/pad default to None).
      {ModelFamily::kGlm4Moe,
       "glm4_moe",
       "Glm4MoeForCausalLM",
       {151552,
        4096,
        10944,
        46,
        96,
        8,
        131072,
        1e-5,
        1e4,
        128,
        8,
        1408,
        0,
        {},
        {},
        {}},
       A::kGrouped,
       R::kScoredGroups,
       S::kUngated,
       X::kSwiglu,
       "mlp",
       "gate",
       {kProj[0], kProj[1], kProj[2]},
       "shared_experts"},
  };
  for (size_t i = 0; i < t.size(); ++i) {
    MOE_CHECK(static_cast<size_t>(t[i].family) == i)
        << "family table out of enum order at " << t[i].model_type;
  }
  return t;
}

}  // namespace

const std::vector<FamilyTraits>& AllFamilies() {
  static const auto* table = new std::vector<FamilyTraits>(MakeTable());
  return *table;
}

const FamilyTraits& TraitsOf(ModelFamily family) {
  const auto& t = AllFamilies();
  const size_t i = static_cast<size_t>(family);
  MOE_CHECK(i < t.size()) << "no family row " << i;
  return t[i];
}

absl::string_view ModelFamilyName(ModelFamily family) {
  return TraitsOf(family).model_type;
}

absl::string_view ModelFamilyArchitecture(ModelFamily family) {
  return TraitsOf(family).architecture;
}

absl::StatusOr<ModelFamily> ParseModelFamily(absl::string_view model_type) {
  std::vector<std::string> names;
  for (const FamilyTraits& f : AllFamilies()) {
    if (f.model_type == model_type) return f.family;
    names.emplace_back(f.model_type);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported model_type '", std::string(model_type),
                   "' (supported: ", absl::StrJoin(names, ", "), ")"));
}

}  // namespace moe
