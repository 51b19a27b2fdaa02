#include "services/moe_cached/expert_store.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/fp8.h"
#include "common/row_interleave.h"
#include "common/logging.h"
#include "common/mxfp4.h"
#include "common/quant.h"
#include "common/status_macros.h"
#include "services/cache/shm_region.h"

namespace moe::cached {
namespace {

uint64_t AlignUp(uint64_t n, uint64_t align) { return (n + align - 1) / align * align; }

double GiB(uint64_t bytes) { return static_cast<double>(bytes) / (1ull << 30); }

// Logs "loaded X of Y GiB (p%), R GB/s, ETA s" at most every interval.
class Progress {
 public:
  Progress(std::string name, uint64_t total, double interval)
      : name_(std::move(name)), total_(total), interval_(absl::Seconds(interval)) {}

  void Add(uint64_t bytes) {
    done_ += bytes;
    absl::Time now = absl::Now();
    if (now - last_ < interval_ || done_ == total_) return;
    last_ = now;
    Log(now, "loading");
  }
  void Finish() { Log(absl::Now(), "loaded"); }

 private:
  void Log(absl::Time now, const char* verb) {
    double secs = std::max(absl::ToDoubleSeconds(now - start_), 1e-9);
    double rate = static_cast<double>(done_) / secs;
    double eta = rate > 0 ? static_cast<double>(total_ - done_) / rate : 0;
    MOE_LOG(INFO) << absl::StrFormat(
        "model %s: %s experts %.3f of %.3f GiB (%.0f%%), %.2f GB/s, ETA %.0f s", name_, verb,
        GiB(done_), GiB(total_), total_ ? 100.0 * done_ / total_ : 100.0, rate / 1e9, eta);
  }

  const std::string name_;
  const uint64_t total_;
  const absl::Duration interval_;
  uint64_t done_ = 0;
  absl::Time start_ = absl::Now();
  absl::Time last_ = absl::Now();
};

}  // namespace

absl::StatusOr<std::vector<ExpertTensorLayout>> ExpertStore::ComputeLayout(
    const TensorView& gate, const TensorView& up, const TensorView& down,
    uint64_t* block_bytes, std::optional<DType> format, const std::vector<TensorView>& biases,
    bool interleave_rows) {
  std::vector<ExpertTensorLayout> layout;
  uint64_t offset = 0;
  const char* roles[3] = {"gate", "up", "down"};
  const TensorView* views[3] = {&gate, &up, &down};
  for (int i = 0; i < 3; ++i) {
    const TensorView& v = *views[i];
    const DType held =
        InterleavedHeld(format.value_or(DefaultHeldFormat(v)), v.shape.empty() ? 0 : v.shape[0],
                        v.shape.empty() ? 0 : v.shape.back(), interleave_rows);
    // Block formats (GGUF experts included) decode to floats on the way.
    const bool convertible =
        IsFloatDType(v.dtype) || v.dtype == DType::kF8E4M3 || IsQuantDType(v.dtype);
    if (held != v.dtype &&
        (!convertible || (!IsFloatDType(held) && !IsQuantDType(held)))) {
      return absl::InvalidArgumentError(absl::StrCat("cannot convert expert ", roles[i],
                                                     " weights of dtype ", DTypeName(v.dtype),
                                                     " to ", DTypeName(held)));
    }
    const std::vector<int64_t>& shape = v.shape;
    uint64_t nbytes = v.nbytes;
    if (held != v.dtype || IsQuantDType(held)) {
      const int64_t b = shape.size() == 2 ? WeightBytes(held, shape[0], shape[1]) : -1;
      if (b < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "expert ", roles[i], " rows of ", shape.empty() ? 0 : shape.back(),
            " weights cannot be held as ", ExpertFormatName(held),
            ": they must be whole blocks of ", QuantGroupSize(held),
            " (--expert-format bf16 holds any shape)"));
      }
      nbytes = static_cast<uint64_t>(b);
    }
    offset = AlignUp(offset, kTensorAlign);
    layout.push_back({roles[i], held, shape, offset, nbytes});
    offset += nbytes;
  }
  if (!biases.empty() && biases.size() != 3) {
    return absl::InvalidArgumentError("expert biases come as gate, up and down");
  }
  const char* bias_roles[3] = {"gate_bias", "up_bias", "down_bias"};
  for (size_t i = 0; i < biases.size(); ++i) {
    if (biases[i].shape.size() != 1 || !IsFloatDType(biases[i].dtype)) {
      return absl::InvalidArgumentError(
          absl::StrCat("expert ", bias_roles[i], " is not a 1-D float tensor"));
    }
    const uint64_t nbytes = sizeof(float) * static_cast<uint64_t>(biases[i].shape[0]);
    offset = AlignUp(offset, kTensorAlign);
    layout.push_back({bias_roles[i], DType::kF32, biases[i].shape, offset, nbytes});
    offset += nbytes;
  }
  *block_bytes = AlignUp(offset, kBlockAlign);
  return layout;
}

