#include "services/engine/moe_model.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/fp8.h"
#include "common/row_interleave.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "services/engine/mla_attention.h"

namespace moe {

absl::StatusOr<std::unique_ptr<MoeModel>> MoeModel::Load(
    const std::string& dir, Backend* backend) {
  ASSIGN_OR_RETURN(ModelDescription desc, ModelDescription::Open(dir));
  const ModelConfig& c = desc.config();
  // YaRN is implemented for the latent attention and the table rope with
  // sinks (the configurations published with it).
  const bool yarn =
      (c.is_mla() || c.has_attention_sinks()) && c.yarn.has_value();
  if (!c.rope_scaling_type.empty() && !yarn) {
    return absl::UnimplementedError(absl::StrCat(
        dir, ": rope scaling '", c.rope_scaling_type, "' is not supported"));
  }
  if (c.clip_qkv.has_value()) {
    return absl::UnimplementedError(
        absl::StrCat(dir, ": clip_qkv is not supported"));
  }
  if (c.o_bias && !c.has_attention_sinks()) {
    return absl::UnimplementedError(absl::StrCat(
        dir, c.is_mla() ? ": attention_bias" : ": o_proj bias",
        " is not supported"));
  }
  std::unique_ptr<MoeModel> model(new MoeModel());
  model->desc_ = std::make_unique<ModelDescription>(std::move(desc));
  model->backend_ = backend;
  model->device_ = backend->Info().is_device;
  RETURN_IF_ERROR(model->Prepare());
  return model;
}

MoeModel::~MoeModel() {
  for (void* p : owned_) backend_->Free(p);
}

int64_t MoeModel::max_context() const {
  const ModelConfig& c = config();
  int64_t n = c.max_position_embeddings > 0 ? c.max_position_embeddings
                                            : int64_t{1} << 20;
  // With sliding_layers the window applies to those only (Session masks).
  // A per-layer window (layer_types) is masked by the attention instead.
  if (c.sliding_window > 0 && !c.has_attention_sinks()) {
    n = std::min(n, c.sliding_window);
  }
  return n;
}

absl::StatusOr<const void*> MoeModel::Place(const TensorView& view) {
  if (!device_) return static_cast<const void*>(view.data);
  ASSIGN_OR_RETURN(void* p, backend_->Alloc(view.nbytes));
  owned_.push_back(p);
  RETURN_IF_ERROR(backend_->CopyToDevice(p, view.data, view.nbytes));
  return static_cast<const void*>(p);
}

namespace {

// The dense matrices that only ever meet Backend::MatMul whole (x W^T over
// whole rows), so any weight dtype of the backend's may stay as it is.
bool PlainMatMulWeight(TensorRole role) {
  switch (role) {
    case TensorRole::kQProj:
    case TensorRole::kKProj:
    case TensorRole::kVProj:
    case TensorRole::kOProj:
    case TensorRole::kLmHead:
    case TensorRole::kRouter:
      return true;
    default:
      return false;
  }
}

bool BackendRuns(const BackendInfo& b, DType t) {
  return (t == DType::kQ8 && b.supports_q8) || (t == DType::kQ4 && b.supports_q4) ||
         (t == DType::kMxfp4 && b.supports_mxfp4) ||
         (IsGgufBlockDType(t) && b.supports_gguf_blocks) ||
         (RowMajorOf(t) != t && b.supports_rows16);
}

}  // namespace

absl::StatusOr<TensorView> MoeModel::DenseView(TensorRole role, int layer, bool blocks_ok) {
  ASSIGN_OR_RETURN(TensorView view, desc_->Dense(role, layer));
  if (view.dtype == DType::kF8E4M3) {
    // Dense FP8 weights are a small share of the bytes: BF16 from here on.
    const uint64_t bytes = static_cast<uint64_t>(view.numel()) * DTypeSize(DType::kBF16);
    ASSIGN_OR_RETURN(uint8_t* buf, host_.Allocate(bytes));
    RETURN_IF_ERROR(ConvertWeightView(view, DType::kBF16, buf));
    return TensorView{DType::kBF16, view.shape, buf, bytes, {}};
  }
  if (IsQuantDType(view.dtype) && !(blocks_ok && BackendRuns(backend_->Info(), view.dtype))) {
    const uint64_t bytes = static_cast<uint64_t>(view.numel()) * sizeof(float);
    ASSIGN_OR_RETURN(uint8_t* buf, host_.Allocate(bytes));
    RETURN_IF_ERROR(ConvertWeightView(view, DType::kF32, buf));
    return TensorView{DType::kF32, view.shape, buf, bytes, {}};
  }
  if (blocks_ok && view.shape.size() == 2) {
    // Q4_K in the CPU's interleaved layout where the backend prefers it.
    const DType held = InterleavedHeld(view.dtype, view.shape[0], view.shape[1],
                                       backend_->Info().prefers_rows16);
    if (held != view.dtype) {
      ASSIGN_OR_RETURN(uint8_t* buf, host_.Allocate(view.nbytes));
      RETURN_IF_ERROR(ConvertWeightView(view, held, buf));
      return TensorView{held, view.shape, buf, view.nbytes, {}};
    }
  }
  return view;
}

absl::StatusOr<Weight> MoeModel::Matrix(TensorRole role, int layer) {
  ASSIGN_OR_RETURN(TensorView view, DenseView(role, layer, PlainMatMulWeight(role)));
  if (!device_ && role != TensorRole::kEmbed && !host_.Holds(view.data)) {
    // Read whole every token: off the checkpoint's mapping (4 KiB pages
    // where the page cache made them so) onto huge pages. The embedding is
    // read a row per token and stays mapped.
    ASSIGN_OR_RETURN(uint8_t* buf, host_.Allocate(view.nbytes));
    std::memcpy(buf, view.data, view.nbytes);
    view.data = buf;
  }
  Weight w;
  w.dtype = view.dtype;
  w.rows = view.shape[0];
  w.cols = view.shape.size() > 1 ? view.shape[1] : 1;
  ASSIGN_OR_RETURN(w.data, Place(view));
  return w;
}

absl::StatusOr<const float*> MoeModel::Vector(TensorRole role, int layer) {
  if (!desc_->HasDense(role, layer)) return nullptr;
  ASSIGN_OR_RETURN(TensorView view, desc_->Dense(role, layer));
  const int64_t n = view.numel();
  ASSIGN_OR_RETURN(const void* src, Place(view));
  ASSIGN_OR_RETURN(void* dst, backend_->Alloc(sizeof(float) * n));
  owned_.push_back(dst);
  RETURN_IF_ERROR(backend_->ConvertToF32(src, view.dtype,
                                         static_cast<float*>(dst), n));
  return static_cast<const float*>(dst);
}

absl::Status MoeModel::Prepare() {
  const ModelConfig& c = config();
  ASSIGN_OR_RETURN(embed_, Matrix(TensorRole::kEmbed, -1));
  ASSIGN_OR_RETURN(lm_head_, Matrix(TensorRole::kLmHead, -1));
  ASSIGN_OR_RETURN(final_norm_, Vector(TensorRole::kFinalNorm, -1));
  layers_.resize(c.num_hidden_layers);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    LayerWeights& w = layers_[l];
    ASSIGN_OR_RETURN(w.input_norm, Vector(TensorRole::kInputNorm, l));
    ASSIGN_OR_RETURN(w.post_norm, Vector(TensorRole::kPostAttnNorm, l));
    w.moe_index = c.MoeLayerIndex(l);
    if (c.is_mla()) {
      RETURN_IF_ERROR(PrepareMla(w, l));
      continue;
    }
    if (c.has_attention_sinks() || c.has_partial_rotary()) {
      RETURN_IF_ERROR(PrepareTableRoped(w, l));
      continue;
    }
    ASSIGN_OR_RETURN(w.q, Matrix(TensorRole::kQProj, l));
    ASSIGN_OR_RETURN(w.k, Matrix(TensorRole::kKProj, l));
    ASSIGN_OR_RETURN(w.v, Matrix(TensorRole::kVProj, l));
    ASSIGN_OR_RETURN(w.o, Matrix(TensorRole::kOProj, l));
    ASSIGN_OR_RETURN(w.q_bias, Vector(TensorRole::kQBias, l));
    ASSIGN_OR_RETURN(w.k_bias, Vector(TensorRole::kKBias, l));
    ASSIGN_OR_RETURN(w.v_bias, Vector(TensorRole::kVBias, l));
    ASSIGN_OR_RETURN(w.q_norm, Vector(TensorRole::kQNorm, l));
    ASSIGN_OR_RETURN(w.k_norm, Vector(TensorRole::kKNorm, l));
    RETURN_IF_ERROR(PrepareMlp(w, l));
  }
  return absl::OkStatus();
}

