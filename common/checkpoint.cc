#include "common/checkpoint.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
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

bool Checkpoint::Has(absl::string_view name) const {
  return where_.count(std::string(name)) > 0;
}

const SafetensorsFile* Checkpoint::FileOf(absl::string_view name) const {
  auto it = where_.find(std::string(name));
  return it == where_.end() ? nullptr : it->second.file;
}

absl::StatusOr<TensorView> Checkpoint::Get(absl::string_view name) const {
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
