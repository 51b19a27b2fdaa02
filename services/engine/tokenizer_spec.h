// Internal: the parsed form of a tokenizer.json and the BPE model. Shared by
// tokenizer_json.cc (parsing), tokenizer_bpe.cc, tokenizer_spm.cc and
// tokenizer.cc.
#ifndef MOECACHE_SERVICES_ENGINE_TOKENIZER_SPEC_H_
#define MOECACHE_SERVICES_ENGINE_TOKENIZER_SPEC_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "services/engine/tokenizer.h"
#include "services/engine/tokenizer_text.h"

namespace moe::tok {

class SpmModel;  // tokenizer_spm.h

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;
  bool lstrip = false;  // absorbs whitespace on its left
  bool rstrip = false;  // absorbs whitespace on its right
};

// Normalizers we apply; NFC is accepted and treated as the identity.
struct NormStep {
  enum Kind { kPrepend, kReplace } kind;
  std::string from;  // kReplace: literal pattern
  std::string to;    // kPrepend: prefix; kReplace: replacement
};

enum class PrependScheme { kAlways, kFirst, kNever };

struct PreStep {
  enum Kind { kByteLevel, kSplit, kMetaspace } kind;
  bool add_prefix_space = false;  // kByteLevel
  bool use_regex = true;          // kByteLevel: split with the GPT-2 pattern
  SplitPattern pattern = SplitPattern::kGpt2;  // kSplit
  std::string replacement;        // kMetaspace, usually "▁"
  PrependScheme prepend = PrependScheme::kAlways;  // kMetaspace
  bool split = true;              // kMetaspace: split before each replacement
};

struct DecStep {
  enum Kind { kByteLevel, kReplace, kByteFallback, kFuse, kStrip, kMetaspace } kind;
  std::string from, to;  // kReplace; kMetaspace: from = replacement
  std::string content;   // kStrip: the character stripped
  int start = 0, stop = 0;  // kStrip
  PrependScheme prepend = PrependScheme::kAlways;  // kMetaspace
};

// The BPE model: vocabulary and merge table.
class BpeModel {
 public:
  // `merges` are (left, right) token strings in rank order. INVALID_ARGUMENT
  // when a merge names a token (or a merged result) not in the vocabulary.
  static absl::StatusOr<BpeModel> Build(
      std::unordered_map<std::string, int32_t> vocab,
      const std::vector<std::pair<std::string, std::string>>& merges);

  // Appends the ids of one pre-tokenized word.
  void EncodeWord(std::string_view word, std::vector<int32_t>* out) const;

  const std::unordered_map<std::string, int32_t>& vocab() const { return vocab_; }

  std::optional<int32_t> unk_id;
  bool byte_fallback = false;
  bool fuse_unk = false;
  bool ignore_merges = false;

 private:
  struct Merge {
    int32_t rank;
    int32_t result;
  };
  static uint64_t Key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  void InitialSymbols(std::string_view word, std::vector<int32_t>* symbols) const;

  std::unordered_map<std::string, int32_t> vocab_;
  std::unordered_map<uint64_t, Merge> merges_;
  int32_t byte_ids_[256];  // id of "<0xNN>", -1 if absent
};

struct TokenizerSpec {
  BpeModel bpe;
  Tokenizer::Kind kind = Tokenizer::Kind::kByteLevel;
  std::vector<std::string> id_to_token;  // model vocab and added tokens
  std::vector<AddedToken> added;         // longest content first
  // For each first byte, indices into `added` (longest first).
  std::vector<std::vector<int>> added_by_first_byte;
  std::unordered_map<int32_t, bool> added_special;  // id -> special
  std::vector<NormStep> normalizers;
  std::vector<PreStep> pre_tokenizers;
  bool has_decoder = false;
  std::vector<DecStep> decoders;
  // Post-processor template for a single sequence: ids to insert, and where
  // the sequence goes (-1 in the list). Empty: no template.
  std::vector<int32_t> single_template;
  std::optional<int32_t> template_bos;  // first item of the template, if special
  // Set for a GGUF "llama" vocabulary: it encodes the text between added
  // tokens and decodes in place of the normalizers, pre-tokenizers, BPE
  // and decoders above (`bpe` then holds the vocabulary only, for lookups).
  std::shared_ptr<const SpmModel> spm;
};

absl::StatusOr<std::unique_ptr<TokenizerSpec>> ParseTokenizerJson(std::string_view json);

// Orders `spec->added` longest content first and fills added_by_first_byte.
// REQUIRES: no added token has empty content.
void IndexAddedTokens(TokenizerSpec* spec);

}  // namespace moe::tok

#endif  // MOECACHE_SERVICES_ENGINE_TOKENIZER_SPEC_H_
