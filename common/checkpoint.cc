#include "common/checkpoint.h"

#include <algorithm>
#include <array>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/file_util.h"
#include "common/gguf_blocks.h"
#include "common/gguf_model.h"
#include "common/quant.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace moe {
namespace {

// Shard names come from a file we do not control: keep them inside `dir`.
bool IsSafeRelativeName(const std::string& name) {
  if (name.empty() || name.front() == '/' ||
      name.find('\0') != std::string::npos) {
    return false;
  }
  size_t start = 0;
  while (start <= name.size()) {
    size_t end = name.find('/', start);
    if (end == std::string::npos) end = name.size();
    absl::string_view part(name.data() + start, end - start);
    if (part.empty() || part == "." || part == "..") return false;
    start = end + 1;
  }
  return true;
}

}  // namespace

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(
    const std::string& dir) {
  std::unique_ptr<Checkpoint> ckpt(new Checkpoint());
  ckpt->dir_ = dir;
  std::string single = JoinPath(dir, kSingleFileName);
  std::string index = JoinPath(dir, kIndexFileName);
  if (IsRegularFile(single)) {
    ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(single));
    for (const TensorInfo& t : file->tensors()) {
      ckpt->where_[t.name] = {file.get(), &t};
      ckpt->names_.push_back(t.name);
    }
    ckpt->files_.push_back(std::move(file));
    return ckpt;
  }
  if (IsRegularFile(index)) {
    RETURN_IF_ERROR(ckpt->OpenIndex(index));
    return ckpt;
  }
  return absl::NotFoundError(absl::StrCat(dir, ": no ", kSingleFileName, " or ",
                                          kIndexFileName,
                                          " in this directory"));
}

absl::Status Checkpoint::OpenIndex(const std::string& index_path) {
  sharded_ = true;
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(index_path));
  auto json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(index_path, ": not a JSON object"));
  }
  auto map_it = json.find("weight_map");
  if (map_it == json.end() || !map_it->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(index_path, ": missing or non-object \"weight_map\""));
  }
  std::map<std::string, const SafetensorsFile*> opened;
  for (auto it = map_it->begin(); it != map_it->end(); ++it) {
    if (!it.value().is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path, ": weight_map entry for '", it.key(),
                       "' is not a file name"));
    }
    const std::string& shard = it.value().get_ref<const std::string&>();
    if (!IsSafeRelativeName(shard)) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path, ": tensor '", it.key(), "' maps to '", shard,
                       "', which is not a plain relative file name"));
    }
    auto found = opened.find(shard);
    if (found == opened.end()) {
      auto file = SafetensorsFile::Open(JoinPath(dir_, shard));
      if (!file.ok()) {
        return absl::Status(
            file.status().code(),
            absl::StrCat(file.status().message(), " (named by ", kIndexFileName,
                         " for '", it.key(), "')"));
      }
      found = opened.emplace(shard, file->get()).first;
      files_.push_back(std::move(*file));
    }
    const TensorInfo* info = found->second->Find(it.key());
    if (info == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path, ": tensor '", it.key(), "' is mapped to ",
                       shard, ", which does not contain it"));
    }
    where_[it.key()] = {found->second, info};
    names_.push_back(it.key());
  }
  std::sort(names_.begin(), names_.end());
  return absl::OkStatus();
}

