// Loading tokenizer.json: what is supported is built, anything else refused.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <optional>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_impl.h"

namespace lockstep {

using nlohmann::json;
using tok_detail::TokenizerImpl;

namespace {

// The GPT-2 pattern ByteLevel(use_regex=true) splits with.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string type_of(const json& j, const char* what) {
  LS_REQUIRE(j.is_object() && j.contains("type") && j["type"].is_string(), ErrorKind::kModel,
             "tokenizer.json: {} has no \"type\"", what);
  return j["type"].get<std::string>();
}

bool flag(const json& j, const char* key, bool fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  LS_REQUIRE(j[key].is_boolean(), ErrorKind::kModel, "tokenizer.json: \"{}\" is not a boolean", key);
  return j[key].get<bool>();
}

// What the normalizer, pre-tokenizer and decoder ask for, before it is
// checked that they form one of the two supported kinds of BPE.
struct Pipeline {
  bool byte_level = false;           // ByteLevel pre-tokenizer
  bool byte_level_decoder = false;
  bool prepend_metaspace = false;    // normalizer Prepend("▁")
  bool spaces_to_metaspace = false;  // normalizer Replace(" ", "▁")
  bool metaspace_to_spaces = false;  // decoder Replace("▁", " ")
  int strip_leading = 0;             // decoder Strip(" ", n, 0)
  // Metaspace pre-tokenizer: its prepend_scheme; decoder Metaspace: the same.
  enum class Scheme { kAlways, kFirst, kNever };
  std::optional<Scheme> metaspace_pre_tokenizer;
  std::optional<Scheme> metaspace_decoder;
};

// A Metaspace pre-tokenizer's or decoder's prepend scheme ("always", "first"
// or "never"; older files say add_prefix_space instead), with "▁" for
// spaces and (pre-tokenizer) no split into words.
Pipeline::Scheme metaspace_scheme(const json& j, bool pre_tokenizer) {
  LS_REQUIRE(j.value("replacement", "") == tok_detail::kMetaspace, ErrorKind::kModel,
             "tokenizer.json: Metaspace with a replacement other than \"▁\" is not supported");
  LS_REQUIRE(!pre_tokenizer || !flag(j, "split", true), ErrorKind::kModel,
             "tokenizer.json: Metaspace pre-tokenizer with split true is not supported");
  std::string scheme = flag(j, "add_prefix_space", true) ? "always" : "never";
  if (j.contains("prepend_scheme") && j["prepend_scheme"].is_string()) scheme = j["prepend_scheme"].get<std::string>();
  if (scheme == "always") return Pipeline::Scheme::kAlways;
  if (scheme == "first") return Pipeline::Scheme::kFirst;
  LS_REQUIRE(scheme == "never", ErrorKind::kModel, "tokenizer.json: Metaspace prepend_scheme '{}' is not supported",
             scheme);
  return Pipeline::Scheme::kNever;
}

// A Replace normalizer or decoder: whether it maps `from` to `to`.
bool replaces(const json& j, std::string_view from, std::string_view to) {
  const json& pattern = j.at("pattern");
  return pattern.contains("String") && pattern["String"] == from && j.at("content") == to;
}

void parse_normalizer(const json& j, TokenizerImpl& impl, Pipeline& p) {
  if (j.is_null()) return;
  std::string type = type_of(j, "normalizer");
  if (type == "NFC") {
    impl.nfc_normalizer = true;
  } else if (type == "Sequence") {
    for (const json& n : j.at("normalizers")) parse_normalizer(n, impl, p);
  } else if (type == "Prepend" && j.at("prepend") == tok_detail::kMetaspace) {
    p.prepend_metaspace = true;
  } else if (type == "Replace" && replaces(j, " ", tok_detail::kMetaspace)) {
    p.spaces_to_metaspace = true;
  } else {
    LS_FAIL(ErrorKind::kModel,
            "tokenizer.json: normalizer {} is not supported (only NFC, and Prepend / Replace of \"▁\" for spaces)",
            j.dump().substr(0, 120));
  }
}

void parse_split(const json& j, TokenizerImpl& impl) {
  std::string behavior = j.value("behavior", "");
  LS_REQUIRE(behavior == "Isolated", ErrorKind::kModel,
             "tokenizer.json: Split behavior '{}' is not supported (only Isolated)", behavior);
  LS_REQUIRE(!flag(j, "invert", false), ErrorKind::kModel,
             "tokenizer.json: Split with invert true is not supported");
  const json& pattern = j.at("pattern");
  if (pattern.contains("Regex")) {
    impl.splitters.push_back(
        std::make_unique<tok_detail::RegexSplitter>(pattern["Regex"].get<std::string>()));
  } else if (pattern.contains("String")) {
    impl.splitters.push_back(std::make_unique<tok_detail::RegexSplitter>(
        tok_detail::escape_regex_literal(pattern["String"].get<std::string>())));
  } else {
    LS_FAIL(ErrorKind::kModel, "tokenizer.json: Split pattern is neither Regex nor String");
  }
}

void parse_pre_tokenizer(const json& j, TokenizerImpl& impl, Pipeline& pipeline) {
  bool& byte_level = pipeline.byte_level;
  std::string type = type_of(j, "pre_tokenizer");
  LS_REQUIRE(!byte_level && !pipeline.metaspace_pre_tokenizer, ErrorKind::kModel,
             "tokenizer.json: pre-tokenizer '{}' after ByteLevel or Metaspace is not supported", type);
  if (type == "Sequence") {
    for (const json& p : j.at("pretokenizers")) parse_pre_tokenizer(p, impl, pipeline);
  } else if (type == "Metaspace") {
    pipeline.metaspace_pre_tokenizer = metaspace_scheme(j, true);
  } else if (type == "Split") {
    parse_split(j, impl);
  } else if (type == "Digits") {
    // Hugging Face splits on char::is_numeric (categories Nd, Nl, No): each
    // numeric character its own piece, or each run of them one piece.
    impl.splitters.push_back(
        std::make_unique<tok_detail::RegexSplitter>(flag(j, "individual_digits", false) ? "\\p{N}" : "\\p{N}+"));
  } else if (type == "ByteLevel") {
    LS_REQUIRE(!flag(j, "add_prefix_space", true), ErrorKind::kModel,
               "tokenizer.json: ByteLevel pre-tokenizer with add_prefix_space true is not supported");
    if (flag(j, "use_regex", true)) {
      impl.splitters.push_back(std::make_unique<tok_detail::RegexSplitter>(kGpt2Pattern));
    }
    byte_level = true;
  } else {
    LS_FAIL(ErrorKind::kModel, "tokenizer.json: pre-tokenizer type '{}' is not supported", type);
  }
}

void parse_decoder(const json& j, Pipeline& p) {
  if (j.is_null()) return;
  std::string type = type_of(j, "decoder");
  if (type == "Sequence") {
    for (const json& d : j.at("decoders")) parse_decoder(d, p);
  } else if (type == "ByteLevel") {
    p.byte_level_decoder = true;
  } else if (type == "Replace" && replaces(j, tok_detail::kMetaspace, " ")) {
    p.metaspace_to_spaces = true;
  } else if (type == "Metaspace") {
    p.metaspace_decoder = metaspace_scheme(j, false);
  } else if (type == "Strip" && j.at("content") == " " && j.at("stop") == 0 && j.at("start").is_number_integer()) {
    // A count of spaces (Hugging Face's usize): a negative one is refused,
    // not narrowed to an int that strips every space or, wrapped, one.
    const int64_t start = j["start"].get<int64_t>();
    LS_REQUIRE(start >= 0 && start <= INT32_MAX, ErrorKind::kModel,
               "tokenizer.json: decoder Strip start {} is not a count of spaces (0 to {})", j["start"].dump(),
               INT32_MAX);
    p.strip_leading = static_cast<int>(start);
  } else {
    // ByteFallback and Fuse are what decoding token bytes in order does anyway.
    LS_REQUIRE(type == "ByteFallback" || type == "Fuse", ErrorKind::kModel,
               "tokenizer.json: decoder {} is not supported", j.dump().substr(0, 120));
  }
}

// Byte-level BPE (Llama 3, Qwen) or SentencePiece-style BPE (Llama 2,
// Mistral; see tok_detail::Metaspace for its two spellings), nothing in between.
void check_pipeline(const Pipeline& p, TokenizerImpl& impl) {
  using Prepend = tok_detail::Metaspace::Prepend;
  const bool any_metaspace = p.prepend_metaspace || p.spaces_to_metaspace || p.metaspace_to_spaces ||
                             p.metaspace_decoder || p.metaspace_pre_tokenizer;
  if (p.byte_level) {
    LS_REQUIRE(!any_metaspace && p.strip_leading == 0, ErrorKind::kModel,
               "tokenizer.json: a ByteLevel pre-tokenizer with \"▁\" normalizers or decoders is not supported");
    return;
  }
  const bool decodes_metaspace = p.metaspace_to_spaces || p.metaspace_decoder;
  const bool legacy = p.spaces_to_metaspace && !p.metaspace_pre_tokenizer;
  const bool pre_tokenized = p.metaspace_pre_tokenizer && !p.spaces_to_metaspace && !p.prepend_metaspace;
  LS_REQUIRE((legacy || pre_tokenized) && decodes_metaspace && impl.splitters.empty() && !p.byte_level_decoder,
             ErrorKind::kModel,
             "tokenizer.json: only byte-level BPE (a ByteLevel pre-tokenizer) or SentencePiece-style BPE (spaces "
             "as \"▁\" by the normalizer or a Metaspace pre-tokenizer, decoded back) is supported");
  tok_detail::Metaspace m{.in_normalizer = legacy, .strip_leading = p.strip_leading};
  if (legacy) {
    m.prepend = p.prepend_metaspace ? Prepend::kAlways : Prepend::kNever;
  } else {
    switch (*p.metaspace_pre_tokenizer) {
      case Pipeline::Scheme::kAlways: m.prepend = Prepend::kIfAbsent; break;
      case Pipeline::Scheme::kFirst: m.prepend = Prepend::kFirstIfAbsent; break;
      case Pipeline::Scheme::kNever: m.prepend = Prepend::kNever; break;
    }
  }
  m.first_token_drops_metaspace = p.metaspace_decoder && *p.metaspace_decoder != Pipeline::Scheme::kNever;
  impl.metaspace = m;
}

void check_bpe_options(const json& model, bool sentencepiece) {
  std::string type = model.value("type", "BPE");
  LS_REQUIRE(type == "BPE", ErrorKind::kModel,
             "tokenizer.json: model type '{}' is not supported (only BPE)", type);
  LS_REQUIRE(!model.contains("dropout") || model["dropout"].is_null(), ErrorKind::kModel,
             "tokenizer.json: BPE dropout is not supported");
  LS_REQUIRE(sentencepiece || !flag(model, "byte_fallback", false), ErrorKind::kModel,
             "tokenizer.json: BPE byte_fallback is not supported with a ByteLevel pre-tokenizer");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    LS_REQUIRE(!model.contains(key) || model[key].is_null() || model[key] == "", ErrorKind::kModel,
               "tokenizer.json: BPE {} is not supported", key);
  }
}

