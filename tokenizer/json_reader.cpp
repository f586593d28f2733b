// Reads tokenizer.json with a SAX handler: model.vocab and model.merges (the
// bulk of an 11 MB file) go straight into flat vectors, the rest into a DOM.
#include <fstream>

#include "common/error.h"
#include "common/json_sax.h"
#include "common/file.h"
#include "tokenizer/tokenizer_impl.h"

namespace lockstep::tok_detail {
namespace {

using nlohmann::json;

class Handler : public nlohmann::json_sax<json> {
 public:
  explicit Handler(TokenizerJson& out) : out_(out) {}

  bool null() override { return scalar(json()); }
  bool boolean(bool v) override { return scalar(json(v)); }
  bool number_integer(number_integer_t v) override { return number(v); }
  bool number_unsigned(number_unsigned_t v) override {
    return number(v > (1ULL << 40) ? -1 : static_cast<int64_t>(v));
  }
  bool number_float(number_float_t v, const string_t&) override { return scalar(json(v)); }
  bool binary(binary_t&) override { return scalar(json()); }
  bool string(string_t& v) override {
    if (mode_ == Mode::kMerges) {
      merge_string(v);
      return true;
    }
    return scalar(json(std::move(v)));
  }
  bool key(string_t& v) override {
    key_ = std::move(v);
    return true;
  }
  bool start_object(std::size_t) override {
    LS_REQUIRE(mode_ == Mode::kDom, ErrorKind::kModel,
               "tokenizer.json: unexpected object inside model.vocab or model.merges");
    if (path_is("model", "vocab")) {
      mode_ = Mode::kVocab;
      out_.has_vocab = true;
      return true;
    }
    return open(json::object());
  }
  bool end_object() override {
    if (mode_ == Mode::kVocab) {
      mode_ = Mode::kDom;
      mode_vocab_seen_ = true;
      return true;
    }
    return close();
  }
  bool start_array(std::size_t) override {
    if (mode_ == Mode::kMerges) {
      LS_REQUIRE(!in_pair_, ErrorKind::kModel, "tokenizer.json: malformed merge {}", rank());
      in_pair_ = true;
      pair_.clear();
      return true;
    }
    LS_REQUIRE(mode_ == Mode::kDom, ErrorKind::kModel,
               "tokenizer.json: unexpected list inside model.vocab");
    if (path_is("model", "merges")) {
      mode_ = Mode::kMerges;
      out_.has_merges = true;
      return true;
    }
    return open(json::array());
  }
  bool end_array() override {
    if (mode_ == Mode::kMerges) {
      if (!in_pair_) {
        mode_ = Mode::kDom;
        return true;
      }
      LS_REQUIRE(pair_.size() == 2, ErrorKind::kModel,
                 "tokenizer.json: merge {} is not a pair of strings", rank());
      add_merge(pair_[0], pair_[1]);
      in_pair_ = false;
      return true;
    }
    return close();
  }
  bool parse_error(std::size_t position, const std::string&,
                   const nlohmann::detail::exception& e) override {
    LS_FAIL(ErrorKind::kModel, "tokenizer.json is not valid JSON (byte {}): {}", position, e.what());
  }

 private:
  enum class Mode { kDom, kVocab, kMerges };

  size_t rank() const { return out_.merges.size() + out_.unresolved_merges.size(); }

  // A value other than an integer id (in model.vocab) or a string (in
  // model.merges) is refused there, as Hugging Face refuses it, rather than
  // stored over the model object's own key; elsewhere it goes into the DOM.
  bool scalar(json v) {
    LS_REQUIRE(mode_ != Mode::kVocab, ErrorKind::kModel, "tokenizer.json: vocab id of '{}' is not an integer", key_);
    LS_REQUIRE(mode_ != Mode::kMerges, ErrorKind::kModel,
               "tokenizer.json: merge {} is not a string \"a b\" or a pair of strings", rank());
    return add(std::move(v));
  }

  bool number(int64_t v) {
    if (mode_ == Mode::kVocab) {
      LS_REQUIRE(v >= 0 && v <= kMaxTokenId, ErrorKind::kModel,
                 "tokenizer.json: token '{}' has an invalid id (ids run from 0 to {})", key_, kMaxTokenId);
      out_.vocab.set(key_, static_cast<int32_t>(v));
      return true;
    }
    LS_REQUIRE(mode_ == Mode::kDom, ErrorKind::kModel, "tokenizer.json: malformed merge {}", rank());
    return add(json(v));
  }