namespace {

// What a GGUF tensor of `type` becomes: kept as it is (`dtype`, its bytes
// viewed in place or, for MXFP4, repacked), or decoded to F32 at load. A
// matrix stays in its blocks (routed experts and dense weights alike: the
// engine decides per use, MoeModel::DenseView); only a block-format vector
// is decoded.
struct GgufPlan {
  DType dtype = DType::kF32;
  bool decode = false;  // dequantize to an owned F32 copy
  bool repack = false;  // ggml MXFP4 -> kMxfp4 (an owned copy)
};

absl::StatusOr<GgufPlan> PlanGgufTensor(const std::string& path, const GgufTensorInfo& t) {
  switch (t.type) {
    case GgufType::kF32: return GgufPlan{DType::kF32};
    case GgufType::kF16: return GgufPlan{DType::kF16};
    case GgufType::kBF16: return GgufPlan{DType::kBF16};
    default: break;
  }
  const std::optional<DType> held = HeldDTypeOfGguf(t.type);
  if (!held.has_value() || !CanDequantizeGguf(t.type)) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": tensor '", t.name, "' is ", GgufTypeName(static_cast<uint32_t>(t.type)),
        ": GGUF tensors of F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K and "
        "MXFP4 are loaded; this type is not yet"));
  }
  if (t.shape().size() < 2) return GgufPlan{DType::kF32, /*decode=*/true};
  return GgufPlan{*held, false, /*repack=*/t.type == GgufType::kMXFP4};
}

