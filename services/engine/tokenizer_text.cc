#include "services/engine/tokenizer_text.h"

#include <array>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace moe::tok {

Utf8Char DecodeUtf8(std::string_view s, size_t pos) {
  const auto b0 = static_cast<uint8_t>(s[pos]);
  if (b0 < 0x80) return {b0, 1, Utf8State::kValid};
  int need;
  uint32_t cp;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1, cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2, cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;  // no overlong forms
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3, cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;  // <= U+10FFFF
  } else {
    return {kInvalidCodepoint, 1, Utf8State::kInvalid};
  }
  for (int i = 1; i <= need; ++i) {
    if (pos + i >= s.size()) return {kInvalidCodepoint, 1, Utf8State::kTruncated};
    const auto b = static_cast<uint8_t>(s[pos + i]);
    const uint8_t l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
    if (b < l || b > h) return {kInvalidCodepoint, 1, Utf8State::kInvalid};
    cp = (cp << 6) | (b & 0x3F);
  }
  return {cp, need + 1, Utf8State::kValid};
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t CompleteUtf8Prefix(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    const Utf8Char c = DecodeUtf8(s, pos);
    if (c.state == Utf8State::kTruncated) break;
    pos += c.len;
  }
  return pos;
}

std::string ToValidUtf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) {
    const Utf8Char c = DecodeUtf8(s, pos);
    if (c.state == Utf8State::kValid) {
      out.append(s.substr(pos, c.len));
    } else {
      out.append("\xEF\xBF\xBD");  // U+FFFD
    }
    pos += c.len;
  }
  return out;
}

absl::StatusOr<SplitPattern> SplitPatternFromRegex(std::string_view regex) {
  static constexpr std::string_view kGpt2 =
      R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
  static constexpr std::string_view kQwen2 =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  static constexpr std::string_view kLlama3 =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  if (regex == kGpt2) return SplitPattern::kGpt2;
  if (regex == kQwen2) return SplitPattern::kQwen2;
  if (regex == kLlama3) return SplitPattern::kLlama3;
  return absl::UnimplementedError(
      absl::StrCat("unsupported pre-tokenizer split regex: ", std::string(regex)));
}

namespace {

// The text decoded once into characters, with byte offsets, so that the
// matchers below can look ahead freely.
struct Chars {
  std::vector<uint32_t> cp;
  std::vector<size_t> offset;  // offset[i]: byte offset of char i; size()+1 entries
};

Chars ToChars(std::string_view text) {
  Chars c;
  size_t pos = 0;
  while (pos < text.size()) {
    const Utf8Char u = DecodeUtf8(text, pos);
    c.cp.push_back(u.cp);
    c.offset.push_back(pos);
    pos += u.len;
  }
  c.offset.push_back(text.size());
  return c;
}

bool IsL(uint32_t cp) { return cp != kInvalidCodepoint && IsLetter(cp); }
bool IsN(uint32_t cp) { return cp != kInvalidCodepoint && IsNumber(cp); }
bool IsS(uint32_t cp) { return cp != kInvalidCodepoint && IsWhitespace(cp); }
bool IsOther(uint32_t cp) { return !IsS(cp) && !IsL(cp) && !IsN(cp); }  // [^\s\p{L}\p{N}]
bool IsCrLf(uint32_t cp) { return cp == '\r' || cp == '\n'; }

uint32_t Lower(uint32_t cp) { return (cp >= 'A' && cp <= 'Z') ? cp + 32 : cp; }

// Each matcher returns the length (in chars) of its alternative's match at
// `i`, or 0 when that alternative does not match. Backtracking is resolved by
// hand, as commented.
class Matcher {
 public:
  explicit Matcher(const std::vector<uint32_t>& cp) : cp_(cp), n_(cp.size()) {}

  uint32_t At(size_t i) const { return i < n_ ? cp_[i] : kInvalidCodepoint - 1; }
  bool Has(size_t i) const { return i < n_; }

  size_t Run(size_t i, bool (*pred)(uint32_t)) const {
    size_t j = i;
    while (j < n_ && pred(cp_[j])) ++j;
    return j - i;
  }

  // 's|'t|'re|'ve|'m|'ll|'d, optionally case-insensitive.
  size_t Contraction(size_t i, bool ignore_case) const {
    if (!Has(i + 1) || At(i) != '\'') return 0;
    auto c = [&](size_t k) { return ignore_case ? Lower(At(k)) : At(k); };
    const uint32_t a = c(i + 1);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if (!Has(i + 2)) return 0;
    const uint32_t b = c(i + 2);
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
  }

