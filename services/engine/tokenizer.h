// Hugging Face `tokenizer.json` BPE tokenizers: the byte-level kind (GPT-2
// byte mapping, ByteLevel / Split pre-tokenizers; Qwen, OLMoE) and the
// SentencePiece kind (`▁` for spaces, `<0xNN>` byte fallback; Mixtral,
// Llama). Only the `BPE` model type is supported. GGUF vocabularies: see
// FromGguf (the "llama" kind is merged by piece scores, not merge ranks).
//
//   ASSIGN_OR_RETURN(auto tok, Tokenizer::FromFile(dir + "/tokenizer.json"));
//   std::vector<int32_t> ids = tok->Encode("Hello world", /*add_special=*/true);
//   std::string text = tok->Decode(ids, /*skip_special=*/true);
//
// Semantics follow the `tokenizers` library: added tokens are matched in the
// raw text first (longest match, leftmost) and never split; the text between
// them is normalized, pre-tokenized and BPE-merged by merge rank (leftmost
// first among equal ranks). Known simplifications, each documented where it
// matters: the NFC normalizer is treated as the identity (input is assumed
// NFC already), added tokens are matched before normalization whatever their
// `normalized` flag, and `single_word` is ignored.
//
// Decode returns the exact bytes the tokens stand for, which need not be
// valid UTF-8 (a byte-fallback or byte-level token may hold part of a
// character). Use StreamDecoder or tok::ToValidUtf8 for display text.
//
// Thread-safety: a Tokenizer is immutable after creation; all const methods
// may be called concurrently. A StreamDecoder is not thread-safe.
#ifndef MOECACHE_SERVICES_ENGINE_TOKENIZER_H_
#define MOECACHE_SERVICES_ENGINE_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace moe {

class GgufMetadata;

namespace tok {
struct TokenizerSpec;  // parsed tokenizer.json (tokenizer_spec.h)
}  // namespace tok

class Tokenizer {
 public:
  enum class Kind { kByteLevel, kSentencePiece };

  // Reads a tokenizer.json. When a tokenizer_config.json sits beside it, its
  // `bos_token` / `eos_token` name bos_id() / eos_id().
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromFile(const std::string& path);
  // INVALID_ARGUMENT for malformed JSON or merges naming unknown tokens;
  // UNIMPLEMENTED for model types other than BPE and unknown components.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJson(std::string_view json);
  // The vocabulary of a GGUF file (llama.cpp's tokenizer.ggml.* keys):
  // - model "gpt2": byte-level BPE with merges and the pre-tokenizer that
  //   tokenizer.ggml.pre names ("default"/"gpt-2", "qwen2", "llama-bpe");
  //   a leading bos only when tokenizer.ggml.add_bos_token says so.
  // - model "llama": SentencePiece pieces with tokenizer.ggml.scores, encoded
  //   as llama.cpp's SPM tokenizer does (spaces as "▁", a "▁" before the
  //   text when tokenizer.ggml.add_space_prefix, default true; highest-score
  //   merges, leftmost first on ties; "<0xNN>" byte fallback, else one
  //   unknown token per character). Unlike llama.cpp, the prefix is not
  //   repeated after each special token (as Metaspace's "first" scheme).
  //   llama.cpp's defaults: unknown/bos/eos ids 0/1/2, add_bos_token true,
  //   add_eos_token false. Decode drops the prefix space of the first token
  //   and renders byte tokens as their bytes. The unknown token (type 2) is
  //   a special added token too, as in a tokenizer.json.
  // Both: token_type 3 (control) tokens are special added tokens, 4 (user
  // defined) plain added ones, matched whole in the text; bos/eos from
  // tokenizer.ggml.{bos,eos}_token_id. NOT_FOUND when the file has no (or a "none")
  // vocabulary; INVALID_ARGUMENT for arrays of different lengths or
  // bos/eos/unknown ids outside the vocabulary; UNIMPLEMENTED naming
  // another model or pre.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromGguf(const GgufMetadata& metadata);
  // The tokenizer of a model path: `path`/tokenizer.json, or a `.gguf`
  // file's vocabulary. NOT_FOUND when there is none.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> ForModel(const std::string& path);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Any byte string is accepted (invalid UTF-8 too). With `add_special` the
  // post-processor's template (e.g. a leading <s>) is applied.
  std::vector<int32_t> Encode(std::string_view text, bool add_special = false) const;
  // Ids outside the vocabulary are skipped; with `skip_special`, so are added
  // tokens marked `special`.
  std::string Decode(absl::Span<const int32_t> ids, bool skip_special = false) const;

  // The token's string as stored in tokenizer.json; empty for unknown ids.
  std::string_view TokenText(int32_t id) const;
  std::optional<int32_t> IdOf(std::string_view token) const;
  bool IsSpecial(int32_t id) const;
  // One past the largest id of the vocabulary and the added tokens.
  int32_t vocab_size() const;
  Kind kind() const;

  std::optional<int32_t> bos_id() const { return bos_id_; }
  std::optional<int32_t> eos_id() const { return eos_id_; }

 private:
  explicit Tokenizer(std::unique_ptr<tok::TokenizerSpec> spec);

  std::unique_ptr<tok::TokenizerSpec> spec_;
  std::optional<int32_t> bos_id_;
  std::optional<int32_t> eos_id_;
};

// Incremental detokenizer for streaming: Push() returns only text made of
// complete UTF-8 characters, holding back a trailing partial character until
// later tokens complete it. Bytes that can never form a valid character are
// emitted as U+FFFD. The concatenation of all Push() results and Flush()
// equals tok::ToValidUtf8(tokenizer.Decode(all ids, skip_special)).
class StreamDecoder {
 public:
  // `tokenizer` must outlive this object.
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special = false);

  std::string Push(int32_t id);
  // Emits whatever is still held back (a truncated character as U+FFFD).
  std::string Flush();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  // A window of the latest tokens: those not yet fully emitted, preceded by
  // context tokens so that decoders which strip a leading space see the same
  // left context as a decode of the whole sequence.
  std::vector<int32_t> ids_;
  size_t emitted_bytes_ = 0;  // bytes of Decode(ids_) already emitted
};

}  // namespace moe

#endif  // MOECACHE_SERVICES_ENGINE_TOKENIZER_H_
