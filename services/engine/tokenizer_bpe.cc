// BPE merging by rank, as in the `tokenizers` library: repeatedly merge the
// adjacent pair of lowest rank, leftmost first among equal ranks.
#include <cstdio>
#include <queue>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "services/engine/tokenizer_spec.h"

namespace moe::tok {

absl::StatusOr<BpeModel> BpeModel::Build(
    std::unordered_map<std::string, int32_t> vocab,
    const std::vector<std::pair<std::string, std::string>>& merges) {
  BpeModel m;
  m.vocab_ = std::move(vocab);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    auto it = m.vocab_.find(name);
    m.byte_ids_[b] = it == m.vocab_.end() ? -1 : it->second;
  }
  m.merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    auto ia = m.vocab_.find(a), ib = m.vocab_.find(b), ir = m.vocab_.find(a + b);
    if (ia == m.vocab_.end() || ib == m.vocab_.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "merge ", rank, " (\"", a, "\" \"", b, "\") names a token not in the vocabulary"));
    }
    if (ir == m.vocab_.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "merge ", rank, " (\"", a, "\" \"", b, "\"): result \"", a + b,
          "\" is not in the vocabulary"));
    }
    // A repeated merge keeps its first (lowest) rank.
    m.merges_.try_emplace(Key(ia->second, ib->second),
                          Merge{static_cast<int32_t>(rank), ir->second});
  }
  return m;
}

void BpeModel::InitialSymbols(std::string_view word, std::vector<int32_t>* symbols) const {
  bool last_was_unk = false;
  size_t pos = 0;
  std::string ch;
  while (pos < word.size()) {
    const Utf8Char c = DecodeUtf8(word, pos);
    ch.assign(word.substr(pos, c.len));
    pos += c.len;
    if (auto it = vocab_.find(ch); it != vocab_.end()) {
      symbols->push_back(it->second);
      last_was_unk = false;
      continue;
    }
    if (byte_fallback) {
      bool all = true;
      for (char b : ch) all = all && byte_ids_[static_cast<uint8_t>(b)] >= 0;
      if (all) {
        for (char b : ch) symbols->push_back(byte_ids_[static_cast<uint8_t>(b)]);
        last_was_unk = false;
        continue;
      }
    }
    if (unk_id.has_value()) {
      if (!(fuse_unk && last_was_unk)) symbols->push_back(*unk_id);
      last_was_unk = true;
    }
    // Without an unknown token the character is dropped, as `tokenizers` does.
  }
}

void BpeModel::EncodeWord(std::string_view word, std::vector<int32_t>* out) const {
  if (word.empty()) return;
  if (ignore_merges) {
    if (auto it = vocab_.find(std::string(word)); it != vocab_.end()) {
      out->push_back(it->second);
      return;
    }
  }
  std::vector<int32_t> sym;
  InitialSymbols(word, &sym);
  const int n = static_cast<int>(sym.size());
  if (n < 2 || merges_.empty()) {
    out->insert(out->end(), sym.begin(), sym.end());
    return;
  }
  std::vector<int> prev(n), next(n);
  for (int i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  std::vector<bool> alive(n, true);
  struct Cand {
    int32_t rank;
    int pos;
    int32_t left, right;
  };
  auto later = [](const Cand& x, const Cand& y) {
    return x.rank != y.rank ? x.rank > y.rank : x.pos > y.pos;
  };
  std::priority_queue<Cand, std::vector<Cand>, decltype(later)> heap(later);
  auto consider = [&](int l) {
    if (l < 0 || next[l] < 0) return;
    auto it = merges_.find(Key(sym[l], sym[next[l]]));
    if (it != merges_.end()) heap.push({it->second.rank, l, sym[l], sym[next[l]]});
  };
  for (int i = 0; i + 1 < n; ++i) consider(i);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    if (!alive[c.pos] || sym[c.pos] != c.left) continue;
    const int r = next[c.pos];
    if (r < 0 || sym[r] != c.right) continue;
    sym[c.pos] = merges_.at(Key(c.left, c.right)).result;
    alive[r] = false;
    next[c.pos] = next[r];
    if (next[r] >= 0) prev[next[r]] = c.pos;
    consider(prev[c.pos]);
    consider(c.pos);
  }
  for (int i = 0; i >= 0; i = next[i]) out->push_back(sym[i]);
}

}  // namespace moe::tok
