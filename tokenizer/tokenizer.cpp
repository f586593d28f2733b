// Tokenizer: encode/decode and the streaming decoder. Loading is in load.cpp.
#include "tokenizer/tokenizer.h"

#include "common/error.h"
#include "common/utf8.h"
#include "tokenizer/tokenizer_impl.h"

namespace lockstep {

using tok_detail::Segment;

Tokenizer::Tokenizer(std::unique_ptr<tok_detail::TokenizerImpl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

namespace tok_detail {

void TokenizerImpl::encode_pretokenized(std::string_view text, bool at_start, std::vector<int32_t>& out) const {
  if (metaspace && !metaspace->in_normalizer) {
    bpe->encode_word(metaspace_normalize(text, at_start), out);
    return;
  }
  thread_local std::vector<std::pair<size_t, size_t>> pieces;
  thread_local std::vector<std::pair<size_t, size_t>> next;
  pieces.clear();
  pieces.emplace_back(0, text.size());
  for (const auto& splitter : splitters) {
    next.clear();
    for (auto [b, e] : pieces) splitter->split(text.substr(b, e - b), b, next);
    pieces.swap(next);
  }
  for (auto [b, e] : pieces) bpe->encode_word(text.substr(b, e - b), out);
}

std::string TokenizerImpl::metaspace_normalize(std::string_view text, bool at_start) const {
  if (text.empty()) return {};
  std::string out = replace_all(text, " ", kMetaspace);
  using P = Metaspace::Prepend;
  const bool absent = out.compare(0, kMetaspace.size(), kMetaspace) != 0;
  const P p = metaspace->prepend;
  if (p == P::kAlways || (absent && (p == P::kIfAbsent || (p == P::kFirstIfAbsent && at_start))))
    out.insert(0, kMetaspace);
  return out;
}

void TokenizerImpl::encode_plain(std::string_view text, bool at_start, std::vector<int32_t>& out) const {
  std::string normalized;
  std::string_view s = text;
  if (nfc_normalizer && nfc(text, normalized)) s = normalized;
  std::string with_metaspace;
  if (metaspace && metaspace->in_normalizer) {
    with_metaspace = metaspace_normalize(s, at_start);
    s = with_metaspace;
  }
  if (normalized_added.empty()) {
    encode_pretokenized(s, at_start, out);
    return;
  }
  std::vector<Segment> segments;
  normalized_added.split(s, segments);
  for (const Segment& seg : segments) {
    if (seg.id >= 0) {
      out.push_back(seg.id);
    } else {
      encode_pretokenized(s.substr(seg.begin, seg.end - seg.begin), at_start && seg.begin == 0, out);
    }
  }
}

}  // namespace tok_detail

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  size_t bad = find_invalid_utf8(text);
  LS_REQUIRE(bad == std::string_view::npos, ErrorKind::kInvalidArgument,
             "text to tokenize is not valid UTF-8 (byte offset {})", bad);
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (impl_->raw_added.empty()) {
    impl_->encode_plain(text, true, out);
    return out;
  }
  std::vector<Segment> segments;
  impl_->raw_added.split(text, segments);
  for (const Segment& seg : segments) {
    if (seg.id >= 0) {
      out.push_back(seg.id);
    } else {
      impl_->encode_plain(text.substr(seg.begin, seg.end - seg.begin), seg.begin == 0, out);
    }
  }
  return out;
}

std::vector<int32_t> Tokenizer::with_special_tokens(const std::vector<int32_t>& ids) const {
  std::vector<int32_t> out = impl_->template_prefix;
  out.insert(out.end(), ids.begin(), ids.end());
  out.insert(out.end(), impl_->template_suffix.begin(), impl_->template_suffix.end());
  return out;
}

bool Tokenizer::has_token(int32_t id) const {
  return id >= 0 && id < vocab_size() && impl_->id_known[static_cast<size_t>(id)];
}

const std::string& Tokenizer::token_bytes(int32_t id) const {
  LS_REQUIRE(has_token(id), ErrorKind::kInvalidArgument, "token id {} is not in the tokenizer's vocabulary (size {})",
             id, vocab_size());
  return impl_->id_bytes[static_cast<size_t>(id)];
}

const std::string& Tokenizer::first_token_bytes(int32_t id) const {
  const std::string& bytes = token_bytes(id);
  auto it = impl_->first_token_bytes.find(id);
  return it == impl_->first_token_bytes.end() ? bytes : it->second;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) out += i == 0 ? first_token_bytes(ids[i]) : token_bytes(ids[i]);
  return out.erase(0, tok_detail::leading_spaces(out, static_cast<size_t>(leading_spaces_stripped())));
}

Utf8Repair Tokenizer::utf8_repair() const {
  return impl_->metaspace ? Utf8Repair::kEachByte : Utf8Repair::kMaximalSubpart;
}

int Tokenizer::leading_spaces_stripped() const { return impl_->metaspace ? impl_->metaspace->strip_leading : 0; }

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->id_bytes.size()); }

std::optional<int32_t> Tokenizer::token_id(std::string_view token) const {
  int32_t id = impl_->spelling_to_id.get(token);
  if (id < 0) return std::nullopt;
  return id;
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size() && impl_->id_special[static_cast<size_t>(id)];
}

std::string StreamDecoder::push(int32_t id) {
  if (!tokenizer_->has_token(id)) return {};
  pending_ += first_ ? tokenizer_->first_token_bytes(id) : tokenizer_->token_bytes(id);
  first_ = false;
  if (strip_left_ > 0 && !pending_.empty()) {
    const size_t spaces = tok_detail::leading_spaces(pending_, static_cast<size_t>(strip_left_));
    pending_.erase(0, spaces);
    // Past the first non-space byte nothing more is stripped.
    strip_left_ = pending_.empty() ? strip_left_ - static_cast<int>(spaces) : 0;
  }
  return take_complete_utf8(pending_, repair_);
}

std::string StreamDecoder::flush() {
  std::string out = take_complete_utf8(pending_, repair_);
  out += repair_truncated_utf8(pending_, repair_);
  pending_.clear();
  return out;
}

}  // namespace lockstep