void set_id(TokenizerImpl& impl, int32_t id, std::string bytes) {
  auto index = static_cast<size_t>(id);
  if (index >= impl.id_bytes.size()) {
    impl.id_bytes.resize(index + 1);
    impl.id_known.resize(index + 1, false);
    impl.id_special.resize(index + 1, false);
  }
  impl.id_bytes[index] = std::move(bytes);
  impl.id_known[index] = true;
}

int32_t checked_id(const json& v, const std::string& token) {
  LS_REQUIRE(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() <= tok_detail::kMaxTokenId,
             ErrorKind::kModel, "tokenizer.json: token '{}' has an invalid id (ids run from 0 to {})", token,
             tok_detail::kMaxTokenId);
  return static_cast<int32_t>(v.get<int64_t>());
}

int32_t spelling_id(const TokenizerImpl& impl, std::string_view spelling, size_t rank) {
  int32_t id = impl.spelling_to_id.get(spelling);
  LS_REQUIRE(id >= 0, ErrorKind::kModel,
             "tokenizer.json: merge {} uses '{}', which is not in the vocab", rank, spelling);
  return id;
}

// The byte of a byte-fallback token "<0xXX>", if `spelling` is one.
std::optional<char> fallback_byte(std::string_view spelling) {
  if (spelling.size() != 6 || spelling.substr(0, 3) != "<0x" || spelling[5] != '>') return std::nullopt;
  int value = 0;
  for (char c : spelling.substr(3, 2)) {
    const int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (digit < 0) return std::nullopt;
    value = value * 16 + digit;
  }
  return static_cast<char>(value);
}

