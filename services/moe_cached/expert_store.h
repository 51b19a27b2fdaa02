// ExpertStore: the daemon's host copy of every routed expert of one model.
//
// Each expert (moe_layer, expert) gets one contiguous block, so that one copy
// moves one expert into an arena slot:
//
//   layer l's blocks from layer(l).offset, block (l, e) at
//   layer(l).offset + e * layer(l).block_bytes
//   inside a block: gate | up | down (| gate_bias | up_bias | down_bias, F32,
//   with expert biases: they travel with their expert), each at a
//   kTensorAlign-aligned offset,
//   the block padded to kBlockAlign (a page), the same layout for all
//   experts of a layer.
//
// Layers differ only where the checkpoint's types do (a GGUF Q4_K_M file
// keeps some layers' down projections in Q6_K): then their blocks differ in
// size, and an arena slot is slot_bytes() long, the largest block; a copy
// moves the expert's own block_bytes. The layouts (per layer: role, dtype,
// shape, offset, nbytes) are what Attach reports to workers.
//
// Host memory: an unnamed memfd mapped shared (fd(): workers that run missed
// experts on the host map it read-only), with transparent huge pages
// requested where the kernel offers them. Pinning (cudaHostRegister) is the
// CUDA backend's job: `ExpertStoreOptions::pin` is the seam it fills in; the
// CPU build leaves it empty.
//
// Thread-safety: immutable after Load; concurrent reads are safe.
#ifndef MOECACHE_SERVICES_MOE_CACHED_EXPERT_STORE_H_
#define MOECACHE_SERVICES_MOE_CACHED_EXPERT_STORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "common/model_desc.h"
#include "services/moe_cached/fd_broker.h"

namespace moe::cached {

inline constexpr uint64_t kTensorAlign = 256;
inline constexpr uint64_t kBlockAlign = 4096;

// Where one tensor of an expert lives inside its block (and inside a slot).
struct ExpertTensorLayout {
  std::string role;  // "gate", "up", "down" (or "gate_bias", ...)
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // bytes from the block start
  uint64_t nbytes = 0;
};

// One MoE layer's experts in the store.
struct ExpertLayerLayout {
  std::vector<ExpertTensorLayout> tensors;
  uint64_t block_bytes = 0;  // one expert, a multiple of kBlockAlign
  uint64_t offset = 0;       // the layer's first block in the store
};

struct ExpertStoreOptions {
  // --expert-format: the dtype the store (and so every copy and arena slot)
  // holds; the checkpoint's experts are converted, quantized for kQ8/kQ4
  // (common/quant.h), while loading. nullopt: each tensor as stored in the
  // checkpoint (q8 for F8_E4M3 checkpoints, whose format no kernel reads; a
  // GGUF file's block-format experts keep their blocks, mixed types
  // included: DefaultHeldFormat).
  std::optional<DType> format;
  // Q4_K, q4, q8 and Q4_0 experts held interleaved (RowGroupOf 16: the CPU's
  // layouts, common/row_interleave.h; the same bytes rearranged). For a
  // store whose experts only ever meet CPU kernels (a daemon without a
  // GPU), on a CPU that prefers them (CpuPrefersRows16); never for a CUDA
  // arena.
  bool interleave_rows = false;
  // Called once on the whole buffer after allocation, before it is filled
  // (CUDA: register it as pinned memory). A failure aborts the load with
  // that status (e.g. RESOURCE_EXHAUSTED naming the memlock limit).
  std::function<absl::Status(void* data, uint64_t bytes)> pin;
  // Called with the same arguments before the buffer is unmapped, when pin
  // succeeded (CUDA: cudaHostUnregister). May be empty.
  std::function<void(void* data, uint64_t bytes)> unpin;
  // Progress is logged at most this often (and once at the end).
  double progress_interval_seconds = 2.0;
};

class ExpertStore {
 public:
  // Copies every routed expert of `model` into host memory. `name` is used in
  // log lines. RESOURCE_EXHAUSTED when the memory cannot be allocated.
  static absl::StatusOr<std::unique_ptr<ExpertStore>> Load(
      const std::string& name, const ModelDescription& model,
      const ExpertStoreOptions& options = {});

