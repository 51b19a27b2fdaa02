// The SentencePiece-style GGUF vocabulary (tokenizer.ggml.model "llama"), as
// llama.cpp's SPM tokenizer (llm_tokenizer_spm) encodes it: spaces become
// "▁", the text is cut into UTF-8 characters, and the adjacent pair whose
// concatenation is a vocabulary piece of the highest score is merged until
// none is left (leftmost first among equal scores); a character that is no
// piece falls back to its "<0xNN>" byte tokens.
#include "services/engine/tokenizer_spm.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <queue>
#include <unordered_map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/gguf_metadata.h"
#include "common/status_macros.h"
#include "services/engine/tokenizer_spec.h"
#include "services/engine/tokenizer_text.h"

namespace moe::tok {
namespace {

constexpr char kSpace[] = "\xE2\x96\x81";  // U+2581, SentencePiece's space
// Real vocabularies have at most a few hundred thousand tokens (as
// tokenizer_json.cc's limit on ids).
constexpr size_t kMaxTokens = size_t{1} << 24;

// The byte of a "<0xNN>" piece (llama.cpp writes upper-case hex), else -1.
int ParseBytePiece(std::string_view text) {
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return -1;
  const int hi = hex(text[3]), lo = hex(text[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

bool IsMarker(SpmTokenType t) {  // rendered and matched as written
  return t == SpmTokenType::kControl || t == SpmTokenType::kUnknown ||
         t == SpmTokenType::kUserDefined;
}

}  // namespace

SpmModel::SpmModel(std::vector<Piece> pieces, std::optional<int32_t> unk_id,
                   bool add_space_prefix)
    : pieces_(std::move(pieces)), unk_id_(unk_id), add_space_prefix_(add_space_prefix) {
  by_text_.reserve(pieces_.size());
  for (size_t id = 0; id < pieces_.size(); ++id) {
    by_text_.try_emplace(pieces_[id].text, static_cast<int32_t>(id));
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    const std::optional<int32_t> id = Find(name);
    byte_ids_[b] = id.has_value() ? *id : -1;
  }
}

std::optional<int32_t> SpmModel::Find(std::string_view text) const {
  auto it = by_text_.find(absl::string_view(text.data(), text.size()));
  if (it == by_text_.end()) return std::nullopt;
  return it->second;
}

// A character that is no piece: its byte tokens, else (as the BPE path's
// byte fallback) one unknown token for the whole character, else nothing.
void SpmModel::Fallback(std::string_view symbol, std::vector<int32_t>* out) const {
  bool all = true;
  for (char b : symbol) all = all && byte_ids_[static_cast<uint8_t>(b)] >= 0;
  if (all) {
    for (char b : symbol) out->push_back(byte_ids_[static_cast<uint8_t>(b)]);
  } else if (unk_id_.has_value()) {
    out->push_back(*unk_id_);
  }
}

void SpmModel::Encode(std::string_view text, bool first, std::vector<int32_t>* out) const {
  std::string s;
  if (add_space_prefix_ && first) s = kSpace;
  s += absl::StrReplaceAll(absl::string_view(text.data(), text.size()), {{" ", kSpace}});
  if (s.empty()) return;
  // Symbols are a linked list of adjacent byte ranges of `s`, one per
  // character at first (an invalid UTF-8 byte is a character of its own).
  struct Symbol {
    size_t start, len;
    int prev, next;
  };
  std::vector<Symbol> sym;
  for (size_t pos = 0; pos < s.size();) {
    const size_t len = static_cast<size_t>(DecodeUtf8(s, pos).len);
    const int k = static_cast<int>(sym.size());
    sym.push_back({pos, len, k - 1, -1});
    if (k > 0) sym[k - 1].next = k;
    pos += len;
  }
  struct Bigram {
    float score;
    int left;    // symbol index, which grows with the position in `s`
    size_t len;  // bytes of the merged text, to recognise a stale entry
  };
  auto lower = [](const Bigram& a, const Bigram& b) {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  };
  std::priority_queue<Bigram, std::vector<Bigram>, decltype(lower)> heap(lower);
  auto consider = [&](int l) {
    if (l < 0 || sym[l].next < 0) return;
    const std::string_view merged =
        std::string_view(s).substr(sym[l].start, sym[l].len + sym[sym[l].next].len);
    if (const std::optional<int32_t> id = Find(merged)) {
      heap.push({pieces_[*id].score, l, merged.size()});
    }
  };
  for (int i = 0; i + 1 < static_cast<int>(sym.size()); ++i) consider(i);
  while (!heap.empty()) {
    const Bigram b = heap.top();
    heap.pop();
    Symbol& left = sym[b.left];
    if (left.len == 0 || left.next < 0) continue;
    Symbol& right = sym[left.next];
    // An entry whose symbols changed since: its length no longer matches
    // (same start and length would be the same text, so still valid).
    if (left.len + right.len != b.len) continue;
    left.len += right.len;
    right.len = 0;
    left.next = right.next;
    if (left.next >= 0) sym[left.next].prev = b.left;
    consider(left.prev);
    consider(b.left);
  }
  for (int i = 0; i >= 0; i = sym[i].next) {
    const std::string_view piece = std::string_view(s).substr(sym[i].start, sym[i].len);
    if (const std::optional<int32_t> id = Find(piece)) {
      out->push_back(*id);
    } else {
      Fallback(piece, out);  // merged symbols are pieces: this is one character
    }
  }
}

std::string SpmModel::Decode(absl::Span<const int32_t> ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    const Piece& p = pieces_[ids[i]];
    if (p.byte >= 0) {
      out.push_back(static_cast<char>(p.byte));
    } else if (IsMarker(p.type)) {
      out.append(p.text);
    } else {
      std::string t = absl::StrReplaceAll(p.text, {{kSpace, " "}});
      // The space that Encode prepended to the text.
      if (i == 0 && add_space_prefix_ && !t.empty() && t[0] == ' ') t.erase(0, 1);
      out.append(t);
    }
  }
  return out;
}

namespace {

// A special token id: the key's value, else llama.cpp's default when the
// vocabulary has it. INVALID_ARGUMENT for an id outside the vocabulary.
absl::StatusOr<std::optional<int32_t>> TokenId(const GgufMetadata& m, const char* key,
                                               std::optional<int32_t> dflt, size_t n) {
  if (!m.Has(key)) {
    if (dflt.has_value() && static_cast<size_t>(*dflt) < n) return dflt;
    return std::nullopt;
  }
  ASSIGN_OR_RETURN(int64_t id, m.GetInt(key));
  if (id < 0 || static_cast<uint64_t>(id) >= n) {
    return absl::InvalidArgumentError(
        absl::StrCat(key, " is ", id, ", outside the ", n, " tokens"));
  }
  return static_cast<int32_t>(id);
}

absl::StatusOr<bool> BoolOr(const GgufMetadata& m, const char* key, bool dflt) {
  if (!m.Has(key)) return dflt;
  return m.GetBool(key);
}

absl::StatusOr<std::vector<SpmModel::Piece>> ReadPieces(const GgufMetadata& m) {
  ASSIGN_OR_RETURN(std::vector<absl::string_view> tokens,
                   m.GetStringArray("tokenizer.ggml.tokens"));
  if (tokens.empty() || tokens.size() > kMaxTokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokenizer.ggml.tokens has ", tokens.size(), " tokens (expected 1 to ", kMaxTokens, ")"));
  }
  std::vector<double> scores;
  if (m.Has("tokenizer.ggml.scores")) {
    ASSIGN_OR_RETURN(scores, m.GetFloatArray("tokenizer.ggml.scores"));
    if (scores.size() != tokens.size()) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer.ggml.scores has ", scores.size(),
                                                     " entries for ", tokens.size(), " tokens"));
    }
  }
  std::vector<int64_t> types;
  if (m.Has("tokenizer.ggml.token_type")) {
    ASSIGN_OR_RETURN(types, m.GetIntArray("tokenizer.ggml.token_type"));
    if (types.size() != tokens.size()) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer.ggml.token_type has ",
                                                     types.size(), " entries for ",
                                                     tokens.size(), " tokens"));
    }
  }
  std::vector<SpmModel::Piece> pieces(tokens.size());
  for (size_t id = 0; id < tokens.size(); ++id) {
    SpmModel::Piece& p = pieces[id];
    p.text = std::string(tokens[id]);
    if (!scores.empty()) {
      if (std::isnan(scores[id])) {
        return absl::InvalidArgumentError(
            absl::StrCat("tokenizer.ggml.scores[", id, "] is not a number"));
      }
      // A FLOAT64 array may hold values beyond float: saturate them.
      constexpr double kMax = std::numeric_limits<float>::max();
      p.score = scores[id] > kMax    ? std::numeric_limits<float>::infinity()
                : scores[id] < -kMax ? -std::numeric_limits<float>::infinity()
                                     : static_cast<float>(scores[id]);
    }
    // Types llama.cpp does not name (0 is "undefined") read as normal.
    const int64_t type = types.empty() ? 1 : types[id];
    p.type = type >= 1 && type <= 6 ? static_cast<SpmTokenType>(type) : SpmTokenType::kNormal;
    if (!IsMarker(p.type)) p.byte = static_cast<int16_t>(ParseBytePiece(p.text));
  }
  return pieces;
}

}  // namespace

