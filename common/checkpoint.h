// A Hugging Face model directory's weights: either one `model.safetensors`
// or `model.safetensors.index.json` plus the shard files it names (the same
// rule transformers uses: the single file wins when both exist). Or a GGUF
// checkpoint (FromGguf), its tensors under our (Hugging Face) names.
//
// Open validates everything up front: every shard parses (see
// SafetensorsFile), every index entry names a shard that exists and holds
// the tensor. Afterwards Get() cannot fail except for unknown names.
//
// Thread-safety: immutable after Open; concurrent reads are safe. Views
// returned by Get() stay valid for the Checkpoint's lifetime (the shards are
// memory-mapped, read-only, zero-copy).
#ifndef MOECACHE_COMMON_CHECKPOINT_H_
#define MOECACHE_COMMON_CHECKPOINT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/dtype.h"
#include "common/gguf.h"
#include "common/model_config.h"
#include "common/safetensors.h"

namespace moe {

inline constexpr char kSingleFileName[] = "model.safetensors";
inline constexpr char kIndexFileName[] = "model.safetensors.index.json";

// The block scales of a block-quantized checkpoint weight (the
// `weight_scale_inv` of FP8 checkpoints, common/fp8.h): one value per
// [block_rows, block_cols] tile of the weight, a [rows, cols] row-major
// matrix of `dtype` (F32, BF16 or F16). Empty (data == nullptr) otherwise.
struct BlockScales {
  DType dtype = DType::kF32;
  const uint8_t* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t block_rows = 0;
  int64_t block_cols = 0;
  size_t nbytes = 0;
};

// A read-only view of one tensor's bytes (little-endian, row-major).
struct TensorView {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
  // Set by ModelDescription for F8_E4M3 weights (and the E8M0 scales of
  // kMxfp4 ones: U8, block 1 x 32); nbytes excludes them.
  BlockScales scales;
  // Element strides of a view into a larger tensor (fused experts,
  // ModelDescription::Expert): element (r, c) of a 2-D view (or i of a 1-D
  // one, with row_stride 0) is at r * row_stride + c * col_stride. Both 0:
  // dense row-major. kMxfp4 views have col_stride 0 or 1 (whole blocks per
  // row) and their scale rows step by row_stride / 32. Only ConvertWeightView
  // and ConvertVectorView (common/fp8.h, common/mxfp4.h) read strided views.
  int64_t row_stride = 0;
  int64_t col_stride = 0;
  bool strided() const { return row_stride != 0 || col_stride != 0; }

  int64_t numel() const;
};

class Checkpoint {
 public:
  // Opens the weights in directory `dir`. NOT_FOUND when it has neither
  // model.safetensors nor model.safetensors.index.json; INVALID_ARGUMENT,
  // naming the file and tensor, for anything malformed.
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Open(
      const std::string& dir);

  // The tensors of a GGUF checkpoint of `config` (ModelConfigFromGguf)
  // under our names (common/gguf_model.h): a stacked expert tensor (or
  // stacked expert bias) becomes one view per expert (no copy), llama's
  // permuted attn_q / attn_k rows are put back in Hugging Face order (a
  // copy, held here). gpt-oss's experts stay split per projection (our
  // names experts.E.{gate,up,down}_proj.{weight,bias}; model_desc.h,
  // BiasedExperts::kPerExpert).
  // Types: F32, F16 and BF16 are viewed as they are. Routed experts in
  // block formats keep their blocks: Q8_0 as kQ8 and Q4_0, Q4_1, Q5_0,
  // Q5_1, Q4_K, Q5_K, Q6_K as kQ4_0 .. kQ6K (views, no copy; an expert's
  // bytes are its GGUF blocks' bytes), MXFP4 repacked to kMxfp4 (lossless,
  // a copy held here). Other tensors in those block types are dequantized
  // to F32 at load (common/gguf_blocks.h: exactly ggml's values).
  // INVALID_ARGUMENT naming the tensor and its type for any other type, and
  // for names the family does not have.
  static absl::StatusOr<std::unique_ptr<Checkpoint>> FromGguf(
      std::unique_ptr<GgufCheckpoint> gguf, const ModelConfig& config, const std::string& path);

  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;

  bool Has(absl::string_view name) const;

  // NOT_FOUND (naming the tensor and directory) for unknown names.
  absl::StatusOr<TensorView> Get(absl::string_view name) const;

  // Where `name` lives: the shard and its header entry; nullptr if unknown
  // (and for every tensor of a GGUF checkpoint).
  // For loaders that want file offsets rather than views.
  const SafetensorsFile* FileOf(absl::string_view name) const;

  // Every tensor name, sorted.
  const std::vector<std::string>& names() const { return names_; }

  // The shard files, in the order first named (one entry when unsharded).
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const {
    return files_;
  }

  // Files the weights are in: the safetensors shards, or the GGUF parts.
  size_t file_count() const { return gguf_ != nullptr ? gguf_->file_count() : files_.size(); }

  // The GGUF file(s) of a FromGguf checkpoint (their tensor infos keep the
  // GGUF types); nullptr for safetensors.
  const GgufCheckpoint* gguf() const { return gguf_.get(); }

  const std::string& dir() const { return dir_; }
  bool sharded() const { return sharded_; }

 private:
  Checkpoint() = default;
  absl::Status OpenIndex(const std::string& index_path);

  std::string dir_;
  bool sharded_ = false;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::vector<std::string> names_;
  struct Location {
    const SafetensorsFile* file;
    const TensorInfo* info;
  };
  std::unordered_map<std::string, Location> where_;
  // A GGUF checkpoint's views (where_ is then empty), and the bytes of the
  // ones it had to copy.
  std::unique_ptr<GgufCheckpoint> gguf_;
  std::unordered_map<std::string, TensorView> views_;
  std::vector<std::vector<uint8_t>> owned_;
};

}  // namespace moe

#endif  // MOECACHE_COMMON_CHECKPOINT_H_
