// Shape validation of the latent-attention and scored-router ops
// (RouterSelect, RopeInterleaved, MlaAttention), shared by all backends.
#include <initializer_list>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/backend.h"

namespace moe {
namespace {

constexpr int64_t kMaxDim = int64_t{1} << 40;

absl::Status CheckDims(
    absl::string_view op,
    std::initializer_list<std::pair<const char*, int64_t>> dims) {
  for (const auto& [name, value] : dims) {
    if (value < 0 || value > kMaxDim) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": ", name, " = ", value, " is out of range"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckPtr(absl::string_view op, const char* name, const void* p,
                      int64_t elements) {
  if (p == nullptr && elements > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": ", name, " is null but has ", elements, " elements"));
  }
  return absl::OkStatus();
}

absl::Status CheckRouterSpec(int64_t experts, int64_t top_k, const float* bias,
                             const RouterSpec& s) {
  constexpr absl::string_view kOp = "RouterSelect";
  if (s.scoring != RouterScoring::kSoftmax &&
      s.scoring != RouterScoring::kSigmoid) {
    return absl::InvalidArgumentError("RouterSelect: unknown scoring");
  }
  if (!(s.scale > 0.0f) || s.scale == std::numeric_limits<float>::infinity()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RouterSelect: scale = ", s.scale, " must be positive and finite"));
  }
  switch (s.selection) {
    case RouterSelection::kGreedy:
      return absl::OkStatus();
    case RouterSelection::kGroupLimited:
    case RouterSelection::kBiasedGroupLimited:
      break;
    default:
      return absl::InvalidArgumentError("RouterSelect: unknown selection");
  }
  if (s.n_group < 1 || experts % s.n_group != 0 || s.topk_group < 1 ||
      s.topk_group > s.n_group) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RouterSelect: need n_group (", s.n_group, ") dividing experts (",
        experts, ") and 1 <= topk_group (", s.topk_group, ") <= n_group"));
  }
  const int64_t per_group = experts / s.n_group;
  if (top_k > s.topk_group * per_group) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RouterSelect: top_k (", top_k, ") exceeds the ",
        s.topk_group * per_group, " experts of the chosen groups"));
  }
  if (s.selection == RouterSelection::kBiasedGroupLimited) {
    if (per_group < 2) {
      return absl::InvalidArgumentError(
          "RouterSelect: biased group selection needs >= 2 experts a group");
    }
    RETURN_IF_ERROR(CheckPtr(kOp, "bias", bias, experts));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Backend::RouterSelect(const float* logits, const float* bias,
                                   int32_t* topk_ids, float* topk_weights,
                                   int64_t tokens, int64_t experts,
                                   int64_t top_k, const RouterSpec& spec,
                                   Stream stream) {
  constexpr absl::string_view kOp = "RouterSelect";
  RETURN_IF_ERROR(CheckDims(
      kOp, {{"tokens", tokens}, {"experts", experts}, {"top_k", top_k}}));
  if (top_k < 1 || top_k > experts ||
      experts > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("RouterSelect: need 1 <= top_k (", top_k, ") <= experts (",
                     experts, ")"));
  }
  RETURN_IF_ERROR(CheckRouterSpec(experts, top_k, bias, spec));
  RETURN_IF_ERROR(CheckPtr(kOp, "logits", logits, tokens * experts));
  RETURN_IF_ERROR(CheckPtr(kOp, "topk_ids", topk_ids, tokens * top_k));
  RETURN_IF_ERROR(CheckPtr(kOp, "topk_weights", topk_weights, tokens * top_k));
  if (tokens == 0) return absl::OkStatus();
  return DoRouterSelect(logits, bias, topk_ids, topk_weights, tokens, experts,
                        top_k, spec, stream);
}

