// A small byte-level BPE tokenizer, trained deterministically on a built-in
// English text and written as a Hugging Face `tokenizer.json` (the GPT-2 /
// Qwen layout: model.type "BPE" over the GPT-2 byte-to-unicode alphabet,
// ByteLevel pre-tokenizer and decoder, special tokens in `added_tokens`).
// Used by MakeModel so that tiny test models come with a real tokenizer.
#ifndef MOECACHE_COMMON_TINY_TOKENIZER_H_
#define MOECACHE_COMMON_TINY_TOKENIZER_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace moe {

// The GPT-2 byte-to-unicode map: byte `b` as the UTF-8 of its printable
// stand-in character (e.g. ' ' -> "Ġ", '\n' -> "Ċ", 'a' -> "a").
std::string ByteToUnicode(uint8_t b);

// The 256 bytes in GPT-2 vocabulary order (printable ranges first); token id
// i < 256 is byte ByteOrder()[i].
const std::vector<uint8_t>& ByteOrder();

// The training text (a few KB of plain English).
absl::string_view BuiltinTrainingText();

// Splits text like GPT-2's pre-tokenizer regex does for ASCII: contractions,
// " ?letters", " ?digits", " ?punctuation", whitespace runs.
std::vector<std::string> PreTokenize(absl::string_view text);

struct TinyTokenizer {
  std::string json;  // tokenizer.json contents
  // Ids 0..255 are bytes, then merges, then the special tokens.
  int32_t num_tokens = 0;
  int32_t num_merges = 0;
  std::vector<std::pair<std::string, int32_t>> special_tokens;  // in order
};

// Learns merges on `text` (most frequent adjacent pair first; ties go to the
// lowest (left id, right id)) until the vocabulary plus `specials` reaches
// `max_vocab`, or no pair occurs twice. INVALID_ARGUMENT when max_vocab
// cannot hold the 256 byte tokens and the specials.
absl::StatusOr<TinyTokenizer> MakeTinyTokenizer(
    int32_t max_vocab, const std::vector<std::string>& specials,
    absl::string_view text = BuiltinTrainingText());

}  // namespace moe

#endif  // MOECACHE_COMMON_TINY_TOKENIZER_H_