// What the Metaspace decoder makes of `spelling` as the first token: every
// "▁" dropped (noted only where that differs from its bytes).
void note_first_token_bytes(TokenizerImpl& impl, int32_t id, std::string_view spelling) {
  if (!impl.metaspace->first_token_drops_metaspace) return;
  if (spelling.find(tok_detail::kMetaspace) == std::string::npos) {
    impl.first_token_bytes.erase(id);  // an added token may take a vocab id
  } else {
    impl.first_token_bytes[id] = tok_detail::replace_all(spelling, tok_detail::kMetaspace, "");
  }
}

// SentencePiece-style vocab: a token's bytes are its spelling with "▁" as a
// space, or the byte of a <0xXX> token; its characters start BPE words.
tok_detail::CharSymbols sentencepiece_vocab(const json& model, const tok_detail::FlatStringMap& vocab,
                                            TokenizerImpl& impl) {
  tok_detail::CharSymbols cs;
  cs.byte_fallback = flag(model, "byte_fallback", false);
  cs.fuse_unk = flag(model, "fuse_unk", false);
  cs.byte_tokens.fill(-1);
  vocab.for_each([&](std::string_view spelling, int32_t id) {
    const std::optional<char> byte = cs.byte_fallback ? fallback_byte(spelling) : std::nullopt;
    if (byte) cs.byte_tokens[static_cast<unsigned char>(*byte)] = id;
    set_id(impl, id, byte ? std::string(1, *byte) : tok_detail::replace_all(spelling, tok_detail::kMetaspace, " "));
    if (!byte) note_first_token_bytes(impl, id, spelling);
    size_t end = 0;
    tok_detail::next_code_point(spelling, end);
    if (!spelling.empty() && end == spelling.size()) cs.chars.set(spelling, id);
  });
  return cs;
}