absl::Status Backend::RopeInterleaved(float* x, const int32_t* positions,
                                      const float* inv_freq, int64_t tokens,
                                      int64_t heads, int64_t stride,
                                      int64_t offset, int64_t rot_dim,
                                      float mscale, Stream stream) {
  constexpr absl::string_view kOp = "RopeInterleaved";
  RETURN_IF_ERROR(CheckDims(kOp, {{"tokens", tokens},
                                  {"heads", heads},
                                  {"stride", stride},
                                  {"offset", offset},
                                  {"rot_dim", rot_dim}}));
  if (rot_dim == 0 || rot_dim % 2 != 0 || offset + rot_dim > stride) {
    return absl::InvalidArgumentError(
        absl::StrCat("RopeInterleaved: rot_dim (", rot_dim,
                     ") must be positive and even, and offset + rot_dim (",
                     offset + rot_dim, ") <= stride (", stride, ")"));
  }
  if (!(mscale > 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("RopeInterleaved: mscale = ", mscale, " must be > 0"));
  }
  RETURN_IF_ERROR(CheckPtr(kOp, "x", x, tokens * heads * stride));
  RETURN_IF_ERROR(CheckPtr(kOp, "positions", positions, tokens));
  RETURN_IF_ERROR(CheckPtr(kOp, "inv_freq", inv_freq, rot_dim / 2));
  if (tokens == 0 || heads == 0) return absl::OkStatus();
  return DoRopeInterleaved(x, positions, inv_freq, tokens, heads, stride,
                           offset, rot_dim, mscale, stream);
}

absl::Status Backend::MlaAttention(const float* q, const void* kv_b,
                                   DType kv_b_dtype, const float* ckv_cache,
                                   const float* kpe_cache, float* out,
                                   const MlaShape& s, float scale,
                                   Stream stream) {
  constexpr absl::string_view kOp = "MlaAttention";
  RETURN_IF_ERROR(CheckDims(kOp, {{"tokens", s.tokens},
                                  {"heads", s.heads},
                                  {"nope_dim", s.nope_dim},
                                  {"rope_dim", s.rope_dim},
                                  {"v_dim", s.v_dim},
                                  {"rank", s.rank},
                                  {"max_seq", s.max_seq},
                                  {"start_pos", s.start_pos}}));
  if (s.heads <= 0 || s.nope_dim <= 0 || s.rope_dim <= 0 || s.v_dim <= 0 ||
      s.rank <= 0) {
    return absl::InvalidArgumentError(
        "MlaAttention: heads, nope_dim, rope_dim, v_dim and rank must be "
        "positive");
  }
  if (kv_b_dtype != DType::kF32 && kv_b_dtype != DType::kF16 &&
      kv_b_dtype != DType::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat("MlaAttention: kv_b dtype ",
                                                   DTypeName(kv_b_dtype),
                                                   " is not F32, F16 or BF16"));
  }
  if (s.start_pos + s.tokens > s.max_seq) {
    return absl::OutOfRangeError(
        absl::StrCat("MlaAttention: positions up to ", s.start_pos + s.tokens,
                     " exceed the latent cache capacity ", s.max_seq));
  }
  if (!(scale > 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("MlaAttention: scale = ", scale, " must be positive"));
  }
  const int64_t qk = s.nope_dim + s.rope_dim;
  RETURN_IF_ERROR(CheckPtr(kOp, "q", q, s.tokens * s.heads * qk));
  RETURN_IF_ERROR(
      CheckPtr(kOp, "kv_b", kv_b, s.heads * (s.nope_dim + s.v_dim) * s.rank));
  RETURN_IF_ERROR(CheckPtr(kOp, "ckv_cache", ckv_cache, s.max_seq * s.rank));
  RETURN_IF_ERROR(
      CheckPtr(kOp, "kpe_cache", kpe_cache, s.max_seq * s.rope_dim));
  RETURN_IF_ERROR(CheckPtr(kOp, "out", out, s.tokens * s.heads * s.v_dim));
  if (s.tokens == 0) return absl::OkStatus();
  return DoMlaAttention(q, kv_b, kv_b_dtype, ckv_cache, kpe_cache, out, s,
                        scale, stream);
}

}  // namespace moe
