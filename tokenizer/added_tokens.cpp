// Matching added tokens inside text, as Hugging Face's AddedVocabulary does.
#include "common/error.h"
#include "tokenizer/tok_internal.h"

namespace lockstep::tok_detail {
namespace {

// Last char of text[0, end) is a word char (regex `\w$`).
bool ends_with_word(std::string_view text, size_t end) {
  if (end == 0) return false;
  size_t i = end - 1;
  while (i > 0 && (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80) --i;
  size_t j = i;
  return is_word_char(next_code_point(text, j));
}

bool starts_with_word(std::string_view text, size_t begin) {
  if (begin >= text.size()) return false;
  return is_word_char(next_code_point(text, begin));
}

}  // namespace

void AddedTokenMatcher::add(const AddedToken& token, std::string pattern) {
  LS_REQUIRE(!pattern.empty(), ErrorKind::kModel, "tokenizer.json: added token {} is empty",
             token.id);
  int32_t node = 0;
  for (char c : pattern) {
    auto uc = static_cast<unsigned char>(c);
    auto it = nodes_[node].next.find(uc);
    if (it == nodes_[node].next.end()) {
      nodes_.emplace_back();
      int32_t created = static_cast<int32_t>(nodes_.size()) - 1;
      nodes_[node].next.emplace(uc, created);
      node = created;
    } else {
      node = it->second;
    }
  }
  first_byte_[static_cast<unsigned char>(pattern[0])] = true;
  if (nodes_[node].token >= 0) return;  // same text twice: the first one wins
  nodes_[node].token = static_cast<int32_t>(tokens_.size());
  tokens_.push_back(token);
}

std::pair<int32_t, size_t> AddedTokenMatcher::longest_at(std::string_view text, size_t pos) const {
  int32_t node = 0;
  std::pair<int32_t, size_t> best{-1, 0};
  for (size_t i = pos; i < text.size(); ++i) {
    auto it = nodes_[node].next.find(static_cast<unsigned char>(text[i]));
    if (it == nodes_[node].next.end()) break;
    node = it->second;
    if (nodes_[node].token >= 0) best = {nodes_[node].token, i + 1 - pos};
  }
  return best;
}

void AddedTokenMatcher::split(std::string_view text, std::vector<Segment>& out) const {
  size_t start_offset = 0;
  size_t pos = 0;
  const size_t n = text.size();
  while (pos < n) {
    if (!first_byte_[static_cast<unsigned char>(text[pos])]) {
      ++pos;
      continue;
    }
    auto [index, len] = longest_at(text, pos);
    if (index < 0) {
      ++pos;
      continue;
    }
    const AddedToken& token = tokens_[index];
    size_t start = pos;
    size_t stop = pos + len;
    pos = stop;  // the search goes on after the match, kept or not
    if (token.single_word && (ends_with_word(text, start) || starts_with_word(text, stop))) {
      continue;
    }
    if (token.lstrip) {
      size_t s = start;
      while (s > start_offset) {
        size_t p = s - 1;
        while (p > 0 && (static_cast<unsigned char>(text[p]) & 0xC0) == 0x80) --p;
        size_t q = p;
        if (!is_white_space(next_code_point(text, q))) break;
        s = p;
      }
      start = s;
    }
    if (token.rstrip) {
      while (stop < n) {
        size_t q = stop;
        if (!is_white_space(next_code_point(text, q))) break;
        stop = q;
      }
      pos = stop;
    }
    if (start_offset < start) out.push_back(Segment{start_offset, start, -1});
    out.push_back(Segment{start, stop, token.id});
    start_offset = stop;
  }
  if (start_offset < n) out.push_back(Segment{start_offset, n, -1});
}

}  // namespace lockstep::tok_detail