void build_model(const json& model, tok_detail::TokenizerJson& file, TokenizerImpl& impl) {
  const bool sentencepiece = impl.metaspace.has_value();
  check_bpe_options(model, sentencepiece);
  LS_REQUIRE(file.has_vocab && file.has_merges, ErrorKind::kModel,
             "tokenizer.json: BPE model needs a vocab object and a merges list");
  LS_REQUIRE(file.vocab.size() > 0, ErrorKind::kModel, "tokenizer.json: model.vocab is empty");
  bool ignore_merges = flag(model, "ignore_merges", false);
  LS_REQUIRE(!(sentencepiece && ignore_merges), ErrorKind::kModel,
             "tokenizer.json: ignore_merges is not supported without a ByteLevel pre-tokenizer");
  tok_detail::FlatStringMap raw_vocab;  // all of it for ignore_merges, else the bytes
  std::optional<tok_detail::CharSymbols> chars;
  if (sentencepiece) {
    chars = sentencepiece_vocab(model, file.vocab, impl);
  } else {
    raw_vocab.reserve(ignore_merges ? file.vocab.size() : 256);
    file.vocab.for_each([&](std::string_view spelling, int32_t id) {
      std::optional<std::string> raw = tok_detail::byte_level_decode(spelling);
      // A spelling outside the byte-level alphabet can never be produced by
      // encoding; HF's decoder emits its UTF-8 as is.
      set_id(impl, id, raw ? *raw : std::string(spelling));
      if (raw && (ignore_merges || raw->size() == 1)) raw_vocab.set(*raw, id);
    });
  }
  impl.spelling_to_id = std::move(file.vocab);
  std::vector<tok_detail::MergeIds> merges = std::move(file.merges);
  std::string joined;
  for (const auto& [a, b] : file.unresolved_merges) {  // the merges came before the vocab
    size_t rank = merges.size();
    joined.assign(a).append(b);
    merges.push_back({spelling_id(impl, a, rank), spelling_id(impl, b, rank),
                      spelling_id(impl, joined, rank)});
  }
  std::optional<int32_t> unk;
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    int32_t id = impl.spelling_to_id.get(model["unk_token"].get<std::string>());
    LS_REQUIRE(id >= 0, ErrorKind::kModel, "tokenizer.json: unk_token is not in the vocab");
    unk = id;
  }
  impl.bpe = std::make_unique<tok_detail::BpeModel>(raw_vocab, merges, ignore_merges, unk, std::move(chars));
}