  ~ExpertStore();
  ExpertStore(const ExpertStore&) = delete;
  ExpertStore& operator=(const ExpertStore&) = delete;

  // The layout of one block, for the given gate/up/down views each held as
  // `format` (nullopt: DefaultHeldFormat(view): its own dtype, or q8 for
  // F8_E4M3 and safetensors MXFP4 experts), then `biases` (none, or the
  // gate, up and down bias views, held as F32). INVALID_ARGUMENT if a view
  // cannot be converted to `format`, or a row is not whole blocks of its
  // held dtype.
  static absl::StatusOr<std::vector<ExpertTensorLayout>> ComputeLayout(
      const TensorView& gate, const TensorView& up, const TensorView& down,
      uint64_t* block_bytes, std::optional<DType> format = std::nullopt,
      const std::vector<TensorView>& biases = {}, bool interleave_rows = false);

  // Every MoE layer's layout (from its expert 0: a layer's experts share
  // their dtypes, and Load checks their shapes), offsets in the store
  // included: what Load lays out, without reading an expert.
  static absl::StatusOr<std::vector<ExpertLayerLayout>> PlanLayers(
      const ModelDescription& model, std::optional<DType> format, bool interleave_rows = false);

  // The gate, up and down bias views of an expert of `model`, or
  // none for families without expert biases.
  static absl::StatusOr<std::vector<TensorView>> BiasViews(const ModelDescription& model,
                                                           int layer, int expert);

  // REQUIRES: 0 <= layer < num_layers(), 0 <= expert < num_experts().
  const uint8_t* Block(int layer, int expert) const;

  int num_layers() const { return num_layers_; }
  int num_experts() const { return num_experts_; }
  int top_k() const { return top_k_; }
  // An arena slot: the largest block of any layer.
  uint64_t slot_bytes() const { return slot_bytes_; }
  // REQUIRES: 0 <= layer < num_layers().
  const ExpertLayerLayout& layer(int layer) const { return layers_[layer]; }
  // The held dtypes of every layer's gate, up and down (ExpertFormatsName
  // says them in words).
  const std::vector<ExpertDTypes>& formats() const { return formats_; }
  // 2 x the weights of one expert (gate, up, down): its FLOPs per token.
  double expert_flops_per_token() const { return flops_per_token_; }
  uint64_t total_bytes() const { return total_bytes_; }
  const uint8_t* data() const { return data_; }  // every block, total_bytes() long
  // Pinned for a device's copies (page-locked: its pages cannot move).
  bool pinned() const { return static_cast<bool>(unpin_); }
  // Bytes per second one thread reads from the store (up to 256 MiB of it,
  // twice): the host figure of the miss cost model when none is given.
  double MeasureReadBytesPerSec() const;
  // The memfd holding every block (total_bytes() long).
  int fd() const { return fd_.get(); }

 private:
  ExpertStore() = default;
  // Writes expert (l, e)'s biases (if any) as F32 into its block.
  absl::Status CopyBiases(const std::string& name, const ModelDescription& model, int l, int e,
                          uint8_t* block) const;

  int num_layers_ = 0;
  int num_experts_ = 0;
  int top_k_ = 0;
  uint64_t slot_bytes_ = 0;
  uint64_t total_bytes_ = 0;
  double flops_per_token_ = 0;
  uint8_t* data_ = nullptr;  // mmap'ed, total_bytes_
  UniqueFd fd_;
  std::function<void(void* data, uint64_t bytes)> unpin_;  // set once pinned
  std::vector<ExpertLayerLayout> layers_;
  std::vector<ExpertDTypes> formats_;
};

}  // namespace moe::cached

#endif  // MOECACHE_SERVICES_MOE_CACHED_EXPERT_STORE_H_
