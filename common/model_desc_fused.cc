// ModelDescription's indexing of fused expert tensors
// (model_desc.h): checks each tensor's shape and dtype and cuts per-expert
// strided views out of it.
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/model_desc.h"
#include "common/mxfp4.h"
#include "common/status_macros.h"

namespace moe {
namespace {

using ExpertViews = std::array<TensorView, 6>;  // gate, up, down, 3 biases

std::string Shape(const std::vector<int64_t>& s) {
  return absl::StrCat("[", absl::StrJoin(s, ", "), "]");
}

// Sizes of one MoE layer; `experts` points at its first expert's views.
struct Layer {
  int64_t num_experts, hidden, inter;
  ExpertViews* experts;
};

// `<p>_blocks` with its `<p>_scales`: rows are output features, gate rows
// the even rows of gate_up_proj, up the odd ones.
void SliceMxfp4(const TensorView& blocks, const TensorView& scales,
                bool gate_up, const Layer& l) {
  const int64_t rows = gate_up ? l.inter : l.hidden;
  const int64_t cols = gate_up ? l.hidden : l.inter;
  const int64_t stored_rows = gate_up ? 2 * l.inter : l.hidden;
  for (int64_t e = 0; e < l.num_experts; ++e) {
    const uint8_t* codes = blocks.data + e * stored_rows * cols / 2;
    const uint8_t* sc = scales.data + e * stored_rows * cols / kMxfp4Group;
    for (int k = 0; k < (gate_up ? 2 : 1); ++k) {
      TensorView v;
      v.dtype = DType::kMxfp4;
      v.shape = {rows, cols};
      v.data = codes + k * cols / 2;
      v.nbytes = static_cast<size_t>(rows * cols / 2);
      v.row_stride = gate_up ? 2 * cols : 0;
      v.scales = {DType::kU8,
                  sc + k * cols / kMxfp4Group,
                  rows,
                  cols / kMxfp4Group,
                  1,
                  kMxfp4Group,
                  static_cast<size_t>(rows * cols / kMxfp4Group)};
      l.experts[e][gate_up ? k : 2] = v;
    }
  }
}

TensorView Strided(const TensorView& whole, const uint8_t* p,
                   std::vector<int64_t> shape, int64_t rs, int64_t cs) {
  TensorView v;
  v.dtype = whole.dtype;
  v.data = p;
  v.nbytes = DTypeSize(whole.dtype);
  for (int64_t d : shape) v.nbytes *= static_cast<size_t>(d);
  v.shape = std::move(shape);
  v.row_stride = rs;
  v.col_stride = cs;
  return v;
}

// A float fused tensor; false if `name` is none of the four.
bool SliceFloat(const std::string& name, const TensorView& whole,
                const Layer& l) {
  const int64_t es = static_cast<int64_t>(DTypeSize(whole.dtype));
  const int64_t h = l.hidden, inter = l.inter;
  for (int64_t e = 0; e < l.num_experts; ++e) {
    ExpertViews& x = l.experts[e];
    if (absl::EndsWith(name, "gate_up_proj")) {  // [E, H, 2I], x @ W
      const uint8_t* p = whole.data + e * h * 2 * inter * es;
      x[0] = Strided(whole, p, {inter, h}, 2, 2 * inter);
      x[1] = Strided(whole, p + es, {inter, h}, 2, 2 * inter);
    } else if (absl::EndsWith(name, "down_proj")) {  // [E, I, H]
      x[2] = Strided(whole, whole.data + e * inter * h * es, {h, inter}, 1, h);
    } else if (absl::EndsWith(name, "gate_up_proj_bias")) {  // [E, 2I]
      const uint8_t* p = whole.data + e * 2 * inter * es;
      x[3] = Strided(whole, p, {inter}, 0, 2);
      x[4] = Strided(whole, p + es, {inter}, 0, 2);
    } else if (absl::EndsWith(name, "down_proj_bias")) {  // [E, H]
      x[5] = Strided(whole, whole.data + e * h * es, {h}, 0, 0);
    } else {
      return false;
    }
  }
  return true;
}

}  // namespace

absl::Status ModelDescription::IndexFusedExperts(const TensorSpec& spec) {
  ASSIGN_OR_RETURN(TensorView whole, checkpoint_->Get(spec.name));
  auto fail = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(
        checkpoint_->dir(), ": tensor '", spec.name, "' ", why, " (",
        TensorRoleName(spec.role), ", layer ", spec.layer, ")"));
  };
  if (whole.shape != spec.shape) {
    return fail(absl::StrCat("has shape ", Shape(whole.shape), ", expected ",
                             Shape(spec.shape), " for this config"));
  }
  const bool packed = spec.dtype == DType::kU8;
  if (packed && whole.dtype != DType::kU8) {
    return fail(absl::StrCat("has dtype ", DTypeName(whole.dtype),
                             ", expected U8 (MXFP4 blocks and scales)"));
  }
  if (!packed && !IsFloatDType(whole.dtype)) {
    return fail(absl::StrCat("has dtype ", DTypeName(whole.dtype),
                             ", expected F32, F16 or BF16"));
  }
  const int moe = config_.MoeLayerIndex(spec.layer);
  const Layer layer{config_.num_experts, config_.hidden_size,
                    config_.moe_intermediate_size,
                    &experts_[static_cast<size_t>(moe * config_.num_experts)]};
  const std::string& n = spec.name;
  if (absl::EndsWith(n, kMxfp4ScalesSuffix)) {
    for (size_t i = 0; i < whole.nbytes; ++i) {
      if (whole.data[i] == 255) {
        return fail(absl::StrCat("holds the E8M0 NaN code 255 at byte ", i));
      }
    }
    return absl::OkStatus();
  }
  if (packed) {
    const std::string base =
        n.substr(0, n.size() - (sizeof(kMxfp4BlocksSuffix) - 1));
    absl::StatusOr<TensorView> scales =
        checkpoint_->Get(base + kMxfp4ScalesSuffix);
    if (!scales.ok()) return absl::OkStatus();  // reported as missing
    SliceMxfp4(whole, *scales, absl::EndsWith(base, "gate_up_proj"), layer);
    return absl::OkStatus();
  }
  if (!SliceFloat(n, whole, layer)) {
    return fail("is not a fused expert tensor");
  }
  return absl::OkStatus();
}

}  // namespace moe