void add_added_tokens(const json& list, TokenizerImpl& impl) {
  if (list.is_null()) return;
  LS_REQUIRE(list.is_array(), ErrorKind::kModel, "tokenizer.json: added_tokens is not a list");
  for (const json& j : list) {
    tok_detail::AddedToken t;
    t.content = j.at("content").get<std::string>();
    t.id = checked_id(j.at("id"), t.content);
    t.special = flag(j, "special", false);
    t.lstrip = flag(j, "lstrip", false);
    t.rstrip = flag(j, "rstrip", false);
    t.single_word = flag(j, "single_word", false);
    t.normalized = flag(j, "normalized", !t.special);
    // Hugging Face's decoder reads an added token's text as it reads a vocab
    // spelling: ByteLevel through the byte-level alphabet when every
    // character is in it ("Ġhi" is " hi"), else as it is; the SentencePiece
    // style with each "▁" as a space (or dropped, the first token).
    if (impl.metaspace) {
      set_id(impl, t.id, tok_detail::replace_all(t.content, tok_detail::kMetaspace, " "));
      note_first_token_bytes(impl, t.id, t.content);
    } else {
      std::optional<std::string> bytes = tok_detail::byte_level_decode(t.content);
      set_id(impl, t.id, bytes ? *bytes : t.content);
    }
    impl.id_special[static_cast<size_t>(t.id)] = t.special;
    impl.spelling_to_id.set(t.content, t.id);
    if (t.content.empty()) continue;
    if (t.normalized) {
      std::string pattern = t.content;
      if (impl.nfc_normalizer) tok_detail::nfc(t.content, pattern);
      if (impl.metaspace && impl.metaspace->in_normalizer)  // spaces as "▁", nothing prepended
        pattern = tok_detail::replace_all(pattern, " ", tok_detail::kMetaspace);
      impl.normalized_added.add(t, std::move(pattern));
    } else {
      impl.raw_added.add(t, t.content);
    }
  }
}