absl::StatusOr<std::vector<ExpertLayerLayout>> ExpertStore::PlanLayers(
    const ModelDescription& model, std::optional<DType> format, bool interleave_rows) {
  static constexpr TensorRole kRoles[3] = {TensorRole::kExpertGate, TensorRole::kExpertUp,
                                           TensorRole::kExpertDown};
  const ModelConfig& c = model.config();
  std::vector<ExpertLayerLayout> layers;
  uint64_t offset = 0;
  for (int l = 0; l < c.num_moe_layers(); ++l) {
    TensorView v[3];
    for (int r = 0; r < 3; ++r) {
      ASSIGN_OR_RETURN(v[r], model.Expert(l, 0, kRoles[r]));
    }
    ASSIGN_OR_RETURN(std::vector<TensorView> biases, BiasViews(model, l, 0));
    ExpertLayerLayout& layer = layers.emplace_back();
    ASSIGN_OR_RETURN(layer.tensors,
                     ComputeLayout(v[0], v[1], v[2], &layer.block_bytes, format, biases,
                                   interleave_rows));
    layer.offset = offset;
    offset += layer.block_bytes * static_cast<uint64_t>(c.num_experts);
  }
  return layers;
}

absl::StatusOr<std::unique_ptr<ExpertStore>> ExpertStore::Load(
    const std::string& name, const ModelDescription& model, const ExpertStoreOptions& options) {
  const ModelConfig& config = model.config();
  std::unique_ptr<ExpertStore> store(new ExpertStore());
  store->num_layers_ = config.num_moe_layers();
  store->num_experts_ = static_cast<int>(config.num_experts);
  store->top_k_ = static_cast<int>(config.top_k);
  if (store->num_layers_ <= 0 || store->num_experts_ <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("model ", name, " has no routed experts"));
  }
  static constexpr TensorRole kRoles[3] = {TensorRole::kExpertGate, TensorRole::kExpertUp,
                                           TensorRole::kExpertDown};
  ASSIGN_OR_RETURN(store->layers_, PlanLayers(model, options.format, options.interleave_rows));
  bool convert = false;  // some tensor changes format (or is gathered)
  for (int l = 0; l < store->num_layers_; ++l) {
    const ExpertLayerLayout& layer = store->layers_[l];
    store->total_bytes_ = layer.offset + layer.block_bytes * static_cast<uint64_t>(store->num_experts_);
    store->slot_bytes_ = std::max(store->slot_bytes_, layer.block_bytes);
    store->formats_.push_back(
        {layer.tensors[0].dtype, layer.tensors[1].dtype, layer.tensors[2].dtype});
    for (int r = 0; r < 3; ++r) {
      ASSIGN_OR_RETURN(TensorView v, model.Expert(l, 0, kRoles[r]));
      convert |= ViewNeedsConversion(v, layer.tensors[r].dtype);
    }
  }
  for (int r = 0; r < 3; ++r) {
    double weights = 1;
    for (int64_t d : store->layers_[0].tensors[r].shape) weights *= static_cast<double>(d);
    store->flops_per_token_ += 2.0 * weights;
  }

  // An unnamed memfd, so that workers can map it read-only (the FdBroker
  // hands it over) and run missed experts where they lie.
  const int fd = ::memfd_create("moecache-experts", MFD_CLOEXEC);
  void* mem = MAP_FAILED;
  if (fd >= 0 && ::ftruncate(fd, static_cast<off_t>(store->total_bytes_)) == 0) {
    mem = cache::MapSharedAligned(fd, store->total_bytes_, PROT_READ | PROT_WRITE);
  }
  if (fd >= 0) store->fd_ = UniqueFd(fd);
  if (mem == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat("model ", name, ": cannot allocate ",
                                                     store->total_bytes_, " bytes for experts: ",
                                                     std::strerror(errno)));
  }
  store->data_ = static_cast<uint8_t*>(mem);
  ::madvise(mem, store->total_bytes_, MADV_HUGEPAGE);  // best effort
  if (options.pin) {
    RETURN_IF_ERROR(options.pin(mem, store->total_bytes_));
    store->unpin_ = options.unpin;
  }

  // Strided views (fused experts) are gathered even when the
  // format stays.
  Progress progress(
      convert ? absl::StrCat(name, " (to ", ExpertFormatsName(store->formats_), ")") : name,
      store->total_bytes_, options.progress_interval_seconds);
  for (int l = 0; l < store->num_layers_; ++l) {
    const ExpertLayerLayout& layer = store->layers_[l];
    TensorView first[3];
    for (int r = 0; r < 3; ++r) {
      ASSIGN_OR_RETURN(first[r], model.Expert(l, 0, kRoles[r]));
    }
    for (int e = 0; e < store->num_experts_; ++e) {
      uint8_t* block = store->data_ + layer.offset + static_cast<uint64_t>(e) * layer.block_bytes;
      for (int r = 0; r < 3; ++r) {
        ASSIGN_OR_RETURN(TensorView view, model.Expert(l, e, kRoles[r]));
        const ExpertTensorLayout& slot = layer.tensors[r];
        const bool convert_view = ViewNeedsConversion(view, slot.dtype);
        if (view.dtype != first[r].dtype || view.shape != slot.shape ||
            (!convert_view && view.nbytes != slot.nbytes)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "model ", name, ": expert L", l, "/E", e, " ", slot.role,
              " differs in shape or dtype from expert L", l, "/E0"));
        }
        if (convert_view) {
          absl::Status s = ConvertWeightView(view, slot.dtype, block + slot.offset);
          if (!s.ok()) {
            return absl::InvalidArgumentError(absl::StrCat(
                "model ", name, ": expert L", l, "/E", e, " ", slot.role, ": ", s.message()));
          }
        } else {
          std::memcpy(block + slot.offset, view.data, view.nbytes);
        }
      }
      RETURN_IF_ERROR(store->CopyBiases(name, model, l, e, block));
      progress.Add(layer.block_bytes);
    }
  }
  progress.Finish();
  return store;
}

