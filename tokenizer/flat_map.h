// Open-addressing hash maps for the tokenizer's large tables: no allocation
// per entry, so a 150k-token vocabulary and 280k merges load quickly.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace lockstep::tok_detail {

inline uint64_t hash_bytes(std::string_view s) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ s.size();
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
  }
  uint64_t tail = 0;
  std::memcpy(&tail, s.data() + i, s.size() - i);
  h = (h ^ tail) * 0x94D049BB133111EBull;
  return h ^ (h >> 29);
}

inline uint64_t mix64(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// String -> int32 map. Keys up to 16 bytes are stored in the slot itself (a
// lookup then touches one cache line), longer ones in an arena. Setting a key
// again overwrites its value.
class FlatStringMap {
 public:
  void reserve(size_t n) {
    if (n * 2 > slots_.size()) rehash(n * 2);
  }
  void set(std::string_view key, int32_t value) {
    if ((size_ + 1) * 2 > slots_.size()) rehash(std::max<size_t>(64, slots_.size() * 2));
    uint64_t h = hash_of(key);
    Slot& slot = slots_[find_slot(key, h)];
    if (slot.hash == 0) {
      slot.hash = h;
      slot.length = static_cast<uint32_t>(key.size());
      if (key.size() <= kInline) {
        std::memcpy(slot.bytes, key.data(), key.size());
      } else {
        uint64_t offset = arena_.size();
        std::memcpy(slot.bytes, &offset, sizeof(offset));
        arena_.append(key);
      }
      ++size_;
    }
    slot.value = value;
  }
  // Value of `key`, or -1.
  int32_t get(std::string_view key) const {
    if (slots_.empty()) return -1;
    const Slot& slot = slots_[find_slot(key, hash_of(key))];
    return slot.hash == 0 ? -1 : slot.value;
  }
  size_t size() const { return size_; }
  template <typename F>
  void for_each(F&& f) const {
    for (const Slot& s : slots_) {
      if (s.hash != 0) f(key_of(s), s.value);
    }
  }

 private:
  static constexpr size_t kInline = 16;
  struct Slot {
    uint64_t hash = 0;  // 0: empty
    uint32_t length = 0;
    int32_t value = 0;
    char bytes[kInline];  // the key, or its arena offset
  };
  static uint64_t hash_of(std::string_view key) { return hash_bytes(key) | 1; }
  std::string_view key_of(const Slot& s) const {
    if (s.length <= kInline) return std::string_view(s.bytes, s.length);
    uint64_t offset;
    std::memcpy(&offset, s.bytes, sizeof(offset));
    return std::string_view(arena_).substr(offset, s.length);
  }
  size_t find_slot(std::string_view key, uint64_t h) const {
    size_t mask = slots_.size() - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
      const Slot& s = slots_[i];
      if (s.hash == 0 || (s.hash == h && s.length == key.size() && key_of(s) == key)) return i;
    }
  }
  void rehash(size_t want) {
    size_t n = 64;
    while (n < want) n *= 2;
    std::vector<Slot> old(n);
    old.swap(slots_);
    for (const Slot& s : old) {
      if (s.hash == 0) continue;
      size_t i = s.hash & (n - 1);
      while (slots_[i].hash != 0) i = (i + 1) & (n - 1);
      slots_[i] = s;
    }
  }

  std::vector<Slot> slots_;
  std::string arena_;
  size_t size_ = 0;
};

// (int32, int32) -> (rank, id) map for BPE merges; the first insert of a pair wins.
class FlatPairMap {
 public:
  struct Value {
    int32_t rank;
    int32_t id;
  };
  void reserve(size_t n) {
    size_t size = 64;
    while (size < n * 2) size *= 2;
    slots_.assign(size, Slot{kEmpty, {0, 0}});
  }
  void insert_first(int32_t a, int32_t b, Value v) {
    uint64_t k = key(a, b);
    size_t mask = slots_.size() - 1;
    for (size_t i = mix64(k) & mask;; i = (i + 1) & mask) {
      if (slots_[i].key == k) return;
      if (slots_[i].key == kEmpty) {
        slots_[i] = Slot{k, v};
        return;
      }
    }
  }
  const Value* find(int32_t a, int32_t b) const {
    uint64_t k = key(a, b);
    size_t mask = slots_.size() - 1;
    for (size_t i = mix64(k) & mask;; i = (i + 1) & mask) {
      if (slots_[i].key == k) return &slots_[i].value;
      if (slots_[i].key == kEmpty) return nullptr;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~0ull;
  struct Slot {
    uint64_t key;
    Value value;
  };
  static uint64_t key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  std::vector<Slot> slots_;
};

}  // namespace lockstep::tok_detail
