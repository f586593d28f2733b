#include "common/utf8.h"

#include <algorithm>
#include <cstdint>

#include <fmt/format.h>

namespace lockstep {

namespace {

// The length of the valid UTF-8 sequence at s[i], or 0.
size_t valid_sequence_length(std::string_view s, size_t i) {
  const auto lead = static_cast<uint8_t>(s[i]);
  if (lead < 0x80) return 1;
  size_t len;
  char32_t min;
  char32_t cp;
  if ((lead & 0xE0) == 0xC0) {
    len = 2, min = 0x80, cp = lead & 0x1F;
  } else if ((lead & 0xF0) == 0xE0) {
    len = 3, min = 0x800, cp = lead & 0x0F;
  } else if ((lead & 0xF8) == 0xF0) {
    len = 4, min = 0x10000, cp = lead & 0x07;
  } else {
    return 0;
  }
  if (i + len > s.size()) return 0;
  for (size_t k = 1; k < len; ++k) {
    const auto c = static_cast<uint8_t>(s[i + k]);
    if ((c & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (c & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return len;
}

}  // namespace

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
    const auto c = static_cast<uint8_t>(s[i]);
    // C0 and C1 controls: a terminal would act on them.
    const bool control = (len == 1 && (c < 0x20 || c == 0x7f)) ||
                         (len == 2 && c == 0xC2 && static_cast<uint8_t>(s[i + 1]) < 0xA0);
    if (len == 0 || control) {
      for (size_t k = 0; k < std::max<size_t>(len, 1); ++k)
        out += fmt::format("\\x{:02x}", static_cast<uint8_t>(s[i + k]));
      i += std::max<size_t>(len, 1);
    } else {
      out.append(s.substr(i, len));
      i += len;
    }
  }
  return out;
}

}  // namespace lockstep
