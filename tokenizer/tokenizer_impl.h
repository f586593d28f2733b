// The state behind lockstep::Tokenizer (internal).
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "tokenizer/tok_internal.h"

namespace lockstep::tok_detail {

// tokenizer.json as read: model.vocab and model.merges apart from the rest.
struct TokenizerJson {
  nlohmann::json root;  // everything but model.vocab and model.merges
  bool has_vocab = false;
  bool has_merges = false;
  FlatStringMap vocab;  // spelling -> id
  // Merges by rank: resolved to ids when the vocab came first (as HF writes
  // it), else kept as spellings in unresolved_merges.
  std::vector<MergeIds> merges;
  std::vector<std::pair<std::string, std::string>> unresolved_merges;
};
TokenizerJson read_tokenizer_json(const std::filesystem::path& path);  // json_reader.cpp

// SentencePiece-style BPE (Llama 2, Mistral; no ByteLevel pre-tokenizer):
// spaces are written as U+2581 "▁" and one is put before a piece of text,
// the whole piece is one BPE word, and the decoder turns "▁" back into
// spaces, <0xXX> tokens into their bytes, and drops the leading space. Two
// spellings of it: the normalizer Prepend("▁") + Replace(" ", "▁") (on
// every piece between raw added tokens, before the normalized ones are
// matched) with the decoder Strip(" ", n, 0), or the Metaspace pre-tokenizer
// (on every piece between added tokens; prepend_scheme "always" or "first":
// only a piece at the start of the input, and never before a "▁") with the
// Metaspace decoder.
inline constexpr std::string_view kMetaspace = "\xE2\x96\x81";  // U+2581

struct Metaspace {
  enum class Prepend { kNever, kAlways, kIfAbsent, kFirstIfAbsent };
  bool in_normalizer = true;  // else the pre-tokenizer
  Prepend prepend = Prepend::kNever;
  int strip_leading = 0;  // leading spaces the decoder drops (Strip)
  // The Metaspace decoder (prepend_scheme "always" or "first") drops every
  // "▁" of the first token it decodes, where it writes a space for the rest.
  bool first_token_drops_metaspace = false;
};

struct TokenizerImpl {
  bool nfc_normalizer = false;
  std::optional<Metaspace> metaspace;  // SentencePiece-style, else byte-level
  // Split pre-tokenizers applied in order (each splits every piece further).
  std::vector<std::unique_ptr<RegexSplitter>> splitters;
  std::unique_ptr<BpeModel> bpe;
  AddedTokenMatcher raw_added;         // normalized == false: matched in the input
  AddedTokenMatcher normalized_added;  // normalized == true: matched after normalization
  std::vector<std::string> id_bytes;   // raw bytes of each id
  // Bytes of an id as the first token decoded, where they differ from
  // id_bytes (Metaspace::first_token_drops_metaspace).
  std::unordered_map<int32_t, std::string> first_token_bytes;
  std::vector<bool> id_known;
  std::vector<bool> id_special;
  FlatStringMap spelling_to_id;  // as written in tokenizer.json
  // The post-processor's TemplateProcessing for a single text: the ids of
  // the special tokens before and after it (e.g. Llama's BOS).
  std::vector<int32_t> template_prefix, template_suffix;

  // at_start: the piece begins the input (for prepend_scheme "first").
  void encode_plain(std::string_view text, bool at_start, std::vector<int32_t>& out) const;
  // A piece of text with spaces as "▁" and the one put before it (Metaspace).
  std::string metaspace_normalize(std::string_view text, bool at_start) const;
  void encode_pretokenized(std::string_view text, bool at_start, std::vector<int32_t>& out) const;
};

}  // namespace lockstep::tok_detail
