// Internal pieces of the tokenizer (not part of the public API).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/flat_map.h"

namespace lockstep::tok_detail {

// Token ids are an index into dense tables: past this one a file is refused
// (the largest vocabularies hold about 2^18 ids).
inline constexpr int64_t kMaxTokenId = (int64_t{1} << 24) - 1;

// ---- UTF-8 and Unicode helpers (unicode.cpp) ------------------------------

// Decodes the code point at s[i] (valid UTF-8 assumed); advances i.
char32_t next_code_point(std::string_view s, size_t& i);
void append_utf8(std::string& out, char32_t cp);
// NFC via utf8proc; returns false (and leaves out untouched) when `s` is
// already known to be unchanged by NFC.
bool nfc(std::string_view s, std::string& out);
bool is_white_space(char32_t cp);  // Unicode White_Space (Rust char::is_whitespace)
bool is_word_char(char32_t cp);    // Rust regex \w: alphabetic, marks, Nd, Pc, Join_Control

// GPT-2 byte <-> unicode mapping used by the ByteLevel pre-tokenizer/decoder.
struct ByteLevelTable {
  std::array<char32_t, 256> byte_to_cp{};
  std::unordered_map<char32_t, uint8_t> cp_to_byte;
};
const ByteLevelTable& byte_level_table();
// Byte-level spelling -> raw bytes; nullopt when a char is outside the table.
std::optional<std::string> byte_level_decode(std::string_view token);
std::string byte_level_encode(std::string_view bytes);
// `s` with every `from` (not empty) replaced by `to`.
std::string replace_all(std::string_view s, std::string_view from, std::string_view to);
// How many of the first `most` bytes of `s` are spaces before anything else.
size_t leading_spaces(std::string_view s, size_t most);

// ---- Regex split (regex_split.cpp) -----------------------------------------

// A compiled PCRE2 pattern (UTF, UCP, JIT) used as an Isolated Split:
// matches and the gaps between them both become pieces.
class RegexSplitter {
 public:
  // `pattern` is in Oniguruma syntax as Hugging Face writes it; \s and \S are
  // rewritten to Unicode White_Space so PCRE2 matches as Oniguruma does.
  explicit RegexSplitter(const std::string& pattern);
  ~RegexSplitter();
  RegexSplitter(const RegexSplitter&) = delete;
  RegexSplitter& operator=(const RegexSplitter&) = delete;
  // Appends [begin, end) byte ranges of `text` (valid UTF-8) to `pieces`,
  // offsets relative to `base`.
  void split(std::string_view text, size_t base, std::vector<std::pair<size_t, size_t>>& pieces) const;

 private:
  void* code_ = nullptr;  // pcre2_code_8*
};

std::string rewrite_regex_for_pcre2(const std::string& pattern);
std::string escape_regex_literal(const std::string& literal);

// ---- BPE model (bpe.cpp) -------------------------------------------------

// Merge of two tokens into a third, by id; a merge's rank is its index.
struct MergeIds {
  int32_t left, right, result;
};

// SentencePiece-style BPE (Llama 2, Mistral): a word starts as one symbol
// per character, looked up by its spelling; a character outside the vocab
// becomes the tokens <0xXX> of its UTF-8 bytes (byte_fallback, when they all
// exist) or the unk token, consecutive unk tokens fused into one (fuse_unk).
struct CharSymbols {
  FlatStringMap chars;                   // one-character spelling -> id
  std::array<int32_t, 256> byte_tokens;  // id of "<0xXX>", -1 when absent
  bool byte_fallback = false;
  bool fuse_unk = false;
};

class BpeModel {
 public:
  // vocab: raw-byte token -> id (tokens whose spelling is not byte-level are
  // left out by the caller); only used when ignore_merges is set, else only
  // the single bytes are needed. With char_symbols, words start as
  // characters (see CharSymbols) instead of bytes.
  BpeModel(const FlatStringMap& vocab, const std::vector<MergeIds>& merges, bool ignore_merges,
           std::optional<int32_t> unk_id, std::optional<CharSymbols> char_symbols = std::nullopt);
  // Appends the ids of one pre-token (raw bytes).
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

 private:
  struct Symbol;
  void initial_symbols(std::string_view word, std::vector<Symbol>& symbols) const;
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;

  FlatStringMap vocab_;
  FlatPairMap merges_;
  std::array<int32_t, 256> byte_ids_{};
  bool ignore_merges_;
  std::optional<int32_t> unk_id_;
  std::optional<CharSymbols> char_symbols_;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

// ---- Added tokens (added_tokens.cpp) ---------------------------------------

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = false;
};

// A piece of text: either an added token (id >= 0) or text to tokenize.
struct Segment {
  size_t begin, end;
  int32_t id;  // -1: plain text
};

// Leftmost-longest matching of a set of added tokens (like HF's Aho-Corasick
// with MatchKind::LeftmostLongest), then HF's single_word/lstrip/rstrip rules.
class AddedTokenMatcher {
 public:
  void add(const AddedToken& token, std::string pattern);
  bool empty() const { return tokens_.empty(); }
  // Splits text[0, size) into segments covering all of it.
  void split(std::string_view text, std::vector<Segment>& out) const;

 private:
  struct Node {
    std::unordered_map<unsigned char, int32_t> next;
    int32_t token = -1;  // index into tokens_
  };
  // Longest token starting at pos: (token index, length), or index -1.
  std::pair<int32_t, size_t> longest_at(std::string_view text, size_t pos) const;

  std::vector<Node> nodes_{1};
  std::vector<AddedToken> tokens_;
  std::array<bool, 256> first_byte_{};
};

}  // namespace lockstep::tok_detail
