// Rank-based BPE over raw bytes (byte-level vocabularies mapped back to bytes).
#include <algorithm>
#include <queue>

#include "common/error.h"
#include "tokenizer/tok_internal.h"

namespace lockstep::tok_detail {
namespace {

constexpr size_t kCacheMaxWordBytes = 256;
constexpr size_t kCacheMaxEntries = 1 << 18;

struct Symbol {
  int32_t id;
  int32_t prev;
  int32_t next;
  bool alive;
};

struct Candidate {
  int32_t rank;
  int32_t pos;
  int32_t new_id;
  // Lowest rank first, then leftmost (as Hugging Face's BPE).
  bool operator>(const Candidate& o) const {
    return rank != o.rank ? rank > o.rank : pos > o.pos;
  }
};

}  // namespace

struct BpeModel::Symbol {
  int32_t id;
  int32_t prev;
  int32_t next;
  bool alive;
};

BpeModel::BpeModel(const FlatStringMap& vocab, const std::vector<MergeIds>& merges,
                   bool ignore_merges, std::optional<int32_t> unk_id, std::optional<CharSymbols> char_symbols)
    : ignore_merges_(ignore_merges), unk_id_(unk_id), char_symbols_(std::move(char_symbols)) {
  for (int b = 0; b < 256; ++b) {
    char c = static_cast<char>(b);
    byte_ids_[b] = vocab.get(std::string_view(&c, 1));
  }
  if (ignore_merges_) vocab_ = vocab;
  merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const MergeIds& m = merges[rank];
    // The first (lowest-rank) occurrence of a pair wins, as in HF.
    merges_.insert_first(m.left, m.right, {static_cast<int32_t>(rank), m.result});
  }
  cache_.reserve(1 << 14);
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (word.size() == 1 && !char_symbols_) {
    int32_t id = byte_ids_[static_cast<unsigned char>(word[0])];
    if (id >= 0) {
      out.push_back(id);
    } else if (unk_id_) {
      out.push_back(*unk_id_);
    }
    return;
  }
  if (ignore_merges_) {
    int32_t id = vocab_.get(word);
    if (id >= 0) {
      out.push_back(id);
      return;
    }
  }
  bool cacheable = word.size() <= kCacheMaxWordBytes;
  std::string key_str;
  if (cacheable) {
    key_str.assign(word);
    std::lock_guard<std::mutex> lock(cache_mutex_);
    auto it = cache_.find(key_str);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  size_t start = out.size();
  merge_word(word, out);
  if (cacheable) {
    std::vector<int32_t> ids(out.begin() + static_cast<std::ptrdiff_t>(start), out.end());
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cache_.size() >= kCacheMaxEntries) cache_.clear();
    cache_.emplace(std::move(key_str), std::move(ids));
  }
}

// The word's symbols before any merge: its bytes, or its characters (CharSymbols).
void BpeModel::initial_symbols(std::string_view word, std::vector<Symbol>& symbols) const {
  const auto push = [&](int32_t id) {
    const int32_t n = static_cast<int32_t>(symbols.size());
    symbols.push_back(Symbol{id, n - 1, n + 1, true});
  };
  const auto push_unk = [&] {
    if (!unk_id_) return;  // HF drops unknown input when there is no unk token
    if (char_symbols_ && char_symbols_->fuse_unk && !symbols.empty() && symbols.back().id == *unk_id_) return;
    push(*unk_id_);
  };
  if (!char_symbols_) {
    for (char c : word) {
      const int32_t id = byte_ids_[static_cast<unsigned char>(c)];
      if (id >= 0) push(id);
      else push_unk();
    }
    return;
  }
  const CharSymbols& cs = *char_symbols_;
  for (size_t i = 0; i < word.size();) {
    const size_t begin = i;
    next_code_point(word, i);
    const std::string_view ch = word.substr(begin, i - begin);
    if (const int32_t id = cs.chars.get(ch); id >= 0) {
      push(id);
      continue;
    }
    const bool bytes_known = cs.byte_fallback && std::all_of(ch.begin(), ch.end(), [&](char b) {
      return cs.byte_tokens[static_cast<unsigned char>(b)] >= 0;
    });
    if (bytes_known) {
      for (char b : ch) push(cs.byte_tokens[static_cast<unsigned char>(b)]);
    } else {
      push_unk();
    }
  }
}

void BpeModel::merge_word(std::string_view word, std::vector<int32_t>& out) const {
  thread_local std::vector<Symbol> symbols;
  thread_local std::vector<Candidate> heap_storage;
  symbols.clear();
  initial_symbols(word, symbols);
  if (symbols.empty()) return;
  symbols.back().next = -1;

  heap_storage.clear();
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap(
      std::greater<>(), std::move(heap_storage));
  auto consider = [&](int32_t pos) {
    int32_t next = symbols[pos].next;
    if (next < 0) return;
    const FlatPairMap::Value* m = merges_.find(symbols[pos].id, symbols[next].id);
    if (m != nullptr) heap.push(Candidate{m->rank, pos, m->id});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i) consider(i);

  while (!heap.empty()) {
    Candidate top = heap.top();
    heap.pop();
    Symbol& left = symbols[top.pos];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    const FlatPairMap::Value* m = merges_.find(left.id, right.id);
    if (m == nullptr || m->id != top.new_id) continue;  // stale
    left.id = top.new_id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (left.prev >= 0) consider(left.prev);
    consider(top.pos);
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) out.push_back(symbols[i].id);
}

}  // namespace lockstep::tok_detail