  void merge_string(std::string& v) {
    if (in_pair_) {
      pair_.push_back(std::move(v));
      return;
    }
    size_t space = v.find(' ');
    LS_REQUIRE(space != std::string::npos && v.find(' ', space + 1) == std::string::npos,
               ErrorKind::kModel, "tokenizer.json: merge {} '{}' is not two tokens", rank(), v);
    std::string_view s(v);
    add_merge(s.substr(0, space), s.substr(space + 1));
  }

  int32_t vocab_id(std::string_view spelling) const {
    int32_t id = out_.vocab.get(spelling);
    LS_REQUIRE(id >= 0, ErrorKind::kModel,
               "tokenizer.json: merge {} uses '{}', which is not in the vocab", rank(), spelling);
    return id;
  }

  // Byte-level spellings concatenate as the bytes do, so a merge's result is
  // the token spelled a + b.
  void add_merge(std::string_view a, std::string_view b) {
    if (!mode_vocab_seen_) {
      out_.unresolved_merges.emplace_back(a, b);
      return;
    }
    joined_.assign(a).append(b);
    out_.merges.push_back(MergeIds{vocab_id(a), vocab_id(b), vocab_id(joined_)});
  }

  // True when the next value is stored at root[a][b].
  bool path_is(const char* a, const char* b) const {
    return stack_.size() == 2 && keys_[1] == a && key_ == b && stack_[1]->is_object();
  }

  json* slot() {
    if (stack_.empty()) return &out_.root;
    json* top = stack_.back();
    if (top->is_array()) {
      top->push_back(json());
      return &top->back();
    }
    return &(*top)[key_];
  }
  bool add(json v) {
    *slot() = std::move(v);
    return true;
  }
  bool open(json v) {
    LS_REQUIRE(stack_.size() < kMaxJsonDepth, ErrorKind::kModel, "tokenizer.json nests values deeper than {} levels",
               kMaxJsonDepth);
    std::string key = stack_.empty() || stack_.back()->is_array() ? std::string() : key_;
    json* s = slot();
    *s = std::move(v);
    stack_.push_back(s);
    keys_.push_back(std::move(key));
    return true;
  }
  bool close() {
    stack_.pop_back();
    keys_.pop_back();
    return true;
  }

  TokenizerJson& out_;
  Mode mode_ = Mode::kDom;
  std::vector<json*> stack_;
  std::vector<std::string> keys_;  // key each open container was stored under
  std::string key_;
  bool in_pair_ = false;
  bool mode_vocab_seen_ = false;  // model.vocab fully read
  std::string joined_;
  std::vector<std::string> pair_;
};

}  // namespace

TokenizerJson read_tokenizer_json(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in.good()) {
    // A folder with only another tokenizer format: say which, and what works instead.
    for (const char* other : {"tokenizer.model", "tekken.json", "vocab.json"})
      LS_REQUIRE(!path_present(path.parent_path() / other), ErrorKind::kModel,
                 "no {} beside {}: lockstep reads Hugging Face tokenizer.json only (give --prompt-ids, or a "
                 "tokenizer.json with --tokenizer)", path.filename().string(), other);
    std::error_code ec;  // why, where the filesystem says (missing, a link that loops, ...)
    (void)std::filesystem::status(path, ec);
    LS_FAIL(ErrorKind::kIo, "cannot open tokenizer file {}{}", path.string(), ec ? ": " + ec.message() : "");
  }
  require_readable_file(path, "tokenizer file");  // not a folder
  in.seekg(0, std::ios::end);
  std::streamoff size = in.tellg();
  in.seekg(0, std::ios::beg);
  LS_REQUIRE(size >= 0, ErrorKind::kIo, "cannot read tokenizer file {}", path.string());
  std::string text(static_cast<size_t>(size), '\0');
  in.read(text.data(), size);
  LS_REQUIRE(in.gcount() == size, ErrorKind::kIo, "cannot read tokenizer file {}", path.string());
  TokenizerJson out;
  Handler handler(out);
  json::sax_parse(text, &handler);
  return out;
}

}  // namespace lockstep::tok_detail