absl::Status MoeModel::PrepareMla(LayerWeights& w, int l) {
  const ModelConfig& c = config();
  if (c.mla.q_lora_rank > 0) {
    ASSIGN_OR_RETURN(w.q_a, Matrix(TensorRole::kQAProj, l));
    ASSIGN_OR_RETURN(w.q_a_norm, Vector(TensorRole::kQANorm, l));
    ASSIGN_OR_RETURN(w.q_b, Matrix(TensorRole::kQBProj, l));
  } else {
    ASSIGN_OR_RETURN(w.q, Matrix(TensorRole::kQProj, l));
  }
  ASSIGN_OR_RETURN(w.kv_a, Matrix(TensorRole::kKvAProj, l));
  ASSIGN_OR_RETURN(w.kv_a_norm, Vector(TensorRole::kKvANorm, l));
  ASSIGN_OR_RETURN(w.kv_b, Matrix(TensorRole::kKvBProj, l));
  ASSIGN_OR_RETURN(w.o, Matrix(TensorRole::kOProj, l));
  if (IsQuantDType(w.kv_b.dtype)) {
    return absl::UnimplementedError(
        absl::StrCat("layer ", l, ": kv_b_proj must be F32, F16 or BF16"));
  }
  if (mla_rope_.inv_freq == nullptr) {
    MlaRope rope = MlaRopeFor(c);
    const size_t bytes = sizeof(float) * rope.inv_freq.size();
    ASSIGN_OR_RETURN(void* p, backend_->Alloc(bytes));
    owned_.push_back(p);
    RETURN_IF_ERROR(backend_->CopyToDevice(p, rope.inv_freq.data(), bytes));
    mla_rope_.inv_freq = static_cast<const float*>(p);
    mla_rope_.mscale = rope.mscale;
    mla_rope_.softmax_scale = rope.softmax_scale;
  }
  return PrepareMlp(w, l);
}