// The post-processor: ByteLevel changes only offsets; TemplateProcessing's
// "single" template gives the special tokens around a text.
void parse_post_processor(const json& j, TokenizerImpl& impl) {
  if (j.is_null()) return;
  const std::string type = type_of(j, "post_processor");
  if (type == "Sequence") {
    for (const json& p : j.at("processors")) parse_post_processor(p, impl);
    return;
  }
  if (type == "ByteLevel") return;
  LS_REQUIRE(type == "TemplateProcessing", ErrorKind::kModel,
             "tokenizer.json: post_processor type '{}' is not supported (ByteLevel, TemplateProcessing)", type);
  bool seen_text = false;
  for (const json& piece : j.at("single")) {
    if (piece.contains("Sequence")) {
      seen_text = true;
      continue;
    }
    const std::string name = piece.at("SpecialToken").at("id").get<std::string>();
    const json& special = j.at("special_tokens");
    LS_REQUIRE(special.contains(name), ErrorKind::kModel,
               "tokenizer.json: TemplateProcessing uses '{}', which its special_tokens do not define", name);
    // As Hugging Face's SpecialToken refuses it: each id has its token text.
    LS_REQUIRE(special[name].contains("ids") && special[name].contains("tokens"), ErrorKind::kModel,
               "tokenizer.json: special token '{}' of TemplateProcessing needs \"ids\" and \"tokens\"", name);
    const json& ids = special[name]["ids"];
    const json& tokens = special[name]["tokens"];
    LS_REQUIRE(ids.is_array() && tokens.is_array() && ids.size() == tokens.size(), ErrorKind::kModel,
               "tokenizer.json: special token '{}' of TemplateProcessing has {} ids and {} tokens (they must match)",
               name, ids.is_array() ? ids.size() : 0, tokens.is_array() ? tokens.size() : 0);
    for (const json& id : ids)
      (seen_text ? impl.template_suffix : impl.template_prefix).push_back(checked_id(id, name));
  }
}

}  // namespace

Tokenizer Tokenizer::load(const std::filesystem::path& tokenizer_json) {
  auto start = std::chrono::steady_clock::now();
  std::filesystem::path path = tokenizer_json;
  std::error_code ec;  // a link that loops is named by the read below
  if (std::filesystem::is_directory(path, ec)) path /= "tokenizer.json";
  tok_detail::TokenizerJson file = tok_detail::read_tokenizer_json(path);
  const json& root = file.root;
  auto impl = std::make_unique<TokenizerImpl>();
  const char* section = "the top level";  // named when a value there has the wrong shape
  try {
    LS_REQUIRE(root.is_object() && root.contains("model"), ErrorKind::kModel,
               "{} has no \"model\"", path.string());
    Pipeline pipeline;
    section = "normalizer";
    parse_normalizer(root.value("normalizer", json()), *impl, pipeline);
    section = "pre_tokenizer";
    json pre = root.value("pre_tokenizer", json());
    if (!pre.is_null()) parse_pre_tokenizer(pre, *impl, pipeline);
    section = "decoder";
    parse_decoder(root.value("decoder", json()), pipeline);
    section = "the pipeline";
    check_pipeline(pipeline, *impl);
    for (const char* key : {"truncation", "padding"}) {
      if (root.contains(key) && !root[key].is_null()) {
        spdlog::warn("{}: \"{}\" is set and ignored", path.string(), key);
      }
    }
    section = "model";
    build_model(root["model"], file, *impl);
    section = "added_tokens";
    add_added_tokens(root.value("added_tokens", json()), *impl);
    section = "post_processor";
    parse_post_processor(root.value("post_processor", json()), *impl);
  } catch (const json::exception& e) {
    LS_FAIL(ErrorKind::kModel, "{}: unexpected structure in {}: {}", path.string(), section, e.what());
  }
  Tokenizer tokenizer(std::move(impl));
  spdlog::debug("loaded {} ({} ids) in {:.3f} s", path.string(), tokenizer.vocab_size(),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return tokenizer;
}

}  // namespace lockstep
