#include "common/utf8.h"

#include <algorithm>
#include <cstdint>

#include <fmt/format.h>

namespace lockstep {

namespace {

uint8_t byte_at(std::string_view s, size_t i) { return static_cast<uint8_t>(s[i]); }

// The length of the valid UTF-8 sequence at s[i], or 0.
size_t valid_sequence_length(std::string_view s, size_t i) {
  const Utf8Sequence seq = utf8_sequence_at(s, i);
  return seq.status == Utf8Sequence::kComplete ? seq.length : 0;
}

}  // namespace

Utf8Sequence utf8_sequence_at(std::string_view s, size_t i) {
  const uint8_t lead = byte_at(s, i);
  if (lead < 0x80) return {1, Utf8Sequence::kComplete};
  // Table 3-7: the lead byte fixes the length and the second byte's range
  // (narrower after E0, ED, F0 and F4: no overlong forms, no surrogates,
  // nothing above U+10FFFF); later bytes are 80..BF.
  size_t length;
  uint8_t low = 0x80, high = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;
    if (lead == 0xED) high = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;
  } else {
    return {1, Utf8Sequence::kInvalid};
  }
  for (size_t k = 1; k < length; ++k) {
    if (i + k == s.size()) return {k, Utf8Sequence::kTruncated};
    const uint8_t c = byte_at(s, i + k);
    if (c < low || c > high) return {k, Utf8Sequence::kInvalid};
    low = 0x80, high = 0xBF;
  }
  return {length, Utf8Sequence::kComplete};
}

size_t find_invalid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t len = valid_sequence_length(s, i);
    if (len == 0) return i;
    i += len;
  }
  return std::string_view::npos;
}

std::string printable(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t len = valid_sequence_length(s, i);
    const uint8_t c = byte_at(s, i);
    // C0 and C1 controls: a terminal would act on them.
    const bool control = (len == 1 && (c < 0x20 || c == 0x7f)) ||
                         (len == 2 && c == 0xC2 && byte_at(s, i + 1) < 0xA0);
    if (len == 0 || control) {
      for (size_t k = 0; k < std::max<size_t>(len, 1); ++k) out += fmt::format("\\x{:02x}", byte_at(s, i + k));
      i += std::max<size_t>(len, 1);
    } else {
      out.append(s.substr(i, len));
      i += len;
    }
  }
  return out;
}

namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

}  // namespace

std::string take_complete_utf8(std::string& bytes, Utf8Repair repair) {
  std::string out;
  size_t i = 0;
  while (i < bytes.size()) {
    const Utf8Sequence seq = utf8_sequence_at(bytes, i);
    if (seq.status == Utf8Sequence::kTruncated) break;  // the next bytes may complete it
    if (seq.status == Utf8Sequence::kComplete) {
      out.append(bytes, i, seq.length);
      i += seq.length;
      continue;
    }
    out += kReplacement;
    // Each byte alone: the bytes after the lead are then stray continuations,
    // one U+FFFD each.
    i += repair == Utf8Repair::kMaximalSubpart ? seq.length : 1;
  }
  bytes.erase(0, i);
  return out;
}

std::string repair_truncated_utf8(std::string_view tail, Utf8Repair repair) {
  if (tail.empty()) return {};
  std::string out;
  const size_t count = repair == Utf8Repair::kMaximalSubpart ? 1 : tail.size();
  for (size_t k = 0; k < count; ++k) out += kReplacement;
  return out;
}

}  // namespace lockstep
