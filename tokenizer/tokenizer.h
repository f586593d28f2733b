// Hugging Face `tokenizer.json` loader and BPE tokenizer.
//
// Supported: byte-level BPE as Llama-3, Qwen2 and Qwen3 ship it (model BPE
// with merges as "a b" strings or ["a", "b"] pairs, ignore_merges;
// normalizer null / NFC / Sequence[NFC]; pre-tokenizer Split(Regex|String,
// Isolated, invert false), Digits (each numeric character or each run of
// them its own piece, as SmolLM ships it) and ByteLevel (add_prefix_space
// false), alone or in a Sequence; decoder ByteLevel or null), and
// SentencePiece-style BPE as
// Llama 2 and Mistral ship it: BPE over characters with byte_fallback and
// fuse_unk, spaces as "▁" either by the normalizer Prepend("▁") +
// Replace(" ", "▁") with the decoder Replace("▁", " "), ByteFallback, Fuse,
// Strip(" ", n, 0), or by a Metaspace pre-tokenizer (split false,
// prepend_scheme always / first / never) with a Metaspace decoder. Added tokens (special or not) are matched inside the text as
// Hugging Face tokenizers does by default, honouring lstrip / rstrip /
// single_word / normalized. Anything else is refused with ErrorKind::kModel
// naming the unsupported type or option.
//
// Ids match Hugging Face tokenizers 0.23 (tests/test_tokenizer.cpp), including
// its NFC with Unicode 9.0 tables. The Split regex runs on PCRE2 10.42, whose
// \p{L}/\p{N} follow Unicode 14: letters and digits assigned later may split
// differently from HF's Oniguruma (and, for Digits, from Rust's
// char::is_numeric). A Tokenizer is immutable after load();
// encode/decode may be called from several threads at once.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/utf8.h"

namespace lockstep {

namespace tok_detail {
struct TokenizerImpl;
}

class Tokenizer {
 public:
  // Loads a tokenizer.json file (or, given a folder, the tokenizer.json in it).
  static Tokenizer load(const std::filesystem::path& tokenizer_json);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Ids of `text` (valid UTF-8), with no special tokens added; added and
  // special tokens written in the text are matched (HF's default).
  std::vector<int32_t> encode(std::string_view text) const;

  // `ids` with the special tokens the tokenizer's post-processor puts around
  // a single text (TemplateProcessing: Llama's BOS; none for ByteLevel or a
  // null post-processor), as Hugging Face's add_special_tokens=True does.
  std::vector<int32_t> with_special_tokens(const std::vector<int32_t>& ids) const;

  // Raw bytes of the tokens, concatenated (special tokens as their text),
  // less the leading spaces the decoder strips (SentencePiece-style: the one
  // the normalizer prepended). May end in, or contain, incomplete UTF-8.
  // Unknown ids are refused (kInvalidArgument).
  std::string decode(const std::vector<int32_t>& ids) const;

  // How many leading spaces decode() drops from the start of a text.
  int leading_spaces_stripped() const;

  // Raw bytes of `id` as the first token of a text: token_bytes(id), but
  // with no space for any "▁" under the Metaspace decoder (prepend_scheme
  // "always" or "first"), as Hugging Face decodes the first token.
  const std::string& first_token_bytes(int32_t id) const;

  // True when `id` names a token of this tokenizer. A model's vocabulary
  // may be larger (Qwen2.5 pads its embedding to a multiple of 128); such
  // ids show no text, as Hugging Face's decode skips them.
  bool has_token(int32_t id) const;

  // Raw bytes of one token; kInvalidArgument for an unknown id.
  const std::string& token_bytes(int32_t id) const;

  // One past the largest id of the model vocabulary and the added tokens.
  int32_t vocab_size() const;

  // Id of a token written as in tokenizer.json (added token content, or a
  // model vocabulary entry in its spelling such as "Ġthe" or "▁the").
  std::optional<int32_t> token_id(std::string_view token) const;

  // How the decoder shows bytes that are not valid UTF-8: one U+FFFD per
  // byte for SentencePiece-style byte tokens (ByteFallback), one per maximal
  // subpart for byte-level BPE (ByteLevel).
  Utf8Repair utf8_repair() const;

  // True when `id` is an added token marked special.
  bool is_special(int32_t id) const;

 private:
  explicit Tokenizer(std::unique_ptr<tok_detail::TokenizerImpl> impl);
  std::unique_ptr<tok_detail::TokenizerImpl> impl_;
};

// Turns a stream of ids into text, returning only complete UTF-8: the bytes of
// a character split across tokens are held back until it is complete. Bytes
// that can never form valid UTF-8 come out as U+FFFD, as many as the
// tokenizer's Hugging Face decoder puts (utf8_repair()), so all output is
// valid and the whole equals tokenizers' decode of the same ids.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer)
      : tokenizer_(&tokenizer), repair_(tokenizer.utf8_repair()), strip_left_(tokenizer.leading_spaces_stripped()) {}
  // An id the tokenizer does not have adds nothing (see has_token).
  std::string push(int32_t id);
  // Whatever is still held back (an incomplete character becomes U+FFFD).
  std::string flush();

 private:
  const Tokenizer* tokenizer_;
  Utf8Repair repair_;
  int strip_left_;  // leading spaces still to drop, as decode() does
  bool first_ = true;  // no token decoded yet (first_token_bytes)
  std::string pending_;
};

// Writes a small, valid byte-level BPE tokenizer.json (Llama-3 style
// pre-tokenizer): ids 0..255 are the bytes, merges learned from a built-in
// text (then synthesized) fill ids up to vocab_size - 3, and the special tokens
// <|begin_of_text|>, <|end_of_text|> are the last two ids
// (vocab_size - 2, vocab_size - 1). vocab_size must be at least 260.
void write_byte_level_bpe_tokenizer(const std::filesystem::path& out, int32_t vocab_size);

}  // namespace lockstep
