// write_byte_level_bpe_tokenizer: a small byte-level BPE tokenizer.json for
// random test models, with merges learned from a built-in text.
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "common/error.h"
#include "tokenizer/tok_internal.h"
#include "tokenizer/tokenizer.h"

namespace lockstep {
namespace {

using tok_detail::byte_level_encode;

constexpr const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

constexpr const char* kTrainingText = R"(The quick brown fox jumps over the lazy dog.
Once upon a time, in a small town by the sea, there lived an old man who
made boats. Every morning he walked to the harbour, and every evening he
came back home with a story to tell. The children of the town loved
his stories, and they would sit around him while the sun went down.
"What did you see today?" they asked. He smiled and said that the sea
is never the same twice, and that is why he loved it so much.
In the beginning there was nothing but the wind and the water; then
the people came, and they built houses, roads and schools. They learned
to read and to write, to count and to measure, and they shared what they
knew with one another. This is the story of how they lived and worked.
def generate(model, prompt, max_tokens=16):
    tokens = tokenize(prompt)
    for step in range(max_tokens):
        logits = model.forward(tokens)
        next_token = int(logits[-1].argmax())
        tokens.append(next_token)
    return detokenize(tokens)
for (int i = 0; i < n; ++i) { sum += values[i] * weights[i]; }
The numbers 1, 2, 3, 10, 42, 100 and 2024 appear here; so do 3.14 and 0.5.
It's a test, isn't it? We'll see what they've done, and I'm sure you'd agree.
)";

struct Trainer {
  std::vector<std::string> tokens;  // raw bytes by id
  std::unordered_set<std::string> known;
  std::vector<std::pair<int32_t, int32_t>> merges;
  std::vector<std::pair<std::vector<int32_t>, int64_t>> words;

  Trainer() {
    for (int b = 0; b < 256; ++b) {
      tokens.emplace_back(1, static_cast<char>(b));
      known.insert(tokens.back());
    }
    std::string_view text(kTrainingText);
    tok_detail::RegexSplitter splitter(kLlama3Pattern);
    std::vector<std::pair<size_t, size_t>> pieces;
    splitter.split(text, 0, pieces);
    std::map<std::string, int64_t> counts;
    for (auto [b, e] : pieces) ++counts[std::string(text.substr(b, e - b))];
    for (const auto& [word, count] : counts) {
      std::vector<int32_t> symbols;
      for (char c : word) symbols.push_back(static_cast<unsigned char>(c));
      words.emplace_back(std::move(symbols), count);
    }
  }

  void add_merge(int32_t a, int32_t b) {
    std::string joined = tokens[a] + tokens[b];
    merges.emplace_back(a, b);
    if (known.insert(joined).second) tokens.push_back(std::move(joined));
  }

  // One step of BPE training; false when no pair is left.
  bool learn_one() {
    std::map<std::pair<int32_t, int32_t>, int64_t> pairs;
    for (const auto& [symbols, count] : words) {
      for (size_t i = 0; i + 1 < symbols.size(); ++i) pairs[{symbols[i], symbols[i + 1]}] += count;
    }
    if (pairs.empty()) return false;
    auto best = pairs.begin();
    for (auto it = pairs.begin(); it != pairs.end(); ++it) {
      if (it->second > best->second) best = it;  // ties: the smallest pair
    }
    auto [a, b] = best->first;
    size_t before = tokens.size();
    add_merge(a, b);
    int32_t merged = tokens.size() > before ? static_cast<int32_t>(tokens.size()) - 1 : -1;
    if (merged < 0) {
      // The merged text already exists: find its id.
      std::string joined = tokens[a] + tokens[b];
      for (size_t i = 0; i < tokens.size(); ++i) {
        if (tokens[i] == joined) merged = static_cast<int32_t>(i);
      }
    }
    for (auto& [symbols, count] : words) {
      std::vector<int32_t> next;
      for (size_t i = 0; i < symbols.size(); ++i) {
        if (i + 1 < symbols.size() && symbols[i] == a && symbols[i + 1] == b) {
          next.push_back(merged);
          ++i;
        } else {
          next.push_back(symbols[i]);
        }
      }
      symbols = std::move(next);
    }
    return true;
  }