// DeepSeek's kv_b_proj joined from llama.cpp's attn_k_b [heads, rank,
// nope] and attn_v_b [heads, v, rank] (JoinKvB): F32 bytes and their shape.
struct JoinedKvB {
  std::vector<uint8_t> bytes;
  std::vector<int64_t> shape;  // [heads * (nope + v), rank]
};
absl::StatusOr<JoinedKvB> JoinKvBHalves(const std::string& path, const GgufCheckpoint& gguf,
                                        const ModelConfig& config, const GgufTensorInfo* k_b,
                                        const GgufTensorInfo* v_b) {
  const int64_t heads = config.num_attention_heads, rank = config.mla.kv_lora_rank,
                nope = config.mla.qk_nope_head_dim, v = config.mla.v_head_dim;
  const std::vector<int64_t> want_k = {heads, rank, nope}, want_v = {heads, v, rank};
  for (const auto& [t, want] : {std::pair{k_b, want_k}, std::pair{v_b, want_v}}) {
    if (t->shape() != want) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": tensor '", t->name, "' has shape [", absl::StrJoin(t->shape(), ", "),
          "]; [", absl::StrJoin(want, ", "),
          "] expected (heads, kv_lora_rank, qk_nope_head_dim, v_head_dim of the config)"));
    }
  }
  std::vector<float> kf(static_cast<size_t>(k_b->numel)), vf(static_cast<size_t>(v_b->numel));
  RETURN_IF_ERROR(DequantizeGguf(k_b->type, gguf.Data(*k_b).data(), k_b->numel, kf.data()));
  RETURN_IF_ERROR(DequantizeGguf(v_b->type, gguf.Data(*v_b).data(), v_b->numel, vf.data()));
  JoinedKvB joined{std::vector<uint8_t>(sizeof(float) * static_cast<size_t>(heads * (nope + v) * rank)),
                   {heads * (nope + v), rank}};
  JoinKvB(kf.data(), vf.data(), heads, nope, v, rank, reinterpret_cast<float*>(joined.bytes.data()));
  return joined;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::FromGguf(
    std::unique_ptr<GgufCheckpoint> gguf, const ModelConfig& config, const std::string& path) {
  std::unique_ptr<Checkpoint> ckpt(new Checkpoint());
  ckpt->dir_ = path;
  std::vector<std::pair<const GgufTensorInfo*, GgufName>> stand_ins;
  // llama's rope-permuted rows of `heads` heads in Hugging Face order: a
  // copy, held here.
  auto unpermuted = [&](const uint8_t* rows, int64_t heads, size_t row_bytes,
                        size_t nbytes) -> const uint8_t* {
    std::vector<uint8_t>& copy = ckpt->owned_.emplace_back(nbytes);
    UndoLlamaRopePermutation(rows, heads, config.head_dim, row_bytes, copy.data());
    return copy.data();
  };
  for (const GgufTensorInfo& t : gguf->tensors()) {
    ASSIGN_OR_RETURN(GgufName name, MapGgufTensorName(config.family, t.name));
    if (!name.stands_in_for.empty()) {
      stand_ins.emplace_back(&t, std::move(name));
      continue;
    }
    // The nextn (MTP) layers llama.cpp keeps after the decoder's: not run,
    // as a folder's are not.
    if (name.nextn || (name.layer >= config.num_hidden_layers &&
                       name.layer < config.num_hidden_layers + config.num_nextn_predict_layers)) {
      continue;
    }
    ASSIGN_OR_RETURN(GgufPlan plan, PlanGgufTensor(path, t));
    absl::Span<const uint8_t> bytes = gguf->Data(t);
    std::vector<int64_t> shape = t.shape();
    if (plan.repack) {
      std::vector<uint8_t>& copy = ckpt->owned_.emplace_back(bytes.size());
      RepackGgufMxfp4(bytes.data(), static_cast<int64_t>(bytes.size() / kMxfp4BlockBytes),
                      copy.data());
      bytes = absl::MakeConstSpan(copy);
    }
    if (name.stacked_experts) {
      // ggml dims [in, out, experts]: expert e is the e-th [out, in] block,
      // whole rows of whole blocks (the reader checked dims[0]); a stacked
      // bias [out, experts] is one [out] row per expert.
      if (shape.size() < 2 || shape.size() > 3 || shape[0] != config.num_experts) {
        return absl::InvalidArgumentError(absl::StrCat(
            path, ": tensor '", t.name, "' stacks ", shape.empty() ? 0 : shape[0],
            " experts; the model has ", config.num_experts));
      }
      const size_t each = bytes.size() / static_cast<size_t>(shape[0]);
      std::vector<int64_t> one(shape.begin() + 1, shape.end());
      // A fused gate/up expert: gate's rows (or bias values), then up's.
      const int parts = name.fused.empty() ? 1 : 2;
      if (parts == 2) {
        if (one[0] % 2 != 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              path, ": tensor '", t.name, "' has ", one[0],
              " rows per expert; gate's and up's, an even number, expected"));
        }
        one[0] /= 2;
      }
      const size_t part_bytes = each / static_cast<size_t>(parts);
      for (int64_t e = 0; e < shape[0]; ++e) {
        for (int p = 0; p < parts; ++p) {
          const std::string ours = name.ForExpert(static_cast<int>(e), p);
          ckpt->views_[ours] =
              TensorView{plan.dtype, one, bytes.data() + e * each + p * part_bytes, part_bytes};
          ckpt->names_.push_back(ours);
        }
      }
      continue;
    }
    if (!name.fused.empty()) {
      // attn_qkv: q's rows (or bias values), k's, v's.
      const int64_t q_rows = config.num_attention_heads * config.head_dim;
      const int64_t kv_rows = config.num_key_value_heads * config.head_dim;
      const int64_t part_rows[3] = {q_rows, kv_rows, kv_rows};
      if (shape.empty() || shape.size() > 2 || q_rows <= 0 || kv_rows <= 0 ||
          shape[0] != q_rows + 2 * kv_rows || plan.decode ||
          (name.rope_permuted && config.head_dim % 2 != 0)) {
        return absl::InvalidArgumentError(absl::StrCat(
            path, ": tensor '", t.name, "' has ", shape.empty() ? 0 : shape[0], " rows; ", q_rows,
            " + 2 x ", kv_rows, " (q, k, v of the config's heads) expected",
            plan.decode ? ", unquantized" : ""));
      }
      const size_t row_bytes = bytes.size() / static_cast<size_t>(shape[0]);
      const uint8_t* at = bytes.data();
      for (int p = 0; p < 3; ++p) {
        std::vector<int64_t> part_shape = shape;
        part_shape[0] = part_rows[p];
        const size_t part_bytes = row_bytes * static_cast<size_t>(part_rows[p]);
        const uint8_t* data =
            name.rope_permuted && p < 2
                ? unpermuted(at, p == 0 ? config.num_attention_heads : config.num_key_value_heads,
                             row_bytes, part_bytes)
                : at;
        ckpt->views_[name.fused[p]] = TensorView{plan.dtype, part_shape, data, part_bytes};
        ckpt->names_.push_back(name.fused[p]);
        at += part_bytes;
      }
      continue;
    }
    const uint8_t* data = bytes.data();
    if (name.rope_permuted) {
      const bool q = absl::StrContains(t.name, "attn_q");
      const int64_t heads = q ? config.num_attention_heads : config.num_key_value_heads;
      const int64_t head_dim = config.head_dim;
      if (shape.size() != 2 || heads <= 0 || head_dim <= 0 || head_dim % 2 != 0 ||
          shape[0] != heads * head_dim) {
        return absl::InvalidArgumentError(absl::StrCat(
            path, ": tensor '", t.name, "' has ", shape.empty() ? 0 : shape[0],
            " rows; ", heads, " heads of ", head_dim, " expected"));
      }
      data = unpermuted(bytes.data(), heads, bytes.size() / static_cast<size_t>(shape[0]),
                        bytes.size());
    }
    size_t nbytes = bytes.size();
    if (plan.decode) {
      // A block-format vector: decoded once to F32 (exactly ggml's
      // dequantized values).
      nbytes = sizeof(float) * static_cast<size_t>(t.numel);
      std::vector<uint8_t>& f32 = ckpt->owned_.emplace_back(nbytes);
      RETURN_IF_ERROR(DequantizeGguf(t.type, data, t.numel, reinterpret_cast<float*>(f32.data())));
      data = f32.data();
    }
    ckpt->views_[name.ours] = TensorView{plan.dtype, shape, data, nbytes};
    ckpt->names_.push_back(name.ours);
  }
  // Stand-ins for a tensor the file lacks: kv_b joined from its halves,
  // anything else refused.
  using StandIn = std::pair<const GgufTensorInfo*, GgufName>;
  std::map<std::string, std::array<const StandIn*, 2>> kv_b_halves;
  for (const StandIn& s : stand_ins) {
    const auto& [t, name] = s;
    if (ckpt->views_.count(name.stands_in_for) != 0) continue;
    if (name.kv_b_half == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor '", t->name, "': ", name.why));
    }
    kv_b_halves[name.stands_in_for][name.kv_b_half - 1] = &s;
  }
  for (const auto& [ours, halves] : kv_b_halves) {
    if (halves[0] == nullptr || halves[1] == nullptr) {
      const StandIn& one = *(halves[0] != nullptr ? halves[0] : halves[1]);
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor '", one.first->name, "': ", one.second.why));
    }
    ASSIGN_OR_RETURN(JoinedKvB joined,
                     JoinKvBHalves(path, *gguf, config, halves[0]->first, halves[1]->first));
    std::vector<uint8_t>& kept = ckpt->owned_.emplace_back(std::move(joined.bytes));
    ckpt->views_[ours] = TensorView{DType::kF32, joined.shape, kept.data(), kept.size()};
    ckpt->names_.push_back(ours);
  }
  std::sort(ckpt->names_.begin(), ckpt->names_.end());
  ckpt->gguf_ = std::move(gguf);
  return ckpt;
}

bool Checkpoint::Has(absl::string_view name) const {
  return where_.count(std::string(name)) > 0 || views_.count(std::string(name)) > 0;
}

const SafetensorsFile* Checkpoint::FileOf(absl::string_view name) const {
  auto it = where_.find(std::string(name));
  return it == where_.end() ? nullptr : it->second.file;
}

absl::StatusOr<TensorView> Checkpoint::Get(absl::string_view name) const {
  if (auto view = views_.find(std::string(name)); view != views_.end()) return view->second;
  auto it = where_.find(std::string(name));
  if (it == where_.end()) {
    return absl::NotFoundError(absl::StrCat(
        dir_, ": checkpoint has no tensor '", std::string(name), "'"));
  }
  const TensorInfo& info = *it->second.info;
  auto bytes = it->second.file->Data(info);
  return TensorView{info.dtype, info.shape, bytes.data(), bytes.size()};
}

}  // namespace moe
