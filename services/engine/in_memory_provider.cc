#include "services/engine/in_memory_provider.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/fp8.h"
#include "common/row_interleave.h"
#include "common/mxfp4.h"
#include "common/quant.h"
#include "common/status_macros.h"

namespace moe {

absl::StatusOr<std::unique_ptr<InMemoryExpertProvider>>
InMemoryExpertProvider::Create(const MoeModel& model,
                               std::optional<DType> format) {
  std::unique_ptr<InMemoryExpertProvider> p(new InMemoryExpertProvider(model));
  const ModelConfig& c = model.config();
  const ModelDescription& d = model.description();
  Backend& be = model.backend();
  const bool device = be.Info().is_device;
  const TensorRole roles[3] = {TensorRole::kExpertGate, TensorRole::kExpertUp,
                               TensorRole::kExpertDown};
  for (int l = 0; l < c.num_moe_layers(); ++l) {
    // Each projection as stored (GGUF blocks stay blocks, mixed types
    // included), unless `format` says otherwise.
    DType held_of[3];
    for (int r = 0; r < 3 && c.num_experts > 0; ++r) {
      ASSIGN_OR_RETURN(TensorView first, d.Expert(l, 0, roles[r]));
      // Q4_K and q4 in the CPU's interleaved layouts where the backend
      // prefers them.
      const DType held = held_of[r] =
          InterleavedHeld(format.value_or(DefaultHeldFormat(first)), first.shape[0],
                          first.shape.back(), be.Info().prefers_rows16);
      if (held == DType::kMxfp4 && !be.Info().supports_mxfp4) {
        return absl::UnimplementedError(absl::StrCat(
            "the ", be.Info().name, " backend has no mxfp4 kernels; hold the experts as q8 "
            "(exact for MXFP4 checkpoints)"));
      }
      if (IsGgufBlockDType(held) && !be.Info().supports_gguf_blocks) {
        return absl::UnimplementedError(absl::StrCat(
            "the ", be.Info().name, " backend does not run ", DTypeName(held),
            " experts: its ggml block kernels failed the self-check at start (see the "
            "WARNING in the log); hold them as q8, q4 or bf16 (--expert-format), or use "
            "--device cpu"));
      }
    }
    for (int e = 0; e < c.num_experts; ++e) {
      const void* ptrs[3];
      for (int r = 0; r < 3; ++r) {
        const DType held = held_of[r];
        ASSIGN_OR_RETURN(TensorView v, d.Expert(l, e, roles[r]));
        ptrs[r] = v.data;
        uint64_t nbytes = v.nbytes;
        if (ViewNeedsConversion(v, held)) {
          const int64_t b = WeightBytes(held, v.shape[0], v.shape[1]);
          if (b < 0) {
            return absl::InvalidArgumentError(absl::StrCat(
                "experts of ", v.shape[1], " columns cannot be held as ",
                ExpertFormatName(held), " (whole blocks of ",
                QuantGroupSize(held), ")"));
          }
          ASSIGN_OR_RETURN(uint8_t* buf, p->converted_.Allocate(static_cast<uint64_t>(b)));
          RETURN_IF_ERROR(ConvertWeightView(v, held, buf));
          ptrs[r] = buf;
          nbytes = static_cast<uint64_t>(b);
        } else if (!device) {
          // Held as stored, copied all the same: the checkpoint's mapping
          // has 4 KiB pages where the page cache made them so, and a decode
          // step streams every expert it routes to (HugePageArena).
          ASSIGN_OR_RETURN(uint8_t* buf, p->converted_.Allocate(nbytes));
          std::memcpy(buf, v.data, nbytes);
          ptrs[r] = buf;
        }
        if (device) {
          ASSIGN_OR_RETURN(void* dst, be.Alloc(nbytes));
          p->owned_.push_back(dst);
          RETURN_IF_ERROR(be.CopyToDevice(dst, ptrs[r], nbytes));
          ptrs[r] = dst;
        }
      }
      ExpertView view{e, ptrs[0], ptrs[1], ptrs[2], {held_of[0], held_of[1], held_of[2]}};
      if (c.has_expert_biases()) {
        const float* biases[3];
        for (int r = 0; r < 3; ++r) {
          ASSIGN_OR_RETURN(biases[r], p->PlaceBias(l, e, r));
        }
        view.gate_bias = biases[0];
        view.up_bias = biases[1];
        view.down_bias = biases[2];
      }
      p->views_.push_back(view);
    }
  }
  return p;
}

absl::StatusOr<const float*> InMemoryExpertProvider::PlaceBias(int moe_layer, int expert,
                                                               int which) {
  static constexpr TensorRole kRoles[3] = {TensorRole::kExpertGateBias,
                                           TensorRole::kExpertUpBias,
                                           TensorRole::kExpertDownBias};
  ASSIGN_OR_RETURN(TensorView v, model_.description().Expert(moe_layer, expert, kRoles[which]));
  const uint64_t bytes = sizeof(float) * static_cast<uint64_t>(v.numel());
  ASSIGN_OR_RETURN(uint8_t* buf, converted_.Allocate(bytes));
  RETURN_IF_ERROR(ConvertVectorView(v, reinterpret_cast<float*>(buf)));
  Backend& be = model_.backend();
  if (!be.Info().is_device) return reinterpret_cast<const float*>(buf);
  ASSIGN_OR_RETURN(void* dst, be.Alloc(bytes));
  owned_.push_back(dst);
  RETURN_IF_ERROR(be.CopyToDevice(dst, buf, bytes));
  return static_cast<const float*>(dst);
}

InMemoryExpertProvider::~InMemoryExpertProvider() {
  for (void* ptr : owned_) model_.backend().Free(ptr);
}

absl::StatusOr<AcquiredExperts> InMemoryExpertProvider::Acquire(
    int moe_layer, absl::Span<const ExpertDemand> demands, bool prefill) {
  const ModelConfig& c = model_.config();
  if (moe_layer < 0 || moe_layer >= c.num_moe_layers()) {
    return absl::InvalidArgumentError(
        absl::StrCat("MoE layer ", moe_layer, " out of range"));
  }
  AcquiredExperts lease;
  lease.moe_layer = moe_layer;
  for (const ExpertDemand& d : demands) {
    if (d.expert < 0 || d.expert >= c.num_experts) {
      return absl::InvalidArgumentError(
          absl::StrCat("expert ", d.expert, " out of range"));
    }
    lease.views.push_back(views_[moe_layer * c.num_experts + d.expert]);
  }
  lease.usage.hits = static_cast<int32_t>(demands.size());
  ++acquires_;
  return lease;
}

void InMemoryExpertProvider::Release(AcquiredExperts& lease) {
  lease.views.clear();
}

}  // namespace moe