absl::StatusOr<std::vector<TensorView>> ExpertStore::BiasViews(const ModelDescription& model,
                                                              int layer, int expert) {
  std::vector<TensorView> out;
  if (!model.config().has_expert_biases()) return out;
  for (TensorRole r : {TensorRole::kExpertGateBias, TensorRole::kExpertUpBias,
                       TensorRole::kExpertDownBias}) {
    ASSIGN_OR_RETURN(TensorView v, model.Expert(layer, expert, r));
    out.push_back(std::move(v));
  }
  return out;
}

absl::Status ExpertStore::CopyBiases(const std::string& name, const ModelDescription& model,
                                     int l, int e, uint8_t* block) const {
  ASSIGN_OR_RETURN(std::vector<TensorView> biases, BiasViews(model, l, e));
  for (size_t i = 0; i < biases.size(); ++i) {
    const ExpertTensorLayout& slot = layers_[l].tensors[3 + i];
    if (biases[i].shape != slot.shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model ", name, ": expert L", l, "/E", e, " ", slot.role,
          " differs in shape from expert L", l, "/E0"));
    }
    RETURN_IF_ERROR(ConvertVectorView(biases[i], reinterpret_cast<float*>(block + slot.offset)));
  }
  return absl::OkStatus();
}

ExpertStore::~ExpertStore() {
  if (data_ == nullptr) return;
  if (unpin_) unpin_(data_, total_bytes_);
  ::munmap(data_, total_bytes_);
}

const uint8_t* ExpertStore::Block(int layer, int expert) const {
  MOE_CHECK(layer >= 0 && layer < num_layers_ && expert >= 0 && expert < num_experts_)
      << "expert L" << layer << "/E" << expert << " out of range";
  const ExpertLayerLayout& l = layers_[layer];
  return data_ + l.offset + static_cast<uint64_t>(expert) * l.block_bytes;
}

double ExpertStore::MeasureReadBytesPerSec() const {
  const uint64_t bytes = std::min<uint64_t>(total_bytes_, uint64_t{256} << 20) & ~uint64_t{63};
  if (bytes == 0) return 0;
  const uint64_t* words = reinterpret_cast<const uint64_t*>(data_);
  uint64_t sum = 0;
  absl::Duration best = absl::InfiniteDuration();
  for (int pass = 0; pass < 2; ++pass) {  // the first pass may fault pages in
    const absl::Time start = absl::Now();
    for (uint64_t i = 0; i < bytes / 8; i += 4) {
      sum += words[i] ^ words[i + 1] ^ words[i + 2] ^ words[i + 3];
    }
    best = std::min(best, absl::Now() - start);
  }
  volatile uint64_t sink = sum;  // keep the loop
  (void)sink;
  const double seconds = std::max(absl::ToDoubleSeconds(best), 1e-9);
  return static_cast<double>(bytes) / seconds;
}

}  // namespace moe::cached
