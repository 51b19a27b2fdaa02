// MoeModel's loading of grouped-attention layers roped from a table (YaRN,
// partial rotary; moe_model.h): head-permuted q/k rows with their biases and
// norms, sinks, o and router biases, and the rope table.
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "services/engine/mla_attention.h"
#include "services/engine/moe_model.h"

namespace moe {
namespace {

// Source of value `i` of a head in the permuted layout: within the first
// `rd` values, pairs (j, j + rd/2) of the published half-split rope move to
// (2j, 2j + 1); the values past rd stay where they are.
int64_t SourceInHead(int64_t i, int64_t rd) {
  if (i >= rd) return i;
  return i % 2 == 0 ? i / 2 : i / 2 + rd / 2;
}

}  // namespace

absl::StatusOr<Weight> MoeModel::HeadPermuted(TensorRole role, int layer) {
  ASSIGN_OR_RETURN(TensorView view, DenseView(role, layer, /*blocks_ok=*/false));
  const int64_t d = config().head_dim, rd = config().rotary_dim;
  if (!IsFloatDType(view.dtype) || view.shape.size() != 2 ||
      view.shape[0] % d != 0) {
    return absl::UnimplementedError(absl::StrCat("layer ", layer, ": ",
                                                 TensorRoleName(role),
                                                 " must be F32, F16 or BF16"));
  }
  const int64_t rows = view.shape[0], cols = view.shape[1];
  const size_t row_bytes = static_cast<size_t>(cols) * DTypeSize(view.dtype);
  ASSIGN_OR_RETURN(uint8_t* buf, host_.Allocate(rows * row_bytes));
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t src = (r / d) * d + SourceInHead(r % d, rd);
    std::memcpy(buf + r * row_bytes, view.data + src * row_bytes, row_bytes);
  }
  TensorView permuted = view;
  permuted.data = buf;
  Weight w;
  w.dtype = view.dtype;
  w.rows = rows;
  w.cols = cols;
  ASSIGN_OR_RETURN(w.data, Place(permuted));
  return w;
}

absl::StatusOr<const float*> MoeModel::HeadPermutedVector(TensorRole role,
                                                          int layer) {
  if (!desc_->HasDense(role, layer)) return nullptr;
  ASSIGN_OR_RETURN(TensorView view, desc_->Dense(role, layer));
  const int64_t d = config().head_dim, rd = config().rotary_dim;
  const int64_t n = view.numel();
  std::vector<float> src(n), dst(n);
  RETURN_IF_ERROR(ConvertToFloat(view.data, view.dtype, static_cast<size_t>(n),
                                 src.data()));
  for (int64_t r = 0; r < n; ++r)
    dst[r] = src[(r / d) * d + SourceInHead(r % d, rd)];
  ASSIGN_OR_RETURN(void* p, backend_->Alloc(sizeof(float) * n));
  owned_.push_back(p);
  RETURN_IF_ERROR(backend_->CopyToDevice(p, dst.data(), sizeof(float) * n));
  return static_cast<const float*>(p);
}

absl::Status MoeModel::PrepareTableRoped(LayerWeights& w, int l) {
  const ModelConfig& c = config();
  ASSIGN_OR_RETURN(w.q, HeadPermuted(TensorRole::kQProj, l));
  ASSIGN_OR_RETURN(w.k, HeadPermuted(TensorRole::kKProj, l));
  ASSIGN_OR_RETURN(w.v, Matrix(TensorRole::kVProj, l));
  ASSIGN_OR_RETURN(w.o, Matrix(TensorRole::kOProj, l));
  ASSIGN_OR_RETURN(w.q_bias, HeadPermutedVector(TensorRole::kQBias, l));
  ASSIGN_OR_RETURN(w.k_bias, HeadPermutedVector(TensorRole::kKBias, l));
  ASSIGN_OR_RETURN(w.v_bias, Vector(TensorRole::kVBias, l));
  ASSIGN_OR_RETURN(w.o_bias, Vector(TensorRole::kOBias, l));
  // Per-head q/k norms are permuted with the rows they scale (RMSNorm over
  // a head does not depend on the order of its values).
  if (c.qk_norm == QkNorm::kFull) {
    return absl::UnimplementedError(
        "q/k norm over the whole projection with a table rope");
  }
  ASSIGN_OR_RETURN(w.q_norm, HeadPermutedVector(TensorRole::kQNorm, l));
  ASSIGN_OR_RETURN(w.k_norm, HeadPermutedVector(TensorRole::kKNorm, l));
  ASSIGN_OR_RETURN(w.sinks, Vector(TensorRole::kSinks, l));
  ASSIGN_OR_RETURN(w.router_bias, Vector(TensorRole::kRouterBias, l));
  w.sliding = c.IsSlidingLayer(l) && c.sliding_window > 0;
  if (head_rope_.inv_freq == nullptr) {
    RopeTable rope = YarnRopeFor(c.rotary_dim, c.rope_theta, c.yarn);
    const size_t bytes = sizeof(float) * rope.inv_freq.size();
    ASSIGN_OR_RETURN(void* p, backend_->Alloc(bytes));
    owned_.push_back(p);
    RETURN_IF_ERROR(backend_->CopyToDevice(p, rope.inv_freq.data(), bytes));
    head_rope_.inv_freq = static_cast<const float*>(p);
    head_rope_.mscale = rope.mscale;
    head_rope_.softmax_scale =
        static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
  }
  return PrepareMlp(w, l);
}

}  // namespace moe