absl::Status MoeModel::PrepareMlp(LayerWeights& w, int l) {
  const ModelConfig& c = config();
  {
    if (w.moe_index >= 0) {
      ASSIGN_OR_RETURN(w.router, Matrix(TensorRole::kRouter, l));
      ASSIGN_OR_RETURN(w.score_bias, Vector(TensorRole::kScoreBias, l));
      if (c.has_shared_expert()) {
        ASSIGN_OR_RETURN(w.shared_gate, Matrix(TensorRole::kSharedGate, l));
        ASSIGN_OR_RETURN(w.shared_up, Matrix(TensorRole::kSharedUp, l));
        ASSIGN_OR_RETURN(w.shared_down, Matrix(TensorRole::kSharedDown, l));
        if (c.has_shared_expert_gate()) {
          ASSIGN_OR_RETURN(w.shared_expert_gate,
                           Matrix(TensorRole::kSharedExpertGate, l));
        }
        if (w.shared_gate.dtype != w.shared_up.dtype ||
            w.shared_gate.dtype != w.shared_down.dtype) {
          return absl::UnimplementedError(absl::StrCat(
              "layer ", l, ": shared expert tensors of mixed dtypes"));
        }
      }
    } else {
      ASSIGN_OR_RETURN(w.dense_gate, Matrix(TensorRole::kMlpGate, l));
      ASSIGN_OR_RETURN(w.dense_up, Matrix(TensorRole::kMlpUp, l));
      ASSIGN_OR_RETURN(w.dense_down, Matrix(TensorRole::kMlpDown, l));
      if (w.dense_gate.dtype != w.dense_up.dtype ||
          w.dense_gate.dtype != w.dense_down.dtype) {
        return absl::UnimplementedError(
            absl::StrCat("layer ", l, ": MLP tensors of mixed dtypes"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace moe
