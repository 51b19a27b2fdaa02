// llama.cpp's tensor names mapped to ours (common/gguf_model.h), as tables:
// the per-layer names of every family, each tagged with the part of a
// model it belongs to, and per family the parts its GGUF files hold.
#include "common/gguf_model.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/logging.h"

namespace moe {
namespace {

// Parts of a decoder layer beyond attention, norms, router and experts.
enum Part : uint32_t {
  kBase = 0,
  kQkNorm = 1 << 0,        // attn_{q,k}_norm
  kQkvBias = 1 << 1,       // attn_{q,k,v}.bias
  kDenseMlp = 1 << 2,      // ffn_{gate,up,down}: leading dense layers
  kSharedExpert = 1 << 3,  // ffn_{gate,up,down}_shexp
  kSharedGate = 1 << 4,    // ffn_gate_inp_shexp (sigmoid-gated shared expert)
  kScoreBias = 1 << 5,     // exp_probs_b.bias (e_score_correction_bias)
  kNextn = 1 << 6,         // nextn.*: the MTP layers' own tensors
  kLatent = 1 << 7,        // attn_q_a*, attn_kv_a*, attn_kv_b: MLA
  kSinksAndBiases = 1 << 8,  // attn_sinks, attn_output / router / expert
                             // biases, post_attention_norm (gpt-oss)
  kFfnNorm = 1 << 9,       // ffn_norm: the post-attention norm elsewhere
};

// Per-expert projection names of GGUF's split biased experts (gpt-oss's
// Hugging Face names are fused: model_desc.h, BiasedExperts::kPerExpert).
constexpr const char* kSplitExpertNames[3] = {"gate_proj", "up_proj",
                                              "down_proj"};

// What each family's GGUF files hold.
struct FamilyNames {
  ModelFamily family;
  uint32_t parts;
  bool rope_permuted;  // llama.cpp permutes attn_q / attn_k rows ("llama")
  // The experts' projection names when not the family row's.
  const char* const* expert_names = nullptr;
};

constexpr FamilyNames kFamilyNames[] = {
    {ModelFamily::kMixtral, kFfnNorm, true},
    {ModelFamily::kQwen2Moe, kFfnNorm | kQkvBias | kSharedExpert | kSharedGate,
     false},
    {ModelFamily::kQwen3Moe, kFfnNorm | kQkNorm, false},
    {ModelFamily::kOlmoe, kFfnNorm | kQkNorm, false},
    {ModelFamily::kGlm4Moe,
     kFfnNorm | kQkNorm | kQkvBias | kDenseMlp | kSharedExpert | kScoreBias |
         kNextn,
     false},
    {ModelFamily::kDeepseekV2, kFfnNorm | kLatent | kDenseMlp | kSharedExpert,
     false},
    {ModelFamily::kDeepseekV3,
     kFfnNorm | kLatent | kDenseMlp | kSharedExpert | kScoreBias, false},
    {ModelFamily::kGptOss, kQkvBias | kSinksAndBiases, false,
     kSplitExpertNames},
};

// llama.cpp's per-layer names (after "blk.N.") and ours (after
// "model.layers.N."); "{moe}", "{router}" and "{shared}" stand for the
// family row's moe_block, router_name and shared_block.
struct LayerName {
  const char* gguf;
  const char* ours;
  Part part;
  bool rope_permuted_in_llama = false;
};

constexpr LayerName kLayerNames[] = {
    {"attn_norm.weight", "input_layernorm.weight", kBase},
    {"ffn_norm.weight", "post_attention_layernorm.weight", kFfnNorm},
    {"attn_q.weight", "self_attn.q_proj.weight", kBase, true},
    {"attn_k.weight", "self_attn.k_proj.weight", kBase, true},
    {"attn_v.weight", "self_attn.v_proj.weight", kBase},
    {"attn_output.weight", "self_attn.o_proj.weight", kBase},
    {"ffn_gate_inp.weight", "{moe}.{router}.weight", kBase},
    {"attn_q_norm.weight", "self_attn.q_norm.weight", kQkNorm},
    {"attn_k_norm.weight", "self_attn.k_norm.weight", kQkNorm},
    {"attn_q.bias", "self_attn.q_proj.bias", kQkvBias},
    {"attn_k.bias", "self_attn.k_proj.bias", kQkvBias},
    {"attn_v.bias", "self_attn.v_proj.bias", kQkvBias},
    {"ffn_gate.weight", "mlp.gate_proj.weight", kDenseMlp},
    {"ffn_up.weight", "mlp.up_proj.weight", kDenseMlp},
    {"ffn_down.weight", "mlp.down_proj.weight", kDenseMlp},
    {"ffn_gate_shexp.weight", "{moe}.{shared}.gate_proj.weight", kSharedExpert},
    {"ffn_up_shexp.weight", "{moe}.{shared}.up_proj.weight", kSharedExpert},
    {"ffn_down_shexp.weight", "{moe}.{shared}.down_proj.weight", kSharedExpert},
    {"ffn_gate_inp_shexp.weight", "{moe}.shared_expert_gate.weight",
     kSharedGate},
    {"exp_probs_b.bias", "{moe}.{router}.e_score_correction_bias", kScoreBias},
    {"nextn.eh_proj.weight", "eh_proj.weight", kNextn},
    {"nextn.enorm.weight", "enorm.weight", kNextn},
    {"nextn.hnorm.weight", "hnorm.weight", kNextn},
    {"nextn.embed_tokens.weight", "embed_tokens.weight", kNextn},
    {"nextn.shared_head_head.weight", "shared_head.head.weight", kNextn},
    {"nextn.shared_head_norm.weight", "shared_head.norm.weight", kNextn},
    {"attn_q_a.weight", "self_attn.q_a_proj.weight", kLatent},
    {"attn_q_a_norm.weight", "self_attn.q_a_layernorm.weight", kLatent},
    {"attn_q_b.weight", "self_attn.q_b_proj.weight", kLatent},
    {"attn_kv_a_mqa.weight", "self_attn.kv_a_proj_with_mqa.weight", kLatent},
    {"attn_kv_a_norm.weight", "self_attn.kv_a_layernorm.weight", kLatent},
    {"attn_kv_b.weight", "self_attn.kv_b_proj.weight", kLatent},
    {"post_attention_norm.weight", "post_attention_layernorm.weight",
     kSinksAndBiases},
    {"attn_sinks.weight", "self_attn.sinks", kSinksAndBiases},
    {"attn_output.bias", "self_attn.o_proj.bias", kSinksAndBiases},
    {"ffn_gate_inp.bias", "{moe}.{router}.bias", kSinksAndBiases},
};

// Tensors of newer llama.cpp converters that stand in for one of ours: a
// file holding ours too loads (these are skipped); one without it is
// refused, saying why (Checkpoint::FromGguf).
struct StandIn {
  const char* gguf;
  const char* ours;  // the tensor it stands in for
  Part part;
  const char* why;
  int kv_b_half = 0;  // GgufName::kv_b_half
};

constexpr StandIn kStandIns[] = {
    {"attn_k_b.weight", "self_attn.kv_b_proj.weight", kLatent,
     "llama.cpp's split of kv_b for absorbed MLA needs both attn_k_b and "
     "attn_v_b of the layer",
     1},
    {"attn_v_b.weight", "self_attn.kv_b_proj.weight", kLatent,
     "llama.cpp's split of kv_b for absorbed MLA needs both attn_k_b and "
     "attn_v_b of the layer",
     2},
};

// gate, up, down as llama.cpp names them.
constexpr const char* kExpertKinds[3] = {"ffn_gate", "ffn_up", "ffn_down"};

const FamilyNames* NamesOf(ModelFamily family) {
  for (const FamilyNames& f : kFamilyNames) {
    if (f.family == family) return &f;
  }
  return nullptr;
}

absl::StatusOr<GgufName> MapLayerTensor(const FamilyNames& names, int layer,
                                        absl::string_view rest) {
  const FamilyTraits& traits = TraitsOf(names.family);
  const std::string prefix = absl::StrCat("model.layers.", layer, ".");
  const std::string moe = absl::StrCat(prefix, traits.moe_block, ".");
  GgufName out;
  out.layer = layer;
  auto ours = [&](const char* pattern) {
    return prefix +
           absl::StrReplaceAll(pattern, {{"{moe}", traits.moe_block},
                                         {"{router}", traits.router_name},
                                         {"{shared}", traits.shared_block}});
  };
  for (const LayerName& n : kLayerNames) {
    if (rest != n.gguf) continue;
    if (n.part != kBase && (names.parts & n.part) == 0) break;
    out.ours = ours(n.ours);
    out.rope_permuted = n.rope_permuted_in_llama && names.rope_permuted;
    out.nextn = n.part == kNextn;
    return out;
  }
  // llama.cpp's --fuse-qkv: q's rows, then k's, then v's (attention of
  // heads, not latent).
  for (const char* what : {"weight", "bias"}) {
    if (rest != absl::StrCat("attn_qkv.", what) || (names.parts & kLatent) != 0) continue;
    if (what[0] == 'b' && (names.parts & kQkvBias) == 0) break;
    for (const char* p : {"q", "k", "v"}) {
      out.fused.push_back(absl::StrCat(prefix, "self_attn.", p, "_proj.", what));
    }
    out.ours = out.fused[0];
    out.rope_permuted = what[0] == 'w' && names.rope_permuted;
    return out;
  }
  for (const StandIn& n : kStandIns) {
    if (rest != n.gguf || (names.parts & n.part) == 0) continue;
    out.stands_in_for = ours(n.ours);
    out.why = n.why;
    out.kv_b_half = n.kv_b_half;
    return out;
  }
  const bool biased = (names.parts & kSinksAndBiases) != 0;
  // Our stacked name of projection k (gate, up, down), "{expert}" for E.
  auto stacked = [&](int k, const char* what) {
    return absl::StrCat(moe, "experts.{expert}.",
                        names.expert_names != nullptr ? names.expert_names[k]
                                                      : traits.expert_names[k],
                        ".", what);
  };
  for (const char* what : {"weight", "bias"}) {
    if (what[0] == 'b' && !biased) break;
    for (int k = 0; k < 3; ++k) {
      if (rest == absl::StrCat(kExpertKinds[k], "_exps.", what)) out.ours = stacked(k, what);
    }
    // llama.cpp's --fuse-gate-up-exps: gate's rows, then up's.
    if (rest == absl::StrCat("ffn_gate_up_exps.", what)) {
      out.fused = {stacked(0, what), stacked(1, what)};
      out.ours = out.fused[0];
    }
    if (!out.ours.empty()) {
      out.stacked_experts = true;
      return out;
    }
  }
  // Older per-expert files: ffn_gate.E.weight.
  std::vector<absl::string_view> parts = absl::StrSplit(rest, '.');
  int expert = 0;
  if (parts.size() == 3 && parts[2] == "weight" && absl::SimpleAtoi(parts[1], &expert) &&
      expert >= 0) {
    for (int k = 0; k < 3; ++k) {
      if (parts[0] != kExpertKinds[k]) continue;
      out.ours = absl::StrReplaceAll(stacked(k, "weight"), {{"{expert}", absl::StrCat(expert)}});
      return out;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "GGUF tensor 'blk.", layer, ".", rest, "' has no counterpart in a ",
      ModelFamilyName(names.family), " model"));
}

}  // namespace

std::vector<std::string> GgufTensorNamesOf(ModelFamily family, int layer) {
  if (layer < 0) return {"token_embd.weight", "output_norm.weight", "output.weight"};
  const FamilyNames* names = NamesOf(family);
  if (names == nullptr) return {};
  const std::string prefix = absl::StrCat("blk.", layer, ".");
  std::vector<std::string> out;
  for (const LayerName& n : kLayerNames) {
    if (n.part == kBase || (names->parts & n.part) != 0) out.push_back(prefix + n.gguf);
  }
  for (const char* what : {"weight", "bias"}) {
    if (what[0] == 'b' && (names->parts & kSinksAndBiases) == 0) break;
    for (const char* kind : kExpertKinds) out.push_back(absl::StrCat(prefix, kind, "_exps.", what));
  }
  return out;
}

std::string GgufName::ForExpert(int expert, int part) const {
  MOE_CHECK(stacked_experts && (part == 0 || part < static_cast<int>(fused.size()))) << ours;
  return absl::StrReplaceAll(fused.empty() ? ours : fused[part],
                             {{"{expert}", absl::StrCat(expert)}});
}

absl::StatusOr<GgufName> MapGgufTensorName(ModelFamily family,
                                           absl::string_view gguf_name) {
  GgufName out;
  if (gguf_name == "token_embd.weight") {
    out.ours = "model.embed_tokens.weight";
    return out;
  }
  if (gguf_name == "output_norm.weight") {
    out.ours = "model.norm.weight";
    return out;
  }
  if (gguf_name == "output.weight") {
    out.ours = "lm_head.weight";
    return out;
  }
  const FamilyNames* names = NamesOf(family);
  if (names == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("GGUF tensor names are not mapped for ",
                     ModelFamilyName(family), " yet"));
  }
  int layer = -1;
  if (absl::StartsWith(gguf_name, "blk.")) {
    absl::string_view rest = gguf_name.substr(4);
    size_t dot = rest.find('.');
    if (dot != absl::string_view::npos &&
        absl::SimpleAtoi(rest.substr(0, dot), &layer) && layer >= 0) {
      return MapLayerTensor(*names, layer, rest.substr(dot + 1));
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("GGUF tensor '", gguf_name, "' has no counterpart in a ",
                   ModelFamilyName(family), " model"));
}

void UndoLlamaRopePermutation(const uint8_t* in, int64_t heads,
                              int64_t head_dim, size_t row_bytes,
                              uint8_t* out) {
  MOE_CHECK(head_dim % 2 == 0) << head_dim;
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t j = 0; j < 2; ++j) {
      for (int64_t i = 0; i < half; ++i) {
        const int64_t hf = h * head_dim + j * half + i;
        const int64_t gguf = h * head_dim + 2 * i + j;
        std::memcpy(out + hf * row_bytes, in + gguf * row_bytes, row_bytes);
      }
    }
  }
}

void JoinKvB(const float* k_b, const float* v_b, int64_t heads, int64_t nope, int64_t v,
             int64_t rank, float* out) {
  for (int64_t h = 0; h < heads; ++h) {
    float* head = out + h * (nope + v) * rank;
    for (int64_t i = 0; i < nope; ++i) {
      for (int64_t r = 0; r < rank; ++r) head[i * rank + r] = k_b[(h * rank + r) * nope + i];
    }
    std::memcpy(head + nope * rank, v_b + h * v * rank, sizeof(float) * v * rank);
  }
}

}  // namespace moe