  // Grows the vocabulary past what the text teaches: base token + letter.
  void synthesize(size_t target) {
    const std::string letters = "etaoinshrdlucmfwypvbgkjqxz";
    std::vector<int32_t> bases;
    for (char c : " " + letters) bases.push_back(static_cast<unsigned char>(c));
    for (size_t i = 256; i < tokens.size(); ++i) bases.push_back(static_cast<int32_t>(i));
    for (size_t next_base = 0; tokens.size() < target; ++next_base) {
      LS_CHECK(next_base < bases.size());
      int32_t base = bases[next_base];
      for (char c : letters) {
        if (tokens.size() >= target) break;
        if (known.count(tokens[base] + c)) continue;
        add_merge(base, static_cast<unsigned char>(c));
        bases.push_back(static_cast<int32_t>(tokens.size()) - 1);
      }
    }
  }
};

nlohmann::ordered_json added_token(int32_t id, const char* content) {
  return {{"id", id},           {"content", content}, {"single_word", false}, {"lstrip", false},
          {"rstrip", false},    {"normalized", false}, {"special", true}};
}

nlohmann::ordered_json tokenizer_json(const Trainer& t, int32_t vocab_size) {
  using nlohmann::ordered_json;
  // Tokens are distinct, so entries are appended without ordered_json's
  // linear look-up per insertion.
  ordered_json vocab = ordered_json::object();
  auto& entries = vocab.get_ref<ordered_json::object_t&>();
  entries.reserve(t.tokens.size());
  for (size_t i = 0; i < t.tokens.size(); ++i) {
    entries.std::vector<ordered_json::object_t::value_type>::emplace_back(byte_level_encode(t.tokens[i]), i);
  }
  ordered_json merges = ordered_json::array();
  for (auto [a, b] : t.merges) {
    merges.push_back(byte_level_encode(t.tokens[a]) + " " + byte_level_encode(t.tokens[b]));
  }
  ordered_json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false},
                             {"trim_offsets", true}, {"use_regex", false}};
  ordered_json j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = {added_token(vocab_size - 2, "<|begin_of_text|>"),
                       added_token(vocab_size - 1, "<|end_of_text|>")};
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"}, {"pattern", {{"Regex", kLlama3Pattern}}}, {"behavior", "Isolated"},
         {"invert", false}},
        byte_level}}};
  j["post_processor"] = byte_level;
  j["decoder"] = byte_level;
  j["model"] = {{"type", "BPE"},         {"dropout", nullptr},
                {"unk_token", nullptr},  {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr}, {"fuse_unk", false},
                {"byte_fallback", false}, {"ignore_merges", false},
                {"vocab", vocab},        {"merges", merges}};
  return j;
}

}  // namespace

void write_byte_level_bpe_tokenizer(const std::filesystem::path& out, int32_t vocab_size) {
  LS_REQUIRE(vocab_size >= 260 && vocab_size <= (1 << 24), ErrorKind::kInvalidArgument,
             "vocab size {} is out of range for a byte-level BPE tokenizer (260 to {})",
             vocab_size, 1 << 24);
  size_t target = static_cast<size_t>(vocab_size) - 2;  // ids below the two special tokens
  Trainer trainer;
  while (trainer.tokens.size() < target && trainer.learn_one()) {
  }
  trainer.synthesize(target);
  std::string text = tokenizer_json(trainer, vocab_size).dump(1);
  std::ofstream file(out, std::ios::binary);
  LS_REQUIRE(file.good(), ErrorKind::kIo, "cannot write tokenizer file {}", out.string());
  file << text << '\n';
  file.close();
  LS_REQUIRE(file.good(), ErrorKind::kIo, "cannot write tokenizer file {}", out.string());
}

}  // namespace lockstep