  // " ?X+" where X is `pred`: with the space only when X follows it.
  size_t SpaceThenRun(size_t i, bool (*pred)(uint32_t)) const {
    if (!Has(i)) return 0;
    if (At(i) == ' ' && Has(i + 1) && pred(At(i + 1))) return 1 + Run(i + 1, pred);
    return Run(i, pred);
  }

  // [^\r\n\p{L}\p{N}]?\p{L}+
  size_t PrefixedLetters(size_t i) const {
    if (!Has(i)) return 0;
    const uint32_t c = At(i);
    if (!IsCrLf(c) && !IsL(c) && !IsN(c) && Has(i + 1) && IsL(At(i + 1))) {
      return 1 + Run(i + 1, IsL);
    }
    return Run(i, IsL);
  }

  // \p{N}{1,max}
  size_t Digits(size_t i, size_t max) const {
    size_t r = Run(i, IsN);
    return r < max ? r : max;
  }

  //  ?[^\s\p{L}\p{N}]+[\r\n]*
  size_t PunctThenNewlines(size_t i) const {
    const size_t p = SpaceThenRun(i, IsOther);
    if (p == 0) return 0;
    return p + Run(i + p, IsCrLf);
  }

  // \s*[\r\n]+ : greedy \s* gives back until [\r\n] can match, so the match
  // ends just after the last CR/LF inside the whitespace run at i.
  size_t SpacesThenNewlines(size_t i) const {
    const size_t r = Run(i, IsS);
    for (size_t k = r; k > 0; --k) {
      if (IsCrLf(At(i + k - 1))) return k;
    }
    return 0;
  }

  // \s+(?!\S) : the whole run at the end of text, else the run less its last
  // space (so that the next char is a space). Then \s+ as the last resort.
  size_t TrailingSpaces(size_t i) const {
    const size_t r = Run(i, IsS);
    if (r == 0) return 0;
    if (i + r == n_) return r;
    return r - 1;
  }

 private:
  const std::vector<uint32_t>& cp_;
  size_t n_;
};

size_t MatchAt(const Matcher& m, size_t i, SplitPattern p) {
  size_t len;
  if (p == SplitPattern::kGpt2) {
    if ((len = m.Contraction(i, false))) return len;
    if ((len = m.SpaceThenRun(i, IsL))) return len;
    if ((len = m.SpaceThenRun(i, IsN))) return len;
    if ((len = m.SpaceThenRun(i, IsOther))) return len;
  } else {
    if ((len = m.Contraction(i, true))) return len;
    if ((len = m.PrefixedLetters(i))) return len;
    if ((len = m.Digits(i, p == SplitPattern::kQwen2 ? 1 : 3))) return len;
    if ((len = m.PunctThenNewlines(i))) return len;
    if ((len = m.SpacesThenNewlines(i))) return len;
  }
  if ((len = m.TrailingSpaces(i))) return len;
  if ((len = m.Run(i, IsS))) return len;
  return 1;  // unreachable for these patterns: every char is in some class
}

}  // namespace

std::vector<std::string_view> SplitText(std::string_view text, SplitPattern pattern) {
  const Chars chars = ToChars(text);
  const Matcher m(chars.cp);
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < chars.cp.size()) {
    const size_t len = MatchAt(m, i, pattern);
    out.push_back(text.substr(chars.offset[i], chars.offset[i + len] - chars.offset[i]));
    i += len;
  }
  return out;
}

namespace {

struct ByteTables {
  std::array<uint32_t, 256> to_cp;
  std::array<int16_t, 512> from_cp;  // code point -> byte, -1 if none
};

const ByteTables& Tables() {
  static const ByteTables* t = [] {
    auto* t = new ByteTables();
    t->from_cp.fill(-1);
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) ||
                             (b >= 0xAE && b <= 0xFF);
      t->to_cp[b] = printable ? static_cast<uint32_t>(b) : next++;
      t->from_cp[t->to_cp[b]] = static_cast<int16_t>(b);
    }
    return t;
  }();
  return *t;
}

}  // namespace

uint32_t ByteToUnicode(uint8_t b) { return Tables().to_cp[b]; }

std::string BytesToByteLevel(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) AppendUtf8(Tables().to_cp[static_cast<uint8_t>(c)], &out);
  return out;
}

std::string ByteLevelToBytes(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    const Utf8Char c = DecodeUtf8(text, pos);
    if (c.state == Utf8State::kValid && c.cp < 512 && Tables().from_cp[c.cp] >= 0) {
      out.push_back(static_cast<char>(Tables().from_cp[c.cp]));
    } else {
      out.append(text.substr(pos, c.len));
    }
    pos += c.len;
  }
  return out;
}

}  // namespace moe::tok
