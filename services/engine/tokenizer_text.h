// Internal text helpers of the tokenizer: UTF-8 decoding, Unicode classes,
// the hand-written pre-tokenizer split patterns, and the GPT-2 byte<->unicode
// mapping. Not a public API; used by tokenizer.cc and its tests.
#ifndef MOECACHE_SERVICES_ENGINE_TOKENIZER_TEXT_H_
#define MOECACHE_SERVICES_ENGINE_TOKENIZER_TEXT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace moe::tok {

bool IsLetter(uint32_t cp);      // \p{L}
bool IsNumber(uint32_t cp);      // \p{N}
bool IsWhitespace(uint32_t cp);  // \s (Unicode White_Space)

// Marks a byte that does not start a valid UTF-8 sequence. Such a byte is one
// "character" of its own, in no class (neither letter, number nor space).
inline constexpr uint32_t kInvalidCodepoint = 0xFFFFFFFFu;

enum class Utf8State { kValid, kInvalid, kTruncated };

struct Utf8Char {
  uint32_t cp;     // kInvalidCodepoint unless state == kValid
  int len;         // bytes consumed: the sequence, or 1 for an invalid byte
  Utf8State state; // kTruncated: a valid prefix cut off by the end of `s`
};

// Decodes the character at s[pos] (REQUIRES: pos < s.size()). Strict: rejects
// overlong forms, surrogates and values above U+10FFFF.
Utf8Char DecodeUtf8(std::string_view s, size_t pos);
void AppendUtf8(uint32_t cp, std::string* out);

// Length of the longest prefix of `s` that holds no truncated sequence at its
// end: what can be emitted now without cutting a character that later bytes
// could still complete.
size_t CompleteUtf8Prefix(std::string_view s);
// Replaces every byte that is not part of a valid sequence with U+FFFD.
std::string ToValidUtf8(std::string_view s);

// The split regexes of the pre-tokenizers we know, implemented by hand.
enum class SplitPattern {
  kGpt2,    // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  kQwen2,   // (?i:'s|...|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  kLlama3,  // as kQwen2 with \p{N}{1,3}
};
// Recognises a Split pre-tokenizer's regex; UNIMPLEMENTED for any other.
absl::StatusOr<SplitPattern> SplitPatternFromRegex(std::string_view regex);
// Cuts `text` into the consecutive matches of `pattern` (they cover it all).
std::vector<std::string_view> SplitText(std::string_view text, SplitPattern pattern);

// GPT-2's reversible byte -> printable code point table.
uint32_t ByteToUnicode(uint8_t b);
// Maps every byte to its printable character (UTF-8 encoded).
std::string BytesToByteLevel(std::string_view bytes);
// Inverse of BytesToByteLevel. Characters outside the table are copied as
// they are (added tokens such as "<|im_end|>" are plain text).
std::string ByteLevelToBytes(std::string_view text);

}  // namespace moe::tok

#endif  // MOECACHE_SERVICES_ENGINE_TOKENIZER_TEXT_H_