absl::StatusOr<GgufSpmVocab> SpmVocabFromGguf(const GgufMetadata& m) {
  ASSIGN_OR_RETURN(std::vector<SpmModel::Piece> pieces, ReadPieces(m));
  const size_t n = pieces.size();
  // llama.cpp's defaults for this model: <unk> 0, <s> 1, </s> 2, a leading
  // <s>, no trailing </s>, a space before the text.
  GgufSpmVocab v;
  ASSIGN_OR_RETURN(const std::optional<int32_t> unk,
                   TokenId(m, "tokenizer.ggml.unknown_token_id", 0, n));
  ASSIGN_OR_RETURN(v.bos_id, TokenId(m, "tokenizer.ggml.bos_token_id", 1, n));
  ASSIGN_OR_RETURN(v.eos_id, TokenId(m, "tokenizer.ggml.eos_token_id", 2, n));
  if (m.Has("tokenizer.ggml.padding_token_id")) {
    // Nothing here pads; the key must still be an integer. llama.cpp
    // tolerates a padding id outside the vocabulary, and so do we.
    RETURN_IF_ERROR(m.GetInt("tokenizer.ggml.padding_token_id").status());
  }
  ASSIGN_OR_RETURN(const bool add_bos, BoolOr(m, "tokenizer.ggml.add_bos_token", true));
  ASSIGN_OR_RETURN(const bool add_eos, BoolOr(m, "tokenizer.ggml.add_eos_token", false));
  ASSIGN_OR_RETURN(const bool add_space_prefix,
                   BoolOr(m, "tokenizer.ggml.add_space_prefix", true));

  auto spec = std::make_unique<TokenizerSpec>();
  spec->kind = Tokenizer::Kind::kSentencePiece;
  std::unordered_map<std::string, int32_t> vocab;
  spec->id_to_token.reserve(n);
  for (size_t id = 0; id < n; ++id) {
    const SpmModel::Piece& p = pieces[id];
    spec->id_to_token.push_back(p.text);
    vocab.try_emplace(p.text, static_cast<int32_t>(id));
    // As the gpt2 path: control tokens (and the unknown one, as a
    // tokenizer.json has it) are special added tokens, user-defined ones
    // plain added tokens; all are matched whole in the text.
    if (IsMarker(p.type) && !p.text.empty()) {
      AddedToken a;
      a.id = static_cast<int32_t>(id);
      a.content = p.text;
      a.special = p.type != SpmTokenType::kUserDefined;
      spec->added_special[a.id] = a.special;
      spec->added.push_back(std::move(a));
    }
  }
  IndexAddedTokens(spec.get());
  ASSIGN_OR_RETURN(spec->bpe, BpeModel::Build(std::move(vocab), {}));
  spec->bpe.unk_id = unk;
  if (add_bos && v.bos_id.has_value()) {
    spec->single_template.push_back(*v.bos_id);
    spec->template_bos = v.bos_id;
  }
  if (add_eos && v.eos_id.has_value()) {
    spec->single_template.push_back(-1);
    spec->single_template.push_back(*v.eos_id);
  } else if (!spec->single_template.empty()) {
    spec->single_template.push_back(-1);
  }
  spec->spm = std::make_shared<const SpmModel>(std::move(pieces), unk, add_space_prefix);
  v.spec = std::move(spec);
  return v;
}

}  // namespace moe::tok
